"""record_attention: every attention call recorded with the layout to put it back in the image."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention, create_model, plug
from vit_attention.analysis import record_attention
from vit_attention.functional.layout import window_layout
from vit_attention.functional.observers import WEIGHT_HOOKS, current_frames


@pytest.mark.parametrize("pad_first", [False, True])
@pytest.mark.parametrize("shift", [0, 2])
def test_window_maps_land_where_the_gradient_says(pad_first, shift):
    """Where a query's weights are placed in the image == the inputs its output depends on."""
    attn = create_attention("window", 16, 2, window_size=4, shift_size=shift, pad_first=pad_first).eval()
    x = torch.randn(1, 7, 9, 16, requires_grad=True)  # not a window multiple: padding on both axes
    with record_attention(attn) as rec:
        out = attn(x)
    (r,) = rec.records
    assert r.grid == (7, 9) and r.layout.groups == 6 and r.weights.shape == (6, 2, 16, 16)  # padded to 8x12
    for q in [(0, 0), (3, 4), (6, 8), (5, 1)]:
        x.grad = None
        out[0, q[0], q[1]].sum().backward(retain_graph=True)
        depends = x.grad[0].abs().sum(-1) > 1e-12  # [H, W]
        looks = rec.records[0].query_map(q)[0] > 1e-12  # [H, W]
        assert torch.equal(depends, looks), (q, depends.int(), looks.int())
    received = r.received()
    assert received.shape == (1, 7, 9) and torch.all(received > 0)


def test_window_layout_covers_every_position_once():
    idx = window_layout(7, 9, (4, 4), (2, 2)).query_pos
    assert idx.shape == (6, 16)
    real = idx[idx >= 0]
    assert torch.equal(real.sort().values, torch.arange(63))


def test_global_records_rollout_and_layers():
    model = create_model("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=3).eval()
    with record_attention(model) as rec, torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    assert [r.module for r in rec.records] == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]
    r = rec.records[0]
    assert r.is_global and r.num_prefix_tokens == 2 and r.grid == (4, 4)
    assert r.weights.shape == (2, 3, 18, 18)
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(2, 3, 18))
    roll = rec.rollout()
    assert roll.shape == (2, 4, 4) and torch.all(roll > 0) and float(roll.sum(dim=(1, 2)).max()) <= 1.0
    assert rec.image_map(layer=1, head=2).shape == (2, 4, 4)
    assert rec.mean_map().shape == (2, 4, 4)
    with pytest.raises(ValueError, match="out of range"):
        rec.image_map(layer=3)
    with pytest.raises(ValueError, match="head=5"):
        rec.image_map(layer=0, head=5)
    assert not WEIGHT_HOOKS and not current_frames()  # nothing left behind


def test_swin_model_maps_reassembled_per_stage():
    model = create_model("swin_tiny_patch4_window7_224", img_size=56, window_size=7, depths=(2, 2, 1, 1),
                         embed_dim=24, num_heads=(1, 2, 2, 2)).eval()
    with record_attention(model) as rec, torch.no_grad():
        model(torch.randn(1, 3, 56, 56))
    grids = [r.grid for r in rec.records]
    assert grids == [(14, 14), (14, 14), (7, 7), (7, 7), (4, 4), (2, 2)]
    assert rec.records[1].info["shift_size"] == (3, 3) and rec.records[0].info["shift_size"] == (0, 0)
    # one 7x7 window covers the 7x7, 4x4 and 2x2 maps (padded): global attention there
    assert [r.is_global for r in rec.records] == [False] * 2 + [True] * 4
    assert rec.image_map(0).shape == (1, 14, 14) and rec.mean_map().shape == (1, 14, 14)
    assert rec.rollout().shape == (1, 2, 2)  # through the last stage, the only one of its grid


def test_plugged_cnn_records_with_module_names():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), plug("mhsa", 16, 2), plug("window", 16, 2,
                                                                                              window_size=4))
    with record_attention(net) as rec, torch.no_grad():
        net(torch.randn(1, 3, 8, 8))
    assert [r.module for r in rec.records] == ["1.attn", "2.attn"]
    assert rec.records[0].is_global and rec.records[1].layout.groups == 4
