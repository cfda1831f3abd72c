"""DaViT model: presets, the Block's second position layer, any input size, features, checkpointing."""

from __future__ import annotations

import pytest
import torch
from fixture_utils import add_noise
from torch import nn

from vit_attention import create_model
from vit_attention.layers import Block, PosConv
from vit_attention.models import model_config

SMALL = dict(depths=(1, 2), embed_dims=(16, 32), num_heads=(2, 4), num_classes=5)


def test_presets_follow_timm():
    t = model_config("davit_tiny")
    assert (t.depths, t.embed_dims, t.num_heads, t.window_size) == ((1, 1, 3, 1), (96, 192, 384, 768),
                                                                   (3, 6, 12, 24), 7)
    g = model_config("davit_giant")
    assert g.depths == (1, 1, 12, 3) and g.embed_dims[0] == 384 and g.num_heads[-1] == 96
    fl = model_config("davit_huge_fl")
    assert (fl.window_size, fl.down_kernel_size, fl.channel_form) == (12, 3, "florence2")
    assert fl.embed_dims == model_config("davit_huge").embed_dims
    assert model_config("davit_base").channel_form == "davit"


def test_block_pairs_keys_and_mechanisms():
    m = create_model("davit_tiny", **SMALL)
    pair = m.stages[1].blocks[1]
    assert pair[0].attn.attention_name == "lsa" and pair[1].attn.attention_name == "channel"
    assert pair[1].attn.form == "davit" and pair[0].attn.window_size == (7, 7) and pair[0].attn.pad_mask is False
    keys = set(m.state_dict())
    for k in ("stem.conv.weight", "stem.norm.bias", "stages.1.downsample.norm.weight",
              "stages.1.downsample.conv.weight", "stages.1.blocks.1.0.pos.proj.weight",
              "stages.1.blocks.1.1.pos2.proj.bias", "stages.0.blocks.0.1.attn.qkv.weight", "head.norm.weight",
              "head.fc.weight"):
        assert k in keys, k
    assert not any("relative_position" in k for k in keys)  # no position bias in DaViT's windows
    fl = create_model("davit_base_fl", **SMALL)
    assert fl.stages[1].downsample.conv.kernel_size == (3, 3) and fl.stages[0].blocks[0][1].attn.form == "florence2"


@pytest.mark.registry
@pytest.mark.parametrize("name", ["davit_base_fl", "davit_huge_fl"])
def test_florence2_towers_are_headless_by_default_like_timm(name):
    """timm builds davit_*_fl with its default tag's (msft_florence2) num_classes=0; a num_classes given still wins."""
    with torch.device("meta"):
        model = create_model(name)
        assert model.num_classes == 0 and model_config(name).num_classes == 0
        keys = model.state_dict()
        assert not any(k.startswith("head.fc.") for k in keys) and "head.norm.weight" in keys
        y = model(torch.empty(1, 3, 64, 64))
        assert y.shape == (1, model.num_features)
        assert create_model(name, num_classes=7).num_classes == 7
        assert create_model("davit_base").num_classes == 1000  # the ImageNet presets keep their classifier


def test_block_pos_mlp_layer_runs_between_the_branches():
    torch.manual_seed(0)
    blk = Block(16, 2, attn_layer="channel", pos_layer=PosConv, pos_mlp_layer=PosConv)
    add_noise(blk, 0.1)
    x = torch.randn(2, 5, 6, 16)
    with torch.no_grad():
        y = blk.pos(x)
        y = y + blk.attn(blk.norm1(y).reshape(2, 30, 16)).view(2, 5, 6, 16)
        y = blk.pos2(y)
        ref = y + blk.mlp(blk.norm2(y))
        torch.testing.assert_close(blk.eval()(x), ref, atol=1e-5, rtol=1e-5)  # fused inference path
        torch.testing.assert_close(blk.train()(x), ref, atol=1e-5, rtol=1e-5)  # plain path
    assert "pos2.proj.weight" in blk.state_dict()
    assert Block(16, 2).pos2 is None  # default unchanged: no second position layer
    with pytest.raises(ValueError, match="pos_mlp_layer"):
        Block(16, 2, style="parallel", pos_mlp_layer=PosConv)


@pytest.mark.parametrize("size", [(58, 50), (32, 32), (17, 23)])
def test_any_input_size_and_feature_maps(size):
    m = create_model("davit_tiny", **SMALL).eval()
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        logits = m(x)
        final, maps = m.forward_intermediates(x)
    assert logits.shape == (2, 5) and bool(torch.isfinite(logits).all())
    h4, w4 = -(-size[0] // 4), -(-size[1] // 4)
    assert maps[0].shape == (2, 16, h4, w4) and maps[1].shape == (2, 32, -(-h4 // 2), -(-w4 // 2))
    assert [f["reduction"] for f in m.feature_info] == [4, 8] and [f["num_chs"] for f in m.feature_info] == [16, 32]
    torch.testing.assert_close(final.permute(0, 3, 1, 2), maps[-1])


def test_features_only_and_head():
    m = create_model("davit_tiny", features_only=True, **SMALL).eval()
    with torch.no_grad():
        maps = m(torch.randn(1, 3, 64, 64))
    assert [t.shape[1:] for t in maps] == [(16, 16, 16), (32, 8, 8)]
    full = create_model("davit_tiny", **SMALL).eval()
    feats = full.forward_features(torch.randn(2, 3, 64, 64))
    assert full.forward_head(feats, pre_logits=True).shape == (2, 32)
    full.reset_classifier(0)
    assert full(torch.randn(1, 3, 64, 64)).shape == (1, 32) and isinstance(full.head.fc, nn.Identity)


def test_grad_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    m = create_model("davit_tiny", **SMALL).train()
    x = torch.randn(2, 3, 40, 36)
    grads = []
    for ckpt in (False, True):
        m.zero_grad()
        m.set_grad_checkpointing(ckpt)
        m(x).sum().backward()
        grads.append(m.stem.conv.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
    assert all(s.grad_checkpointing for s in m.stages)


def test_other_mechanisms_plug_in_and_bad_configs_raise():
    m = create_model("davit_tiny", spatial_attn_layer="window", spatial_attn_kwargs=dict(window_size=4), **SMALL)
    assert m.stages[0].blocks[0][0].attn.attention_name == "window" and m(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    with pytest.raises(ValueError, match="spatial mechanism"):
        create_model("davit_tiny", spatial_attn_layer="channel", **SMALL)
    with pytest.raises(ValueError, match="num_heads"):
        create_model("davit_tiny", depths=(1, 1), embed_dims=(16, 30), num_heads=(2, 4))
    with pytest.raises(ValueError, match="channel_form"):
        create_model("davit_tiny", channel_form="v3", **SMALL)
    with pytest.raises(ValueError, match="down_kernel_size"):
        create_model("davit_tiny", down_kernel_size=4, **SMALL)
