"""Twins checkpoint parity against timm fixtures (PCPVT, SVT at a size that needs LSA padding) and the layouts.

Fixtures: tests/fixtures/make_fixtures_twins.py. Tolerance: max |ours - ref| <= 1e-5 * max |ref|.
"""

import pytest
import torch
from fixture_utils import load_fixture, rel_err

from vit_attention import create_model
from vit_attention.functional import switched
from vit_attention.models.twins import Twins
from vit_attention.weights import convert_state_dict, load_weights
from vit_attention.weights.twins import TIMM_TO_OURS


def _model(cfg: dict) -> Twins:
    keys = ("img_size", "patch_size", "embed_dims", "num_heads", "mlp_ratios", "depths", "sr_ratios", "wss",
            "num_classes")
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k in keys}
    return Twins(**kw).eval()


@pytest.mark.parity
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("name", ["timm_twins_pcpvt", "timm_twins_svt"])
def test_timm_fixture_parity(name, fused):
    state, t, cfg = load_fixture(name)
    model = _model(cfg)
    report = load_weights(model, state)
    assert report.layout == "timm" and report.ok, report
    x = t["input"]
    with torch.no_grad(), switched(model, fused_attention=fused):
        feats = model.forward_features(x)  # [B, h, w, C]
        out = model.forward_head(feats)
        pre = model.forward_head(feats, pre_logits=True)
    B, h, w, C = feats.shape
    assert rel_err(feats.reshape(B, h * w, C), t["features"]) <= 1e-5  # timm: normalised tokens [B, h·w, C]
    assert rel_err(pre, t["pre_logits"]) <= 1e-5
    assert rel_err(out, t["output"]) <= 1e-5


@pytest.mark.parity
def test_svt_fixture_exercises_lsa_padding_and_floor_reduction():
    _, t, cfg = load_fixture("timm_twins_svt")
    H = t["input"].shape[-1] // cfg["patch_size"]
    sizes = [H]
    for _ in cfg["depths"][1:]:
        sizes.append(sizes[-1] // 2)
    assert sizes == [18, 9, 4, 2]
    assert all(s % ws for s, ws in zip(sizes, cfg["wss"]) if s > ws)  # stages 0-1 need padded groups
    assert any(s % r for s, r in zip(sizes, cfg["sr_ratios"]))  # a GSA conv drops rows


@pytest.mark.parity
def test_masked_lsa_padding_differs_from_timm_at_padded_sizes():
    state, t, cfg = load_fixture("timm_twins_svt")
    model = _model(cfg)
    masked = Twins(**{**model.cfg.to_dict(), "lsa_pad_mask": True}).eval()
    load_weights(model, state)
    load_weights(masked, state)
    with torch.no_grad():
        assert rel_err(masked(t["input"]), t["output"]) > 1e-3  # the policy matters where maps are padded


@pytest.mark.parity
def test_rename_table_round_trip_and_original_layout():
    state, _, cfg = load_fixture("timm_twins_svt")
    model = _model(cfg)
    ours = convert_state_dict(state, model)
    assert set(ours) == set(model.state_dict())
    assert "stages.1.pos.proj.0.weight" in ours and "head.fc.weight" in ours
    assert len(TIMM_TO_OURS) == 4
    # the original Meituan-AutoML/Twins gvt.py keeps timm's names, wrapped in {'model': ...}
    report = load_weights(model, {"model": state}, format="original")
    assert report.ok and report.layout == "original"
    report = load_weights(model, state, format="timm")  # our keys are not timm's: format="timm" converts
    assert report.ok and report.layout == "timm"
    assert load_weights(model, model.state_dict(), format="vit_attention").ok


def test_preset_state_dict_matches_timm_key_set_after_rename():
    """Every timm key of twins_svt_small (listed from its structure) lands on one of ours."""
    with torch.device("meta"):
        model = create_model("twins_svt_small")
    own = model.state_dict()
    inverse = {}
    for k in own:  # our key -> timm's
        t = k.replace("head.fc.", "head.")
        parts = t.split(".")
        if parts[0] == "stages":
            i, rest = parts[1], parts[2:]
            if rest[0] == "downsample":
                t = ".".join(["patch_embeds", i, *rest[1:]])
            elif rest[0] == "blocks":
                t = ".".join(["blocks", i, *rest[1:]])
            elif rest[0] == "pos":
                t = ".".join(["pos_block", i, *rest[1:]])
        inverse[t] = k
    converted = convert_state_dict({t: own[k] for t, k in inverse.items()}, model)
    assert set(converted) == set(own)


@pytest.mark.parity
def test_other_class_count_drops_the_head():
    state, t, cfg = load_fixture("timm_twins_pcpvt")
    model = Twins(**{**_model(cfg).cfg.to_dict(), "num_classes": 3})
    with pytest.warns(UserWarning, match="classifier"):
        report = load_weights(model, state, strict=False)
    assert "head.fc" in report.dropped
