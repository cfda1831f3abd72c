"""Parity with timm's CaiT through the committed fixture (no skips); the original deit layout; adapters."""

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_parity, load_fixture

from vit_attention.models.cait import Cait, CaitConfig
from vit_attention.weights import load_weights
from vit_attention.weights.cait import RENAMES, from_timm, to_timm

pytestmark = pytest.mark.parity  # every test here compares with a reference implementation

_TIMM_KEYS = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes", "qkv_bias",
              "init_values", "depth_token_only", "mlp_ratio_token_only")


def _model(cfg: dict, **extra) -> Cait:
    return Cait(CaitConfig(**{**{k: v for k, v in cfg.items() if k in _TIMM_KEYS}, **extra})).eval()


@pytest.mark.parametrize("fmt", ["auto", "timm", "original"])
def test_timm_cait_parity(fmt):
    state, t, cfg = load_fixture("timm_cait")
    assert any(k.endswith("gamma_1") for k in state) and "pos_embed" in state  # the fixture is timm's layout
    model = _model(cfg)
    report = load_weights(model, state, format=fmt)
    assert report.ok, report
    assert report.layout == {"auto": "original"}.get(fmt, fmt)
    assert_fixture_parity(model, t)


def test_gammas_matter():
    """The fixture's LayerScale is far from its init: zeroing one gamma changes the output."""
    state, t, cfg = load_fixture("timm_cait")
    assert all(state[k].abs().mean() > 0.03 for k in state if "gamma_" in k)
    state = dict(state)
    state["blocks_token_only.1.gamma_2"] = torch.zeros_like(state["blocks_token_only.1.gamma_2"])
    model = _model(cfg)
    load_weights(model, state)
    with torch.no_grad():
        assert (model(t["input"]) - t["output"]).abs().max() > 1e-3


def test_original_deit_checkpoint_layout(tmp_path):
    """facebookresearch/deit files: ``{"model": {"module.<timm key>": ...}, "optimizer": ..., "epoch": ...}``."""
    state, t, cfg = load_fixture("timm_cait")
    path = tmp_path / "S24_224.pth"
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, "optimizer": {"state": {}}, "epoch": 3}, path)
    model = _model(cfg)
    report = load_weights(model, path)
    assert report.ok and report.layout == "original"
    assert_fixture_parity(model, t)


def test_rename_table_round_trip():
    state, _, cfg = load_fixture("timm_cait")
    ours = from_timm(dict(state))
    model = _model(cfg)
    assert set(ours) == set(model.state_dict())  # every key but LayerScale's is timm's own name
    assert {k for k in state if k not in ours} == {k for k in state if "gamma_" in k}
    assert to_timm(ours).keys() == state.keys()
    assert len(RENAMES) == 1


def test_pos_embed_resampled_for_another_size():
    """A model built at 48x48 (a 6x6 grid) loads the 4x4-grid checkpoint; the table is resampled bicubically."""
    state, t, cfg = load_fixture("timm_cait")
    model = _model(cfg, img_size=48)
    report = load_weights(model, state)
    assert report.ok and any("pos_embed resampled from 4x4 to 6x6" in n for n in report.notes)
    assert model.pos_embed.shape == (1, 36, cfg["embed_dim"])
    # the same as resampling at run time in a model that keeps the 4x4 table
    dyn = _model(cfg, dynamic_img_size=True)
    load_weights(dyn, state)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), dyn(x), rtol=1e-5, atol=1e-6)
        assert_parity(dyn(t["input"]), t["output"])  # the native size is untouched


def test_other_class_count_drops_the_head():
    state, t, cfg = load_fixture("timm_cait")
    model = _model(cfg, num_classes=7)
    with pytest.warns(UserWarning, match="classifier head"):
        report = load_weights(model, state)
    assert report.ok and report.dropped == ["head"]
    with torch.no_grad():
        assert_parity(model.forward_features(t["input"]), t["features"])
