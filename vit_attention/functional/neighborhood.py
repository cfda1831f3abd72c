"""Neighbourhood attention index plans (NAT, Hassani et al. 2023; DiNAT, Hassani & Shi 2022).

Each query ``(i, j)`` of an ``H x W`` map attends to a ``K x K`` neighbourhood of keys with
dilation ``d``. The window rule is NATTEN's (the reference library): along each axis the positions
split into ``d`` interleaved groups (``p mod d``); inside a group of length ``L_g`` a query at
group index ``s`` sees group indices ``[start, start + K)`` with ``start = clamp(s - K // 2, 0,
L_g - K)``, i.e. the window is centred and *clamped inside the map* at borders (it shifts, it is
never padded). The relative-position-bias index of a key is ``(key - query) / d + K - 1`` per axis
(in ``[0, 2K - 2]``), flattened as ``row · (2K - 1) + col``.

The plan here computes attention in **tiles** without ever building an ``N x N`` matrix: the
queries of a ``T x T`` tile (of one dilation group) share the union of their windows, an
``R x R`` key region with ``R <= T + K - 1``; a boolean mask keeps each query to its own ``K x K``
window. Every tile then is a small dense attention problem the fused kernel runs at full speed
(``[B, nT, nh, T², hd]`` queries against ``[B, nT, nh, R², hd]`` keys), and memory grows linearly
with the number of tokens (``nT · R²`` gathered keys, about ``N · (T + K - 1)² / T²``). ``T = 1``
is the exact per-query gather; larger tiles trade redundant logits (``R² / K²`` per query) for
fewer, larger kernels.

Plans depend only on sizes and are cached (read-only tensors, built on the CPU).

**FlexAttention** (backend ``"flex"``, :func:`neighborhood_pattern`): the same rule described once
over the whole map, ``N = Hp·Wp`` queries against the same ``N`` keys: ``mask_mod`` = the key lies in
the query's clamped (dilated) window, ``score_mod`` = ``rpb[h, Δr/d + K-1, Δc/d + K-1]`` read from the
parameter. The tokens run in the order that leaves the block mask the most empty 128 x 128 blocks
(counted exactly per geometry among :data:`ORDER_CANDIDATES`; at 56 x 56 and 28 x 28, ``K = 7``: row-major
for ``d = 1``, grouped by residue ``(r mod d, c mod d)`` for a dilated window; :func:`token_order`).
"""

from __future__ import annotations

import functools
import itertools
import math
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .attention import scaled_dot_product_attention
from .flex import AttentionPattern, flex_buffer, use_flex
from .layout import PAD, AttentionLayout
from .observers import attention_observed
from .window import _CPU, _cached, assume_constant_result, static_args

__all__ = ["window_start", "neighborhood_plan", "NeighborhoodPlan", "default_tile_size", "neighborhood_attention",
           "neighborhood_bias", "neighborhood_layout", "MASKED", "token_order", "neighborhood_pattern",
           "FLEX_ORDER", "FLEX_TILE", "TOKEN_ORDERS", "ORDER_CANDIDATES"]


