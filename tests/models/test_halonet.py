"""HaloNet models: sizes of timm's presets, feature levels, plug-and-play mechanisms, validation."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_model
from vit_attention.models.halonet import HaloNetConfig, SelfAttnBlock

SMALL = dict(stem_chs=16, block_types=("b", "ba", "ba", "a"), channels=(16, 32, 32, 32), num_heads=(2,) * 4,
             attn_kwargs={"block_size": 2, "halo_size": 1}, num_classes=5, img_size=64)

# timm 1.0.31 ``sum(p.numel() for p in timm.create_model(name).parameters())`` (checked in the side env)
TIMM_PARAMS = {"halonet_h1": 8_100_056, "halonet26t": 12_480_288, "sehalonet33ts": 13_691_712,
               "halonet50ts": 22_733_280, "haloregnetz_b": 11_680_072}


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameter_counts_equal_timm(name: str) -> None:
    with torch.device("meta"):
        model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) == TIMM_PARAMS[name]


def test_halonet26t_layout_and_strides() -> None:
    with torch.device("meta"):
        model = create_model("halonet26t")
    keys = set(model.state_dict())
    for k in ("stem.conv1.conv.weight", "stem.conv3.bn.running_var", "stages.2.1.self_attn.q.weight",
              "stages.2.1.self_attn.kv.weight", "stages.2.1.self_attn.pos_embed.height_rel",
              "stages.3.0.shortcut.conv.weight", "stages.3.0.post_attn.weight", "stages.1.0.conv2_kxk.conv.weight",
              "head.fc.weight"):
        assert k in keys, k
    attn = model.stages[3][0].self_attn
    assert attn.block_stride == 2 and attn.block_size == 8 and attn.halo_size == 2
    assert tuple(attn.pos_embed.height_rel.shape) == (2 * 12 - 1, 64)  # win 12, hd 512 / 8
    assert [d["reduction"] for d in model.feature_info] == [2, 4, 8, 16, 32]


def test_feature_levels_and_head() -> None:
    torch.manual_seed(0)
    model = create_model("halonet26t", **SMALL).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        feats = model.forward_features(x)
        logits = model(x)
        nhwc = model.forward_intermediates(x, indices=[0, -1], output_fmt="NHWC", intermediates_only=True)
    assert [m.shape[1] for m in maps] == [d["num_chs"] for d in model.feature_info] == [16, 16, 32, 32, 32]
    assert [64 // m.shape[-1] for m in maps] == [2, 4, 8, 16, 32]
    assert torch.equal(final, feats) and torch.equal(maps[-1], feats)
    assert logits.shape == (2, 5)
    torch.testing.assert_close(model.forward_head(feats, pre_logits=True), feats.mean(dim=(2, 3)))
    assert [tuple(m.shape) for m in nhwc] == [(2, 32, 32, 16), (2, 2, 2, 32)]


def test_sizes_that_are_not_block_multiples_run() -> None:
    """timm asserts block multiples; here the halo mechanism pads (72 px: maps 9, 5, 3 with blocks of 2)."""
    model = create_model("halonet26t", **SMALL).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 72, 72)).shape == (1, 5)


@pytest.mark.parametrize("mechanism", ["neighborhood", "window", "cosine_window", "mhsa"])
def test_any_mechanism_replaces_halo(mechanism: str) -> None:
    # cosine_window builds its projections without bias: the family's init must not assume one
    kwargs = {"neighborhood": {"kernel_size": 3}, "window": {"window_size": 2}, "cosine_window": {"window_size": 2},
              "mhsa": {}}[mechanism]
    model = create_model("halonet26t", **{**SMALL, "attn_layer": mechanism, "attn_kwargs": kwargs}).eval()
    blocks = [m for m in model.modules() if isinstance(m, SelfAttnBlock)]
    assert blocks and all(b.self_attn.attention_name == mechanism for b in blocks)
    strided = [b for b in blocks if b.shortcut is not None and not isinstance(b.shortcut, torch.nn.Identity)]
    assert strided and all(isinstance(b.pool, torch.nn.AvgPool2d) for b in strided)  # no stride keyword: pooled
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 64))
    assert out.shape == (1, 5) and bool(torch.isfinite(out).all())


def test_training_step_reaches_every_parameter() -> None:
    model = create_model("sehalonet33ts", **SMALL, drop_path_rate=0.1)
    model.train()
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing
    assert {n for n in model.no_weight_decay()} and all(n.endswith("_rel") for n in model.no_weight_decay())


def test_reset_classifier() -> None:
    model = create_model("halonet26t", **SMALL)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 32)


@pytest.mark.parametrize("bad,match", [
    (dict(block_types=("bx",)), "block_types"),
    (dict(block_types=("b", "a")), "channels"),
    (dict(strides=(1, 3, 2, 2)), "strides"),
    (dict(act_layer="gelu"), "act_layer"),
    (dict(downsample="avg"), "downsample"),
    (dict(attn_layer="nope"), "attn_layer"),
])
def test_validation_names_the_field(bad: dict, match: str) -> None:
    with pytest.raises((ValueError, KeyError, TypeError), match=match):
        HaloNetConfig(**bad)
