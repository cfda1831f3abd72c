"""DINOv2 (models/dinov2.py, weights/dinov2.py): presets, parity with timm (committed fixtures), with
Hugging Face ``Dinov2Model`` / ``Dinov2WithRegistersModel`` live, and the original facebookresearch layout."""

from __future__ import annotations

import tempfile

import pytest
import torch
from fixture_utils import assert_parity, check_wide_fixture, load_fixture, meta_model_with_timm_params
from hf_utils import perturb_fan_in
from transformers import Dinov2Config, Dinov2Model, Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from vit_attention import create_model
from vit_attention.layers import GluMlp
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.dinov2 import Dinov2
from vit_attention.models.vit import VisionTransformerConfig
from vit_attention.weights import load_weights
from vit_attention.weights.hub import hf_config_overrides

NAMES = [f"vit_{s}_patch14{r}_dinov2" for s in ("small", "base", "large", "giant") for r in ("", "_reg4")]
FIXTURES = ["timm_dinov2", "timm_dinov2_reg4", "timm_dinov2_reg4_glu"]


def _ours_from_timm(cfg: dict, **extra) -> Dinov2:
    """Our model for a timm fixture's constructor kwargs."""
    kw = {k: v for k, v in cfg.items() if k not in ("mlp_layer", "act_layer")}
    if cfg.get("mlp_layer") == "SwiGLUPacked":
        kw["mlp_layer"] = "glu"
    if "act_layer" in cfg:
        kw["act"] = cfg["act_layer"]
    return Dinov2(VisionTransformerConfig(**{**kw, **extra})).eval()


# ---------------------------------------------------------------- presets
def test_registered_presets():
    assert set(list_models("*dinov2*")) == set(NAMES)
    for name in NAMES:
        p = get_model_entry(name).preset
        assert p["img_size"] == 518 and p["patch_size"] == 14 and p["init_values"] == 1e-5 and p["num_classes"] == 0
        assert p.get("reg_tokens", 0) == (4 if "reg4" in name else 0)
        assert p.get("no_embed_class", False) == ("reg4" in name)
        assert (p.get("mlp_layer") == "glu") == ("giant" in name)


@pytest.mark.registry
@pytest.mark.parametrize("name", ["vit_giant_patch14_reg4_dinov2", "vit_small_patch14_dinov2"])
def test_structure_on_meta_equals_timm_counts(name):
    m = meta_model_with_timm_params(name)
    C = m.embed_dim
    if "reg4" in name:
        assert m.reg_token.shape == (1, 4, C) and m.pos_embed.shape == (1, 37 * 37, C) and m.num_prefix_tokens == 5
    else:
        assert m.reg_token is None and m.pos_embed.shape == (1, 1 + 37 * 37, C) and m.num_prefix_tokens == 1
    if "giant" in name:
        mlp = m.blocks[0].mlp
        assert isinstance(mlp, GluMlp) and mlp.fc1.weight.shape == (8192, 1536) and mlp.fc2.weight.shape == (1536, 4096)
        assert isinstance(mlp.act, torch.nn.SiLU)
    assert m.num_classes == 0 and m.cfg.norm_eps == 1e-6


# ---------------------------------------------------------------- timm (fixtures)
@pytest.mark.parity
@pytest.mark.parametrize("fixture", FIXTURES)
def test_timm_parity(fixture):
    # 42x70: the table resampled every forward (bicubic, antialias), non-square grid 3x5
    model, _, t, cfg = check_wide_fixture(fixture, _ours_from_timm, wide=("features", "pre_logits"))
    with torch.no_grad():
        inter = model.forward_intermediates(t["input_wide"], indices=2, output_fmt="NCHW", intermediates_only=True)
    assert len(inter) == 2
    for i, grid in enumerate(inter):
        assert grid.shape == (2, cfg["embed_dim"], 3, 5)  # patch tokens only: the registers are not in the grid
        assert_parity(grid, t[f"inter_wide.{i}"])


@pytest.mark.parity
def test_layerscale_matters():
    state, t, cfg = load_fixture("timm_dinov2_reg4")
    assert all((state[k] - 0.1).abs().max() > 0.01 for k in state if k.endswith(".gamma"))
    state = dict(state, **{"blocks.1.ls2.gamma": torch.zeros_like(state["blocks.1.ls2.gamma"])})
    model = _ours_from_timm(cfg)
    load_weights(model, state)
    with torch.no_grad():
        assert (model.forward_features(t["input"]) - t["features"]).abs().max() > 1e-3


