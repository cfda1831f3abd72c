"""Window partition / reverse, padding, shift masks and relative-position helpers (functional/window.py)."""

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from vit_attention.functional.window import (
    MASK_VALUE,
    log_relative_coords_table,
    num_windows,
    pad_to_window,
    relative_position_index,
    shift_window_mask,
    to_pair,
    window_partition,
    window_reverse,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sizes = st.integers(1, 5)


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), nh=sizes, nw=sizes, wh=sizes, ww=sizes, C=st.integers(1, 6))
def test_partition_reverse_round_trip(B, nh, nw, wh, ww, C):
    H, W = nh * wh, nw * ww
    x = torch.randn(B, H, W, C)
    win = window_partition(x, (wh, ww))
    assert win.shape == (B * nh * nw, wh * ww, C)
    assert torch.equal(window_reverse(win, (wh, ww), H, W), x)
    # the 4-D window form reverses too
    assert torch.equal(window_reverse(win.view(-1, wh, ww, C), (wh, ww), H, W), x)


@settings(max_examples=60, deadline=None)
@given(H=st.integers(1, 17), W=st.integers(1, 17), wh=st.integers(1, 7), ww=st.integers(1, 7))
def test_pad_partition_reverse_crop_round_trip_any_size(H, W, wh, ww):
    x = torch.randn(2, H, W, 3)
    xp, (ph, pw) = pad_to_window(x, (wh, ww))
    assert xp.shape == (2, H + ph, W + pw, 3) and (H + ph) % wh == 0 and (W + pw) % ww == 0
    assert 0 <= ph < wh and 0 <= pw < ww
    assert not xp[:, H:].any() and not xp[:, :, W:].any()  # zero padding bottom / right
    win = window_partition(xp, (wh, ww))
    assert win.shape[0] == 2 * num_windows(H, W, (wh, ww))
    assert torch.equal(window_reverse(win, (wh, ww), H + ph, W + pw)[:, :H, :W], x)


def test_partition_window_order_and_content():
    B, H, W, C, wh, ww = 2, 6, 8, 3, 3, 4
    x = torch.arange(B * H * W * C, dtype=torch.float32).view(B, H, W, C)
    win = window_partition(x, (wh, ww))  # [B·nW, N, C]
    nWh, nWw = H // wh, W // ww
    for b in range(B):
        for i in range(nWh):
            for j in range(nWw):
                expect = x[b, i * wh:(i + 1) * wh, j * ww:(j + 1) * ww].reshape(wh * ww, C)  # row-major tokens
                assert torch.equal(win[b * nWh * nWw + i * nWw + j], expect)


def test_partition_errors_name_the_problem():
    with pytest.raises(ValueError, match="not a multiple of window_size"):
        window_partition(torch.randn(1, 7, 8, 2), 4)
    with pytest.raises(ValueError, match=r"\[B, H, W, C\]"):
        window_partition(torch.randn(7, 8, 2), 4)
    with pytest.raises(ValueError, match="window_size must be an int or a pair"):
        to_pair((1, 2, 3))


def test_relative_position_index_brute_force_and_cached():
    wh, ww = 3, 5
    idx = relative_position_index((wh, ww))
    N = wh * ww
    assert idx.shape == (N, N) and idx.dtype == torch.int64
    for i in range(N):
        for j in range(N):
            dh, dw = i // ww - j // ww, i % ww - j % ww
            assert idx[i, j] == (dh + wh - 1) * (2 * ww - 1) + (dw + ww - 1)
    assert idx.min() == 0 and idx.max() == (2 * wh - 1) * (2 * ww - 1) - 1
    assert relative_position_index((wh, ww)) is idx  # built once


def _slice_mask(Hp, Wp, wh, ww, sh, sw):
    """The reference construction: labels by slices (0,-Ws) (-Ws,-s) (-s,None) per axis."""
    img = torch.zeros(1, Hp, Wp, 1)
    cnt = 0
    for hs in (slice(0, -wh), slice(-wh, -sh), slice(-sh, None)):
        for ws in (slice(0, -ww), slice(-ww, -sw), slice(-sw, None)):
            img[:, hs, ws, :] = cnt
            cnt += 1
    lab = window_partition(img, (wh, ww)).squeeze(-1)  # [nW, N]
    diff = lab[:, None, :] - lab[:, :, None]
    return diff.masked_fill(diff != 0, MASK_VALUE).masked_fill(diff == 0, 0.0)


@settings(max_examples=40, deadline=None)
@given(nh=st.integers(1, 4), nw=st.integers(1, 4), wh=st.integers(2, 6), ww=st.integers(2, 6), data=st.data())
def test_shift_mask_matches_slice_construction(nh, nw, wh, ww, data):
    sh = data.draw(st.integers(1, wh - 1))
    sw = data.draw(st.integers(1, ww - 1))
    Hp, Wp = nh * wh, nw * ww
    mask = shift_window_mask(Hp, Wp, (wh, ww), (sh, sw))
    assert mask.shape == (nh * nw, wh * ww, wh * ww)
    assert torch.equal(mask, _slice_mask(Hp, Wp, wh, ww, sh, sw))
    assert torch.equal(mask, mask.transpose(1, 2))
    assert torch.all(mask.diagonal(dim1=1, dim2=2) == 0)
    assert set(mask.unique().tolist()) <= {0.0, MASK_VALUE}


