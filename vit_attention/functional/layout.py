"""Where each query and key row of an attention call sits on the image grid: :class:`AttentionLayout`.

A mechanism hands the attention core (:func:`.attention.scaled_dot_product_attention`) its layout
next to q, k, v; observers get it in ``info["layout"]`` and put the weights ``[*b, nh, N, M]`` back
in image space with it, the same way for every mechanism (no branch per mechanism):

* ``query_pos [G, n]`` / ``key_pos [G, m]``: for each row, its flat grid index ``row·W + col``;
  ``-1`` = padding, ``-2 - p`` = the ``p``-th prefix / global token (class, distillation, ...).
  ``G`` groups (windows, neighbourhoods; 1 for global attention) each hold ``n`` queries and ``m`` keys;
* ``grid (H, W)``: the query grid; ``key_grid (h, w)``: the keys' grid when it is coarser (spatial
  reduction); a key's weight is then spread evenly over the ``H x W`` cells it covers;
* ``fold``: how the groups sit in the weights' leading dims: ``"batch"`` = ``[B·G, nh, n, m]`` (or
  ``[B, G, nh, n, m]``, the same memory), ``"heads"`` = ``[B, G·nh, n, m]`` (windows folded into heads);
* ``axis``: ``"tokens"``, or ``"channels"`` (attention over channels: no spatial map).

Layouts hold index tensors on the CPU; the builders here are cached per size, and mechanisms
build one only while an observer is registered (:func:`.attention.attention_observed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .window import _CPU, _cached, to_pair, window_gather_index

__all__ = ["PAD", "AttentionLayout", "prefix_code", "token_layout", "window_layout"]

PAD = -1  # a padding row: not on the grid, nothing placed there
Fold = Literal["batch", "heads"]
Axis = Literal["tokens", "channels"]


def prefix_code(p: int) -> int:
    """The position code of the ``p``-th prefix / global token (``-2 - p``)."""
    return -2 - int(p)


def _as_groups(pos: Tensor, name: str) -> Tensor:
    if not isinstance(pos, Tensor) or pos.dtype != torch.long or pos.dim() not in (1, 2):
        raise ValueError(f"{name} must be a long tensor [rows] or [groups, rows], got "
                         f"{getattr(pos, 'dtype', type(pos))} {tuple(getattr(pos, 'shape', ()))}")
    return pos.view(1, -1) if pos.dim() == 1 else pos


@dataclass(frozen=True, eq=False)
class AttentionLayout:
    """Where the rows of one attention call sit on the grid; see the module docstring.

    Fields:
        grid: the query grid ``(H, W)``; None when the mechanism does not know it (token rows, see
            :meth:`on_grid`).
        query_pos: long ``[n]`` or ``[G, n]``: flat index on ``grid`` per query row, ``-1`` padding,
            ``<= -2`` prefix / global tokens (:func:`prefix_code`).
        key_pos: likewise per key row on ``key_grid``, ``[m]`` or ``[G, m]``; None = the keys are not
            on the image (cross-attention to a context).
        key_grid: the keys' grid (default ``grid``); coarser for spatial reduction.
        fold: ``"batch"`` (weights ``[B·G, nh, n, m]``) or ``"heads"`` (``[B, G·nh, n, m]``).
        axis: ``"tokens"`` or ``"channels"`` (rows are channels, e.g. DaViT's channel attention:
            no spatial map; the positions are then not grid cells and are not checked).
        query_cells: optional long ``[G, n, c]``: the grid cells each query row stands for, ``-1``
            padding (a shared query whose one weight row serves several cells, e.g. MobileViT v2's
            separable attention: one context query per group of tokens). :meth:`query_map` of a
            cell then reads the rows that stand for it; None = each row stands for its ``query_pos``.
    """

    grid: tuple[int, int] | None
    query_pos: Tensor
    key_pos: Tensor | None = None
    key_grid: tuple[int, int] | None = None
    fold: Fold = "batch"
    axis: Axis = "tokens"
    query_cells: Tensor | None = None

    def __post_init__(self) -> None:
        q = _as_groups(self.query_pos, "query_pos")
        object.__setattr__(self, "query_pos", q)
        cells = self.query_cells
        if cells is not None and (not isinstance(cells, Tensor) or cells.dtype != torch.long or cells.dim() != 3
                                  or tuple(cells.shape[:2]) != tuple(q.shape)):
            raise ValueError(f"query_cells must be a long tensor [G, n, c] with query_pos's [G, n] = "
                             f"{list(q.shape)}, got {getattr(cells, 'dtype', type(cells))} "
                             f"{tuple(getattr(cells, 'shape', ()))}")
        if self.key_pos is not None:
            k = _as_groups(self.key_pos, "key_pos")
            if k.shape[0] not in (1, q.shape[0]):
                raise ValueError(f"key_pos has {k.shape[0]} groups, query_pos {q.shape[0]}")
            object.__setattr__(self, "key_pos", k.expand(q.shape[0], -1))
        if self.fold not in ("batch", "heads"):
            raise ValueError(f"fold must be 'batch' or 'heads', got {self.fold!r}")
        if self.axis not in ("tokens", "channels"):
            raise ValueError(f"axis must be 'tokens' or 'channels', got {self.axis!r}")
        if self.grid is not None:
            object.__setattr__(self, "grid", tuple(int(s) for s in self.grid))
            if self.key_grid is None:
                object.__setattr__(self, "key_grid", self.grid)
        if self.key_grid is not None:
            object.__setattr__(self, "key_grid", tuple(int(s) for s in self.key_grid))
        for pos, g, name in ((q, self.grid, "query_pos"), (self.key_pos, self.key_grid, "key_pos")):
            if (self.axis == "tokens" and pos is not None and g is not None and pos.numel()
                    and int(pos.max()) >= g[0] * g[1]):
                raise ValueError(f"{name} holds index {int(pos.max())}, outside the {g[0]}x{g[1]} grid")

    # ------------------------------------------------------------------ description
    @property
    def groups(self) -> int:
        """``G``: windows / neighbourhoods (1 for global attention)."""
        return self.query_pos.shape[0]

    @property
    def num_prefix_tokens(self) -> int:
        """Distinct prefix / global tokens among the query rows."""
        return int(self.query_pos[self.query_pos <= -2].unique().numel())

    @property
    def is_global(self) -> bool:
        """One group whose keys are its queries (every token may attend to every token)."""
        return (self.groups == 1 and self.key_pos is not None and self.key_grid == self.grid
                and torch.equal(self.key_pos, self.query_pos))

    def on_grid(self, grid: tuple[int, int]) -> AttentionLayout:
        """A grid-less layout of token rows placed on ``grid``: the last ``H·W`` rows are the grid,
        the rows before them prefix tokens (self), or the keys stay off the grid (cross-attention)."""
        if self.grid is not None:
            return self
        H, W = int(grid[0]), int(grid[1])
        n = self.query_pos.shape[-1]
        if self.groups != 1 or n < H * W:
            raise ValueError(f"cannot place {n} token rows on a {H}x{W} grid")
        same = self.key_pos is not None and torch.equal(self.key_pos, self.query_pos)
        q = _token_pos(n, H * W)
        return AttentionLayout((H, W), q, q if same else None, fold=self.fold, axis=self.axis)

    # ------------------------------------------------------------------ placement
    def canonical(self, weights: Tensor) -> Tensor:
        """Weights as the core gave them ``[*b, nh', n, m]`` -> ``[B, G, nh, n, m]``."""
        G = self.groups
        n, m = weights.shape[-2:]
        if n != self.query_pos.shape[1] or (self.key_pos is not None and m != self.key_pos.shape[1]):
            raise ValueError(f"weights {tuple(weights.shape)} do not match the layout's {self.query_pos.shape[1]} "
                             f"queries x {None if self.key_pos is None else self.key_pos.shape[1]} keys per group")
        if self.fold == "heads":
            return weights.reshape(-1, G, weights.shape[-3] // G, n, m)  # [B, G, nh, n, m]
        return weights.reshape(-1, G, weights.shape[-3], n, m)  # [B, G, nh, n, m]

    def _check_spatial(self, what: str) -> tuple[tuple[int, int], tuple[int, int], Tensor]:
        if self.axis != "tokens":
            raise ValueError(f"{what}: attention over the {self.axis} axis (axis={self.axis!r}) has no map on the "
                             "image grid")
        if self.grid is None or self.key_grid is None:
            raise ValueError(f"{what}: the layout has no grid; pass grid=(H, W)")
        if self.key_pos is None:
            raise ValueError(f"{what}: the keys are not on the image grid (cross-attention to a context)")
        return self.grid, self.key_grid, self.key_pos

    def _to_grid(self, vals: Tensor, key_pos: Tensor) -> Tensor:
        """Per-key values ``[B, K]`` at flat ``key_pos [K]`` -> ``[B, H, W]`` (coarse keys spread evenly)."""
        grid, key_grid, _ = self._check_spatial("placement")
        keep = key_pos >= 0
        out = vals.new_zeros(vals.shape[0], key_grid[0] * key_grid[1])
        out.index_add_(1, key_pos[keep], vals[:, keep])  # [B, h·w]
        if key_grid != grid:
            out = out @ spread_matrix(key_grid, grid).to(out.dtype)  # [B, H·W]
        return out.view(-1, *grid)  # [B, H, W]

    def query_map(self, weights: Tensor, query: tuple[int, int] | str | int, head: int | None = None) -> Tensor:
        """Where one query looks: ``[B, H, W]``, summing to its row's weight on grid keys.

        ``weights``: as the core gave them (``[*b, nh', n, m]``); ``query``: a grid position
        ``(row, col)``, ``"cls"`` (the first prefix token) or a position code (``-2 - p``). A query
        that sits in several rows gets their mean; ``head``: one head, else the mean over heads.
        """
        grid, _, key_pos = self._check_spatial("query_map")
        w = _heads(self.canonical(weights), head)  # [B, G, n, m]
        if isinstance(query, str):
            if query != "cls":
                raise ValueError(f"query must be (row, col), 'cls' or a prefix code, got {query!r}")
            code = prefix_code(0)
        elif isinstance(query, int):
            code = query
        else:
            r, c = int(query[0]), int(query[1])
            if not (0 <= r < grid[0] and 0 <= c < grid[1]):
                raise ValueError(f"query {tuple(query)} is outside the {grid[0]}x{grid[1]} grid")
            code = r * grid[1] + c
        if self.query_cells is not None and code >= 0:  # shared query rows: the rows standing for the cell
            g, i = (self.query_cells == code).any(dim=-1).nonzero(as_tuple=True)
        else:
            g, i = (self.query_pos == code).nonzero(as_tuple=True)
        if g.numel() == 0:
            what = "no prefix (class) token" if code <= -2 else f"no query row at {query}"
            raise ValueError(f"the layout has {what}; pass query=(row, col)")
        rows = w[:, g, i]  # [B, R, m]
        maps = self._to_grid(rows.flatten(1), key_pos[g].reshape(-1))  # sum over the R rows (no -1: B may be 0)
        return maps / g.numel()  # [B, H, W]

    def prefix_share(self, weights: Tensor, head: int | None = None) -> Tensor:
        """Share of the grid queries' attention that lands on each prefix token (class, registers, globals):
        ``[B, P]``, the mean over every grid query row of its weight on prefix key ``p`` (``P`` =
        :attr:`num_prefix_tokens`; registers that soak up attention show here, Darcet et al. 2024)."""
        _, _, key_pos = self._check_spatial("prefix_share")
        P = self.num_prefix_tokens
        w = _heads(self.canonical(weights), head)  # [B, G, n, m]
        on_grid = self.query_pos >= 0  # [G, n]
        rows = on_grid.sum().clamp_min(1)
        shares = []
        for p in range(P):
            keys = (key_pos == prefix_code(p)).to(w.dtype)  # [G, m]
            per_row = (w * keys[None, :, None, :]).sum(dim=-1)  # [B, G, n]
            shares.append((per_row * on_grid[None].to(w.dtype)).sum(dim=(1, 2)) / rows)
        return torch.stack(shares, dim=-1) if shares else w.new_zeros(w.shape[0], 0)  # [B, P]

    def received(self, weights: Tensor, head: int | None = None) -> Tensor:
        """Attention each grid cell receives as a key, averaged over the queries that may attend to it:
        ``[B, H, W]`` (a key's total over its group's rows, divided by those rows, padding included)."""
        _, _, key_pos = self._check_spatial("received")
        w = _heads(self.canonical(weights), head).sum(dim=2)  # [B, G, m]: summed over the queries
        flat = key_pos.reshape(-1)
        totals = self._to_grid(w.flatten(1), flat)  # [B, H, W]
        rows = torch.full((1, flat.numel()), float(self.query_pos.shape[1]), dtype=w.dtype)
        count = self._to_grid(rows, flat)  # [1, H, W]: queries that see each cell
        return totals / count.clamp_min(1e-12)


def _heads(w: Tensor, head: int | None) -> Tensor:
    """``[B, G, nh, n, m]`` -> one head or the mean over heads, ``[B, G, n, m]``."""
    nh = w.shape[2]
    if head is None:
        return w.mean(dim=2)
    if not -nh <= head < nh:
        raise ValueError(f"head={head} out of range for {nh} heads")
    return w[:, :, head]


@_cached(maxsize=64)
def _spread_matrix(h: int, w: int, H: int, W: int) -> Tensor:
    def cover(coarse: int, fine: int) -> Tensor:  # [coarse, fine]: 1 where a coarse cell covers a fine one
        f = torch.arange(fine, device=_CPU)
        if coarse > fine:  # keys finer than the grid (MViTv2's stage-opening queries): each lies in one cell
            return (torch.arange(coarse, device=_CPU)[:, None] * fine // coarse == f[None, :]).float()
        return (f[None, :] * coarse // fine == torch.arange(coarse, device=_CPU)[:, None]).float()

    m = torch.einsum("ab,cd->acbd", cover(h, H), cover(w, W)).reshape(h * w, H * W)  # [h·w, H·W]
    return m / m.sum(dim=1, keepdim=True).clamp_min(1.0)


def spread_matrix(key_grid: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """``[h·w, H·W]``: row ``k`` spreads a coarse key's weight evenly over the fine cells it covers.

    Fine cell ``(r, c)`` lies under coarse cell ``(r·h // H, c·w // W)``. Along an axis where the keys are finer
    than the grid (``h > H``), key row ``r`` lies in cell ``r·H // h`` and gives it its whole weight. Cached;
    read-only.
    """
    return _spread_matrix(int(key_grid[0]), int(key_grid[1]), int(grid[0]), int(grid[1]))


def _token_pos(n: int, cells: int) -> Tensor:
    """``[n]``: ``n - cells`` prefix codes, then the grid ``0 .. cells - 1``."""
    P = n - cells
    return torch.cat([-2 - torch.arange(P, device=_CPU), torch.arange(cells, device=_CPU)])


@_cached(maxsize=128)
def _token_layout(n: int, m: int | None, grid: tuple[int, int] | None, P: int,
                  key_grid: tuple[int, int] | None = None) -> AttentionLayout:
    if key_grid is not None and grid is not None and n == P + grid[0] * grid[1]:
        # keys: the same prefix tokens, then a coarser (reduced) map of the grid
        return AttentionLayout(grid, _token_pos(n, grid[0] * grid[1]),
                               _token_pos(P + key_grid[0] * key_grid[1], key_grid[0] * key_grid[1]),
                               key_grid=key_grid)
    if grid is None:  # rows are sequence positions, placed by an observer that knows the grid (on_grid)
        q = torch.arange(n, device=_CPU)
        return AttentionLayout(None, q, q if m is None else None)
    H, W = grid
    if m is not None and n == P and m >= H * W:  # prefix queries over a context [m - H·W prefix; grid] (CaiT)
        return AttentionLayout((H, W), _token_pos(n, 0), _token_pos(m, H * W))
    if n != P + H * W:  # not the grid's tokens (e.g. a pooling query): rows stay sequence positions
        return _token_layout(n, m, None, 0)
    q = _token_pos(n, H * W)
    return AttentionLayout((H, W), q, q if m is None else None)


def token_layout(num_tokens: int, feat_size: tuple[int, int] | None = None, num_prefix_tokens: int = 0, *,
                 num_context: int | None = None, key_grid: tuple[int, int] | None = None) -> AttentionLayout:
    """Global attention over tokens ``[B, P + H·W, C]``: one group, prefix tokens first.

    Without ``feat_size`` the rows are sequence positions (grid unknown, see
    :meth:`AttentionLayout.on_grid`). ``num_context``: keys come from a context of that many tokens
    (not on the image), except when every query is a prefix token (``num_tokens ==
    num_prefix_tokens``, CaiT's class attention): then the context is ``[prefix; H·W grid]`` tokens
    and its keys are placed on the grid. ``key_grid (h, w)``: the keys are the same prefix tokens followed by a
    coarser ``h x w`` map of the grid (spatial reduction: PVT / Twins ``sra``, CvT's strided k / v);
    each coarse key's weight is spread over the cells it covers when placed. Cached per sizes.
    """
    grid = None if feat_size is None else (int(feat_size[0]), int(feat_size[1]))
    kg = None if key_grid is None else (int(key_grid[0]), int(key_grid[1]))
    return _token_layout(int(num_tokens), None if num_context is None else int(num_context), grid,
                         int(num_prefix_tokens), kg)


@_cached(maxsize=128)
def _window_layout(H: int, W: int, wh: int, ww: int, sh: int, sw: int, pad_first: bool, fold: str
                   ) -> AttentionLayout:
    fwd, _ = window_gather_index(H, W, (wh, ww), (sh, sw), pad_first=pad_first)
    pos = torch.where(fwd == H * W, PAD, fwd).view(-1, wh * ww)  # [nW, Wh·Ww]
    return AttentionLayout((H, W), pos, pos, fold=fold)  # type: ignore[arg-type]


def window_layout(H: int, W: int, window_size: int | tuple[int, int], shift: tuple[int, int] = (0, 0), *,
                  pad_first: bool = True, fold: Fold = "batch") -> AttentionLayout:
    """(Shifted, padded) windows of an ``H x W`` map, each attending to itself: groups = windows.

    ``shift``: the shift actually applied; ``pad_first``: pad then roll (torchvision), else roll then
    pad; ``fold``: ``"batch"`` (``[B·nW, nh, N, N]``) or ``"heads"`` (``[B, nW·nh, N, N]``). Cached.
    """
    wh, ww = to_pair(window_size)
    sh, sw = to_pair(shift, "shift_size")
    if math.prod((H, W)) <= 0:
        raise ValueError(f"window_layout needs a non-empty map, got {H}x{W}")
    return _window_layout(int(H), int(W), wh, ww, sh, sw, bool(pad_first), fold)