def window_start(index: Tensor, length: int | Tensor, kernel_size: int) -> Tensor:
    """NATTEN's clamped window start of group positions ``index`` in a group of ``length`` (an int or per
    position): ``[...] -> [...]``."""
    last = torch.as_tensor(length, device=index.device) - kernel_size  # the last start inside the group
    return torch.minimum((index - kernel_size // 2).clamp_min(0), last)


def default_tile_size(kernel_size: int, dilation: int = 1) -> int:
    """Query tile side used when none is given: 4 for ``K <= 7`` (2x redundant logits at ``K = 7``), else ``K // 2``."""
    return 4 if kernel_size <= 7 else max(1, kernel_size // 2)


class NeighborhoodPlan:
    """Index plan of one map size (see the module docstring). All tensors live on the CPU, long / bool.

    Attributes:
        query_index ``[nT, T²]``: flat map index ``r·W + c`` of each tile's query slot, ``-1`` = empty slot.
        query_gather ``[nT, T²]``: the same with every empty slot replaced by a query of its tile whose
            mask and bias row it repeats (so gathering and scattering back need no padding row).
        key_index ``[nT, R²]``: flat map index of each tile's key slot, ``-1`` = empty slot.
        mask ``[nT, T², R²]``: True where the slot's query may attend to the slot's key.
        bias_index ``[nT, T², R²]``: index into the flattened ``[(2K-1)²]`` relative-position table (0 where masked).
        tile, region: ``T`` and ``R``.
    """

    def __init__(self, query_index: Tensor, key_index: Tensor, mask: Tensor, bias_index: Tensor,
                 tile: int, region: int, query_gather: Tensor | None = None) -> None:
        self.query_index, self.key_index, self.mask, self.bias_index = query_index, key_index, mask, bias_index
        self.tile, self.region = tile, region
        self.query_gather = query_index if query_gather is None else query_gather

    @property
    def num_tiles(self) -> int:
        """``nT``: tiles over all dilation groups."""
        return self.query_index.shape[0]


def _axis_plan(length: int, K: int, d: int, T: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """1-D plan: query ``[t, T]`` (full indices, -1 empty), the same with each empty slot replaced by the
    tile's first query (it then computes exactly that query's row), key ``[t, R]`` (-1 empty), mask
    ``[t, T, R]``, rel ``[t, T, R]``."""
    group_lengths = [math.ceil((length - g) / d) for g in range(d)]
    R = min(T + K - 1, max(group_lengths))
    qs, dups, ks, ms, rs = [], [], [], [], []
    for g, Lg in enumerate(group_lengths):
        if Lg < K:
            raise ValueError(f"a map side of {length} is smaller than kernel_size * dilation = {K * d}; pad it first")
        for t0 in range(0, Lg, T):
            s = torch.arange(t0, t0 + T, device=_CPU)  # group indices of the tile's query slots
            valid_q = s < Lg
            s = torch.where(valid_q, s, t0)  # an empty slot repeats the tile's first query (same row, same output)
            start = window_start(s, Lg, K)  # [T]
            Rt = min(T + K - 1, Lg)
            a = min(int(start[0]), Lg - Rt)  # region start: holds every window of the tile
            u = torch.arange(a, a + R, device=_CPU)  # group indices of the key slots
            valid_k = u < a + Rt
            inside = (u[None, :] >= start[:, None]) & (u[None, :] < start[:, None] + K) & valid_k[None, :]
            rel = torch.where(inside, u[None, :] - s[:, None] + K - 1, 0)
            qs.append(torch.where(valid_q, g + d * s, -1))
            dups.append(g + d * s)
            ks.append(torch.where(valid_k, g + d * u, -1))
            ms.append(inside)
            rs.append(rel)
    return torch.stack(qs), torch.stack(dups), torch.stack(ks), torch.stack(ms), torch.stack(rs)


@_cached(maxsize=64)
def _plan(H: int, W: int, kh: int, kw: int, dh: int, dw: int, T: int) -> NeighborhoodPlan:
    qr, dr, kr, mr, rr = _axis_plan(H, kh, dh, T)  # rows: [a, T], [a, T], [a, R1], [a, T, R1], [a, T, R1]
    qc, dc, kc, mc, rc = _axis_plan(W, kw, dw, T)  # cols: [b, T], [b, T], [b, R2], [b, T, R2], [b, T, R2]
    a, b = qr.shape[0], qc.shape[0]
    R1, R2 = kr.shape[1], kc.shape[1]

    def outer_index(ir: Tensor, ic: Tensor) -> Tensor:  # [a, n], [b, m] -> [a·b, n·m] flat map indices
        flat = ir[:, None, :, None] * W + ic[None, :, None, :]
        flat = torch.where((ir[:, None, :, None] < 0) | (ic[None, :, None, :] < 0), -1, flat)
        return flat.reshape(a * b, -1)

    query_index = outer_index(qr, qc)  # [nT, T²]
    query_gather = outer_index(dr, dc)  # [nT, T²]: no empty slot (each repeats a query of its tile)
    key_index = outer_index(kr, kc)  # [nT, R1·R2]
    # [a, b, T(r), T(c), R1, R2]: both axes inside their window
    mask = (mr[:, None, :, None, :, None] & mc[None, :, None, :, None, :]).reshape(a * b, T * T, R1 * R2)
    bias_index = (rr[:, None, :, None, :, None] * (2 * kw - 1) + rc[None, :, None, :, None, :])
    bias_index = torch.where(mask, bias_index.reshape(a * b, T * T, R1 * R2), 0)
    return NeighborhoodPlan(query_index, key_index, mask, bias_index, T, max(R1, R2), query_gather)


def _check_args(H: int, W: int, kernel_size: int | tuple[int, int], dilation: int | tuple[int, int],
                tile_size: int | None = None) -> tuple[int, int, int, int, int]:
    """``(kh, kw, dh, dw, T)`` after checking them and the map size (each side at least ``K·d``), in Python only
    (no plan is built: traced code checks without reading a tensor)."""
    kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else tuple(dilation)
    if kh % 2 == 0 or kw % 2 == 0 or kh < 1 or kw < 1:
        raise ValueError(f"kernel_size must be odd and positive (the window is centred), got {kernel_size!r}")
    if dh < 1 or dw < 1:
        raise ValueError(f"dilation must be >= 1, got {dilation!r}")
    T = default_tile_size(max(kh, kw)) if tile_size is None else int(tile_size)
    if T < 1:
        raise ValueError(f"tile_size must be >= 1, got {tile_size!r}")
    for length, K, d in ((H, kh, dh), (W, kw, dw)):  # the shortest dilation group (floor(side / d)) holds a window
        if length < K * d:
            raise ValueError(f"a map side of {length} is smaller than kernel_size * dilation = {K * d}; pad it first")
    return int(kh), int(kw), int(dh), int(dw), T


def neighborhood_plan(H: int, W: int, kernel_size: int | tuple[int, int], dilation: int | tuple[int, int] = 1,
                      tile_size: int | None = None) -> NeighborhoodPlan:
    """The tiled plan of a ``H x W`` map (each side at least ``K · d``): see :class:`NeighborhoodPlan`. Cached."""
    kh, kw, dh, dw, T = _check_args(H, W, kernel_size, dilation, tile_size)
    return _plan(int(H), int(W), int(kh), int(kw), int(dh), int(dw), T)


def _graph_inputs(builder: Callable[..., Any], maxsize: int = 64) -> Callable[..., Any]:
    """``builder`` (pure in its hashable arguments, returning index tensors) with its results kept in a store
    that traced code reads by name: under ``torch.compile`` the build runs eagerly at trace time and the
    tensors enter the graph as inputs. Traced into the graph, the builders would break it (``nonzero``); as
    ``assume_constant_result`` constants (:func:`.window._cached`'s ``constant_under_compile``) their tuples
    with None entries trip a dynamo guard bug (torch 2.13: "Guard failed on the same frame it was created ...
    name 'constant_0' is not defined"). A FIFO of ``maxsize`` results."""
    store: dict[tuple[Any, ...], Any] = {}
    # one attribute per key, read by name: dynamo reads an attribute when traced code first asks for it, while a
    # dict read in traced code would be the snapshot taken at the frame's first lookup (a later key: KeyError)
    slots = types.SimpleNamespace()
    names = itertools.count()

    @assume_constant_result
    def ensure(*key: Any) -> str:
        if key not in store:
            name = f"k{next(names)}"
            store[key] = (name, builder(*key))
            setattr(slots, name, store[key][1])
            if len(store) > maxsize:
                old, _ = store.pop(next(iter(store)))
                delattr(slots, old)
        return store[key][0]

    @functools.wraps(builder)
    def lookup(*key: Any) -> Any:
        return getattr(slots, ensure(*static_args(key)))

    return lookup


MASKED = -1e4  # additive logit of a key outside the window: exp(-1e4 + logit) is exactly 0 in fp32 and bf16


@_graph_inputs
@_cached(maxsize=64)
def _device_plan(Hp: int, Wp: int, kernel_size: tuple[int, int], dilation: tuple[int, int], tile: int,
                 device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Plan tensors on ``device``: query gather ``[nT·T²]``, key gather ``[nT·R²]`` (empty key slots -> 0, masked),
    the window as an additive mask ``[nT, 1, T², R²]`` (0 / :data:`MASKED`), bias index ``[nT, T², R²]``, and
    the way back: the query slot of each map position ``[Hp·Wp]`` (its one real slot, never a repeat)."""
    plan = neighborhood_plan(Hp, Wp, kernel_size, dilation, tile)
    ki = plan.key_index.clamp_min(0)
    window = torch.zeros(plan.mask.shape, device=_CPU).masked_fill_(~plan.mask, MASKED)[:, None]
    qi = plan.query_index.reshape(-1)
    real = qi >= 0
    slot = torch.empty(Hp * Wp, dtype=torch.long, device=_CPU)
    slot[qi[real]] = real.nonzero().squeeze(1)
    return (plan.query_gather.reshape(-1).to(device), ki.reshape(-1).to(device), window.to(device),
            plan.bias_index.to(device), slot.to(device))


def neighborhood_bias(rpb: Tensor | None, Hp: int, Wp: int, kernel_size: int | tuple[int, int],
                      dilation: int | tuple[int, int] = 1, tile_size: int | None = None, *,
                      device: torch.device | str | None = None) -> Tensor:
    """The additive bias of every tile: the relative-position bias ``rpb [nh, 2Kh-1, 2Kw-1]`` gathered by
    offset, plus the window mask: ``[nT, nh, T², R²]`` (``[nT, 1, T², R²]`` without ``rpb``, on ``device``)."""
    kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else tuple(dilation)
    kh, kw, dh, dw, T = _check_args(Hp, Wp, (kh, kw), (dh, dw), tile_size)
    device = rpb.device if rpb is not None else torch.device(device or "cpu")
    _, _, window, bias_index, _ = _device_plan(Hp, Wp, (kh, kw), (dh, dw), T, device)
    if rpb is None:
        return window
    return rpb.flatten(1)[:, bias_index].transpose(0, 1) + window  # [nT, nh, T², R²]


def neighborhood_layout(H: int, W: int, Hp: int, Wp: int, kernel_size: int | tuple[int, int],
                        dilation: int | tuple[int, int] = 1, tile_size: int | None = None) -> AttentionLayout:
    """Where the tiles' rows sit: groups = tiles, rows placed on the ``H x W`` grid of a map padded to
    ``Hp x Wp`` (padding and empty slots are PAD)."""
    plan = neighborhood_plan(Hp, Wp, kernel_size, dilation, tile_size)

    def on_grid(index: Tensor) -> Tensor:
        r, c = index // Wp, index % Wp
        return torch.where((index >= 0) & (r < H) & (c < W), r * W + c, PAD)

    return AttentionLayout((H, W), on_grid(plan.query_index), on_grid(plan.key_index))


def neighborhood_attention(qkv: Tensor, num_heads: int, kernel_size: int | tuple[int, int],
                           dilation: int | tuple[int, int] = 1, *, rpb: Tensor | None = None,
                           bias: Tensor | None = None, scale: float | None = None, tile_size: int | None = None,
                           dropout_p: float = 0.0, grid: tuple[int, int] | None = None,
                           fused: bool | None = None, backend: str | None = None) -> Tensor:
    """Neighbourhood attention of a packed map ``qkv [B, Hp, Wp, 3C]`` (each side >= ``K·d``) -> ``[B, Hp, Wp, C]``.

    ``rpb [nh, 2Kh-1, 2Kw-1]``: relative-position bias, or ``bias``: :func:`neighborhood_bias` computed
    beforehand (a module caches it at inference); ``scale``: logit scale (default ``hd^-1/2``);
    ``grid``: the unpadded ``(H, W)`` for recorded maps (default the whole map). One call of the
    library's attention function on all tiles at once: ``[B, nT, nh, T², hd]`` queries against
    ``[B, nT, nh, R², hd]`` keys, with the window mask and the relative-position bias as one additive bias.
    ``fused`` / ``backend``: the caller's captured fused-attention switch and attention backend (None: the
    process defaults). When they select FlexAttention (:func:`.flex.use_flex`) and no precomputed ``bias``
    is given, the map runs as one :func:`neighborhood_pattern` over all ``Hp·Wp`` tokens instead of tiles.
    """
    B, Hp, Wp, C3 = qkv.shape
    C = C3 // 3
    if C3 != 3 * C or C % num_heads:
        raise ValueError(f"qkv must be [B, H, W, 3C] with C divisible by num_heads={num_heads}, got {tuple(qkv.shape)}")
    kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else tuple(dilation)
    if bias is None and use_flex(backend, fused, qkv.device, mechanism="neighborhood"):
        return _neighborhood_flex(qkv, num_heads, (kh, kw), (dh, dw), rpb, scale, dropout_p, fused)
    kh, kw, dh, dw, T = _check_args(Hp, Wp, (kh, kw), (dh, dw), tile_size)
    qi, ki, window, _, back = _device_plan(Hp, Wp, (kh, kw), (dh, dw), T, qkv.device)
    nT, _, T2, R2 = window.shape
    N, nh, hd = Hp * Wp, num_heads, C // num_heads
    if bias is None:
        bias = window if rpb is None else neighborhood_bias(rpb, Hp, Wp, (kh, kw), (dh, dw), T)
    flat = qkv.reshape(B, N, C3)  # [B, N, 3C]
    q = flat[:, qi, :C].view(B, nT, T2, nh, hd).transpose(2, 3)  # [B, nT, nh, T², hd]
    kv = flat[:, ki, C:].view(B, nT, R2, 2, nh, hd).permute(3, 0, 1, 4, 2, 5)  # [2, B, nT, nh, R², hd]
    layout = None
    if attention_observed():
        layout = neighborhood_layout(*(grid or (Hp, Wp)), Hp, Wp, (kh, kw), (dh, dw), T)
    out = scaled_dot_product_attention(q, kv[0], kv[1], bias=bias, scale=scale, dropout_p=dropout_p,
                                       layout=layout, fused=fused, backend=backend)  # [B, nT, nh, T², hd]
    out = out.transpose(2, 3).reshape(B, nT * T2, C)  # [B, nT·T², C]
    # back to map order, each position read from its real slot: a repeated query (an empty slot filled with a query
    # of its tile) computes the same row, but its copy is dropped, so no gradient is counted twice
    return out.index_select(1, back).view(B, Hp, Wp, C)


# ----------------------------------------------------------------------------- FlexAttention: one pattern
TOKEN_ORDERS = ("row", "tile", "residue")
FLEX_TILE = 8  # tile side of the "tile" order (64 tokens: two tiles per 128-token block)
# The flex path runs in the order of ORDER_CANDIDATES whose block mask visits the fewest 128 x 128 blocks, counted
# exactly per geometry from the windows (_visited_blocks: one entry per query and window key, cheap). Measured
# (share of blocks skipped, K = 7; "tile" = 8 x 8 tiles, "residue" = (r mod d, c mod d) groups, row-major inside):
#   56 x 56, d = 1: row 80.6 %, tile 75.8 % (16 x 16 tiles 73.0 %)      28 x 28, d = 1: row 59.2 %, tile 40.8 %
#   56 x 56, d = 4: row 49.0 %, tile 46.2 %, residue 88.3 %              56 x 56, d = 8: row 34.6 %, tile 0 %,
#   residue 88.3 %          28 x 28, d = 2: row 36.7 %, tile 24.5 %, residue 61.2 %
# A row of 56 tokens is short beside a 128-token block: row-major keeps a window's 7 rows in ~5 blocks, while
# compact tiles straddle block boundaries on every side. A dilated window lives in one residue group, whose
# tokens residue-major order keeps together (tiles inside a group measured the same as rows). Ties keep the
# earlier candidate (row-major first: no gathers).
ORDER_CANDIDATES: tuple[tuple[str, int], ...] = (("row", 0), ("residue", 0), ("tile", FLEX_TILE),
                                                 ("residue", FLEX_TILE))
FLEX_ORDER: tuple[str, int] | None = None  # None: the geometry's best candidate; an (order, tile) pair forces one
_FLEX_BLOCK = 128  # FlexAttention's default block size (queries and keys)


def _axis_window_starts(length: int, K: int, d: int) -> Tensor:
    """The first key (map coordinate) of each position's window along one axis: ``[length]``."""
    pos = torch.arange(length, device=_CPU)
    g = pos % d
    return g + d * window_start(pos // d, (length - g + d - 1) // d, K)


@_cached(maxsize=256)
def _visited_blocks(Hp: int, Wp: int, kernel_size: tuple[int, int], dilation: tuple[int, int], order: str,
                    tile: int) -> int:
    """How many ``128 x 128`` blocks of the ``N x N`` logits in ``order`` hold a (query, window key) pair."""
    (kh, kw), (dh, dw) = kernel_size, dilation
    rows = _axis_window_starts(Hp, kh, dh)[:, None] + dh * torch.arange(kh, device=_CPU)  # [Hp, Kh]
    cols = _axis_window_starts(Wp, kw, dw)[:, None] + dw * torch.arange(kw, device=_CPU)  # [Wp, Kw]
    keys = (rows[:, None, :, None] * Wp + cols[None, :, None, :]).reshape(Hp * Wp, kh * kw)  # [N, K²] map indices
    position = torch.argsort(token_order(Hp, Wp, order, tile, dilation))  # map index -> sequence position
    n = -(-(Hp * Wp) // _FLEX_BLOCK)
    visited = torch.zeros(n, n, dtype=torch.bool, device=_CPU)
    visited[position[:, None] // _FLEX_BLOCK, position[keys] // _FLEX_BLOCK] = True
    return int(visited.sum())


@assume_constant_result  # under torch.compile: counted eagerly (a Python pair)
def _flex_order(Hp: int, Wp: int, kernel_size: tuple[int, int], dilation: tuple[int, int]) -> tuple[str, int]:
    """The (order, tile) of :data:`ORDER_CANDIDATES` whose block mask visits the fewest blocks (the first of equals),
    or :data:`FLEX_ORDER` when set."""
    if FLEX_ORDER is not None:
        return FLEX_ORDER
    return min(ORDER_CANDIDATES, key=lambda o: _visited_blocks(Hp, Wp, kernel_size, dilation, *o))


@_cached(maxsize=64)
def _token_order(H: int, W: int, order: str, tile: int, dh: int, dw: int) -> Tensor:
    r = torch.arange(H, device=_CPU)[:, None].expand(H, W)
    c = torch.arange(W, device=_CPU)[None, :].expand(H, W)
    if order == "row":
        return torch.arange(H * W, device=_CPU)
    group, rows, cols = torch.zeros_like(r), H, W
    if order == "residue":  # (r mod d, c mod d) groups, each on its own (r // d, c // d) grid
        group, r, c, rows, cols = (r % dh) * dw + c % dw, r // dh, c // dw, -(-H // dh), -(-W // dw)
    tile_r, tile_c = (1, cols) if tile == 0 else (tile, tile)  # tile 0: row-major (inside each group)
    tiles_r, tiles_c = -(-rows // tile_r), -(-cols // tile_c)
    rank = ((group * tiles_r + r // tile_r) * tiles_c + c // tile_c) * tile_r * tile_c
    rank = rank + (r % tile_r) * tile_c + c % tile_c
    return torch.argsort(rank.reshape(-1), stable=True)


def token_order(H: int, W: int, order: str = "tile", tile: int = FLEX_TILE,
                dilation: int | tuple[int, int] = 1) -> Tensor:
    """The flat map index ``r·W + c`` at each position of a token sequence: ``[H·W]`` long (CPU, cached).

    ``order``: ``"row"`` (row-major, the identity), ``"tile"`` (``tile x tile`` tiles row-major, row-major
    inside; partial tiles at the right / bottom border), ``"residue"`` (grouped by ``(r mod dh, c mod dw)``,
    each group's ``(r // dh, c // dw)`` grid in ``tile x tile`` tiles: a dilated window then lies in one
    group). ``tile = 0``: row-major (inside each group).
    """
    if order not in TOKEN_ORDERS:
        raise ValueError(f"order must be one of {TOKEN_ORDERS}, got {order!r}")
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else tuple(dilation)
    return _token_order(int(H), int(W), order, int(tile), int(dh), int(dw))


@_graph_inputs
@_cached(maxsize=64)
def _flex_index(Hp: int, Wp: int, kernel_size: tuple[int, int], dilation: tuple[int, int], order: str, tile: int,
                device: torch.device) -> tuple[Tensor | None, Tensor | None, tuple[Tensor, ...]]:
    """Sequence order ``[N]`` (None: row-major), its inverse ``[N]``, and per sequence position ``[N]``, for the
    row then the column: the map coordinate, the window's first key (map coordinate), the residue ``mod d`` and
    the index inside the dilation group."""
    perm = token_order(Hp, Wp, order, tile, dilation)
    r, c = perm // Wp, perm % Wp  # map coordinates of each sequence position
    per_axis = []
    for pos, length, K, d in ((r, Hp, kernel_size[0], dilation[0]), (c, Wp, kernel_size[1], dilation[1])):
        g, s = pos % d, pos // d
        group_length = (length - g + d - 1) // d
        per_axis += [pos, g + d * window_start(s, group_length, K), g, s]  # coordinate, window's first, residue, group
    identity = order == "row"
    inverse = torch.argsort(perm)
    return (None if identity else perm.to(device), None if identity else inverse.to(device),
            tuple(t.to(device) for t in per_axis))


def neighborhood_pattern(Hp: int, Wp: int, kernel_size: int | tuple[int, int], dilation: int | tuple[int, int] = 1,
                         *, rpb: Tensor | None = None, order: str | None = None, tile: int | None = None,
                         device: torch.device | str = "cpu") -> tuple[AttentionPattern, Tensor | None, Tensor | None]:
    """Neighbourhood attention of a ``Hp x Wp`` map (sides >= ``K·d``) as one :class:`~.flex.AttentionPattern`
    over its ``N = Hp·Wp`` tokens in ``order`` with ``tile`` (:func:`token_order`; default: the measured-best
    of :data:`ORDER_CANDIDATES` for the geometry; ``tile`` default :data:`FLEX_TILE` for ``"tile"``, else 0).

    ``mask_mod``: key ``(r, c)`` lies in query ``(i, j)``'s window: same residue mod ``d`` per axis and within
    ``K`` group steps of the clamped start (:func:`window_start`). ``score_mod`` (with ``rpb [nh, 2Kh-1, 2Kw-1]``):
    ``+ rpb[h, (r - i)/dh + Kh-1, (c - j)/dw + Kw-1]``, read from ``rpb`` on each call (its gradient flows).
    Returns the pattern, the order ``perm [N]`` (sequence position -> flat map index; None for row-major) and its
    inverse ``[N]`` (on ``device``). The block mask is cached per sizes, kernel, dilation, order and device.
    """
    kh, kw, dh, dw, _ = _check_args(Hp, Wp, kernel_size, dilation, 1)
    if order is None:
        order, tile = _flex_order(int(Hp), int(Wp), (int(kh), int(kw)), (int(dh), int(dw)))
    tile = (FLEX_TILE if order == "tile" else 0) if tile is None else tile
    if order not in TOKEN_ORDERS:
        raise ValueError(f"order must be one of {TOKEN_ORDERS}, got {order!r}")
    device = torch.device(device)
    perm, inverse, tables = _flex_index(int(Hp), int(Wp), (int(kh), int(kw)), (int(dh), int(dw)), order, int(tile),
                                        device)
    row, lo_r, res_r, grp_r, col, lo_c, res_c, grp_c = (flex_buffer(t) for t in tables)  # captured by the mods
    span_r, span_c = dh * (kh - 1), dw * (kw - 1)

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        dr, dc = row[kv] - lo_r[q], col[kv] - lo_c[q]  # from the window's first key
        return ((dr >= 0) & (dr <= span_r) & (res_r[kv] == res_r[q])
                & (dc >= 0) & (dc <= span_c) & (res_c[kv] == res_c[q]))

    score_mod = None
    if rpb is not None:
        if tuple(rpb.shape[1:]) != (2 * kh - 1, 2 * kw - 1):
            raise ValueError(f"rpb must be [nh, {2 * kh - 1}, {2 * kw - 1}], got {tuple(rpb.shape)}")
        rpb = flex_buffer(rpb)

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            # outside the window (masked) the offset may leave the table: clamped, the value is never used
            ir = (grp_r[kv] - grp_r[q] + kh - 1).clamp(0, 2 * kh - 2)
            ic = (grp_c[kv] - grp_c[q] + kw - 1).clamp(0, 2 * kw - 2)
            return score + rpb[h, ir, ic]

    key = ("neighborhood", int(Hp), int(Wp), kh, kw, dh, dw, order, tile)
    return AttentionPattern(Hp * Wp, Hp * Wp, mask_mod, score_mod, cache_key=key), perm, inverse


def _neighborhood_flex(qkv: Tensor, num_heads: int, kernel_size: tuple[int, int], dilation: tuple[int, int],
                       rpb: Tensor | None, scale: float | None, dropout_p: float, fused: bool | None) -> Tensor:
    """The flex path of :func:`neighborhood_attention`: one core call over the whole map, ``[B, Hp, Wp, 3C] ->
    [B, Hp, Wp, C]`` (tokens gathered into the pattern's order and scattered back)."""
    B, Hp, Wp, C3 = qkv.shape
    C, N, nh = C3 // 3, Hp * Wp, num_heads
    pattern, perm, inverse = neighborhood_pattern(Hp, Wp, kernel_size, dilation, rpb=rpb, device=qkv.device)
    flat = qkv.reshape(B, N, 3, nh, C // nh)
    if perm is not None:
        flat = flat[:, perm]
    q, k, v = flat.permute(2, 0, 3, 1, 4).unbind(0)  # [B, nh, N, hd] each
    out = scaled_dot_product_attention(q, k, v, scale=scale, dropout_p=dropout_p, fused=fused, backend="flex",
                                       pattern=pattern)  # [B, nh, N, hd]
    out = out.transpose(1, 2).reshape(B, N, C)
    if inverse is not None:
        out = out[:, inverse]
    return out.view(B, Hp, Wp, C)
