"""EVA-02 (models/eva02.py): presets, structure, parity with timm's Eva (committed fixtures)."""

import pytest
import torch
from fixture_utils import assert_fixture_parity, load_fixture, meta_model_with_timm_params

from vit_attention import create_model
from vit_attention.attention.rope import RotaryEmbedding
from vit_attention.layers.mlp import GluMlp, SwiGLU
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.eva02 import Eva02
from vit_attention.weights import load_weights

NAMES = [f"eva02_{s}_patch14_224" for s in ("tiny", "small", "base", "large")]
FT = ["eva02_tiny_patch14_336", "eva02_small_patch14_336", "eva02_base_patch14_448", "eva02_large_patch14_448"]
CLIP = ["eva02_base_patch16_clip_224", "eva02_large_patch14_clip_224", "eva02_large_patch14_clip_336"]
# timm 1.0.31 on the meta device: exact parameter counts (heads included)
TIMM_PARAMS = {"eva02_tiny_patch14_336": 5_756_584, "eva02_small_patch14_336": 22_129_000,
               "eva02_base_patch14_448": 87_117_544, "eva02_large_patch14_448": 305_080_232,
               "eva02_base_patch16_clip_224": 86_263_040, "eva02_large_patch14_clip_224": 304_105_152,
               "eva02_large_patch14_clip_336": 304_432_832}
# the fixtures' reduced timm Eva: patch 8 on 32 px, RoPE reference grid 6x6, dynamic size for the 24x40 input
SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10, dynamic_img_size=True,
             rope_kwargs={"convention": "eva", "ref_feat_shape": (6, 6)})
CASES = [("timm_eva02_ts", "eva02_tiny_patch14_224"), ("timm_eva02_bl", "eva02_base_patch14_224"),
         ("timm_eva02_clip", "eva02_base_patch16_clip_224")]


def test_registered_names_and_presets():
    assert set(list_models("eva02*")) == set(NAMES + FT + CLIP)
    for name in NAMES:
        e = get_model_entry(name)
        p = e.preset
        assert e.family == "eva02" and p["qkv_bias"] == "qv" and p["act"] == "silu" and p["num_classes"] == 0
        assert p["rope_kwargs"] == {"convention": "eva", "ref_feat_shape": [16, 16]} and p["global_pool"] == "avg"
        assert e.meta["published_params_m"] > 0 and e.meta["published_gmacs"] > 0


@pytest.mark.registry
@pytest.mark.parametrize("name,hidden", [("eva02_tiny_patch14_224", 512), ("eva02_small_patch14_224", 1024),
                                         ("eva02_base_patch14_224", 2048), ("eva02_large_patch14_224", 2730)])
def test_structure_on_meta(name, hidden):
    with torch.device("meta"):
        m = create_model(name)
    C = m.embed_dim
    assert isinstance(m, Eva02) and m.pos_embed.shape == (1, 1 + 16 * 16, C) and m.num_prefix_tokens == 1
    b = m.blocks[0]
    assert isinstance(b.attn.rope, RotaryEmbedding) and b.attn.rope.convention == "eva"
    assert b.attn.rope.ref_feat_shape == (16, 16) and b.attn.rope.layout == "interleaved"
    assert b.attn.q_bias.shape == (C,) and b.attn.qkv.bias is None and b.norm1.eps == 1e-6
    assert not hasattr(b, "ls1") or isinstance(b.ls1, torch.nn.Identity)
    if "tiny" in name or "small" in name:
        assert isinstance(b.mlp, GluMlp) and b.mlp.fc1.out_features == 2 * hidden and b.mlp.fc2.in_features == hidden
    else:
        assert isinstance(b.mlp, SwiGLU) and b.mlp.fc1_g.out_features == hidden
        assert isinstance(b.mlp.norm, torch.nn.LayerNorm) and b.mlp.norm.normalized_shape == (hidden,)
    assert isinstance(m.norm, torch.nn.Identity) and isinstance(m.fc_norm, torch.nn.LayerNorm)
    assert isinstance(m.head, torch.nn.Identity)


