"""CLIP image towers (models/clip.py, weights/clip.py): presets, parity with timm (committed fixtures), with
Hugging Face ``CLIPVisionModel(WithProjection)`` / ``CLIPModel`` live, and the OpenAI layout."""

from __future__ import annotations

import tempfile

import pytest
import torch
from fixture_utils import assert_parity, check_wide_fixture, load_fixture, meta_model_with_timm_params
from hf_utils import load_from_hf, perturb_fan_in
from transformers import CLIPConfig, CLIPModel, CLIPVisionConfig, CLIPVisionModel, CLIPVisionModelWithProjection

from vit_attention import create_model
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.clip import CLIP
from vit_attention.models.vit import VisionTransformerConfig
from vit_attention.weights import load_weights
from vit_attention.weights.hub import hf_config_overrides

NAMES = [f"vit_{s}_clip{q}_224" for s in ("base_patch16", "base_patch32", "large_patch14") for q in ("", "_quickgelu")]
NAMES += ["vit_huge_patch14_clip_224"]


def _ours_from_timm(cfg: dict, **extra) -> CLIP:
    assert cfg["norm_layer"] == "LayerNormEps1e-5"
    kw = {k: v for k, v in cfg.items() if k not in ("act_layer", "norm_layer")}
    kw.update(act=cfg.get("act_layer", "gelu"), norm_eps=1e-5)
    return CLIP(VisionTransformerConfig(**{**kw, **extra})).eval()


# ---------------------------------------------------------------- presets
def test_registered_presets():
    assert {n for n in list_models("*clip*") if get_model_entry(n).family == "clip"} == set(NAMES)  # not EVA-CLIP
    for name in NAMES:
        p = get_model_entry(name).preset
        assert p["pre_norm"] is True and p["norm_eps"] == 1e-5
        assert p["act"] == ("quick_gelu" if "quickgelu" in name else "gelu")
        assert p["num_classes"] == (1000 if "quickgelu" not in name else 768 if "large" in name else 512)


@pytest.mark.registry
@pytest.mark.parametrize("name", ["vit_large_patch14_clip_quickgelu_224", "vit_base_patch32_clip_224"])
def test_structure_on_meta_equals_timm_counts(name):
    m = meta_model_with_timm_params(name)
    assert m.patch_embed.proj.bias is None and isinstance(m.norm_pre, torch.nn.LayerNorm) and m.norm_pre.eps == 1e-5
    grid = 16 if "patch14" in name else 7
    assert m.pos_embed.shape == (1, 1 + grid * grid, m.embed_dim) and m.num_prefix_tokens == 1


def test_huge_on_meta_equals_timm():
    """``vit_huge_patch14_clip_224``: timm 1.0.31 on the meta device, 632,047,080 parameters (1000 classes)."""
    m = meta_model_with_timm_params("vit_huge_patch14_clip_224", 632_047_080)
    assert m.embed_dim == 1280 and len(m.blocks) == 32 and m.pos_embed.shape == (1, 1 + 16 * 16, 1280)


# ---------------------------------------------------------------- timm (fixtures)
@pytest.mark.parity
@pytest.mark.parametrize("fixture", ["timm_clip", "timm_clip_quickgelu"])
def test_timm_parity(fixture):
    _, state, t, cfg = check_wide_fixture(fixture, _ours_from_timm)
    assert "patch_embed.proj.bias" not in state and "norm_pre.weight" in state
    with torch.no_grad():
        other = _ours_from_timm(cfg, act="gelu" if cfg.get("act_layer") == "quick_gelu" else "quick_gelu")
        load_weights(other, state)
        assert (other(t["input"]) - t["output"]).abs().max() > 1e-3  # the activation flavour matters


def _to_openai(state: dict, prefix: str) -> dict:
    """timm keys -> OpenAI CLIP visual keys (``proj`` is the transposed head, its bias dropped)."""
    out = {}
    for k, v in state.items():
        if k == "head.bias":
            continue
        if k == "head.weight":
            out[prefix + "proj"] = v.t().contiguous()
            continue
        if k == "cls_token":
            out[prefix + "class_embedding"] = v.reshape(-1)
            continue
        if k == "pos_embed":
            out[prefix + "positional_embedding"] = v[0]
            continue
        for a, b in (("patch_embed.proj.", "conv1."), ("norm_pre.", "ln_pre."), ("blocks.", "transformer.resblocks."),
                     (".norm1.", ".ln_1."), (".norm2.", ".ln_2."), (".attn.qkv.", ".attn.in_proj_"),
                     (".attn.proj.", ".attn.out_proj."), (".mlp.fc1.", ".mlp.c_fc."), (".mlp.fc2.", ".mlp.c_proj.")):
            k = k.replace(a, b)
        k = "ln_post." + k[len("norm."):] if k.startswith("norm.") else k
        out[prefix + k] = v
    return out