def test_shift_mask_only_last_row_and_column_of_windows_are_split():
    mask = shift_window_mask(8, 8, 4, 2)  # 2x2 windows; window 0 is untouched by the wrap-around
    assert torch.all(mask[0] == 0)
    assert torch.any(mask[1] != 0) and torch.any(mask[2] != 0) and torch.any(mask[3] != 0)
    # an unshifted axis is not split: shift only along W
    m = shift_window_mask(8, 8, 4, (0, 2))
    assert torch.equal(m[0], m[2]) and torch.all(m[0] == 0) and torch.any(m[1] != 0)


def test_shift_mask_cached_per_size_and_validated():
    a = shift_window_mask(14, 14, 7, 3)
    assert shift_window_mask(14, 14, 7, 3) is a
    assert shift_window_mask(21, 14, 7, 3) is not a
    with pytest.raises(ValueError, match="smaller than window_size"):
        shift_window_mask(14, 14, 7, 7)
    with pytest.raises(ValueError, match="not a multiple"):
        shift_window_mask(15, 14, 7, 3)


@pytest.mark.parity
@pytest.mark.parametrize("case", ["timm_swin", "timm_swin_pad60", "timm_swinv2_pretrained_ws"])
def test_masks_and_tables_equal_reference_buffers(case):
    t = load_file(FIXTURES / f"{case}.safetensors")
    idx = relative_position_index(4)
    assert torch.equal(t["nonpersistent.layers.0.blocks.0.attn.relative_position_index"], idx)
    # stage 0 is 16x16 (15x15 padded to 16 for pad60), stage 1 is 8x8; window 4, shift 2
    assert torch.equal(t["nonpersistent.layers.0.blocks.1.attn_mask"], shift_window_mask(16, 16, 4, 2))
    assert torch.equal(t["nonpersistent.layers.1.blocks.1.attn_mask"], shift_window_mask(8, 8, 4, 2))
    key = "nonpersistent.layers.0.blocks.0.attn.relative_coords_table"
    if key in t:  # SwinV2, coordinates normalised by the pre-training window 8
        assert torch.equal(t[key][0], log_relative_coords_table(4, 8))
        assert not torch.equal(t[key][0], log_relative_coords_table(4, 0))


def test_log_coords_table_formula():
    table = log_relative_coords_table((3, 5))
    assert table.shape == (5, 9, 2)
    # the extreme offsets map to +-8 before the log: log2(9) / log2(8)
    expect = torch.log2(torch.tensor(9.0)) / 3
    torch.testing.assert_close(table[-1, -1], torch.stack([expect, expect]))
    torch.testing.assert_close(table[0, 0], -torch.stack([expect, expect]))
    assert torch.all(table[2, 4] == 0)


@pytest.mark.parametrize("H,W,shift,pad_first", [(8, 8, 2, True), (6, 10, 2, True), (6, 10, 2, False), (8, 8, 0, True),
                                                 (7, 9, 0, False)])
def test_window_head_gather_index_round_trip(H, W, shift, pad_first):
    from vit_attention.functional.window import window_gather_index, window_head_gather_index

    ws, nh, hd = 4, 3, 2
    qkv_rows, out_rows = window_head_gather_index(H, W, ws, shift, nh, pad_first=pad_first)
    fwd, _ = window_gather_index(H, W, ws, shift, pad_first=pad_first)
    N, nW = ws * ws, fwd.numel() // (ws * ws)
    T = H * W + 1  # with the zero token
    # packed projection [T, 3, nh, hd] whose value encodes (token, which, head)
    tok = torch.arange(T).view(T, 1, 1, 1).float()
    qkv = (tok * 100 + torch.arange(3).view(1, 3, 1, 1) * 10 + torch.arange(nh).view(1, 1, nh, 1)).expand(T, 3, nh, hd)
    g = qkv.reshape(1, -1, hd).index_select(1, qkv_rows).view(3, nW, nh, N, hd)
    expect = (fwd.view(nW, 1, N).float() * 100 + torch.arange(nh).view(1, nh, 1)).unsqueeze(0) + \
        torch.arange(3).view(3, 1, 1, 1) * 10
    assert torch.equal(g[..., 0], expect)  # q/k/v of window slot (w, n), head h = token fwd[w·N + n]
    back = g[0].reshape(1, -1, hd).index_select(1, out_rows).view(H * W, nh, hd)  # q rows back in token order
    assert torch.equal(back[:, :, 0], torch.arange(H * W).view(-1, 1).float() * 100 + torch.arange(nh).view(1, nh))
    with pytest.raises(ValueError, match="num_heads"):
        window_head_gather_index(H, W, ws, shift, 0)


@pytest.mark.parametrize("bad", ["12", "ab", True, (1,), (1.5, 2), (True, 2), None, 2.0])
def test_to_pair_rejects_what_is_not_an_int_or_a_pair_of_ints(bad):
    from vit_attention.functional.window import to_pair

    with pytest.raises(ValueError, match="window_size must be an int or a pair of ints"):
        to_pair(bad)
