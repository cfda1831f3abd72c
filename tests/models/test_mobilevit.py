"""MobileViT v1 / v2 models: structure, feature maps, resize rules, plug-and-play mechanisms, validation."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_model
from vit_attention.models.mobilevit import MobileViT, MobileViTConfig

SMALL = dict(stem_chs=8, channels=(8, 16, 16, 24, 24), depths=(1, 2, 1, 1, 1), transformer_dims=(0, 0, 16, 24, 24),
             transformer_depths=(0, 0, 2, 1, 1), num_classes=5)


def _small(name: str, **kw) -> MobileViT:
    torch.manual_seed(0)
    num_features = 32 if name.startswith("mobilevit_") else 0
    return create_model(name, **{**SMALL, "num_features": num_features, **kw}).eval()


@pytest.mark.registry
@pytest.mark.parametrize("name", ["mobilevit_s", "mobilevitv2_100"])
def test_feature_levels_and_head(name: str) -> None:
    model = _small(name, img_size=128)
    x = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        feats = model.forward_features(x)
        logits = model(x)
    assert [m.shape[1] for m in maps] == [d["num_chs"] for d in model.feature_info]
    assert [128 // m.shape[-1] for m in maps] == [d["reduction"] for d in model.feature_info] == [2, 4, 8, 16, 32]
    assert torch.equal(final, feats) and torch.equal(maps[-1], feats)
    assert logits.shape == (2, 5)
    torch.testing.assert_close(model.forward_head(feats, pre_logits=True), feats.mean(dim=(2, 3)))
    nhwc = model.forward_intermediates(x, indices=[1, -1], output_fmt="NHWC", intermediates_only=True)
    assert [tuple(m.shape) for m in nhwc] == [(2, 32, 32, 16), tuple(feats.permute(0, 2, 3, 1).shape)]


def test_v1_resizes_up_and_back_v2_only_up() -> None:
    """At 80 px the stride-16 map is 5x5: v1 returns 5x5 (timm / HF), v2 keeps the 6x6 it resized to (timm)."""
    x = torch.randn(1, 3, 80, 80)
    with torch.no_grad():
        v1 = _small("mobilevit_xxs").forward_intermediates(x, intermediates_only=True)
        v2 = _small("mobilevitv2_050").forward_intermediates(x, intermediates_only=True)
    assert [tuple(m.shape[-2:]) for m in v1] == [(40, 40), (20, 20), (10, 10), (5, 5), (3, 3)]
    assert [tuple(m.shape[-2:]) for m in v2] == [(40, 40), (20, 20), (10, 10), (6, 6), (4, 4)]


@pytest.mark.registry
@pytest.mark.parametrize(("name", "mechanism"), [("mobilevit_xxs", "unfold"), ("mobilevitv2_050", "separable")])
def test_default_mechanisms_and_any_other_plugs_in(name: str, mechanism: str) -> None:
    model = _small(name)
    blk = model.stages[2][1].transformer[0]
    assert blk.attn.attention_name == mechanism and blk.attn.patch_size == 2
    for other, kw in [("mhsa", {}), ("window", {"window_size": 2})]:
        swapped = _small(name, attn_layer=other, attn_kwargs=kw)
        assert swapped.stages[2][1].transformer[0].attn.attention_name == other
        with torch.no_grad():
            assert swapped(torch.randn(1, 3, 64, 64)).shape == (1, 5)


def test_gradient_checkpointing_matches() -> None:
    model = _small("mobilevit_xxs").train()
    x = torch.randn(2, 3, 64, 64)
    torch.manual_seed(1)
    ref = model(x)
    model.set_grad_checkpointing(True)
    torch.manual_seed(1)
    out = model(x)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_presets_follow_timm_widths() -> None:
    cfg = create_model("mobilevitv2_075", num_classes=0).cfg
    assert cfg.stem_chs == 24 and cfg.channels == (48, 96, 192, 288, 384)
    assert cfg.transformer_dims == (0, 0, 96, 144, 192) and cfg.num_heads == 1 and cfg.num_features == 0
    xs = create_model("mobilevit_xs", num_classes=0)
    assert xs.num_features == 384 and xs.stages[2][0].conv1_1x1.conv.out_channels == 192  # 48 * expand 4


def test_reset_classifier() -> None:
    model = _small("mobilevit_xxs")
    model.reset_classifier(3)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 32)


@pytest.mark.parametrize(("override", "match"), [
    (dict(transformer_dims=(0, 0, 16, 24)), "transformer_dims"),
    (dict(transformer_depths=(0, 0, 0, 1, 1)), "transformer_depths"),
    (dict(transformer_dims=(0, 0, 18, 24, 24)), "num_heads"),
    (dict(block_type="v4"), "block_type"),
    (dict(kernel_size=2), "kernel_size"),
    (dict(attn_layer="nope"), "attn_layer"),
])
def test_bad_config_names_the_field(override: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError, KeyError), match=match):
        MobileViTConfig(**{**SMALL, **override})


@pytest.mark.registry
@pytest.mark.parametrize(("name", "published"), [
    ("mobilevitv3_xxs", 1.2), ("mobilevitv3_xs", 2.5), ("mobilevitv3_s", 5.8),
    ("mobilevitv3_050", 1.4), ("mobilevitv3_075", 3.0), ("mobilevitv3_100", 5.1)])
def test_v3_parameter_counts_round_to_the_readme(name: str, published: float) -> None:
    """micronDLA/MobileViTv3 README figures (one decimal): our counts round to them."""
    with torch.device("meta"):
        model = create_model(name)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == published


def test_v3_v1_block_fuses_local_and_global_with_a_1x1_conv_and_adds_the_input() -> None:
    model = _small("mobilevitv3_xxs")
    blk = model.stages[2][1]
    d, c = blk.conv_1x1.out_channels, blk.conv_1x1.in_channels
    assert blk.conv_kxk.conv.groups == c  # depthwise local conv
    assert blk.conv_fusion.conv.kernel_size == (1, 1) and blk.conv_fusion.conv.in_channels == d + c
    x = torch.randn(2, c, 6, 5)  # odd width: the v1 resize path
    with torch.no_grad():
        blk.conv_fusion.bn.weight.zero_()
        blk.conv_fusion.bn.bias.zero_()  # fusion -> SiLU(0) = 0: the block is the identity
        torch.testing.assert_close(blk(x), x)
        local = blk.conv_1x1(blk.conv_kxk(x))
        blk.conv_fusion.bn.weight.fill_(1.0)
        blk.conv_fusion.conv.weight[:, d:].zero_()  # only the local features left in the fusion
        fused = blk.conv_fusion(torch.cat((local, torch.zeros(2, c, 6, 5)), dim=1))
        torch.testing.assert_close(blk(x), x + fused)


def test_v3_v2_block_projects_global_then_local_and_adds_the_resized_input() -> None:
    model = _small("mobilevitv3_050")
    blk = model.stages[3][1]
    d = blk.conv_1x1.out_channels
    assert blk.conv_proj.conv.in_channels == 2 * d and isinstance(blk.conv_proj.act, torch.nn.Identity)
    x = torch.randn(1, blk.conv_1x1.in_channels, 3, 4)
    with torch.no_grad():
        blk.conv_proj.bn.weight.zero_()
        blk.conv_proj.bn.bias.zero_()
        out = blk(x)
        up = torch.nn.functional.interpolate(x, size=(4, 4), mode="bilinear", align_corners=True)
        torch.testing.assert_close(out, up)  # only the (resized) input is left
        blk.conv_proj.bn.weight.fill_(1.0)
        blk.conv_proj.conv.weight[:, :d].zero_()  # only the local half (second) left
        local = blk.conv_1x1(blk.conv_kxk(up))
        expect = up + blk.conv_proj(torch.cat((torch.zeros_like(local), local), dim=1))
        torch.testing.assert_close(blk(x), expect)
