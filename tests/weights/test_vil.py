"""ViL checkpoints: the original microsoft/vision-longformer ``MsViT`` layout through ``load_weights``, against
a fixture recorded from the original code (``tests/fixtures/make_fixtures_vil.py``: reduced MsViT, 64 px,
windows 3 on 16x16 / 8x8 maps, one global token per stage but the last)."""

from __future__ import annotations

import pytest
import torch
from fixture_utils import assert_parity, load_fixture

from vit_attention import create_attention
from vit_attention.attention import AttentionCall
from vit_attention.functional import switched
from vit_attention.models.vil import VilConfig, VisionLongformer
from vit_attention.weights import load_weights
from vit_attention.weights.vil import from_original_vil

# the fixture's arch string 'l1,h2,d16,n1,s1,g1,p4,f3_l2,h2,d32,n2,s1,g1,p2,f3_l3,h2,d32,n1,s0,g1,p2,f7_l4,...,g0,...'
_SMALL = dict(img_size=64, embed_dims=(16, 32, 32, 32), depths=(1, 2, 1, 1), num_heads=(2, 2, 2, 2),
              window_sizes=(3, 3, 7, 7), num_classes=10)


def _model() -> VisionLongformer:
    return VisionLongformer(VilConfig(**_SMALL)).eval()


@pytest.mark.parity
def test_original_fixture_parity() -> None:
    state, t, cfg = load_fixture("original_vil")
    assert cfg["img_size"] == 64 and "layer1.1.attn.query_global.weight" in state and "layer4.0.cls_pos_embed" in state
    model = _model()
    report = load_weights(model, state)
    assert report.layout == "original" and report.ok, str(report)
    x = t["input"]
    with torch.no_grad():
        assert_parity(model(x), t["output"])
        feats = model.forward_features(x)
        assert_parity(model.forward_head(feats, pre_logits=True), t["features"])
        stage = model.stages[0]
        tokens, grid, _ = stage.downsample(x)  # Tokens: (tokens, grid, globals)
        for blk in stage.blocks:
            tokens = blk(tokens, grid, 1)
        assert_parity(tokens, t["stage1"])  # globals first, as the original
        s2 = model.stages[1]
        m1 = tokens[:, 1:].reshape(x.shape[0], *grid, -1)
        tokens, grid, _ = s2.downsample(m1)
        for blk in s2.blocks:
            tokens = blk(tokens, grid, 1)
        assert_parity(tokens, t["stage2"])


@pytest.mark.parity
def test_converter_names_every_original_part() -> None:
    state, _, _ = load_fixture("original_vil")
    ours = from_original_vil(state)
    keys = set(_model().state_dict())
    assert set(ours) == keys  # nothing missing, nothing unexpected (the empty stage-4 cls_pos_embed dropped)
    assert "stages.0.blocks.0.norm1.weight" in ours and "stages.1.blocks.1.norm2.bias" in ours
    assert torch.equal(ours["stages.2.blocks.0.attn.qkv.weight"], state["layer3.1.attn.qkv.weight"])
    assert torch.equal(ours["head.fc.weight"], state["head.weight"])
    assert "stages.0.downsample.norm.weight" in ours and "stages.3.downsample.cls_pos_embed" not in ours


def test_relative_position_index_buffers_are_dropped() -> None:
    out = from_original_vil({"layer1.1.attn.relative_position_index": torch.zeros(4, 36, dtype=torch.long),
                             "layer1.1.norm.weight": torch.ones(2), "layer1.2.norm.bias": torch.zeros(2)})
    assert list(out) == ["stages.0.blocks.0.norm1.weight", "stages.0.blocks.0.norm2.bias"]


@pytest.mark.parity
@pytest.mark.parametrize("name", ["original_vil_attn_rpe", "original_vil_attn"])
def test_original_attention_module_parity(name: str) -> None:
    """``longformer2d`` with the original ``Long2DSCSelfAttention``'s weights (RPE tables, separate or shared
    global projections) on the probe's tokens: per-pixel Linear 3 -> C, learned globals in front."""
    state, t, cfg = load_fixture(name)
    attn = create_attention("longformer2d", cfg["dim"], cfg["num_heads"], window_size=cfg["w"],
                            share_weights=cfg["sharew"], rel_pos_bias=cfg["rpe"], num_global_tokens=cfg["nglo"]).eval()
    own = from_original_vil({k[len("attn."):]: v for k, v in state.items() if k.startswith("attn.")})
    if cfg["sharew"]:  # the converter's sharew rule applies to block keys; here the module's own names
        own = {k: v for k, v in own.items() if "_global." not in k}
    attn.load_state_dict(own, strict=True)
    x = t["input"]  # [B, 3, H, W]
    B, _, H, W = x.shape
    tokens = torch.nn.functional.linear(x.flatten(2).transpose(1, 2), state["embed.weight"], state["embed.bias"])
    tokens = torch.cat([state["glob"].expand(B, -1, -1), tokens], dim=1)
    with torch.no_grad():
        out = attn(tokens, AttentionCall(feat_size=(H, W), num_prefix_tokens=cfg["nglo"]))
        with switched(attn, fused_attention=False):
            explicit = attn(tokens, AttentionCall(feat_size=(H, W), num_prefix_tokens=cfg["nglo"]))
    assert_parity(out, t["output"])
    assert_parity(explicit, t["output"])
