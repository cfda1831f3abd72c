"""``AttentionRecord.query_map`` for every mechanism, placed only by the layout the mechanism reports.

Checked against what the weights mean, built independently of the library's placement: the
inputs a query's output depends on (autograd), and a dense ``[H·W, H·W]`` attention matrix
assembled by hand from the raw weights the core saw (windows cut from an explicitly padded and
rolled index map).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vit_attention import create_attention, list_attention, plug
from vit_attention.analysis import record_attention
from vit_attention.attention import AttentionCall, get_attention_spec
from vit_attention.functional import register_attention_hook
from vit_attention.layers.layout_adapter import apply_attention

NAMES = [n for n in list_attention() if not get_attention_spec(n).weights_note]  # those that form weights
DIM = 32


def _plugged(name: str) -> nn.Sequential:
    spec = get_attention_spec(name)
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, DIM, 3, padding=1), plug(name, DIM, spec.example_heads, **spec.example_kwargs),
                         nn.Conv2d(DIM, 8, 1)).eval()


def _channel_axis(r) -> bool:
    """A record of attention over channels (DaViT): no grid, and ``query_map`` says why."""
    if r.layout.axis != "channels":
        return False
    assert r.grid is None and not r.is_self_attention
    with pytest.raises(ValueError, match="channels axis"):
        r.query_map((0, 0))
    return True


@pytest.mark.parametrize("name", NAMES)
def test_plugged_cnn_query_maps_sum_to_one_on_the_grid(name):
    net = _plugged(name)
    normalized = get_attention_spec(name).normalized_weights  # False: mixed after the softmax (talking heads)
    with record_attention(net) as rec, torch.no_grad():
        net(torch.randn(2, 3, 8, 8))
    (r,) = rec.records
    if _channel_axis(r):
        return
    assert r.module == "1.attn" and r.grid == (8, 8) and r.is_self_attention
    for row in range(8):
        for col in range(8):
            for head in (None, 1):
                m = r.query_map((row, col), head)  # [B, H, W]
                assert m.shape == (2, 8, 8) and bool(torch.isfinite(m).all())
                if normalized:
                    assert bool((m >= 0).all())
                    torch.testing.assert_close(m.sum(dim=(-2, -1)), torch.ones(2), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="outside the 8x8 grid"):
        r.query_map((8, 0))


@pytest.mark.parametrize("extra", [{}, {"pad_first": False}], ids=["default", "roll_then_pad"])
@pytest.mark.parametrize("name", NAMES)
def test_query_map_lies_where_the_output_depends(name, extra):
    """Non-zero exactly on the cells the query's output depends on (7x9: padded for windows)."""
    spec = get_attention_spec(name)
    if extra and not set(extra) <= spec.init_kwargs:
        extra = {}  # the mechanism has no such keyword: its default again
    torch.manual_seed(0)
    attn = create_attention(name, 16, 2, **spec.example_kwargs, **extra).eval()
    x = torch.randn(1, 7, 9, 16, requires_grad=True)
    with record_attention(attn) as rec:
        out = apply_attention(attn, x)  # [1, 7, 9, 16]
    (r,) = rec.records
    if _channel_axis(r):
        return
    for q in [(0, 0), (3, 4), (6, 8), (5, 1), (6, 0), (0, 8)]:
        x.grad = None
        out[0, q[0], q[1]].sum().backward(retain_graph=True)
        depends = x.grad[0].abs().sum(-1) > 1e-12  # [H, W]
        looks = r.query_map(q)[0].abs() > 1e-12  # [H, W]; either sign (mixed heads may be negative)
        assert torch.equal(depends, looks), (q, depends.int(), looks.int())


def _window_positions(H: int, W: int, ws: int, shift: int, pad_first: bool) -> torch.Tensor:
    """``[nW, ws²]`` flat map position of every window slot (-1 = padding), by padding and rolling an
    index map the way torchvision (pad, roll) and timm (roll, pad) do, and cutting windows by hand."""
    idx = torch.arange(H * W, dtype=torch.float32).view(1, 1, H, W)
    Hp, Wp = H + (-H) % ws, W + (-W) % ws
    sh = 0 if pad_first and Hp <= ws else shift
    sw = 0 if pad_first and Wp <= ws else shift
    if pad_first:
        grid = torch.roll(F.pad(idx, (0, Wp - W, 0, Hp - H), value=-1.0), (-sh, -sw), dims=(2, 3))
    else:
        grid = F.pad(torch.roll(idx, (-sh, -sw), dims=(2, 3)), (0, Wp - W, 0, Hp - H), value=-1.0)
    grid = grid[0, 0].long()
    return torch.stack([grid[i:i + ws, j:j + ws].reshape(-1) for i in range(0, Hp, ws) for j in range(0, Wp, ws)])


