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

For the ``"flex"`` backend the same rule is written once over the whole sequence
(:func:`longformer2d_pattern`): an :class:`~.flex.AttentionPattern` whose ``mask_mod`` lets a global
query or key through and otherwise compares the chunks ``(r // w, c // w)`` of query and key (at most
one apart on each axis), and whose ``score_mod`` reads the relative-position tables (local
``(4w - 1)²`` table at ``(Δr + 2w - 1)·(4w - 1) + Δc + 2w - 1``, global-to-local, global-to-global).
The map tokens may be put in chunk-major order (:data:`ORDERS`, ``"tiled"``): the block mask then
skips more blocks than in row-major order (``longformer2d_sparsity``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .flex import AttentionPattern, flex_buffer
from .layout import PAD, AttentionLayout, prefix_code
from .neighborhood import MASKED
from .window import _CPU, _cached

__all__ = ["Longformer2DPlan", "longformer2d_plan", "longformer2d_rel_index", "longformer2d_layouts",
           "longformer2d_device_plan", "ORDERS", "longformer2d_order", "longformer2d_sequence_index",
           "longformer2d_pattern", "longformer2d_sparsity"]


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


@_cached(maxsize=64, constant_under_compile=True)
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


@_cached(maxsize=64, constant_under_compile=True)
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


# ----------------------------------------------------------------------------- the pattern (flex backend)
# token orders of the map in the flex call (the globals first in each): "row" (row-major, as the module's input),
# "tiled" (chunk-major: chunks row-major, each chunk's positions row-major) or "snake" (chunk-major with the
# chunks of odd chunk rows right to left, so consecutive chunk rows meet at their ends)
ORDERS: tuple[str, ...] = ("row", "tiled", "snake")
# the order the module runs on flex: the one whose block mask skips the most 128 x 128 blocks (longformer2d_sparsity,
# G = 1): ViL-S stage 1 (56x56, w 7) row 52.9 %, tiled 59.5 %, snake 64.5 %; ViL-B stage 1 (96x96, w 6) 76.9 /
# 86.8 / 86.6 %; ViL-B stage 2 (48x48, w 8) 36.8 / 45.4 / 46.7 %
DEFAULT_ORDER = "snake"


def _check_order(order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {list(ORDERS)}, got {order!r}")
    return order


@_cached(maxsize=64, constant_under_compile=True)
def _order(H: int, W: int, w: int, order: str) -> Tensor:
    if order == "row":
        return torch.arange(H * W, device=_CPU)
    plan = longformer2d_plan(H, W, w)
    index = plan.query_index.view(*plan.chunks, w * w)  # [mx, my, w²]
    if order == "snake":
        index = index.clone()
        index[1::2] = index[1::2].flip(1)  # odd chunk rows right to left
    index = index.reshape(-1)
    return index[index >= 0].clone()  # [H·W]: chunk-major, padding slots dropped


def longformer2d_order(H: int, W: int, window_size: int, order: str = DEFAULT_ORDER) -> Tensor | None:
    """The flat map index (row-major ``r·W + c``) at each map position of the flex sequence: ``[H·W]`` (CPU);
    None for ``"row"`` (the identity). Cached."""
    if _check_order(order) == "row":
        return None
    longformer2d_plan(H, W, window_size)  # checks the sizes
    return _order(int(H), int(W), int(window_size), order)


@_cached(maxsize=64)
def _sequence_index(H: int, W: int, w: int, G: int, order: str, device: torch.device) -> tuple[Tensor, Tensor]:
    flat = _order(H, W, w, order)
    index = torch.cat([torch.arange(G, device=_CPU), flat + G])
    return index.to(device), torch.argsort(index).to(device)


def longformer2d_sequence_index(H: int, W: int, window_size: int, num_global: int, order: str = DEFAULT_ORDER,
                                device: torch.device | str = "cpu") -> tuple[Tensor, Tensor] | None:
    """Token gathers of the flex call on ``device``: ``index [G + H·W]`` (``x[:, index]``: the module's tokens in
    ``order``, globals first) and its inverse (``out[:, inverse]``: back to the module's order); None for
    ``"row"`` (the identity). Cached."""
    if _check_order(order) == "row":
        return None
    longformer2d_plan(H, W, window_size)
    return _sequence_index(int(H), int(W), int(window_size), int(num_global), order, torch.device(device))


@_cached(maxsize=64)
def _tables(H: int, W: int, w: int, G: int, split: bool, order: str, device: torch.device) -> tuple[Tensor, ...]:
    """Per sequence position (queries ``[G + H·W]``, keys ``[M]``): row, column (-1 for globals), global index
    (-1 for map tokens) and part (keys: 0 = the map queries' keys, 1 = the global queries' own keys when
    ``split``; queries: the part they read)."""
    flat = _order(H, W, w, order)
    none = torch.full((G,), -1, dtype=torch.long, device=_CPU)
    row = torch.cat([none, flat // W])  # [G + H·W]
    col = torch.cat([none, flat % W])
    glob = torch.cat([torch.arange(G, device=_CPU), torch.full((H * W,), -1, dtype=torch.long, device=_CPU)])
    q_part = torch.zeros(G + H * W, dtype=torch.long, device=_CPU)
    k_part = q_part
    k_row, k_col, k_glob = row, col, glob
    if split:  # the global queries read their own keys and values (kv_global), appended after the map queries'
        q_part = torch.cat([torch.ones(G, dtype=torch.long, device=_CPU), q_part[G:]])
        k_part = torch.cat([k_part, torch.ones_like(k_part)])
        k_row, k_col, k_glob = torch.cat([row, row]), torch.cat([col, col]), torch.cat([glob, glob])
    return tuple(t.to(device) for t in (row, col, glob, q_part, k_row, k_col, k_glob, k_part))


def longformer2d_pattern(H: int, W: int, window_size: int, num_global: int, *, order: str = DEFAULT_ORDER,
                         split_globals: bool = False, local_table: Tensor | None = None,
                         g2l: Tensor | None = None, g2g: Tensor | None = None,
                         device: torch.device | str = "cpu") -> AttentionPattern:
    """The 2-D Longformer over the whole sequence as one :class:`~.flex.AttentionPattern`.

    Queries: ``[G + H·W]``, the ``G`` globals then the map in ``order`` (:func:`longformer2d_order`).
    Keys: the same ``N = G + H·W`` tokens; with ``split_globals`` (separate global projections) ``2N``:
    the map queries' keys, then the global queries' own (each query reads only its half).

    A global query sees every key (of its half), every query sees the global keys, and a map query at
    ``(r, c)`` sees the map keys whose chunk ``(r' // w, c' // w)`` is at most one chunk away on each axis:
    exactly the module's ``3 x 3`` chunk rule with its bottom / right padding (keys beyond the map do not
    exist in the sequence).

    Args:
        local_table: ``[(4w - 1)², nh]`` local relative-position table (None: no bias).
        g2l: ``[2, nh, G]`` (``[0]``: global query -> map key, ``[1]``: map query -> global key); g2g:
            ``[nh, G, G]``. Both read only when ``G > 0`` and ``local_table`` is given.
        device: where the index tables live (the call's device).

    The tables are read inside ``score_mod`` (their gradients flow through FlexAttention); the
    ``cache_key`` fixes the geometry ``(H, W, w, G, split, order)``.
    """
    longformer2d_plan(H, W, window_size)
    H, W, w, G = int(H), int(W), int(window_size), int(num_global)
    split = bool(split_globals) and G > 0
    device = torch.device(device)
    tables = _tables(H, W, w, G, split, _check_order(order), device)
    row, col, glob, q_part, k_row, k_col, k_glob, k_part = (flex_buffer(t) for t in tables)
    N = G + H * W

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        qr, qc, kr, kc = row[q], col[q], k_row[kv], k_col[kv]
        near = ((qr // w - kr // w).abs() <= 1) & ((qc // w - kc // w).abs() <= 1)
        seen = (glob[q] >= 0) | (k_glob[kv] >= 0) | near
        return seen & (q_part[q] == k_part[kv]) if split else seen

    score_mod = None
    if local_table is not None:
        table, span, size = flex_buffer(local_table), 4 * w - 1, local_table.shape[0]
        g2l, g2g = flex_buffer(g2l), flex_buffer(g2g)

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            qr, qc, kr, kc = row[q], col[q], k_row[kv], k_col[kv]
            index = ((qr - kr + 2 * w - 1) * span + qc - kc + 2 * w - 1).clamp(0, size - 1)  # masked pairs clamped
            bias = table[index, h]
            if G and g2l is not None and g2g is not None:
                gq, gk = glob[q], k_glob[kv]
                gqc, gkc = gq.clamp(min=0), gk.clamp(min=0)
                from_global = torch.where(gk >= 0, g2g[h, gqc, gkc], g2l[0][h, gqc])
                bias = torch.where(gq >= 0, from_global, torch.where(gk >= 0, g2l[1][h, gkc], bias))
            return score + bias

    return AttentionPattern(N, 2 * N if split else N, mask_mod=mask_mod, score_mod=score_mod,
                            cache_key=("longformer2d", H, W, w, G, split, order))


def longformer2d_sparsity(H: int, W: int, window_size: int, num_global: int, order: str = DEFAULT_ORDER,
                          device: torch.device | str = "cpu") -> float:
    """Percentage of the ``128 x 128`` blocks of the ``[G + H·W]²`` logits the flex block mask skips."""
    from .flex import block_mask_for

    pattern = longformer2d_pattern(H, W, window_size, num_global, order=order, device=device)
    return float(block_mask_for(pattern, torch.device(device)).sparsity())
