"""MViTv2 checkpoint layouts (weights/mvitv2.py): timm's files are our keys; facebookresearch/mvit's flat
``blocks.{i}`` layout (width projection ``proj``, classifier ``head.projection``) converts one to one in both widening
layouts, and a fixture of the original repository's model (class token, its residual-pooling rule, softmax head) is
reproduced; tables of another length are resized linearly and a classifier of another class count is dropped."""

import re

import pytest
import torch
from fixture_utils import assert_loads, assert_parity, load_fixture

from vit_attention import create_model
from vit_attention.functional.rel_pos import resize_rel_pos

pytestmark = pytest.mark.parity

CASES = [("timm_mvitv2", "mvitv2_tiny", dict(embed_dim=8, depths=(2, 1, 1, 1)), "shortcut_proj_attn"),
         ("timm_mvitv2_large", "mvitv2_large", dict(embed_dim=8, depths=(2, 2, 1, 2)), "shortcut_proj_mlp")]


def _original_layout(state: dict, depths: tuple[int, ...], proj: str) -> dict:
    """Our (timm's) keys written back in facebookresearch/mvit's layout, as timm's checkpoint_filter_fn reads it."""
    starts = [sum(depths[:s]) for s in range(len(depths))]
    out = {}
    for k, v in state.items():
        m = re.fullmatch(r"stages\.(\d+)\.blocks\.(\d+)\.(.+)", k)
        if m is not None:
            rest = m.group(3).replace(f"{proj}.", "proj.")
            k = f"blocks.{starts[int(m.group(1))] + int(m.group(2))}.{rest}"
        out[k.replace("head.fc.", "head.projection.")] = v
    return out


@pytest.mark.parametrize("name,preset,overrides,proj", CASES)
def test_original_layout_converts_one_to_one(name, preset, overrides, proj):
    state, t, _ = load_fixture(name)
    model = create_model(preset, img_size=64, num_classes=10, **overrides).eval()
    original = _original_layout(state, overrides["depths"], proj)
    assert any(k.endswith(".proj.weight") and k.startswith("blocks.") and "attn" not in k for k in original)
    assert_loads(model, original, "original")
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


def test_tables_of_another_length_resized_and_other_heads_dropped():
    state, t, _ = load_fixture("timm_mvitv2")
    model = create_model("mvitv2_tiny", img_size=96, num_classes=5, embed_dim=8, depths=(2, 1, 1, 1)).eval()
    with pytest.warns(UserWarning, match="classes"):
        report = assert_loads(model, state)
    assert any("rel_pos tables resized" in n for n in report.notes) and "head.fc" in report.dropped
    key = "stages.0.blocks.0.attn.rel_pos_h"
    assert torch.equal(model.state_dict()[key], resize_rel_pos(state[key], 47))


def test_parity_with_the_original_repository():
    """facebookresearch/mvit@dfbdfdf's MViT with the class token (fixture by make_fixtures_mvitv2.py): its flat
    layout loads, and with ``residual_cls=False`` (the original leaves the class row out of the residual pooling)
    the tokens, the class token and its eval-mode softmax equal ours; timm's rule (the default) differs."""
    state, t, _ = load_fixture("original_mvitv2")
    model = create_model("mvitv2_small_cls", img_size=64, num_classes=10, embed_dim=8, depths=(2, 1, 1, 1),
                         residual_cls=False).eval()
    assert_loads(model, state, "original")
    timm_rule = create_model("mvitv2_small_cls", img_size=64, num_classes=10, embed_dim=8,
                             depths=(2, 1, 1, 1)).eval()
    timm_rule.load_state_dict(model.state_dict())
    with torch.no_grad():
        feats = model.forward_features(t["input"])
        assert_parity(feats, t["features"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["pre_logits"])
        assert_parity(model(t["input"]).softmax(-1), t["output"])
        assert (timm_rule.forward_features(t["input"])[:, 0] - t["features"][:, 0]).abs().max() > 1e-3
