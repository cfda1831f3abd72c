"""ViTDet (models/vitdet.py): the published layouts (global blocks, tables, drop path), the simple feature
pyramid's structure and detectron2 shapes at 1024², GMACs reconciled with Hugging Face's count, any image
size, features_only, and the plain backbone (``pyramid=False``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from transformers import VitDetConfig, VitDetModel

from vit_attention import create_model
from vit_attention.analysis import flops
from vit_attention.layers.norm import LayerNorm2d
from vit_attention.models.vitdet import ConvNorm

B, L, H = "vitdet_base_patch16_1024", "vitdet_large_patch16_1024", "vitdet_huge_patch16_1024"
SMALL = dict(img_size=128, embed_dim=32, depth=3, num_heads=2, global_block_indices=(1,), window_size=3,
             pretrain_img_size=48, pyramid_channels=16)
# (width, depth, heads, global blocks, drop path, HF VitDetModel GMACs at 1024², transformers 5.23.0)
PUBLISHED = {B: (768, 12, 12, (2, 5, 8, 11), 0.1, 482.8), L: (1024, 24, 16, (5, 11, 17, 23), 0.4, 1489.4),
             H: (1280, 32, 16, (7, 15, 23, 31), 0.5, 2976.8)}


def _padding_projection_gmacs(C: int, depth: int, glob: tuple[int, ...]) -> float:
    """What the references spend on the 70² - 64² padded tokens that we do not project: qkv and proj of the
    804 padded slots in every window block (ours projects one zero token for all of them)."""
    n, np_ = 64 * 64, 70 * 70
    return (depth - len(glob)) * (3 * (np_ - n - 1) + (np_ - n)) * C * C / 1e9


@pytest.mark.registry
@pytest.mark.parametrize("name", [B, L, H])
def test_published_layout_and_pyramid_shapes_at_1024(name):
    C, depth, heads, glob, dpr, _ = PUBLISHED[name]
    with torch.device("meta"):
        model = create_model(name)
        levels = model.forward_pyramid(torch.empty(1, 3, 1024, 1024))
    hd = C // heads
    for i, blk in enumerate(model.blocks):
        attn = blk.attn
        assert attn.is_windowed == (i not in glob), i
        assert attn.rel_pos_h.shape == attn.rel_pos_w.shape == ((127 if i in glob else 27), hd)
    assert model.pos_embed.shape == (1, 197, C)  # MAE's 14x14 grid + class row
    assert model.blocks[-1].drop_path1.p == pytest.approx(dpr)
    assert {k: tuple(v.shape) for k, v in levels.items()} == {
        "p2": (1, 256, 256, 256), "p3": (1, 256, 128, 128), "p4": (1, 256, 64, 64), "p5": (1, 256, 32, 32),
        "p6": (1, 256, 16, 16)}
    assert {k: tuple(v) for k, v in model.output_shape().items()} == {
        "p2": (256, 4), "p3": (256, 8), "p4": (256, 16), "p5": (256, 32), "p6": (256, 64)}
    assert [(d["num_chs"], d["reduction"]) for d in model.feature_info] == [(256, s) for s in (4, 8, 16, 32, 64)]


def test_pyramid_modules_are_detectron2s():
    """simfp_{2,3,4,5}: the layer types, widths and indices of detectron2's SimpleFeaturePyramid (keys load as
    they are), conv biases off under LN."""
    with torch.device("meta"):
        m = create_model(B)
    kinds = {n: [type(x).__name__ for x in getattr(m, n)] for n in ("simfp_2", "simfp_3", "simfp_4", "simfp_5")}
    assert kinds == {"simfp_2": ["ConvTranspose2d", "LayerNorm2d", "GELU", "ConvTranspose2d", "ConvNorm", "ConvNorm"],
                     "simfp_3": ["ConvTranspose2d", "ConvNorm", "ConvNorm"], "simfp_4": ["ConvNorm", "ConvNorm"],
                     "simfp_5": ["MaxPool2d", "ConvNorm", "ConvNorm"]}
    assert m.simfp_2[0].out_channels == 384 and m.simfp_2[3].out_channels == 192 and m.simfp_2[4].in_channels == 192
    assert m.simfp_3[1].in_channels == 384 and m.simfp_4[0].in_channels == m.simfp_5[1].in_channels == 768
    for conv in (c for c in m.modules() if isinstance(c, ConvNorm)):
        assert conv.bias is None and isinstance(conv.norm, LayerNorm2d) and conv.norm.eps == 1e-6
    assert {k for k in m.state_dict() if k.startswith("simfp_4.")} == {
        "simfp_4.0.weight", "simfp_4.0.norm.weight", "simfp_4.0.norm.bias",
        "simfp_4.1.weight", "simfp_4.1.norm.weight", "simfp_4.1.norm.bias"}


@pytest.mark.parity
def test_gmacs_equal_hugging_face_minus_the_padded_projections():
    """Ours at 1024² plus the projections of padded tokens the references compute = HF VitDetModel measured
    on the meta device (to the LayerNorms, which FlopCounterMode does not count: 0.1 %)."""
    C, depth, heads, glob, _, published = PUBLISHED[B]
    cfg = VitDetConfig(hidden_size=C, num_hidden_layers=depth, num_attention_heads=heads, image_size=1024,
                       pretrain_image_size=224, window_size=14, use_relative_position_embeddings=True,
                       window_block_indices=[i for i in range(depth) if i not in glob])
    with torch.device("meta"):
        hf = VitDetModel(cfg)
        with FlopCounterMode(display=False) as counter:
            hf(torch.empty(1, 3, 1024, 1024))
        ours = create_model(B, num_classes=0)
    hf_gmacs = counter.get_total_flops() / 2e9
    assert hf_gmacs == pytest.approx(published, abs=0.05)
    gmacs = flops(ours, (1, 3, 1024, 1024)).gmacs
    assert gmacs + _padding_projection_gmacs(C, depth, glob) == pytest.approx(hf_gmacs, rel=2e-3)


@pytest.mark.registry
@pytest.mark.parametrize("name", [L, H])
def test_gmacs_large_huge_reconcile_with_the_published_figures(name):
    C, depth, _, glob, _, published = PUBLISHED[name]
    with torch.device("meta"):
        model = create_model(name, num_classes=0)
    gmacs = flops(model, (1, 3, 1024, 1024)).gmacs
    assert gmacs + _padding_projection_gmacs(C, depth, glob) == pytest.approx(published, rel=2e-3)


@pytest.mark.parametrize("size", [(128, 128), (100, 130), (64, 200)])
def test_any_image_size(size):
    model = create_model(B, **SMALL).eval()
    x = torch.randn(1, 3, *size)
    gh, gw = -(-size[0] // 16), -(-size[1] // 16)  # images padded to the patch
    with torch.no_grad():
        feats = model.forward_features(x)
        levels = model.forward_pyramid(x)
        assert model(x).shape == (1, 1000)
    assert feats.shape == (1, gh, gw, 32)
    assert levels["p2"].shape[-2:] == (4 * gh, 4 * gw) and levels["p4"].shape[-2:] == (gh, gw)
    assert levels["p5"].shape[-2:] == (gh // 2, gw // 2)
    assert levels["p6"].shape[-2:] == ((gh // 2 + 1) // 2, (gw // 2 + 1) // 2)


def test_features_only_is_the_pyramid():
    full = create_model(B, **SMALL).eval()
    feats = create_model(B, **SMALL, features_only=True).eval()
    feats.load_state_dict(full.state_dict())
    x = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        maps, levels = feats(x), full.forward_pyramid(x)
        nhwc = full.forward_intermediates(x, (0, -1), output_fmt="NHWC", intermediates_only=True)
    assert feats.feature_info.reduction() == [4, 8, 16, 32, 64] and feats.feature_info.channels() == [16] * 5
    for m, ref in zip(maps, levels.values()):
        torch.testing.assert_close(m, ref)
    torch.testing.assert_close(nhwc[0], levels["p2"].permute(0, 2, 3, 1))
    torch.testing.assert_close(nhwc[1], levels["p6"].permute(0, 2, 3, 1))


def test_plain_backbone_without_pyramid():
    model = create_model(B, **SMALL, pyramid=False).eval()
    assert not any(k.startswith("simfp_") for k in model.state_dict())
    assert model.output_shape() == {"last_feat": (32, 16)}
    assert [d["module"] for d in model.feature_info] == ["blocks.0", "blocks.1", "blocks.2"]
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        last, maps = model.forward_intermediates(x, [-1])
        torch.testing.assert_close(maps[0], model.forward_features(x).permute(0, 3, 1, 2))
        torch.testing.assert_close(last, model.forward_features(x))
    with pytest.raises(ValueError, match="pyramid=False"):
        model.forward_pyramid(x)


def test_abs_pos_is_the_bicubic_resize_of_the_pretraining_grid_without_class_row():
    model = create_model(B, **SMALL)
    grid = model.pos_embed[:, 1:].reshape(1, 3, 3, 32).permute(0, 3, 1, 2)
    ref = F.interpolate(grid, size=(8, 5), mode="bicubic", align_corners=False).permute(0, 2, 3, 1)
    torch.testing.assert_close(model.abs_pos((8, 5)), ref)


def test_classifier_api_and_weight_decay_names():
    model = create_model(B, **SMALL)
    model.reset_classifier(7)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 7)
    model.reset_classifier(0)
    assert isinstance(model.head.fc, nn.Identity)
    names = model.no_weight_decay()
    assert "pos_embed" in names and "blocks.1.attn.rel_pos_h" in names and not any("qkv" in n for n in names)


@pytest.mark.parametrize("bad,match", [(dict(scale_factors=(4.0, 3.0)), "scale_factors"),
                                       (dict(scale_factors=(1.0, 2.0)), "scale_factors"),
                                       (dict(global_block_indices=(-1,)), "global_block_indices"),
                                       (dict(window_size=-2), "window_size"),
                                       (dict(attn_layer="mhsa"), "spatial")])
def test_bad_config_is_named(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        create_model(B, **{**SMALL, **bad})


def test_augment_impl_model_equals_the_bias_model():
    model = create_model(B, **SMALL).eval()
    aug = create_model(B, **SMALL, rel_pos_impl="augment").eval()
    aug.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in model.parameters():  # non-zero tables
            p.add_(0.05 * torch.randn_like(p))
        aug.load_state_dict(model.state_dict())
        x = torch.randn(1, 3, 128, 96)
        torch.testing.assert_close(aug.forward_features(x), model.forward_features(x), rtol=1e-5, atol=1e-5)
    assert aug.blocks[1].attn.rel_pos_impl == "augment" and aug.blocks[0].attn.is_windowed