@pytest.mark.parity
def test_registers_left_out_of_avg_pool():
    """transformers #37817: a patch mean must skip the class token and the 4 registers."""
    state, t, cfg = load_fixture("timm_dinov2_reg4")
    model = _ours_from_timm(cfg, global_pool="avg", fc_norm=False)
    load_weights(model, state)
    with torch.no_grad():
        pooled = model.forward_head(t["features"], pre_logits=True)
    torch.testing.assert_close(pooled, t["features"][:, 5:].mean(1))
    assert (pooled - t["features"][:, 1:].mean(1)).abs().max() > 1e-3  # registers would change it


@pytest.mark.parity
def test_loads_at_another_size():
    """A 3x3-grid checkpoint into a 4x5-grid model: the table resampled once at load = resampled each forward."""
    state, t, cfg = load_fixture("timm_dinov2")
    model = _ours_from_timm(cfg, img_size=(56, 70), dynamic_img_size=False)
    report = load_weights(model, state)
    assert report.ok and any("resampled from 3x3 to 4x5" in n for n in report.notes)
    dyn = _ours_from_timm(cfg)
    load_weights(dyn, state)
    x = torch.randn(2, 3, 56, 70)
    with torch.no_grad():
        torch.testing.assert_close(model(x), dyn(x), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the original facebookresearch/dinov2 layout
def _to_original(state: dict, *, reg: bool, glu: bool, chunked: bool = False) -> dict:
    """timm keys -> facebookresearch/dinov2 keys (a class slot in the table, mask_token, register_tokens, w12/w3)."""
    out = {k.replace("reg_token", "register_tokens"): v for k, v in state.items()}
    if glu:
        out = {k.replace(".mlp.fc1.", ".mlp.w12.").replace(".mlp.fc2.", ".mlp.w3."): v for k, v in out.items()}
    if chunked:  # BlockChunk: blocks.<chunk>.<global block index>.
        out = {("blocks.0." + k[len("blocks."):] if k.startswith("blocks.") else k): v for k, v in out.items()}
    if reg:  # the original table keeps a class slot that timm folded into cls_token
        slot = 0.3 * torch.randn(1, 1, out["pos_embed"].shape[-1], generator=torch.Generator().manual_seed(0))
        out["pos_embed"] = torch.cat([slot, out["pos_embed"]], dim=1)
        out["cls_token"] = out["cls_token"] - slot
    out["mask_token"] = torch.zeros(1, out["cls_token"].shape[-1])
    return out


@pytest.mark.parity
@pytest.mark.parametrize("fixture,chunked", [("timm_dinov2", False), ("timm_dinov2_reg4", False),
                                             ("timm_dinov2_reg4_glu", True)])
def test_original_layout(fixture, chunked):
    state, t, cfg = load_fixture(fixture)
    original = _to_original(state, reg="reg4" in fixture, glu=fixture.endswith("glu"), chunked=chunked)
    assert "mask_token" in original and ("register_tokens" in original) == ("reg4" in fixture)
    assert any(".w12." in k for k in original) == fixture.endswith("glu")
    model = _ours_from_timm(cfg)
    report = load_weights(model, original)
    assert report.ok and report.layout == "original", report
    with torch.no_grad():
        assert_parity(model.forward_features(t["input"]), t["features"])
        assert_parity(model.forward_features(t["input_wide"]), t["features_wide"])


# ---------------------------------------------------------------- Hugging Face, live
def _hf(reg: bool, swiglu: bool) -> torch.nn.Module:
    kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=42, patch_size=14,
              use_swiglu_ffn=swiglu)
    torch.manual_seed(0)
    model = Dinov2WithRegistersModel(Dinov2WithRegistersConfig(**kw)) if reg else Dinov2Model(Dinov2Config(**kw))
    return perturb_fan_in(model, ("embeddings",), "lambda1")


def _ours_from_hf(hf: torch.nn.Module) -> Dinov2:
    over = hf_config_overrides(hf.config.to_dict(), VisionTransformerConfig)
    return Dinov2(VisionTransformerConfig(**over, num_classes=0, dynamic_img_size=True)).eval()


