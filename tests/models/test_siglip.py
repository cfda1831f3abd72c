"""SigLIP (models/siglip.py, weights/siglip.py): presets, parity with timm (committed fixtures) and with
Hugging Face ``SiglipVisionModel`` / ``SiglipModel`` live."""

from __future__ import annotations

import tempfile

import pytest
import torch
from fixture_utils import assert_parity, check_wide_fixture, meta_model_with_timm_params
from hf_utils import load_from_hf, perturb_fan_in
from transformers import SiglipConfig, SiglipModel, SiglipVisionConfig, SiglipVisionModel

from vit_attention import create_model
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.siglip import SigLIP
from vit_attention.models.vit import VisionTransformerConfig
from vit_attention.weights import load_weights
from vit_attention.weights.hub import hf_config_overrides

NAMES = ["vit_base_patch16_siglip_224", "vit_base_patch16_siglip_256", "vit_base_patch16_siglip_384",
         "vit_base_patch16_siglip_512", "vit_base_patch16_siglip_gap_224", "vit_so400m_patch14_siglip_224",
         "vit_so400m_patch14_siglip_384", "vit_base_patch32_siglip_256", "vit_large_patch16_siglip_256",
         "vit_large_patch16_siglip_384"]
# timm 1.0.31 on the meta device, exact (num_classes=0)
TIMM_PARAMS = {"vit_base_patch32_siglip_256": 94_552_320, "vit_large_patch16_siglip_256": 315_956_224,
               "vit_large_patch16_siglip_384": 316_283_904}


def _ours_from_timm(cfg: dict, **extra) -> SigLIP:
    kw = {k: v for k, v in cfg.items() if k != "act_layer"}
    if "act_layer" in cfg:
        kw["act"] = cfg["act_layer"]
    else:
        kw["act"] = "gelu"
    return SigLIP(VisionTransformerConfig(**{**kw, **extra})).eval()


# ---------------------------------------------------------------- presets
def test_registered_presets():
    assert set(list_models("*siglip*", family="siglip")) == set(NAMES)  # naflexvit_*_siglip: the NaFlex family
    for name in NAMES:
        p = get_model_entry(name).preset
        act = "gelu_tanh" if name == "vit_base_patch32_siglip_256" else "gelu"  # timm: exact GELU but for B/32
        assert p["class_token"] is False and p["num_classes"] == 0 and p["act"] == act
        assert p["global_pool"] == ("avg" if "_gap_" in name else "map")


@pytest.mark.registry
@pytest.mark.parametrize("name", ["vit_so400m_patch14_siglip_384", "vit_base_patch16_siglip_224"])
def test_structure_on_meta_equals_timm_counts(name):
    m = meta_model_with_timm_params(name)
    C = m.embed_dim
    grid = 27 if "so400m" in name else 14
    assert m.cls_token is None and m.num_prefix_tokens == 0 and m.pos_embed.shape == (1, grid * grid, C)
    assert m.attn_pool.latent.shape == (1, 1, C) and m.attn_pool.kv.weight.shape == (2 * C, C)
    assert m.attn_pool.mlp.fc1.weight.shape[0] == m.blocks[0].mlp.fc1.weight.shape[0] == (4304 if grid == 27 else 3072)


def test_so400m_384_ignores_the_pixels_past_the_last_patch():
    """384 px at patch 14: 27 patches cover 378 px; like the stride-14 conv of timm / HF, the rest is ignored."""
    m = create_model("vit_so400m_patch14_siglip_384", embed_dim=32, num_heads=2, depth=1, mlp_ratio=2.0).eval()
    x = torch.randn(1, 3, 384, 384)
    y = x.clone()
    y[..., 378:, :] = 5.0
    y[..., :, 378:] = -5.0
    with torch.no_grad():
        torch.testing.assert_close(m(x), m(y), rtol=0, atol=0)
        assert m.forward_features(x).shape == (1, 27 * 27, 32)


# ---------------------------------------------------------------- timm (fixtures)
@pytest.mark.parity
@pytest.mark.parametrize("fixture", ["timm_siglip", "timm_siglip_gap"])
def test_timm_parity(fixture):
    _, state, t, cfg = check_wide_fixture(fixture, _ours_from_timm, wide=("features", "pre_logits"))
    with torch.no_grad():  # the activation matters: the other GELU flavour moves the embedding
        other = _ours_from_timm(cfg, act="gelu" if cfg.get("act_layer") == "gelu_tanh" else "gelu_tanh")
        load_weights(other, state)
        assert (other.forward_head(other.forward_features(t["input"]), pre_logits=True)
                - t["pre_logits"]).abs().max() > 1e-6


