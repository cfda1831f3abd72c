"""DINOv3 (models/dinov3.py): presets, structure, parity with timm (committed fixtures) and HF (live)."""

import pytest
import torch
from fixture_utils import add_noise, assert_fixture_parity, assert_parity, load_fixture

from vit_attention import create_model
from vit_attention.attention.rope import RotaryEmbedding
from vit_attention.layers import LayerScale
from vit_attention.layers.mlp import Mlp, SwiGLU
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.dinov3 import DINOv3
from vit_attention.weights import load_weights

SIZES = ["small", "small_plus", "base", "large", "huge_plus"]
NAMES = [f"vit_{s}_patch16_dinov3{q}" for s in SIZES for q in ("", "_qkvb")]
SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)


def test_registered_names_and_presets():
    assert set(list_models("*dinov3*")) == set(NAMES)
    for name in NAMES:
        e = get_model_entry(name)
        p = e.preset
        assert e.family == "dinov3" and p["reg_tokens"] == 4 and p["pos_embed"] == "none"
        assert p["rope"] == "axial" and p["rope_kwargs"] == {"convention": "dinov3"}
        assert p["qkv_bias"] == ("qv" if name.endswith("_qkvb") else False)
        assert (p["norm_eps"], p["init_values"], p["img_size"], p["num_classes"]) == (1e-5, 1e-5, 256, 0)
        assert p.get("mlp_layer", "mlp") == ("swiglu" if "plus" in name else "mlp")
        assert e.meta["published_params_m"] > 0 and e.meta["published_gmacs"] > 0


def test_structure_on_meta():
    with torch.device("meta"):
        m = create_model("vit_small_plus_patch16_dinov3_qkvb")
    assert isinstance(m, DINOv3) and m.num_prefix_tokens == 5 and m.pos_embed is None
    assert m.reg_token.shape == (1, 4, 384) and m.cls_token.shape == (1, 1, 384)
    b = m.blocks[0]
    assert isinstance(b.attn.rope, RotaryEmbedding) and b.attn.rope.convention == "dinov3"
    assert b.attn.rope.layout == "half" and isinstance(b.ls1, LayerScale) and b.norm1.eps == 1e-5
    assert isinstance(b.mlp, SwiGLU) and b.mlp.fc1_g.out_features == 1536 and isinstance(b.mlp.norm, torch.nn.Identity)
    assert b.attn.q_bias.shape == (384,) and b.attn.qkv.bias is None
    assert isinstance(m.norm, torch.nn.LayerNorm) and isinstance(m.fc_norm, torch.nn.Identity)
    assert isinstance(m.head, torch.nn.Identity) and m.global_pool == "avg"
    with torch.device("meta"):
        base = create_model("vit_base_patch16_dinov3")
    assert isinstance(base.blocks[0].mlp, Mlp) and base.blocks[0].attn.q_bias is None
    assert base.blocks[0].mlp.fc1.out_features == 3072 and base.blocks[0].attn.rope.head_dim == 64


def _small(name: str = "vit_small_patch16_dinov3", **kw) -> DINOv3:
    torch.manual_seed(0)
    m = create_model(name, **{**SMALL, **kw}).eval()
    add_noise(m, 0.1)
    return m