@pytest.mark.parity
@pytest.mark.parametrize("prefix", ["visual.", ""])
def test_openai_layout(prefix):
    state, t, cfg = load_fixture("timm_clip_quickgelu")
    state = dict(state, **{"head.bias": torch.zeros_like(state["head.bias"])})  # raw CLIP: a bias-free projection
    original = _to_openai(state, prefix)
    if prefix:  # a full two-tower file: the text transformer shares the resblocks names at the top level
        original.update({"transformer.resblocks.0.ln_1.weight": torch.ones(8),
                         "token_embedding.weight": torch.ones(4, 8), "text_projection": torch.ones(8, 24),
                         "logit_scale": torch.tensor(4.6)})
    assert "conv1.weight" in {k.removeprefix("visual.") for k in original}
    model = _ours_from_timm(cfg)
    report = load_weights(model, original)
    assert report.ok and report.layout == "openai", report
    with torch.no_grad():
        model.load_state_dict(state)  # the same function as the timm weights with a zero bias
        ref = model(t["input"])
        load_weights(model, original)
        assert_parity(model.forward_features(t["input"]), t["features"])
        assert_parity(model(t["input"]), ref)


# ---------------------------------------------------------------- Hugging Face, live
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=48,
               patch_size=16, projection_dim=24)


def _ours_from_hf(config: dict) -> CLIP:
    over = hf_config_overrides(config, VisionTransformerConfig)
    assert over["act"] == "quick_gelu" and over["pre_norm"] is True and over["norm_eps"] == 1e-5
    return CLIP(VisionTransformerConfig(**over)).eval()


@pytest.mark.parity
@pytest.mark.parametrize("names", ["file", "memory"])
def test_huggingface_with_projection_parity(names):
    torch.manual_seed(0)
    hf = perturb_fan_in(CLIPVisionModelWithProjection(CLIPVisionConfig(**_VISION)))
    config = dict(hf.config.to_dict(), architectures=["CLIPVisionModelWithProjection"])
    ours = _ours_from_hf(config)
    assert ours.num_classes == 24
    load_from_hf(ours, hf, names)
    assert torch.equal(ours.head.bias, torch.zeros(24))
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(pixel_values=x, output_hidden_states=True)
        inner = hf.vision_model(pixel_values=x)
        feats = ours.forward_features(x)
        # HF's last_hidden_state is not post-normed: ours = post_layernorm(theirs)
        assert_parity(feats, hf.vision_model.post_layernorm(inner.last_hidden_state))
        assert (feats - inner.last_hidden_state).abs().max() > 1e-2
        assert_parity(ours.forward_head(feats, pre_logits=True), inner.pooler_output)
        assert_parity(ours(x), ref.image_embeds)


@pytest.mark.parity
def test_huggingface_vision_model_without_projection():
    torch.manual_seed(0)
    hf = perturb_fan_in(CLIPVisionModel(CLIPVisionConfig(**_VISION)))
    ours = _ours_from_hf(dict(hf.config.to_dict(), architectures=["CLIPVisionModel"]))
    assert ours.num_classes == 0
    report = load_weights(ours, hf.state_dict())
    assert report.ok, report
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_parity(ours(x), hf(pixel_values=x).pooler_output)


@pytest.mark.parity
def test_huggingface_two_tower_file():
    torch.manual_seed(0)
    cfg = CLIPConfig(vision_config=_VISION, projection_dim=24,
                     text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      vocab_size=64, max_position_embeddings=8))
    hf = perturb_fan_in(CLIPModel(cfg))
    ours = _ours_from_hf(cfg.to_dict())
    report = load_weights(ours, hf.state_dict())
    assert report.ok and report.layout == "huggingface", report
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.visual_projection(hf.vision_model(pixel_values=x).pooler_output)
        assert_parity(ours(x), ref)


@pytest.mark.parity
def test_create_model_from_a_transformers_folder():
    """``create_model(preset, pretrained=folder)``: a tower with its projection gets the projection as its head
    (``num_classes`` = the folder's ``projection_dim``, 24 here) without being told."""
    torch.manual_seed(0)
    hf = perturb_fan_in(CLIPVisionModelWithProjection(CLIPVisionConfig(**_VISION)))
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(3))
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        with pytest.warns(UserWarning, match="another architecture"):  # a tiny folder
            m = create_model("vit_base_patch16_clip_quickgelu_224", pretrained=d).eval()
    assert m.cfg.act == "quick_gelu" and m.embed_dim == 32 and m.num_classes == 24
    with torch.no_grad():
        assert_parity(m(x), hf(pixel_values=x).image_embeds)
