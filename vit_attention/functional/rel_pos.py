"""MViTv2's decomposed relative position bias (Li et al. 2022), used by ViTDet and SAM's image encoder.

The logit of query ``i`` (grid cell ``(qh, qw)``) for key ``j`` (cell ``(kh, kw)``) gets

    q_i · R_h[qh - kh + (K_h - 1)]  +  q_i · R_w[qw - kw + (K_w - 1)]

with ``q`` the *unscaled* query of the head and two learned tables ``R_h [2·K_h - 1, hd]`` and
``R_w [2·K_w - 1, hd]``. Instead of a ``(2K-1)²``-entry table per head (Swin), one table per axis,
shared by the heads, read through the query: the bias depends on the query's content.

:func:`decomposed_rel_pos_bias` returns it as the additive ``bias`` of the library's one attention
function (:func:`~.attention.scaled_dot_product_attention`): ``[*b, nh, N, M]``. It costs
``N·(K_h + K_w)·hd`` multiply-adds per head (two small products with the gathered tables), and
the bias itself is the size of the logits.

:func:`decomposed_rel_pos_qk` gives the same logits without materialising the bias: the position
term is a dot product with one-hot key coordinates, appended to q and k (``q' = [q·s | q·R_h | q·R_w]``,
``k' = [k | onehot(key row) | onehot(key col)]``), so the fused kernel runs in O(N) memory for
``(K_h + K_w)·N·M`` more multiply-adds per head (worth it for global attention on large maps: on
an H100, ViTDet-B's 64x64 global block in bf16 ran 3x faster in a tenth of the memory).

:func:`decomposed_rel_pos_pattern` gives the same logits to the ``"flex"`` backend: an
:class:`~.flex.AttentionPattern` with no mask whose ``score_mod`` adds ``rel_h[b, h, q, kv // kw] +
rel_w[b, h, q, kv % kw]``, read from the two small per-query terms ``[*b, nh, N, kh]`` and
``[*b, nh, N, kw]`` (never an ``N x M`` tensor): FlexAttention's form of ViTDet's global blocks.

Tables whose length is not ``2·max(q, k) - 1`` (a model run at another size than it was built for)
are resized linearly (``align_corners=False``), and the coordinates are scaled when the query and
key sizes differ: the rule of the references (detectron2 ``get_rel_pos``, Hugging Face VitDet,
timm ``samvit``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .flex import AttentionPattern, flex_buffer
from .window import to_pair

__all__ = ["resize_rel_pos", "rel_pos_table", "decomposed_rel_pos_bias", "decomposed_rel_pos_qk",
           "decomposed_rel_pos_pattern"]


def resize_rel_pos(rel_pos: Tensor, length: int) -> Tensor:
    """Linearly resize a table ``[L, hd]`` to ``[length, hd]`` (itself when ``L == length``)."""
    if rel_pos.dim() != 2:
        raise ValueError(f"rel_pos must be a table [L, hd], got shape {tuple(rel_pos.shape)}")
    if rel_pos.shape[0] == length:
        return rel_pos
    table = rel_pos.t().unsqueeze(0)  # [1, hd, L]
    table = F.interpolate(table.float(), size=length, mode="linear", align_corners=False).to(rel_pos.dtype)
    return table[0].t()  # [length, hd]


def rel_pos_table(q_size: int, k_size: int, rel_pos: Tensor) -> Tensor:
    """The table read at every (query, key) offset along one axis: ``[q_size, k_size, hd]``.

    ``rel_pos [L, hd]`` is resized to ``2·max(q_size, k_size) - 1`` rows when ``L`` differs; with
    ``q_size != k_size`` the shorter axis' coordinates are stretched to the longer one's.
    """
    if q_size <= 0 or k_size <= 0:
        raise ValueError(f"q_size and k_size must be positive, got {q_size} and {k_size}")
    table = resize_rel_pos(rel_pos, 2 * max(q_size, k_size) - 1)  # [2·max - 1, hd]
    q_coords = torch.arange(q_size, device=table.device)[:, None] * max(k_size / q_size, 1.0)  # [q, 1]
    k_coords = torch.arange(k_size, device=table.device)[None, :] * max(q_size / k_size, 1.0)  # [1, k]
    index = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)  # [q, k], >= 0
    return table[index.long()]  # [q, k, hd]


def _rel_terms(q: Tensor, rel_pos_h: Tensor, rel_pos_w: Tensor, q_size: int | Sequence[int],
               k_size: int | Sequence[int] | None) -> tuple[Tensor, Tensor]:
    """``q·R_h`` ``[*b, nh, qh, qw, kh]`` and ``q·R_w`` ``[*b, nh, qh, qw, kw]`` (shapes checked)."""
    qh, qw = to_pair(q_size, "q_size")
    kh, kw = to_pair(k_size if k_size is not None else (qh, qw), "k_size")
    if q.dim() < 3 or q.shape[-2] != qh * qw:
        raise ValueError(f"q must be [*b, nh, N, hd] with N = {qh}x{qw} = {qh * qw} (q_size), "
                         f"got shape {tuple(q.shape)}")
    hd = q.shape[-1]
    for name, t in (("rel_pos_h", rel_pos_h), ("rel_pos_w", rel_pos_w)):
        if t.dim() != 2 or t.shape[-1] != hd:
            raise ValueError(f"{name} must be a table [L, {hd}] (the head dim of q), got shape {tuple(t.shape)}")
    Rh = rel_pos_table(qh, kh, rel_pos_h).to(q.dtype)  # [qh, kh, hd]
    Rw = rel_pos_table(qw, kw, rel_pos_w).to(q.dtype)  # [qw, kw, hd]
    r_q = q.reshape(*q.shape[:-2], qh, qw, hd)  # [*b, nh, qh, qw, hd]
    rel_h = torch.einsum("...hwc,hkc->...hwk", r_q, Rh)  # [*b, nh, qh, qw, kh]
    rel_w = torch.einsum("...hwc,wkc->...hwk", r_q, Rw)  # [*b, nh, qh, qw, kw]
    return rel_h, rel_w


def decomposed_rel_pos_bias(q: Tensor, rel_pos_h: Tensor, rel_pos_w: Tensor, q_size: int | Sequence[int],
                            k_size: int | Sequence[int] | None = None) -> Tensor:
    """The decomposed relative-position bias for queries ``q``: ``[*b, nh, N, M]``.

    Args:
        q: unscaled queries ``[*b, nh, N, hd]``, ``N = qh·qw`` in row-major order of the query grid
            (windows or heads may be folded into the leading dims in any way).
        rel_pos_h: height table ``[Lh, hd]``; rel_pos_w: width table ``[Lw, hd]`` (resized when
            ``L != 2·max(q, k) - 1`` along that axis).
        q_size: the query grid ``(qh, qw)``; k_size: the key grid ``(kh, kw)`` (default: ``q_size``),
            ``M = kh·kw`` keys in row-major order.

    Returns:
        ``bias [*b, nh, N, M]`` with ``bias[..., (qh, qw), (kh, kw)] = q·R_h[qh, kh] + q·R_w[qw, kw]``,
        in ``q``'s dtype; pass it as ``bias=`` of the attention core.
    """
    rel_h, rel_w = _rel_terms(q, rel_pos_h, rel_pos_w, q_size, k_size)
    bias = rel_h.unsqueeze(-1) + rel_w.unsqueeze(-2)  # [*b, nh, qh, qw, kh, kw]
    return bias.flatten(-4, -3).flatten(-2)  # [*b, nh, N, M]


def decomposed_rel_pos_qk(q: Tensor, k: Tensor, rel_pos_h: Tensor, rel_pos_w: Tensor, q_size: int | Sequence[int],
                          k_size: int | Sequence[int] | None = None, *, scale: float) -> tuple[Tensor, Tensor]:
    """q and k whose dot product is ``(q·scale) kᵀ + decomposed_rel_pos_bias(q, ...)``: call the core with ``scale=1``.

    Args:
        q: unscaled queries ``[*b, nh, N, hd]`` on the grid ``q_size``; k: keys ``[*b, nh, M, hd]`` on
            ``k_size`` (default ``q_size``), both row-major; rel_pos_h, rel_pos_w: as
            :func:`decomposed_rel_pos_bias`; scale: the logit scale of ``q kᵀ``.

    Returns:
        ``q' = [q·scale | q·R_h | q·R_w]`` ``[*b, nh, N, hd + kh + kw]`` and
        ``k' = [k | onehot(key row) | onehot(key col)]`` ``[*b, nh, M, hd + kh + kw]``: the bias is
        never materialised, so the fused kernel applies (values keep their ``hd``).
    """
    rel_h, rel_w = _rel_terms(q, rel_pos_h, rel_pos_w, q_size, k_size)
    kh, kw = rel_h.shape[-1], rel_w.shape[-1]
    if k.shape[-2] != kh * kw or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must be [*b, nh, M, {q.shape[-1]}] with M = {kh}x{kw} (k_size), got {tuple(k.shape)}")
    q_aug = torch.cat([q * scale, rel_h.flatten(-3, -2), rel_w.flatten(-3, -2)], dim=-1)  # [*b, nh, N, hd+kh+kw]
    keys = torch.arange(kh * kw, device=k.device)
    onehot = torch.cat([F.one_hot(keys // kw, kh), F.one_hot(keys % kw, kw)], dim=-1).to(k.dtype)  # [M, kh+kw]
    k_aug = torch.cat([k, onehot.expand(*k.shape[:-1], kh + kw)], dim=-1)  # [*b, nh, M, hd+kh+kw]
    return q_aug, k_aug


def decomposed_rel_pos_pattern(q: Tensor, rel_pos_h: Tensor, rel_pos_w: Tensor, q_size: int | Sequence[int],
                               k_size: int | Sequence[int] | None = None) -> AttentionPattern:
    """The decomposed relative positions of queries ``q`` as a flex :class:`~.flex.AttentionPattern` (no mask).

    Args:
        q: unscaled queries ``[B, nh, N, hd]`` (4-D, as the flex call's), ``N = qh·qw`` row-major on ``q_size``.
        rel_pos_h, rel_pos_w, q_size, k_size: as :func:`decomposed_rel_pos_bias` (``M = kh·kw`` keys, row-major).

    Returns:
        A pattern over ``N`` queries and ``M`` keys whose ``score_mod`` adds ``rel_h[b, h, q, kv // kw] +
        rel_w[b, h, q, kv % kw]`` with ``rel_h = q·R_h`` ``[B, nh, N, kh]`` and ``rel_w = q·R_w`` ``[B, nh, N, kw]``
        (captured: gradients flow to ``q`` and the tables): the logits of the bias path without its ``[N, M]``
        tensor. No ``mask_mod`` (every key), so no block mask is built.
    """
    if q.dim() != 4:
        raise ValueError(f"decomposed_rel_pos_pattern needs q [B, nh, N, hd], got shape {tuple(q.shape)}")
    rel_h, rel_w = _rel_terms(q, rel_pos_h, rel_pos_w, q_size, k_size)
    kh, kw = rel_h.shape[-1], rel_w.shape[-1]
    rel_h, rel_w = flex_buffer(rel_h.flatten(2, 3)), flex_buffer(rel_w.flatten(2, 3))  # [B, nh, N, kh], [.., kw]

    def score_mod(score: Tensor, b: Tensor, h: Tensor, qi: Tensor, kv: Tensor) -> Tensor:
        return score + rel_h[b, h, qi, kv // kw] + rel_w[b, h, qi, kv % kw]

    return AttentionPattern(q.shape[-2], kh * kw, score_mod=score_mod, cache_key=("rel_pos", kh, kw))
