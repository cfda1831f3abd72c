"""ViTDet parity: live against Hugging Face ``VitDetModel`` (backbone) and against detectron2's
``SimpleFeaturePyramid(ViT)`` through a committed fixture (tests/fixtures/make_fixtures_vitdet.py);
the detectron2, Hugging Face and MAE layouts through ``load_weights``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixture_utils import add_noise, assert_parity, load_fixture
from transformers import VitDetConfig, VitDetModel

from vit_attention import create_model
from vit_attention.weights import load_weights
from vit_attention.weights.vitdet import to_huggingface

NAME = "vitdet_base_patch16_1024"
# our reduced twin of the HF config below: a 8x8 map, windows of 3 (padded to 9x9) in blocks 0 and 2,
# block 1 global, position embedding from a 4x4 pre-training grid
_OURS_SMALL = dict(img_size=64, patch_size=8, embed_dim=32, depth=3, num_heads=2, window_size=3,
                   global_block_indices=(1,), pretrain_img_size=32, drop_path_rate=0.0)
_HF_SMALL = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, mlp_ratio=4, image_size=64, patch_size=8,
                 pretrain_image_size=32, window_size=3, window_block_indices=[0, 2],
                 use_relative_position_embeddings=True, use_absolute_position_embeddings=True, drop_path_rate=0.0,
                 layer_norm_eps=1e-6, qkv_bias=True)


def _hf() -> VitDetModel:
    torch.manual_seed(0)
    ref = VitDetModel(VitDetConfig(**_HF_SMALL)).eval()
    add_noise(ref, 0.1)  # the relative-position tables start at zero: perturb everything
    return ref


@pytest.mark.parity
@pytest.mark.parametrize("size", [(64, 64), (48, 72), (40, 40)])
def test_live_hf_vitdet_backbone(size: tuple[int, int]) -> None:
    """The backbone's last map [B, C, H/p, W/p] equals HF's at the built size and at others (padded windows,
    resized tables, resized position grid)."""
    ref = _hf()
    model = create_model(NAME, **_OURS_SMALL, pyramid=False, num_classes=0).eval()
    report = load_weights(model, ref.state_dict())
    assert report.layout == "huggingface" and report.ok, str(report)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(pixel_values=x).last_hidden_state  # [B, C, H', W']
        ours = model.forward_features(x).permute(0, 3, 1, 2)
    assert ours.shape == expected.shape
    assert_parity(ours, expected)


@pytest.mark.parity
def test_hf_layout_round_trip_and_pyramid_model_loads_backbone_non_strictly() -> None:
    ref = _hf()
    model = create_model(NAME, **_OURS_SMALL, pyramid=False, num_classes=0)
    load_weights(model, ref.state_dict())
    back = to_huggingface(model.state_dict())
    assert set(back) == set(ref.state_dict())
    fresh = VitDetModel(VitDetConfig(**_HF_SMALL)).eval()
    fresh.load_state_dict(back, strict=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    full = create_model(NAME, **_OURS_SMALL, num_classes=0)  # with the pyramid: HF has none
    report = load_weights(full, ref.state_dict(), strict=False)
    assert report.missing and all(k.startswith("simfp_") for k in report.missing)
    with pytest.raises(RuntimeError, match="simfp_"):
        load_weights(create_model(NAME, **_OURS_SMALL, num_classes=0), ref.state_dict())


@pytest.mark.parity
def test_hf_residual_blocks_are_refused() -> None:
    state = {**_hf().state_dict(), "encoder.layer.0.residual.conv1.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="residual"):
        load_weights(create_model(NAME, **_OURS_SMALL, pyramid=False, num_classes=0), state)


# ---------------------------------------------------------------- detectron2 (fixture)
def _d2_model() -> tuple[torch.nn.Module, dict, dict]:
    state, tensors, cfg = load_fixture("detectron2_vitdet")
    vit, pyr = cfg["vit"], cfg["pyramid"]
    glob = tuple(i for i in range(vit["depth"]) if i not in vit["window_block_indexes"])
    model = create_model(NAME, img_size=vit["img_size"], patch_size=vit["patch_size"], embed_dim=vit["embed_dim"],
                         depth=vit["depth"], num_heads=vit["num_heads"], window_size=vit["window_size"],
                         global_block_indices=glob, pretrain_img_size=vit["pretrain_img_size"],
                         pyramid_channels=pyr["out_channels"], scale_factors=tuple(pyr["scale_factors"]),
                         norm_eps=cfg["norm_eps"], drop_path_rate=0.0, num_classes=0).eval()
    return model, state, tensors


@pytest.mark.parity
def test_detectron2_pyramid_fixture() -> None:
    """detectron2's ViT + SimpleFeaturePyramid: every level p2 ... p6, the backbone map, and a 48x80 input."""
    model, state, tensors = _d2_model()
    report = load_weights(model, state)
    assert report.layout == "detectron2" and report.ok, str(report)
    with torch.no_grad():
        levels = model.forward_pyramid(tensors["input"])
        assert list(levels) == ["p2", "p3", "p4", "p5", "p6"]
        for name, value in levels.items():
            ref = tensors[f"pyramid.{name}"]
            assert value.shape == ref.shape, name
            assert_parity(value, ref)
        assert_parity(model.forward_features(tensors["input"]).permute(0, 3, 1, 2), tensors["features"])
        flat = torch.cat([v.flatten(1) for v in levels.values()], 1)
        assert_parity(flat, tensors["output"])
        rect = model.forward_pyramid(tensors["input_rect"])
        assert_parity(torch.cat([v.flatten(1) for v in rect.values()], 1), tensors["output_rect"])
    assert {k: tuple(v) for k, v in model.output_shape().items()} == {
        "p2": (16, 4), "p3": (16, 8), "p4": (16, 16), "p5": (16, 32), "p6": (16, 64)}