@pytest.mark.parametrize("name", ["window", "cosine_window"])
@pytest.mark.parametrize(("H", "W", "shift", "pad_first"),
                         [(8, 8, 0, True), (8, 8, 2, True), (7, 9, 2, True), (7, 9, 2, False), (7, 9, 0, False)])
def test_window_maps_equal_a_dense_oracle(name, H, W, shift, pad_first):
    ws, nh, B = 4, 2, 2
    torch.manual_seed(0)
    attn = create_attention(name, 16, nh, window_size=ws, shift_size=shift, pad_first=pad_first).eval()
    raw: list[torch.Tensor] = []
    handle = register_attention_hook(lambda w, info: raw.append(w.clone()))
    try:
        with record_attention(attn) as rec, torch.no_grad():
            attn(torch.randn(B, H, W, 16))
    finally:
        handle.remove()
    (r,) = rec.records
    (w,) = raw  # [B·nW, nh, n, n] (windows in batch) or [B, nW·nh, n, n] (folded into heads)
    pos = _window_positions(H, W, ws, shift, pad_first)  # [nW, n]
    nW, n = pos.shape
    per_window = w.view(B, nW, nh, n, n)  # both are this memory: image, window, head
    for head in (None, 0, 1):
        hw = per_window.mean(dim=2) if head is None else per_window[:, :, head]  # [B, nW, n, n]
        dense = torch.zeros(B, H * W, H * W)
        for win in range(nW):
            for i in range(n):
                for j in range(n):
                    if pos[win, i] >= 0 and pos[win, j] >= 0:
                        dense[:, pos[win, i], pos[win, j]] += hw[:, win, i, j]
        for q in range(H * W):
            row, col = divmod(q, W)
            torch.testing.assert_close(r.query_map((row, col), head), dense[:, q].view(B, H, W))
        # received: a key's weight from every row of its window (padding rows too), over the window's rows
        received = torch.zeros(B, H * W)
        for win in range(nW):
            for j in range(n):
                if pos[win, j] >= 0:
                    received[:, pos[win, j]] = hw[:, win, :, j].sum(-1) / n
        torch.testing.assert_close(r.received(head), received.view(B, H, W))
    # the weight a query puts on padding slots is not on the grid: the map sums to the rest
    slot_weight = per_window.mean(dim=2)  # [B, nW, n, n]
    on_grid = (slot_weight * (pos >= 0)[None, :, None, :]).sum(-1)  # [B, nW, n]
    for win, i in [(0, 0), (nW - 1, n - 1)]:
        if pos[win, i] >= 0:
            row, col = divmod(int(pos[win, i]), W)
            torch.testing.assert_close(r.query_map((row, col)).sum(dim=(-2, -1)), on_grid[:, win, i])


def test_global_record_with_prefix_tokens_places_the_patch_rows():
    torch.manual_seed(0)
    attn = create_attention("mhsa", 16, 2).eval()
    x = torch.randn(1, 2 + 12, 16)
    with record_attention(attn) as rec, torch.no_grad():
        apply_attention(attn, x, AttentionCall(feat_size=(3, 4), num_prefix_tokens=2))
    (r,) = rec.records
    assert r.grid == (3, 4) and r.num_prefix_tokens == 2 and r.has_class_token
    w = r.weights  # [1, nh, 14, 14]
    torch.testing.assert_close(r.query_map((2, 1))[0], w[0, :, 2 + 9, 2:].mean(0).view(3, 4))
    torch.testing.assert_close(r.query_map("cls", head=1)[0], w[0, 1, 0, 2:].view(3, 4))


def test_cross_attention_record_has_no_map():
    torch.manual_seed(0)
    attn = create_attention("mhsa", 16, 2).eval()
    with record_attention(attn) as rec, torch.no_grad():
        attn(torch.randn(1, 12, 16), AttentionCall(feat_size=(3, 4), context=torch.randn(1, 5, 16)))
    (r,) = rec.records
    assert not r.is_self_attention
    with pytest.raises(ValueError, match="not on the image grid"):
        r.query_map((0, 0))