# ---------------------------------------------------------------- Hugging Face, live
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=48,
               patch_size=16)


def _ours_from_hf(config: dict) -> SigLIP:
    over = hf_config_overrides(config, VisionTransformerConfig)
    assert over["act"] == "gelu_tanh" and over["global_pool"] == "map" and over["class_token"] is False
    return SigLIP(VisionTransformerConfig(**over)).eval()


@pytest.mark.parity
@pytest.mark.parametrize("names", ["file", "memory"])
def test_huggingface_vision_model_parity(names):
    torch.manual_seed(0)
    hf = perturb_fan_in(SiglipVisionModel(SiglipVisionConfig(**_VISION)), ("embedding", "probe"))
    ours = _ours_from_hf(hf.config.to_dict())
    load_from_hf(ours, hf, names)
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(pixel_values=x)
        feats = ours.forward_features(x)
        assert_parity(feats, ref.last_hidden_state)  # post_layernorm applied in both
        assert_parity(ours.forward_head(feats, pre_logits=True), ref.pooler_output)  # MAP
        # timm's exact GELU on HF (tanh) weights: close but not equal (MODERN C.2)
        exact = SigLIP(VisionTransformerConfig(**{**ours.cfg.to_dict(), "act": "gelu"})).eval()
        load_weights(exact, hf.state_dict())
        assert 1e-7 < (exact.forward_head(exact.forward_features(x), pre_logits=True)
                       - ref.pooler_output).abs().max() < 1e-2


@pytest.mark.parity
def test_huggingface_two_tower_file():
    """A ``SiglipModel`` state dict (``vision_model.`` prefix, text tower, logit scale / bias): the image tower."""
    torch.manual_seed(0)
    cfg = SiglipConfig(vision_config=_VISION, text_config=dict(hidden_size=32, intermediate_size=64,
                                                              num_hidden_layers=1, num_attention_heads=2,
                                                              vocab_size=64, max_position_embeddings=8))
    hf = perturb_fan_in(SiglipModel(cfg), ("embedding", "probe"))
    state = hf.state_dict()
    assert any(k.startswith("text_model.") for k in state) and any(k.startswith("vision_model.") for k in state)
    ours = _ours_from_hf(cfg.to_dict())
    report = load_weights(ours, state)
    assert report.ok and report.layout == "huggingface", report
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.vision_model(pixel_values=x)
        assert_parity(ours.forward_head(ours.forward_features(x), pre_logits=True), ref.pooler_output)


@pytest.mark.parity
def test_huggingface_resamples_otherwise():
    """HF resizes the table only with ``interpolate_pos_encoding=True``, bicubic without antialias: not timm's,
    but ``pos_embed_resize="bicubic"`` (MODERN A.2)."""
    torch.manual_seed(0)
    hf = perturb_fan_in(SiglipVisionModel(SiglipVisionConfig(**_VISION)), ("embedding", "probe"))
    base = _ours_from_hf(hf.config.to_dict()).cfg.to_dict()
    ours = SigLIP(VisionTransformerConfig(**{**base, "dynamic_img_size": True})).eval()
    load_weights(ours, hf.state_dict())
    hf_rule = SigLIP(VisionTransformerConfig(**{**base, "dynamic_img_size": True, "pos_embed_resize": "bicubic"}))
    load_weights(hf_rule.eval(), hf.state_dict())
    xw = torch.randn(2, 3, 48, 80, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(pixel_values=xw, interpolate_pos_encoding=True).last_hidden_state
        diff = ours.forward_features(xw) - ref
        assert_parity(hf_rule.forward_features(xw), ref)
    assert diff.abs().max() > 1e-4


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_new_presets_on_meta_equal_timm(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name])
    side = int(name.rsplit("_", 1)[1]) // m.patch_embed.patch_size[0]
    assert m.cls_token is None and m.pos_embed.shape == (1, side * side, m.embed_dim) and m.global_pool == "map"


@pytest.mark.parity
def test_create_model_from_a_transformers_folder():
    """``create_model(preset, pretrained=folder)``: config.json sets the tanh GELU and the sizes."""
    torch.manual_seed(0)
    hf = perturb_fan_in(SiglipVisionModel(SiglipVisionConfig(**_VISION)), ("embedding", "probe"))
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(3))
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        with pytest.warns(UserWarning, match="another architecture"):  # a tiny folder
            m = create_model("vit_base_patch16_siglip_224", pretrained=d).eval()
    assert m.cfg.act == "gelu_tanh" and m.embed_dim == 32
    with torch.no_grad():
        assert_parity(m(x), hf(pixel_values=x).pooler_output)
