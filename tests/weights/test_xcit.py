"""XCiT checkpoint layouts (weights/xcit.py): timm's (the fixture) and the original facebookresearch/xcit files
(``{"model": ...}``, ``pos_embeder``, packed class-attention ``qkv``) load to the same model; ours maps back to
timm's names exactly; a head of another class count is dropped."""

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_loads, load_fixture

from vit_attention import create_model
from vit_attention.weights import load_weights
from vit_attention.weights.xcit import to_timm

pytestmark = pytest.mark.parity

P16 = dict(img_size=(48, 64), patch_size=16, embed_dim=32, depth=2, num_heads=4, num_classes=10, eta=1.0,
           tokens_norm=True)


def _model(**kw):
    return create_model("xcit_nano_12_p16_224", **{**P16, **kw}).eval()


def _original(state: dict) -> dict:
    """timm's fixture state in the authors' layout: ``pos_embeder``, one ``qkv`` per class-attention block."""
    out = {}
    for k, v in state.items():
        if ".attn.q." in k and k.startswith("cls_attn_blocks."):
            p, what = k.split(".attn.q.")
            out[f"{p}.attn.qkv.{what}"] = torch.cat([state[f"{p}.attn.{n}.{what}"] for n in "qkv"], 0)
        elif (".attn.k." in k or ".attn.v." in k) and k.startswith("cls_attn_blocks."):
            continue
        else:
            out[k.replace("pos_embed.", "pos_embeder.")] = v
    return out


def test_timm_layout_is_detected_renamed_and_maps_back():
    state, t, _ = load_fixture("timm_xcit")
    model = _model()
    report = assert_loads(model, state, "timm")
    assert not report.missing and not report.unexpected
    back = to_timm(model.state_dict())
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    explicit = _model()
    assert_loads(explicit, state, "timm", format="timm")
    assert_fixture_parity(explicit, t)


def test_original_layout_loads_to_the_same_model():
    state, t, _ = load_fixture("timm_xcit")
    original = {"model": _original(state)}
    assert "pos_embeder.token_projection.weight" in original["model"]
    assert "cls_attn_blocks.0.attn.qkv.weight" in original["model"]
    model = _model()
    assert_loads(model, original, "original")
    assert_fixture_parity(model, t)
    forced = _model()
    assert_loads(forced, _original(state), "original", format="original")
    torch.testing.assert_close(forced.state_dict(), model.state_dict())


def test_a_head_of_another_class_count_is_dropped():
    state, t, _ = load_fixture("timm_xcit")
    model = _model(num_classes=3)
    head = model.head.weight.detach().clone()
    with pytest.warns(UserWarning, match="classifier head has 10 classes"):
        report = load_weights(model, state)
    assert report.layout == "timm" and torch.equal(model.head.weight, head)
    assert any("head" in n for n in report.notes + report.missing)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(t["input"]), t["features"], atol=1e-5, rtol=1e-5)
