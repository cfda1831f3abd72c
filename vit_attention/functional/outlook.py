"""Outlook attention's window plumbing (VOLO, Yuan et al. 2022): the overlapping ``K x K`` windows of a map.

Outlook attention cuts a channels-last map ``[B, H, W, C]`` into ``h·w`` overlapping ``K x K`` windows
(stride ``s``, zero padding ``p = (K - 1) / 2``: ``h, w = ceil(H/s), ceil(W/s)``), mixes the ``K²`` values of each
window with generated ``K² x K²`` weights and sums the windows' outputs back onto the map. These functions are
that cutting and summing, as ``torch.nn.functional.unfold`` / ``fold`` with heads split out, plus where each
window's slots sit on the image (:func:`outlook_layout`, for the attention observers). The channel order of
``unfold`` is channel-major (``c·K² + slot``) and heads are contiguous blocks of ``hd`` channels, as in timm 1.0.31
``timm/models/volo.py`` and sail-sg/volo ``models/volo.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .layout import PAD, AttentionLayout
from .runtime import capturing
from .window import _CPU, _cached

__all__ = ["outlook_grid", "outlook_unfold", "outlook_fold", "outlook_layout", "check_outlook_geometry"]


def check_outlook_geometry(kernel_size: int, padding: int, stride: int) -> None:
    """Raise ``ValueError`` unless ``kernel_size`` is a positive odd int, ``padding = (kernel_size - 1) / 2`` and
    ``stride`` a positive int: the only windows whose count is the pooled grid ``ceil(H/s) x ceil(W/s)`` at every
    map size (the weights are generated per pooled cell)."""
    for name, value in (("kernel_size", kernel_size), ("stride", stride), ("padding", padding)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "padding" else 1):
            raise ValueError(f"{name} must be a {'non-negative' if name == 'padding' else 'positive'} int, "
                             f"got {value!r}")
    if kernel_size % 2 == 0 or padding != (kernel_size - 1) // 2:
        raise ValueError(f"kernel_size must be odd and padding (kernel_size - 1) // 2 (one window per pooled cell, "
                         f"ceil(H/stride) x ceil(W/stride)), got kernel_size={kernel_size}, padding={padding}")


def outlook_grid(H: int, W: int, stride: int) -> tuple[int, int]:
    """The window grid ``(h, w) = (ceil(H/s), ceil(W/s))`` of an ``H x W`` map (= the ceil-mode pooled grid)."""
    return -(-H // stride), -(-W // stride)


def outlook_unfold(v: Tensor, num_heads: int, kernel_size: int, padding: int, stride: int) -> Tensor:
    """The windows' values: ``v [B, H, W, C] -> [B, h·w, nh, K², hd]`` (zeros past the border)."""
    B, H, W, C = v.shape
    h, w = outlook_grid(H, W, stride)
    K2 = kernel_size * kernel_size
    cols = F.unfold(v.permute(0, 3, 1, 2), kernel_size, padding=padding, stride=stride)  # [B, C·K², h·w]
    return cols.reshape(B, num_heads, C // num_heads, K2, h * w).permute(0, 4, 1, 3, 2)  # [B, h·w, nh, K², hd]


def outlook_fold(out: Tensor, size: tuple[int, int], kernel_size: int, padding: int, stride: int) -> Tensor:
    """The windows' outputs summed back onto the map: ``[B, h·w, nh, K², hd] -> [B, H, W, C]``.

    Overlapping slots add up (a pixel gets 1 to ``ceil(K/s)²`` contributions); nothing is averaged. Eager runs
    ``torch.nn.functional.fold``; while torch captures a graph (export, ONNX, compile) the same sum is written with
    pads, adds and reshapes (:func:`_fold_by_shifts`: ONNX opset 17 has no ``col2im``).
    """
    if capturing():
        return _fold_by_shifts(out, size, kernel_size, padding, stride)
    B, L, nh, K2, hd = out.shape
    cols = out.permute(0, 2, 4, 3, 1).reshape(B, nh * hd * K2, L)  # [B, C·K², h·w]
    y = F.fold(cols, size, kernel_size, padding=padding, stride=stride)  # [B, C, H, W]
    return y.permute(0, 2, 3, 1)  # [B, H, W, C]


def _fold_by_shifts(out: Tensor, size: tuple[int, int], K: int, p: int, s: int) -> Tensor:
    """:func:`outlook_fold` with no scatter: ``[B, h·w, nh, K², hd] -> [B, H, W, C]``.

    Slot ``(a, b)`` of window ``(i, j)`` lands on pixel ``(s·i + a - p, s·j + b - p)``: writing ``a - p = s·q + t``
    (``0 <= t < s``), that is phase ``t`` of cell ``i + q``. Each slot's map ``[B, h, w, C]`` is shifted by its cell
    offset ``q`` (zero padding) and added to its phase's map; the ``s x s`` phase maps interleave into the image.
    """
    B, L, nh, K2, hd = out.shape
    H, W = size
    h, w = outlook_grid(H, W, s)
    y = out.reshape(B, h, w, nh, K, K, hd)
    before, after = -(-p // s), (K - 1 - p) // s  # cells the shifts reach before / after the grid
    hh, ww = h + before + after, w + before + after
    phases: dict[tuple[int, int], Tensor] = {}
    for a in range(K):
        qa, ta = divmod(a - p, s)
        for b in range(K):
            qb, tb = divmod(b - p, s)
            t = y[:, :, :, :, a, b].reshape(B, h, w, nh * hd)  # [B, h, w, C]
            t = F.pad(t, (0, 0, qb + before, after - qb, qa + before, after - qa))  # [B, hh, ww, C]
            phases[ta, tb] = t if (ta, tb) not in phases else phases[ta, tb] + t
    zeros = out.new_zeros(B, hh, ww, nh * hd)
    rows = [torch.stack([phases.get((ta, tb), zeros) for tb in range(s)], dim=3) for ta in range(s)]
    full = torch.stack(rows, dim=2).reshape(B, hh * s, ww * s, nh * hd)  # [B, hh, s, ww, s, C] interleaved
    return full[:, before * s:before * s + H, before * s:before * s + W]  # [B, H, W, C]


@_cached(maxsize=64)
def _outlook_layout(H: int, W: int, K: int, p: int, s: int) -> AttentionLayout:
    h, w = outlook_grid(H, W, s)
    oy = torch.arange(h, device=_CPU)[:, None] * s - p + torch.arange(K, device=_CPU)[None]  # [h, K] rows
    ox = torch.arange(w, device=_CPU)[:, None] * s - p + torch.arange(K, device=_CPU)[None]  # [w, K] cols
    rows, cols = oy[:, None, :, None], ox[None, :, None, :]  # [h, 1, K, 1], [1, w, 1, K]
    inside = (rows >= 0) & (rows < H) & (cols >= 0) & (cols < W)  # [h, w, K, K]
    pos = torch.where(inside, rows * W + cols, torch.full((), PAD, device=_CPU))  # [h, w, K, K]
    pos = pos.reshape(h * w, K * K)  # [G = h·w windows, K² slots]
    return AttentionLayout((H, W), pos, pos, fold="batch")


def outlook_layout(H: int, W: int, kernel_size: int, padding: int, stride: int) -> AttentionLayout:
    """Where the slots of each window sit on the ``H x W`` map: ``h·w`` groups of ``K²`` query rows (the window's
    output slots) and ``K²`` keys (its source slots), ``-1`` past the border; weights ``[B, h·w, nh, K², K²]``
    (``fold="batch"``). A pixel inside several windows has one row in each (observers take their mean). Cached."""
    return _outlook_layout(int(H), int(W), int(kernel_size), int(padding), int(stride))