@pytest.mark.parity
def test_detectron2_detector_checkpoint_numpy_and_other_heads_dropped() -> None:
    """A whole detector's ``model`` dict (the zoo's numpy arrays made tensors; ROI heads, pixel_mean) keeps the
    backbone only."""
    model, state, tensors = _d2_model()
    detector = {k: v.numpy() for k, v in state.items()}
    detector.update({"roi_heads.box_predictor.cls_score.weight": np.zeros((81, 1024), np.float32),
                     "proposal_generator.rpn_head.conv.weight": np.zeros((256, 256, 3, 3), np.float32),
                     "pixel_mean": np.zeros((3, 1, 1), np.float32)})
    report = load_weights(model, {k: torch.as_tensor(v) for k, v in detector.items()})
    assert report.ok and report.layout == "detectron2"
    with torch.no_grad():
        assert_parity(model.forward_pyramid(tensors["input"])["p2"], tensors["pyramid.p2"])


# ---------------------------------------------------------------- MAE pre-training
def test_mae_pretrained_vit_initialises_the_backbone() -> None:
    """An MAE ViT checkpoint (timm names, class token, final norm, decoder) -> blocks and pos_embed as they
    are, relative-position tables zero, pyramid / probe left missing (strict=False, as detectron2 loads it)."""
    vit = create_model("vit_base_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2)
    mae = dict(vit.state_dict())
    mae.update({"mask_token": torch.zeros(1, 1, 16), "decoder_embed.weight": torch.zeros(16, 32),
                "decoder_blocks.0.norm1.weight": torch.ones(16), "decoder_pred.weight": torch.zeros(192, 16)})
    model = create_model(NAME, **_OURS_SMALL)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("rel_pos_h", "rel_pos_w")):
                p.fill_(1.0)
    report = load_weights(model, mae, strict=False)
    assert report.layout == "mae" and not report.unexpected and not report.mismatched
    assert report.missing and all(k.startswith(("simfp_", "head.")) for k in report.missing)
    own = model.state_dict()
    assert torch.equal(own["pos_embed"], mae["pos_embed"])  # [1, 1 + 4·4, C]: the class row kept, dropped at run time
    assert torch.equal(own["blocks.2.attn.qkv.weight"], mae["blocks.2.attn.qkv.weight"])
    assert all(not own[k].any() for k in own if k.endswith(("rel_pos_h", "rel_pos_w")))


@pytest.mark.parity
def test_rel_pos_tables_of_another_length_are_resized() -> None:
    """A checkpoint trained at another size: the global block's tables are resized linearly on load."""
    ref = _hf()
    state = ref.state_dict()
    small = create_model(NAME, **{**_OURS_SMALL, "img_size": 48}, pyramid=False, num_classes=0)  # 6x6: tables 11
    report = load_weights(small, state)
    assert report.ok and any("resized" in n for n in report.notes)
    assert small.blocks[1].attn.rel_pos_h.shape[0] == 11
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():  # the tables resized on load act as the run-time resize of the 64-px model
        big = create_model(NAME, **_OURS_SMALL, pyramid=False, num_classes=0).eval()
        load_weights(big, state)
        assert_parity(small.eval().forward_features(x), big.forward_features(x))
