"""Index plans of ViL's 2-D Longformer attention (Zhang et al. 2021, "Multi-Scale Vision Longformer").

An ``H x W`` map is cut into ``W_c x W_c`` chunks on a fixed grid (``w = window_size``; the map is
thought of as padded bottom / right to ``(mx·w) x (my·w)``, ``mx = ceil(H / w)``, ``my = ceil(W / w)``).
The queries of chunk ``(m, n)`` attend to the keys of the ``3 x 3`` block of chunks
``(m + a, n + b)``, ``a, b ∈ {-1, 0, 1}``, plus every global (prefix) token; keys outside the map
(beyond a border chunk, or in the padding) are masked: the original's ``exact=0`` ("sliding chunk
with zero padding", the ViL default). The mask depends on the chunk only, never on the query inside it.

Key slots are ordered as the original ``slidingchunk_2d``: the global tokens first, then the nine
neighbour chunks row-major over ``(a, b)`` (``(-1, -1), (-1, 0), ..., (1, 1)``), each chunk's
``w²`` slots row-major, so its relative-position index table
(:func:`longformer2d_rel_index`, ``[w², 9w²]`` into a ``(4w - 1)²`` table) applies unchanged.

Nothing ``N x N`` is built: each chunk is one small dense problem ``[w²] x [G + 9w²]`` for the
library's single attention function (all chunks in one call). Plans depend only on sizes and are
cached (read-only CPU tensors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .layout import PAD, AttentionLayout, prefix_code
from .neighborhood import MASKED
from .window import _CPU, _cached

__all__ = ["Longformer2DPlan", "longformer2d_plan", "longformer2d_rel_index", "longformer2d_layouts",
           "longformer2d_device_plan"]


@dataclass(frozen=True, eq=False)
class Longformer2DPlan:
    """Index plan of one ``H x W`` map and window ``w`` (CPU tensors; ``nc = mx·my`` chunks).

    Attributes:
        query_index ``[nc, w²]``: flat map index ``r·W + c`` of each chunk slot, ``-1`` = padding.
        query_gather ``[nc, w²]``: the same with each padding slot replaced by its chunk's first
            query (always inside the map): it computes that query's row again (the mask is per chunk).
        slot_of ``[H·W]``: the slot ``chunk·w² + i`` holding each map position (to read outputs back).
        key_index ``[nc, 9w²]``: flat map index of each neighbour-chunk key slot, ``-1`` = outside the map.
        valid ``[nc, 9w²]``: ``key_index >= 0``.
        chunks: ``(mx, my)``; window: ``w``.
    """

    query_index: Tensor
    query_gather: Tensor
    slot_of: Tensor
    key_index: Tensor
    valid: Tensor
    chunks: tuple[int, int]
    window: int

    @property
    def num_chunks(self) -> int:
        """``nc = mx·my``."""
        return self.chunks[0] * self.chunks[1]


@_cached(maxsize=64)
def _plan(H: int, W: int, w: int) -> Longformer2DPlan:
    mx, my = math.ceil(H / w), math.ceil(W / w)
    rows = torch.arange(mx * w, device=_CPU).view(mx, w)  # [mx, w]: padded row of chunk m, slot x
    cols = torch.arange(my * w, device=_CPU).view(my, w)  # [my, w]

    def chunk_index(r: Tensor, c: Tensor) -> Tensor:  # [a, w], [b, w] -> [a·b, w²] flat index, -1 outside
        inside = (r[:, None, :, None] >= 0) & (r[:, None, :, None] < H) & (c[None, :, None, :] >= 0) \
            & (c[None, :, None, :] < W)
        flat = r[:, None, :, None] * W + c[None, :, None, :]
        return torch.where(inside, flat, -1).reshape(r.shape[0] * c.shape[0], w * w)

    query_index = chunk_index(rows, cols)  # [nc, w²]
    query_gather = torch.where(query_index >= 0, query_index, query_index[:, :1])
    slot = torch.arange(mx * my * w * w, device=_CPU).view(mx * my, w * w)
    slot_of = torch.empty(H * W, dtype=torch.long, device=_CPU)
    keep = query_index >= 0
    slot_of[query_index[keep]] = slot[keep]
    # neighbour chunks (a, b) row-major; chunk (m + a, n + b) holds padded rows (m + a)·w + x
    parts = [chunk_index(rows + a * w, cols + b * w) for a in (-1, 0, 1) for b in (-1, 0, 1)]  # 9 x [nc, w²]
    key_index = torch.cat(parts, dim=1)  # [nc, 9w²]
    return Longformer2DPlan(query_index, query_gather, slot_of, key_index, key_index >= 0, (mx, my), w)


def longformer2d_plan(H: int, W: int, window_size: int) -> Longformer2DPlan:
    """The chunk plan of an ``H x W`` map with window ``w``: see :class:`Longformer2DPlan`. Cached."""
    if not isinstance(window_size, int) or isinstance(window_size, bool) or window_size < 1:
        raise ValueError(f"window_size must be a positive int, got {window_size!r}")
    if int(H) < 1 or int(W) < 1:
        raise ValueError(f"feat_size must be positive, got {(H, W)}")
    return _plan(int(H), int(W), window_size)


@_cached(maxsize=16)
def _rel_index(w: int) -> Tensor:
    q = torch.arange(w * w, device=_CPU)
    qy, qx = q // w, q % w  # [w²]
    ky = torch.cat([torch.arange(w, device=_CPU).repeat_interleave(w) + a * w for a in (-1, 0, 1) for _ in range(3)])
    kx = torch.cat([torch.arange(w, device=_CPU).repeat(w) + b * w for _ in (-1, 0, 1) for b in (-1, 0, 1)])
    ry = qy[:, None] - ky[None, :] + 2 * w - 1  # [w², 9w²] in [0, 4w - 2]
    rx = qx[:, None] - kx[None, :] + 2 * w - 1
    return ry * (4 * w - 1) + rx


def longformer2d_rel_index(window_size: int) -> Tensor:
    """``[w², 9w²]``: index into the ``(4w - 1)²`` local relative-position table of query slot ``i``
    (row-major in its chunk) and key slot ``j`` (neighbour order of the module docstring). Cached."""
    return _rel_index(int(window_size))


@_cached(maxsize=64)
def longformer2d_device_plan(H: int, W: int, w: int, num_global: int, device: torch.device
                             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Plan tensors on ``device``: query gather ``[nc·w²]`` (map indices) and key gather
    ``[nc·(G + 9w²)]`` (token indices into ``[G + H·W]``; keys outside the map point at token 0 and are masked), the
    mask as an additive bias ``[nc, 1, 1, G + 9w²]`` (0 / :data:`MASKED`), the read-back index ``[H·W]``."""
    plan = longformer2d_plan(H, W, w)
    G, nc = num_global, plan.num_chunks
    glob = torch.arange(G, device=_CPU).expand(nc, G)
    keys = torch.cat([glob, torch.where(plan.valid, plan.key_index + G, 0)], dim=1)  # [nc, G + 9w²]
    allowed = torch.cat([torch.ones(nc, G, dtype=torch.bool, device=_CPU), plan.valid], dim=1)[:, None, None]
    mask = torch.zeros(allowed.shape, device=_CPU).masked_fill_(~allowed, MASKED)
    return (plan.query_gather.reshape(-1).to(device), keys.reshape(-1).to(device), mask.to(device),
            plan.slot_of.to(device))


@_cached(maxsize=64)
def _layouts(H: int, W: int, w: int, G: int) -> tuple[AttentionLayout, AttentionLayout | None]:
    plan = longformer2d_plan(H, W, w)
    nc = plan.num_chunks
    prefix = torch.tensor([prefix_code(p) for p in range(G)], dtype=torch.long, device=_CPU)
    keys = torch.cat([prefix.expand(nc, G), torch.where(plan.valid, plan.key_index, PAD)], dim=1)
    local = AttentionLayout((H, W), torch.where(plan.query_index >= 0, plan.query_index, PAD), keys, fold="heads")
    if not G:
        return local, None
    all_keys = torch.cat([prefix, torch.arange(H * W, device=_CPU)])
    return local, AttentionLayout((H, W), prefix, all_keys)


def longformer2d_layouts(H: int, W: int, window_size: int, num_global: int
                         ) -> tuple[AttentionLayout, AttentionLayout | None]:
    """Where the rows sit: the local call (groups = chunks folded into the heads, ``[B, nc·nh, w², G + 9w²]``
    weights) and the
    global call (one group: the ``G`` global queries x all ``G + H·W`` keys; None without globals)."""
    return _layouts(int(H), int(W), int(window_size), int(num_global))
