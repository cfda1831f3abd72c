"""MViTv2's decomposed relative-position bias (functional/rel_pos.py): a written-out oracle, Hugging Face's
``add_decomposed_relative_positions`` (resized tables, query and key grids of different sizes), the
``query_bias`` hook of ``window_attention``, and errors that name the argument."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.vitdet.modeling_vitdet import add_decomposed_relative_positions

from vit_attention.functional.rel_pos import (
    decomposed_rel_pos_bias,
    decomposed_rel_pos_qk,
    rel_pos_table,
    resize_rel_pos,
)
from vit_attention.functional.window_attention import window_attention, window_tokens


def _oracle(q: torch.Tensor, rh: torch.Tensor, rw: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """ViTDet's decomposed relative position (Li et al., ECCV 2022, arXiv 2203.16527) term by term, equal query /
    key grids and tables of 2K - 1 rows: [*, N, N]."""
    H, W = grid
    out = torch.zeros(*q.shape[:-1], H * W)
    for i in range(H * W):
        for j in range(H * W):
            (qi, qj), (ki, kj) = divmod(i, W), divmod(j, W)
            out[..., i, j] = (q[..., i, :] * rh[qi - ki + H - 1]).sum(-1) + (q[..., i, :] * rw[qj - kj + W - 1]).sum(-1)
    return out


@pytest.mark.parametrize("grid", [(3, 4), (1, 5), (2, 2)])
def test_equals_the_written_out_formula(grid):
    g = torch.Generator().manual_seed(0)
    H, W = grid
    q = torch.randn(2, 3, H * W, 8, generator=g)  # [B, nh, N, hd]
    rh, rw = torch.randn(2 * H - 1, 8, generator=g), torch.randn(2 * W - 1, 8, generator=g)
    bias = decomposed_rel_pos_bias(q, rh, rw, grid)
    assert bias.shape == (2, 3, H * W, H * W)
    torch.testing.assert_close(bias, _oracle(q, rh, rw, grid), rtol=1e-5, atol=1e-5)


@pytest.mark.parity
@pytest.mark.parametrize("q_size,k_size,lengths", [((4, 4), (4, 4), (7, 7)), ((4, 6), (4, 6), (5, 15)),
                                                   ((4, 4), (2, 2), (7, 3)), ((3, 5), (6, 5), (9, 9))])
def test_equals_hugging_face(q_size, k_size, lengths):
    """HF adds the term to logits [B·nh, N, M]; ours is the bias alone: add it to zeros. Covers the linear
    resize (tables not 2·max - 1 long) and the coordinate stretch of unequal query / key grids."""
    g = torch.Generator().manual_seed(1)
    N, M = q_size[0] * q_size[1], k_size[0] * k_size[1]
    q = torch.randn(6, N, 16, generator=g)  # HF: [B·nh, N, hd]
    rh, rw = torch.randn(lengths[0], 16, generator=g), torch.randn(lengths[1], 16, generator=g)
    ref = add_decomposed_relative_positions(torch.zeros(6, N, M), q, rh, rw, q_size, k_size)
    ours = decomposed_rel_pos_bias(q.view(2, 3, N, 16), rh, rw, q_size, k_size).reshape(6, N, M)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_resize_is_linear_interpolation_and_identity_at_length():
    t = torch.randn(7, 4)
    assert resize_rel_pos(t, 7) is t
    ref = F.interpolate(t.t()[None], size=13, mode="linear", align_corners=False)[0].t()
    torch.testing.assert_close(resize_rel_pos(t, 13), ref)
    assert rel_pos_table(3, 3, t[:5]).shape == (3, 3, 4)
    assert torch.equal(rel_pos_table(3, 3, t[:5])[0, 2], t[0]) and torch.equal(rel_pos_table(3, 3, t[:5])[2, 0], t[4])


def test_bias_carries_gradients_to_the_tables_and_q():
    q = torch.randn(1, 2, 6, 4, requires_grad=True)
    rh, rw = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    decomposed_rel_pos_bias(q, rh, rw, (2, 3)).square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, rh, rw))


def test_bad_shapes_name_the_argument():
    q = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match="q_size"):
        decomposed_rel_pos_bias(q, torch.randn(3, 4), torch.randn(5, 4), (2, 2))
    with pytest.raises(ValueError, match="rel_pos_w"):
        decomposed_rel_pos_bias(q, torch.randn(3, 4), torch.randn(5, 3), (2, 3))
    with pytest.raises(ValueError, match="rel_pos"):
        resize_rel_pos(torch.randn(3, 4, 1), 5)


@pytest.mark.parametrize("hw", [(4, 4), (5, 7)])  # unpadded (windows in the batch) and padded (in the heads)
def test_window_attention_query_bias_is_added_per_window(hw):
    """query_bias sees every window's queries in row-major window order, whichever way windows are folded:
    a bias that is zero changes nothing, and the decomposed bias equals per-window attention done by hand."""
    g = torch.Generator().manual_seed(2)
    H, W = hw
    nh, hd, ws = 2, 4, 2
    x = torch.randn(1, H, W, nh * hd, generator=g)
    wq = torch.randn(3 * nh * hd, nh * hd, generator=g) / 3
    rh, rw = torch.randn(3, hd, generator=g), torch.randn(3, hd, generator=g)
    qkv = window_tokens(x, ws) @ wq.T
    kw = dict(feat_size=hw, num_heads=nh, window_size=ws)
    plain = window_attention(qkv, None, **kw)
    torch.testing.assert_close(window_attention(qkv, None, query_bias=lambda q: torch.zeros_like(q[..., :1]), **kw),
                               plain)
    out = window_attention(qkv, None, query_bias=lambda q: decomposed_rel_pos_bias(q, rh, rw, (ws, ws)), **kw)
    xp = F.pad(x, (0, 0, 0, (-W) % ws, 0, (-H) % ws))  # the references' unmasked zero padding
    ref = torch.zeros_like(xp)
    for i in range(0, xp.shape[1], ws):
        for j in range(0, xp.shape[2], ws):
            t = xp[:, i:i + ws, j:j + ws].reshape(1, -1, nh * hd) @ wq.T
            q, k, v = t.view(1, -1, 3, nh, hd).permute(2, 0, 3, 1, 4)  # each [1, nh, N, hd]
            a = (q @ k.transpose(-2, -1) * hd ** -0.5 + decomposed_rel_pos_bias(q, rh, rw, (ws, ws))).softmax(-1)
            ref[:, i:i + ws, j:j + ws] = (a @ v).transpose(1, 2).reshape(1, ws, ws, nh * hd)
    torch.testing.assert_close(out.view(1, H, W, -1), ref[:, :H, :W], rtol=1e-5, atol=1e-6)
    assert (out - plain).abs().max() > 1e-3


@pytest.mark.parametrize("q_size,k_size", [((4, 5), (4, 5)), ((3, 3), (6, 2))])
def test_augmented_q_k_give_the_same_logits(q_size, k_size):
    """decomposed_rel_pos_qk: (q'·k'ᵀ) == (q·scale)·kᵀ + bias, for equal and unequal grids (resized tables)."""
    g = torch.Generator().manual_seed(3)
    N, M = q_size[0] * q_size[1], k_size[0] * k_size[1]
    q, k = torch.randn(2, 3, N, 8, generator=g), torch.randn(2, 3, M, 8, generator=g)
    rh, rw = torch.randn(9, 8, generator=g), torch.randn(5, 8, generator=g)
    qa, ka = decomposed_rel_pos_qk(q, k, rh, rw, q_size, k_size, scale=0.35)
    assert qa.shape == (2, 3, N, 8 + k_size[0] + k_size[1]) and ka.shape == (2, 3, M, qa.shape[-1])
    ref = (q * 0.35) @ k.transpose(-2, -1) + decomposed_rel_pos_bias(q, rh, rw, q_size, k_size)
    torch.testing.assert_close(qa @ ka.transpose(-2, -1), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="k_size"):
        decomposed_rel_pos_qk(q, k[..., :-1, :], rh, rw, q_size, k_size, scale=1.0)