@pytest.mark.parity
@pytest.mark.parametrize("reg,swiglu", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("names", ["file", "memory"])
def test_huggingface_parity(reg, swiglu, names):
    hf = _hf(reg, swiglu)
    ours = _ours_from_hf(hf)
    assert ours.num_prefix_tokens == (5 if reg else 1) and ours.cfg.no_embed_class == reg
    if names == "memory":  # transformers 5 in-memory names (q_proj / o_proj, gate_proj / up_proj / down_proj)
        report = load_weights(ours, hf.state_dict())
    else:  # the hub file names, through a saved model folder
        with tempfile.TemporaryDirectory() as d:
            hf.save_pretrained(d)
            report = load_weights(ours, d)
    assert report.ok and report.layout == "huggingface", report
    x = torch.randn(2, 3, 42, 42, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(pixel_values=x)
        feats = ours.forward_features(x)
        assert_parity(feats, ref.last_hidden_state)
        assert_parity(ours.forward_head(feats, pre_logits=True), ref.pooler_output)
        if reg:  # non-square: HF's register model resamples as timm does (size=, bicubic, antialias)
            xw = torch.randn(2, 3, 42, 70, generator=torch.Generator().manual_seed(2))
            assert_parity(ours.forward_features(xw), hf(pixel_values=xw).last_hidden_state)


def _default_and_bicubic(hf: torch.nn.Module) -> tuple[Dinov2, Dinov2]:
    """Two models of ``hf``'s config with its weights: the default table resampling (timm's) and
    ``pos_embed_resize="bicubic"`` (bicubic, no antialias)."""
    ours, bicubic = _ours_from_hf(hf), _ours_from_hf(hf)
    bicubic.cfg.pos_embed_resize = "bicubic"
    for m in (ours, bicubic):
        load_weights(m, hf.state_dict())
    return ours, bicubic


@pytest.mark.parity
def test_huggingface_plain_resamples_otherwise():
    """HF ``Dinov2Model`` resizes the table with ``size=``, bicubic, no antialias (MODERN A.2): our default
    ("timm") equals it at the native size only; ``pos_embed_resize="bicubic"`` equals it at every size."""
    hf = _hf(False, False)
    ours, hf_rule = _default_and_bicubic(hf)
    with torch.no_grad():
        for hw in ((42, 70), (70, 70), (28, 28), (56, 98)):  # grids 3x5, 5x5, 2x2, 4x7 from the native 3x3
            xw = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(2))
            ref = hf(pixel_values=xw).last_hidden_state
            assert (ours.forward_features(xw) - ref).abs().max() > 1e-4
            assert_parity(hf_rule.forward_features(xw), ref)


@pytest.mark.parity
def test_huggingface_register_rule_is_timms():
    """HF ``Dinov2WithRegistersModel`` resizes with antialias, timm's rule (our default); the no-antialias rule
    is not it."""
    hf = _hf(True, False)
    ours, other = _default_and_bicubic(hf)
    with torch.no_grad():
        for hw in ((70, 70), (28, 56)):
            xw = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(4))
            ref = hf(pixel_values=xw).last_hidden_state
            assert_parity(ours.forward_features(xw), ref)
            assert (other.forward_features(xw) - ref).abs().max() > 1e-4