def test_any_size_and_pools():
    m = _small(num_classes=7)
    with torch.no_grad():
        for hw in ((32, 32), (24, 40), (56, 16)):
            feats = m.forward_features(torch.randn(2, 3, *hw))
            assert feats.shape == (2, 5 + hw[0] // 8 * hw[1] // 8, 32)
        torch.testing.assert_close(m.forward_head(feats, pre_logits=True), feats[:, 5:].mean(1))  # registers out
        m.reset_classifier(0, "token")
        torch.testing.assert_close(m.forward_head(feats), feats[:, 0])


def test_rope_replaces_position_embeddings():
    """Permuting the patches changes the output (RoPE sees positions); the prefix tokens are not rotated."""
    m = _small()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        a = m.forward_features(x)
        swapped = torch.cat([x[..., 8:], x[..., :8]], dim=-1)  # roll one patch column
        b = m.forward_features(swapped)
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-4


@pytest.mark.registry
@pytest.mark.parity
@pytest.mark.parametrize("case,name", [("timm_dinov3", "vit_small_patch16_dinov3"),
                                       ("timm_dinov3_qkvb_swiglu", "vit_small_plus_patch16_dinov3_qkvb")])
def test_timm_parity(case, name):
    state, t, cfg = load_fixture(case)
    assert any(k.endswith("gamma_1") for k in state)  # timm's Eva layout
    m = create_model(name, **SMALL, num_classes=cfg["num_classes"]).eval()
    report = load_weights(m, state)
    assert report.ok and report.layout == "timm", report
    assert_fixture_parity(m, t)
    assert_fixture_parity(m, t, "_nonsquare", outputs=("output",))  # 3x5 grid


@pytest.mark.parity
def test_timm_parity_needs_the_half_rotation():
    """The same weights with the interleaved layout (timm PR #2692's bug) are far from the reference."""
    state, t, cfg = load_fixture("timm_dinov3")
    m = create_model("vit_small_patch16_dinov3", **SMALL, num_classes=10,
                     rope_kwargs={"convention": "dinov3", "layout": "interleaved"}).eval()
    load_weights(m, state)
    with torch.no_grad():
        assert (m(t["input"]) - t["output"]).abs().max() > 1e-2 * t["output"].abs().max()


# ------------------------------------------------------------------ Hugging Face DINOv3ViTModel, live
def _hf(gated: bool = False, **kw):
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    cfg = DINOv3ViTConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=2, intermediate_size=64 if gated
                          else 128, patch_size=8, image_size=32, num_register_tokens=4, layerscale_value=0.1,
                          use_gated_mlp=gated, hidden_act="silu" if gated else "gelu", **kw)
    torch.manual_seed(0)
    hf = DINOv3ViTModel(cfg)
    add_noise(hf, 0.1)
    return hf.eval()  # eval: train mode randomises the RoPE coordinates (pos_embed_rescale=2)


@pytest.mark.parity
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("hub_file", [False, True])
def test_hf_parity(gated, hub_file):
    hf = _hf(gated)
    state = hf.state_dict()
    assert any(k.startswith("model.layer.") for k in state)  # transformers 5 in-memory names
    if hub_file:  # the names in the hub's safetensors files
        state = {k.removeprefix("model."): v for k, v in state.items()}
    name = "vit_small_plus_patch16_dinov3_qkvb" if gated else "vit_small_patch16_dinov3_qkvb"
    extra = dict(mlp_ratio=2.0) if gated else {}
    m = create_model(name, **SMALL, global_pool="token", **extra).eval()
    report = load_weights(m, state)
    assert report.ok and report.layout == "huggingface", report
    for hw in ((32, 32), (24, 40)):
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            out = hf(pixel_values=x)
            feats = m.forward_features(x)
        assert_parity(feats, out.last_hidden_state)
        assert_parity(m.forward_head(feats), out.pooler_output)


@pytest.mark.parity
def test_hf_zero_biases_load_into_the_bias_free_preset():
    """HF files carry q / v biases for every size; all-zero ones (distilled B / L / H+) drop with a note,
    non-zero ones fail a strict load (use the _qkvb preset)."""
    hf = _hf()
    with torch.no_grad():
        for layer in hf.model.layer:
            layer.attention.q_proj.bias.zero_()
            layer.attention.v_proj.bias.zero_()
    m = create_model("vit_small_patch16_dinov3", **SMALL, global_pool="token").eval()
    report = load_weights(m, hf.state_dict())
    assert report.ok and any("all-zero q / v biases dropped" in n for n in report.notes)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert_parity(m.forward_features(x), hf(pixel_values=x).last_hidden_state)
    report = load_weights(create_model("vit_small_patch16_dinov3", **SMALL), _hf().state_dict(), strict=False)
    assert "blocks.0.attn.q_bias" in report.unexpected


@pytest.mark.parity
def test_hf_config_reader():
    from vit_attention.weights.hub import hf_config_overrides

    cfg = _hf(True).config.to_dict()
    over = hf_config_overrides(cfg)
    assert over["mlp_layer"] == "swiglu" and over["act"] == "silu" and over["mlp_ratio"] == 2.0
    assert (over["reg_tokens"], over["qkv_bias"], over["norm_eps"], over["init_values"]) == (4, "qv", 1e-5, 0.1)
    assert over["rope"] == "axial" and over["rope_kwargs"] == {"convention": "dinov3"} and over["pos_embed"] == "none"
    m = DINOv3(**{**over, "img_size": 32, "num_classes": 0, "global_pool": "token"}).eval()
    assert load_weights(m, _hf(True).state_dict()).ok
