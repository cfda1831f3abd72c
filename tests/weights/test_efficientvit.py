"""EfficientViT-MIT checkpoint layouts (weights/efficientvit.py): timm 1.0.31's and the original
mit-han-lab/efficientvit keys onto ours, from the committed fixtures (tests/fixtures/make_fixtures_efficientvit.py); a
classifier of another class count left fresh."""

import pytest
import torch
from fixture_utils import assert_loads, assert_parity, load_fixture

from vit_attention import create_model
from vit_attention.weights import LoadReport, convert_state_dict

pytestmark = pytest.mark.parity

SMALL = dict(widths=(8, 8, 16, 16, 32), depths=(1, 2, 2, 1, 1), head_dim=8, head_widths=(32, 48), num_classes=10)


@pytest.mark.parametrize(("fixture", "name"), [("timm_efficientvit", "efficientvit_b0"),
                                               ("timm_efficientvit_large", "efficientvit_l1")])
def test_timm_keys_map_onto_ours_one_to_one(fixture, name):
    """Every timm tensor lands on one of ours with the same values (1x1 convolutions squeezed to Linear weights),
    and every one of ours is covered."""
    state, t, _ = load_fixture(fixture)
    model = create_model(name, **SMALL).eval()
    report = LoadReport()
    converted = convert_state_dict(state, model, report=report)
    own = model.state_dict()
    assert report.layout == "timm" and set(converted) == set(own) and len(converted) == len(state)
    block = "stages.3.blocks.1"
    torch.testing.assert_close(converted[f"{block}.attn.qkv.weight"],
                               state[f"{block}.context_module.main.qkv.conv.weight"][:, :, 0, 0], rtol=0, atol=0)
    torch.testing.assert_close(converted[f"{block}.attn.norm.running_var"],
                               state[f"{block}.context_module.main.proj.norm.running_var"], rtol=0, atol=0)
    torch.testing.assert_close(converted["head.fc.weight"], state["head.classifier.4.weight"], rtol=0, atol=0)
    assert_loads(model, state, "timm")
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


def test_a_classifier_for_another_class_count_is_left_fresh():
    state, t, _ = load_fixture("timm_efficientvit")
    model = create_model("efficientvit_b0", **{**SMALL, "num_classes": 7}).eval()
    with pytest.warns(UserWarning, match="10 classes in the checkpoint and 7 in the model"):
        report = assert_loads(model, state, "timm")
    assert report.dropped == ["head.fc"]
    with torch.no_grad():
        assert_parity(model.forward_head(model.forward_features(t["input"]), pre_logits=True), t["pre_logits"])


@pytest.mark.parametrize(("fixture", "name", "extra"), [
    ("original_efficientvit", "efficientvit_b0", {}),
    ("original_efficientvit_large", "efficientvit_l1", {"head_bn_eps": 1e-7}),  # the model zoo's eps, head included
])
def test_original_repository_layout_and_parity(fixture, name, extra):
    """mit-han-lab/efficientvit's keys (``backbone.input_stem`` / ``backbone.stages.{s}.op_list.{j}``, L: the stem as
    stage 0; ``head.op_list``) load one to one; with its LiteMLA eps (1e-15) the logits, features and pre-logits
    agree. timm's eps (1e-5) moves the B model's perturbed logits by more than the parity tolerance."""
    state, t, _ = load_fixture(fixture)
    model = create_model(name, **SMALL, **extra, attn_eps=1e-15).eval()
    report = LoadReport()
    converted = convert_state_dict(state, model, report=report)
    assert report.layout == "original" and set(converted) == set(model.state_dict()) and len(converted) == len(state)
    assert_loads(model, state, "original")
    with torch.no_grad():
        feats = model.forward_features(t["input"])
        assert_parity(feats, t["features"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["pre_logits"])
        assert_parity(model(t["input"]), t["output"])
    if fixture == "original_efficientvit":
        timm_eps = create_model(name, **SMALL).eval()
        assert_loads(timm_eps, state, "original")
        with torch.no_grad():
            with pytest.raises(AssertionError):
                assert_parity(timm_eps(t["input"]), t["output"])