@pytest.mark.registry
@pytest.mark.parity
@pytest.mark.parametrize("case,name", CASES)
def test_timm_parity(case, name):
    state, t, cfg = load_fixture(case)
    assert cfg["ref_feat_shape"] == [6, 6] and cfg["img_size"] == 32
    m = create_model(name, **SMALL).eval()
    report = load_weights(m, state)
    assert report.ok, report
    assert report.layout == ("timm" if "q_proj" in str(list(state)) else "vit_attention")  # Ti / S: our own keys
    assert_fixture_parity(m, t)
    assert_fixture_parity(m, t, "_nonsquare", outputs=("output",))  # pos_embed resampled, RoPE grid rescaled


@pytest.mark.parity
@pytest.mark.parametrize("wrong", [{"convention": "eva", "ref_feat_shape": (4, 4)},  # no rescale
                                   {"convention": "naver"}])
def test_parity_needs_eva_rope(wrong):
    state, t, _ = load_fixture("timm_eva02_ts")
    m = create_model("eva02_tiny_patch14_224", **{**SMALL, "rope_kwargs": wrong}).eval()
    load_weights(m, state)
    with torch.no_grad():
        assert (m(t["input"]) - t["output"]).abs().max() > 1e-3 * t["output"].abs().max()


def test_other_sizes_rescale_the_rope_grid():
    torch.manual_seed(0)
    m = create_model("eva02_tiny_patch14_224", img_size=42, embed_dim=32, depth=1, num_heads=2,
                     dynamic_img_size=True).eval()
    with torch.no_grad():
        assert m.forward_features(torch.randn(1, 3, 28, 56)).shape == (1, 1 + 2 * 4, 32)
    cos, _ = m.blocks[0].attn.rope.tables((8, 8))
    cos16, _ = m.blocks[0].attn.rope.tables((16, 16))
    torch.testing.assert_close(cos[1], cos16[2])  # column 1 of 8 sits where column 2 of 16 does


@pytest.mark.registry
@pytest.mark.parametrize("name", FT + CLIP)
def test_new_presets_on_meta_equal_timm(name):
    """Fine-tuned classifiers (336 / 448, mean pool + fc_norm, 1000 classes) and EVA-CLIP towers (class token,
    final norm, inner attention norm, CLIP projection head): parameter counts equal timm's exactly."""
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name])
    b = m.blocks[0]
    assert b.attn.rope.ref_feat_shape == (16, 16)
    if name in CLIP:
        assert m.global_pool == "token" and isinstance(m.norm, torch.nn.LayerNorm)
        assert isinstance(m.fc_norm, torch.nn.Identity)
        assert isinstance(b.attn.norm, torch.nn.LayerNorm) and b.attn.norm.normalized_shape == (m.embed_dim,)
        assert b.attn.norm.eps == 1e-6 and m.num_classes == (512 if "base" in name else 768)
    else:
        assert m.global_pool == "avg" and isinstance(m.fc_norm, torch.nn.LayerNorm) and m.num_classes == 1000
        assert isinstance(b.attn.norm, torch.nn.Identity)
    side = int(name.rsplit("_", 1)[1]) // m.patch_embed.patch_size[0]
    assert m.pos_embed.shape[1] == 1 + side * side


@pytest.mark.parity
def test_inner_attn_norm_matters():
    """The CLIP fixture needs the inner norm: without it (its weights dropped) the output moves."""
    state, t, _ = load_fixture("timm_eva02_clip")
    m = create_model("eva02_base_patch16_clip_224", **dict(SMALL, attn_norm=False)).eval()
    load_weights(m, {k: v for k, v in state.items() if ".attn.norm." not in k})
    with torch.no_grad():
        assert (m(t["input"]) - t["output"]).abs().max() > 1e-3 * t["output"].abs().max()


def test_attn_norm_needs_mhsa():
    from vit_attention.models.vit import VisionTransformerConfig

    with pytest.raises(ValueError, match="attn_norm"):
        VisionTransformerConfig(attn_norm=True, attn_layer="talking_heads")