def test_original_plain_rule_in_the_model():
    """``pos_embed_resize="dinov2"``: the forward at another size adds the original plain DINOv2 table (offset
    0.1, no antialias), in the dynamic forward and in ``set_input_size`` alike; it differs from timm's."""
    from vit_attention.functional.pos_embed import resample_abs_pos_embed

    cfg = dict(embed_dim=32, depth=1, num_heads=2, patch_size=14, img_size=42, num_classes=0, dynamic_img_size=True)
    torch.manual_seed(0)
    ours = Dinov2(VisionTransformerConfig(**cfg, pos_embed_resize="dinov2")).eval()
    timm_rule = Dinov2(VisionTransformerConfig(**cfg)).eval()
    timm_rule.load_state_dict(ours.state_dict())
    with torch.no_grad():
        ours.pos_embed.normal_()
        timm_rule.pos_embed.copy_(ours.pos_embed)
        x = torch.randn(1, 3, 70, 98, generator=torch.Generator().manual_seed(6))
        embedded, _ = ours._embed(x)
        tokens = ours.patch_embed(x)
        expect = torch.cat([ours.cls_token, tokens], 1) + resample_abs_pos_embed(ours.pos_embed, (5, 7), (3, 3),
                                                                                 rule="dinov2")
        assert_parity(embedded, expect)
        assert (ours.forward_features(x) - timm_rule.forward_features(x)).abs().max() > 1e-3
        dyn = ours.forward_features(x)
        ours.set_input_size((70, 98))
        assert_parity(ours.pos_embed, resample_abs_pos_embed(timm_rule.pos_embed, (5, 7), (3, 3), rule="dinov2"))
        assert_parity(ours.forward_features(x), dyn)
    with pytest.raises(ValueError, match="pos_embed_resize"):
        VisionTransformerConfig(**cfg, pos_embed_resize="hf")


@pytest.mark.parity
def test_hf_config_reader_giant():
    cfg = Dinov2Config(hidden_size=1536, num_hidden_layers=40, num_attention_heads=24, use_swiglu_ffn=True,
                       image_size=518)
    over = hf_config_overrides(cfg.to_dict(), VisionTransformerConfig)
    assert over["mlp_layer"] == "glu" and over["act"] == "silu" and int(1536 * over["mlp_ratio"]) == 8192
    reg = hf_config_overrides(Dinov2WithRegistersConfig().to_dict(), VisionTransformerConfig)
    assert reg["reg_tokens"] == 4 and reg["no_embed_class"] is True


@pytest.mark.parity
def test_create_model_from_a_transformers_folder():
    """``create_model(preset, pretrained=folder)``: the folder's config.json (read by our reader) wins."""
    hf = _hf(True, False)
    x = torch.randn(2, 3, 42, 42, generator=torch.Generator().manual_seed(3))
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        with pytest.warns(UserWarning, match="another architecture"):  # a tiny folder
            m = create_model("vit_small_patch14_reg4_dinov2", pretrained=d).eval()
    assert m.embed_dim == 32 and m.num_prefix_tokens == 5 and m.num_classes == 0
    with torch.no_grad():
        assert_parity(m(x), hf(pixel_values=x).pooler_output)


@pytest.mark.parity
def test_timm_layout_with_a_class_slot_into_a_register_model():
    """An original-style table (class slot kept) under timm names loads into the reg4 model, folded exactly."""
    state, t, cfg = load_fixture("timm_dinov2_reg4")
    slot = 0.3 * torch.randn(1, 1, cfg["embed_dim"], generator=torch.Generator().manual_seed(5))
    state = dict(state, pos_embed=torch.cat([slot, state["pos_embed"]], 1), cls_token=state["cls_token"] - slot)
    model = _ours_from_timm(cfg)
    report = load_weights(model, state, format="timm")
    assert report.ok and any("folded" in n for n in report.notes)
    with torch.no_grad():
        assert_parity(model.forward_features(t["input"]), t["features"])


def test_loading_at_another_size_follows_the_models_resize_rule():
    """A 5x5 table loaded into a 3x3 model is resampled once, by the model's ``pos_embed_resize`` rule: the
    original plain DINOv2's offset rule for ``"dinov2"``, timm's otherwise (they differ)."""
    from vit_attention.functional import resample_abs_pos_embed
    from vit_attention.weights import load_weights

    kw = dict(embed_dim=32, num_heads=2, depth=1, patch_size=14, num_classes=0)
    torch.manual_seed(0)
    big = create_model("vit_small_patch14_dinov2", img_size=70, **kw)
    state = big.state_dict()
    tables = {}
    for rule in ("dinov2", "timm"):
        small = create_model("vit_small_patch14_dinov2", img_size=42, pos_embed_resize=rule, **kw)
        report = load_weights(small, state)
        assert report.ok, report
        want = resample_abs_pos_embed(state["pos_embed"], (3, 3), (5, 5), num_prefix_tokens=1, rule=rule)
        torch.testing.assert_close(small.pos_embed.detach(), want)
        tables[rule] = want
    assert not torch.allclose(tables["dinov2"], tables["timm"], atol=1e-4)
