"""EfficientViT-MSRA checkpoints (vit_attention/weights/efficientvit_msra.py): timm's files are our own keys,
persisted ``attention_bias_idxs`` are dropped, tables of another window are resampled as timm's checkpoint filter
does, and a classifier of another class count is dropped (fixtures from
tests/fixtures/make_fixtures_efficientvit_msra.py)."""

import pytest
import torch
from fixture_utils import assert_loads, assert_parity, load_fixture

from vit_attention import create_model
from vit_attention.functional.attention_bias import attention_bias_index
from vit_attention.weights import load_weights

pytestmark = pytest.mark.parity

M2 = dict(img_size=160, num_classes=10, embed_dim=(16, 24, 32), key_dim=(8, 8, 8), depth=(1, 1, 2),
          num_heads=(4, 3, 2), window_size=(7, 7, 7), kernels=(7, 5, 3, 3))


def _model(**overrides: object) -> torch.nn.Module:
    return create_model("efficientvit_m2", **{**M2, **overrides}).eval()


def test_timm_files_are_our_own_keys():
    state, t, _ = load_fixture("timm_efficientvit_msra_m2")
    model = _model()
    assert set(state) == set(model.state_dict())
    assert not assert_loads(model, state, "vit_attention").notes  # nothing converted, nothing resampled
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


def test_persisted_bias_indices_are_dropped():
    state, t, _ = load_fixture("timm_efficientvit_msra_m2")
    state = dict(state)
    state["stages.0.blocks.0.mixer.m.attn.attention_bias_idxs"] = attention_bias_index(7)
    model = _model()
    assert_loads(model, state, "timm")
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


@pytest.mark.parametrize("tag, size", [("img96", 96), ("img128", 128)])
def test_weights_of_another_window_load_resampled_as_timms_filter(tag, size):
    """Built at another size (windows 6, 3, 2 at 96; 7, 4, 2 at 128), the 160 px weights load with every changed
    table resampled: timm's outputs after its own set_input_size."""
    state, t, _ = load_fixture("timm_efficientvit_msra_m2")
    model = _model(img_size=size)
    report = assert_loads(model, state)
    assert any("attention_biases tables resampled" in n for n in report.notes)
    with torch.no_grad():
        assert_parity(model(t[f"input_{tag}"].float()), t[f"output_{tag}"])


def test_a_classifier_of_another_class_count_is_dropped():
    state, _, _ = load_fixture("timm_efficientvit_msra_m2")
    model = _model(num_classes=7)
    with pytest.warns(UserWarning, match="10 classes in the checkpoint and 7 in the model"):
        report = load_weights(model, state)
    assert report.ok and "head.linear" in report.dropped


def test_the_original_repositorys_files_convert_to_its_outputs():
    """microsoft/Cream's flat layout (blocks{1,2,3}, the subsample triples at the head of the next list, ``.c`` /
    ``.l``, persistent indices): converted, our model gives the original's last map, pooled features and logits."""
    state, t, cfg = load_fixture("original_efficientvit_msra")
    assert any(k.startswith("blocks2.0.") for k in state) and any(k.endswith("attention_bias_idxs") for k in state)
    model = create_model("efficientvit_m1", **{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})
    assert_loads(model.eval(), {"model": state}, "original")
    with torch.no_grad():
        feats = model.forward_features(t["input"])
        assert_parity(feats.permute(0, 3, 1, 2), t["features"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["pre_logits"])
        assert_parity(model(t["input"]), t["output"])
