"""MaxViT checkpoint layouts (weights/maxvit.py): timm 1.0.31's MaxxVit and torchvision 0.29's MaxVit names onto
ours, from the committed fixtures (tests/fixtures/make_fixtures_maxvit.py)."""

import math

import pytest
import torch
from fixture_utils import load_fixture

from vit_attention import create_model
from vit_attention.weights import load_weights
from vit_attention.weights.layouts import converters_for

pytestmark = pytest.mark.parity

SMALL = dict(embed_dims=(16, 32), depths=(1, 2), stem_width=16, head_hidden_size=32, dim_head=8, window_size=4,
             num_classes=10, img_size=(64, 96))


def test_timm_names_map_one_to_one_onto_ours():
    """Every timm key has exactly one of ours: only the tables lose ``rel_pos.``; nothing else is renamed."""
    state, _, _ = load_fixture("timm_maxvit")
    model = create_model("maxvit_tiny_tf_224", **SMALL)
    (timm,) = [c for c in converters_for("maxvit") if c.layout == "timm"]
    assert timm.detect(state) and not timm.detect(model.state_dict())
    converted = timm.convert(dict(state), model)
    assert set(converted) == set(model.state_dict())
    renamed = {k for k in state if k not in converted}
    assert renamed and all(k.endswith(".attn.rel_pos.relative_position_bias_table") for k in renamed)
    for k, v in converted.items():
        want = state.get(k, state.get(k.replace(".attn.relative_position_bias_table",
                                                ".attn.rel_pos.relative_position_bias_table")))
        assert want is not None and torch.equal(v, want), k


def test_timm_lookup_buffers_are_ignored_and_a_head_of_another_class_count_is_dropped():
    state, _, _ = load_fixture("timm_maxvit")
    key = "stages.0.blocks.0.attn_block.attn.rel_pos.height_lookup"
    model = create_model("maxvit_tiny_tf_224", **{**SMALL, "num_classes": 7})
    with pytest.warns(UserWarning, match="head.fc has 10 classes in the checkpoint and 7 in the model"):
        report = load_weights(model, {**state, key: torch.zeros(4, 4, 7)})
    assert report.ok and report.layout == "timm"
    assert torch.equal(model.stages[1].blocks[1].conv.se.fc1.weight, state["stages.1.blocks.1.conv.se.fc1.weight"])


def test_our_own_files_load_without_conversion():
    model = create_model("maxvit_tiny_tf_224", **SMALL)
    report = load_weights(create_model("maxvit_tiny_tf_224", **SMALL), model.state_dict())
    assert report.ok and report.layout != "timm"


def test_torchvision_tables_are_flipped_and_queries_rescaled():
    """A Swin-layout table (query minus key) becomes the TF one (key minus query): both offset axes flipped; the q
    rows of to_qkv scaled by sqrt(hd / C) (torchvision's C^-1/2 logits); the index buffers dropped."""
    state, _, _ = load_fixture("torchvision_maxvit")
    model = create_model("maxvit_t", **{**SMALL, "img_size": 64})
    (tv,) = [c for c in converters_for("maxvit") if c.layout == "torchvision"]
    assert tv.detect(state) and not tv.detect(model.state_dict())
    converted = tv.convert(dict(state), model)
    assert set(converted) == set(model.state_dict())
    src = "blocks.1.layers.1.layers.grid_attention.attn_layer.1."
    dst = "stages.1.blocks.1.attn_grid.attn."
    table = state[src + "relative_position_bias_table"]  # [(2P-1)², nh] = [49, 4]
    tf = converted[dst + "relative_position_bias_table"]
    assert tf.shape == (4, 7, 7)
    dr, dc = 2, -1  # query minus key (r_q - r_k, c_q - c_k): row (dr + 3)·7 + (dc + 3) of torchvision's table
    torch.testing.assert_close(tf[:, -dr + 3, -dc + 3], table[(dr + 3) * 7 + (dc + 3)])
    C, hd = 32, 8
    qkv = state[src + "to_qkv.weight"]
    torch.testing.assert_close(converted[dst + "qkv.weight"][:C], qkv[:C] * math.sqrt(hd / C))
    torch.testing.assert_close(converted[dst + "qkv.weight"][C:], qkv[C:])
    assert any(k.endswith("relative_position_index") for k in state)


def test_timm_rw_tables_are_flipped_and_qkv_rows_regrouped():
    """timm's rw files: a Swin-layout table [(2P-1)², nh] (query minus key) becomes the TF one; the per-head qkv rows
    [q_h | k_h | v_h] (head_first) become [q | k | v]."""
    state, _, _ = load_fixture("timm_maxvit_rw")
    model = create_model("maxvit_nano_rw_256", embed_dims=(16, 32), depths=(1, 2), stem_width=(8, 16), dim_head=8,
                         window_size=4, num_classes=10, img_size=(64, 96))
    (timm,) = [c for c in converters_for("maxvit") if c.layout == "timm"]
    converted = timm.convert(dict(state), model)
    assert set(converted) == set(model.state_dict())
    prefix = "stages.1.blocks.0.attn_block.attn."
    table = state[prefix + "rel_pos.relative_position_bias_table"]  # [49, 4]
    torch.testing.assert_close(converted[prefix + "relative_position_bias_table"][:, 3 - 1, 3 + 2],
                               table[(1 + 3) * 7 + (-2 + 3)])  # query minus key (1, -2)
    nh, hd, C = 4, 8, 32
    qkv = state[prefix + "qkv.weight"]
    ours = converted[prefix + "qkv.weight"]
    for h in range(nh):
        for j in range(3):  # q, k, v of head h
            torch.testing.assert_close(ours[j * C + h * hd:j * C + (h + 1) * hd], qkv[h * 3 * hd + j * hd:
                                                                                    h * 3 * hd + (j + 1) * hd])


def test_timm_rmlp_mlp_keys_are_renamed_and_qkv_rows_regrouped():
    state, _, _ = load_fixture("timm_maxvit_rmlp")
    model = create_model("maxvit_rmlp_base_rw_224", embed_dims=(16, 32), depths=(1, 2), stem_width=(8, 16),
                         dim_head=8, window_size=4, num_classes=10, img_size=(64, 96), head_hidden_size=32,
                         init_values=1e-6)
    (timm,) = [c for c in converters_for("maxvit") if c.layout == "timm"]
    assert timm.detect(state)
    converted = timm.convert(dict(state), model)
    assert set(converted) == set(model.state_dict())
    prefix = "stages.0.blocks.0.attn_grid.attn."
    assert torch.equal(converted[prefix + "rel_pos_mlp.fc2.weight"], state[prefix + "rel_pos.mlp.fc2.weight"])
    nh, hd = 2, 8  # stage 0: 16 channels
    bias = state[prefix + "qkv.bias"]
    regrouped = bias.view(nh, 3, hd).transpose(0, 1).reshape(-1)  # [q_h | k_h | v_h] per head -> [q | k | v]
    assert torch.equal(converted[prefix + "qkv.bias"], regrouped) and not torch.equal(regrouped, bias)
