"""FlexiViT (models/flexivit.py): presets, published sizes, timm parity at several patch sizes, loading a
checkpoint at another patch size with timm's FlexiViT rule (bilinear, no anti-aliasing)."""

import copy

import pytest
import torch
from fixture_utils import assert_parity, assert_resized_parity, load_fixture

from vit_attention import create_model
from vit_attention.analysis.flops import flops
from vit_attention.functional import resample_abs_pos_embed, resample_patch_embed
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.flexivit import FlexiViT
from vit_attention.models.pretrained_table import DEFAULT_TAGS, PRETRAINED_CFGS
from vit_attention.models.vit import VisionTransformerConfig
from vit_attention.weights import load_weights

NAMES = ["flexivit_small", "flexivit_base", "flexivit_large"]


def _fixture_model(**over) -> tuple[FlexiViT, dict, dict]:
    state, t, cfg = load_fixture("timm_flexivit")
    model = FlexiViT(VisionTransformerConfig(**{**cfg, **over})).eval()
    return model, state, t


def test_registered_presets():
    assert set(list_models("flexivit*")) == set(NAMES)
    for name in NAMES:
        p = get_model_entry(name).preset
        assert (p["img_size"], p["patch_size"], p["no_embed_class"], p["global_pool"]) == (240, 16, True, "token")
        assert get_model_entry(name).family == "flexivit"


@pytest.mark.registry
@pytest.mark.parametrize("name", NAMES)
def test_params_and_gmacs_match_published(name):
    with torch.device("meta"):
        m = create_model(name)
    assert isinstance(m, FlexiViT) and m.pos_embed.shape[1] == 15 * 15  # no class slot
    meta = get_model_entry(name).meta
    n = sum(p.numel() for p in m.parameters()) / 1e6
    assert abs(n - meta["published_params_m"]) < 0.001  # timm 1.0.31 on meta, to the thousand
    macs = flops(m, (1, 3, 240, 240)).total / 1e9
    assert abs(macs - meta["published_gmacs"]) / meta["published_gmacs"] < 0.01


def test_pretrained_tags():
    assert DEFAULT_TAGS["flexivit_small"] == "1200ep_in1k"
    cfg = PRETRAINED_CFGS["flexivit_base.patch30_in21k"]
    assert cfg["input_size"] == (3, 240, 240) and cfg["crop_pct"] == 0.95 and cfg["mean"] == (0.5, 0.5, 0.5)
    assert cfg["num_classes"] == 21843


@pytest.mark.parity
def test_timm_parity_at_several_patch_sizes():
    model, state, t = _fixture_model()
    assert load_weights(model, state).ok
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
        assert_parity(model.forward_features(t["input"]), t["features"])
    assert_resized_parity(model, t)  # measured <= 8.6e-7 relative


@pytest.mark.parity
def test_load_at_another_patch_size_uses_the_flexivit_rule():
    """timm's checkpoint_filter_fn for flexivit* (bilinear, no antialias): patch-8 weights into a patch-12 model."""
    model, state, t = _fixture_model(img_size=36, patch_size=12)
    report = load_weights(model, state)
    assert report.ok, report
    assert any("bilinear pseudo-inverse" in n for n in report.notes)
    assert any("pos_embed resampled from 4x4 to 3x3" in n for n in report.notes)
    assert_parity(model.patch_embed.proj.weight.detach(), t["filtered.patch_embed.proj.weight"])
    assert_parity(model.pos_embed.detach(), t["filtered.pos_embed"])
    with torch.no_grad():
        assert_parity(model(t["input_load12"]), t["output_load12"])
    # the same as set_input_size with the same rule; timm's default (bicubic) rule is another kernel
    m8, _, _ = _fixture_model()
    load_weights(m8, state)
    bil, bic = copy.deepcopy(m8), copy.deepcopy(m8)
    bil.set_input_size(img_size=36, patch_size=12, interpolation="bilinear", antialias=False)
    bic.set_input_size(img_size=36, patch_size=12)
    torch.testing.assert_close(bil.patch_embed.proj.weight, model.patch_embed.proj.weight)
    torch.testing.assert_close(bil.pos_embed, model.pos_embed)
    assert (bic.patch_embed.proj.weight - model.patch_embed.proj.weight).abs().max() > 1e-3


def test_load_patch30_checkpoint_into_patch16_preset_layout():
    """flexivit_base.patch30_in21k holds a 30x30 kernel and an 8x8 table (240 / 30): both fit the patch-16 model."""
    torch.manual_seed(0)
    model = create_model("flexivit_small", embed_dim=32, num_heads=2, depth=1, num_classes=0)
    own = model.state_dict()
    state = {k: torch.randn_like(v) for k, v in own.items()}
    state["patch_embed.proj.weight"] = torch.randn(32, 3, 30, 30)
    state["pos_embed"] = torch.randn(1, 64, 32)
    report = load_weights(model, state)
    assert report.ok, report
    torch.testing.assert_close(model.patch_embed.proj.weight,
                               resample_patch_embed(state["patch_embed.proj.weight"], 16, interpolation="bilinear",
                                                    antialias=False))
    torch.testing.assert_close(model.pos_embed, resample_abs_pos_embed(state["pos_embed"], (15, 15), (8, 8),
                                                                       num_prefix_tokens=0, interpolation="bilinear",
                                                                       antialias=False))


def test_reduced_model_any_patch_and_size():
    entry = get_model_entry("flexivit_base")
    m = create_model("flexivit_base", **entry.reduced_overrides(), num_classes=7).eval()
    assert m.patch_embed.img_size == (48, 48) and m.grid_size == (3, 3)
    x = torch.randn(2, 3, 48, 48)
    assert m(x).shape == (2, 7)
    for img, patch in ((48, 8), ((48, 80), 16), (60, 30)):
        m.set_input_size(img_size=img, patch_size=patch)
        h, w = (img, img) if isinstance(img, int) else img
        assert m.forward_features(torch.randn(1, 3, h, w)).shape == (1, 1 + (h // patch) * (w // patch), 32)
