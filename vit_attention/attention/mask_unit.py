"""Hiera's mask-unit attention (Ryali et al., "Hiera: A Hierarchical Vision Transformer without the
Bells-and-Whistles", ICML 2023) on tokens in Hiera's unrolled order, with query pooling at stage transitions.

The tokens ``[B, N, C]`` of an ``H x W`` grid arrive in Hiera's unrolled order
(:mod:`vit_attention.functional.mask_unit`) of ``k = log2(mask_unit)`` steps: the ``nMU = N / mask_unit²`` mask
units are the ``mask_unit x mask_unit`` windows of the map, and token ``n`` belongs to unit ``n mod nMU``. Per block
(timm 1.0.31 ``timm/models/hiera.py`` ``MaskUnitAttention``, equal to facebookresearch/hiera ``hiera.py``)::

    q, k, v = split_heads(x W_qkv + b)                   # W_qkv: C -> 3·C', hd = C' / nh
    mask units: the queries and keys of unit u are the tokens n ≡ u (mod nMU)
    q = max over the q_stride quarters of q                 (q pooling; the unrolled 2x2 max-pool)
    out = proj(softmax(q kᵀ · hd^-½) v)                   # no position term of any kind

or the same over all tokens (``mask_unit_attn=False``: global attention, q pooled the same way). In image terms
mask-unit attention is window attention without bias or shift on ``mask_unit x mask_unit`` windows, and q pooling
a 2x2 max-pool of the queries on the map; the keys of a pooling block keep the pre-pool window.

:class:`MaskUnitAttention` (registered ``mask_unit``) keeps the width and the token count, as every mechanism; the
pooling block that opens a Hiera stage (``q_stride = 4``, the width ``C -> C'``) is :class:`MaskUnitPoolAttention`,
not registered (the registry's contract maps tokens to tokens of the same count and width), sharing the code; the
family builds it. Prefix tokens (a class token, where a model plugs this mechanism in with one; Hiera has none)
attend to every token and every token attends to them; the grid tokens keep their units.

A grid that does not hold whole units (a generic use on any map; Hiera refuses such sizes) has no unrolled order:
its tokens are taken row-major and the units are the map's ``mask_unit x mask_unit`` windows from the top left, the
last ones cut by the border (:func:`window_rows_pattern`, one masked call), which is what Hiera's attention computes
on such a window. Recorded maps are placed in image space: each unit's rows at the grid cells of its window (the
order undone). On the ``"flex"`` backend the units run as one call over the unit-major sequence with the
block-diagonal mask ``q // w == kv // (q_stride·w)`` (:func:`mask_unit_pattern`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_packed
from ..functional.flex import AttentionPattern, PatternDoc, flex_buffer, use_flex
from ..functional.layout import AttentionLayout, prefix_code
from ..functional.linear import apply_linear
from ..functional.mask_unit import unit_positions, unrolled_positions
from ..functional.observers import attention_observed
from .base import AttentionCall, AttentionModule, check_heads, check_map_tokens_call, grid_of
from .registry import register_attention
from .transfer import PACKED_QKV_SLOTS

__all__ = ["MaskUnitAttention", "MaskUnitPoolAttention", "mask_unit_pattern", "window_rows_pattern"]


def _check_mask_unit(mask_unit: Any) -> int:
    """``mask_unit`` as an int after checking it is a power of 2 (the side of a unit of the unrolled order)."""
    if not isinstance(mask_unit, int) or isinstance(mask_unit, bool) or mask_unit < 1 \
            or mask_unit & (mask_unit - 1):
        raise ValueError(f"mask_unit must be a power of 2 >= 1 (the side, in tokens, of a mask unit of Hiera's "
                         f"unrolled order), got {mask_unit!r}")
    return mask_unit


def mask_unit_pattern(num_units: int, unit_queries: int, unit_keys: int, num_prefix_tokens: int = 0,
                      ) -> AttentionPattern:
    """Mask-unit attention as one :class:`~vit_attention.functional.flex.AttentionPattern`.

    Without prefix tokens the sequence is unit-major (unit ``u``'s ``unit_queries`` queries, then the next unit's;
    the keys likewise with ``unit_keys`` per unit): ``mask_mod = q // unit_queries == kv // unit_keys``, a
    block-diagonal mask. With ``P`` prefix tokens the sequence is ``[P prefix; the unrolled tokens]`` (one query
    per key): a prefix query or key is always seen, grid tokens when ``(q - P) mod nMU == (kv - P) mod nMU``.
    """
    P, nW, wq, wk = int(num_prefix_tokens), int(num_units), int(unit_queries), int(unit_keys)
    if P:
        if wq != wk:
            raise ValueError("prefix tokens need one query per key (no q pooling)")

        def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return (q < P) | (kv < P) | ((q - P) % nW == (kv - P) % nW)

        return AttentionPattern(P + nW * wq, P + nW * wk, mask_mod=mask_mod, cache_key=("mask_unit", P, nW, wq))

    def block_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return q // wq == kv // wk

    return AttentionPattern(nW * wq, nW * wk, mask_mod=block_mod, cache_key=("mask_unit", 0, nW, wq, wk))


def window_rows_pattern(grid: tuple[int, int], mask_unit: int, num_prefix_tokens: int = 0, *,
                        device: torch.device | str = "cpu") -> AttentionPattern:
    """Mask units on a grid that does not hold whole units, as one pattern over ``[P prefix; H·W tokens]`` in
    row-major order: grid tokens see the grid tokens of their ``mask_unit x mask_unit`` window (windows from the top
    left, the last ones cut by the border: bottom / right padding whose slots are no keys); prefix tokens see and
    are seen by all. ``device``: where the unit table lives (the call's device)."""
    H, W = int(grid[0]), int(grid[1])
    P, m = int(num_prefix_tokens), int(mask_unit)
    r = torch.arange(H * W, device=device)
    unit = (r // W) // m * ((W + m - 1) // m) + (r % W) // m
    unit = flex_buffer(torch.cat([torch.full((P,), -1, dtype=torch.long, device=device), unit]))

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (q < P) | (kv < P) | (unit[q] == unit[kv])

    return AttentionPattern(P + H * W, P + H * W, mask_mod=mask_mod, cache_key=("mask_unit_rows", H, W, m, P))


class _MaskUnitCore(AttentionModule):
    """Mask-unit or global attention with q pooling, ``[B, P + L, C] -> [B, P + L / q_stride, C']`` (the shared
    code of :class:`MaskUnitAttention` and :class:`MaskUnitPoolAttention`; see the module docstring).

    Keys: ``qkv`` (``Linear(C, 3·C')``), ``proj`` (``Linear(C', C')``), timm's and the original's.
    """

    accepts = frozenset({"residual"})
    merging_note = ("its mask units are fixed windows of Hiera's unrolled token order (token n in unit n mod nMU); "
                    "merged tokens would no longer fill them")

    def _build(self, dim: int, dim_out: int, num_heads: int, *, q_stride: int, mask_unit: int,
               mask_unit_attn: bool, qkv_bias: bool, attn_drop: float, proj_drop: float) -> None:
        check_heads(dim, 1)
        self.init_attention(dim_out, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.dim, self.dim_out = dim, dim_out
        self.mask_unit = _check_mask_unit(mask_unit)
        if not isinstance(mask_unit_attn, bool):
            raise ValueError(f"mask_unit_attn must be a bool (mask-unit or global attention), got {mask_unit_attn!r}")
        if not isinstance(qkv_bias, bool):
            raise ValueError(f"qkv_bias must be a bool, got {qkv_bias!r}")
        self.mask_unit_attn = mask_unit_attn
        self.q_stride = q_stride
        self.steps = int(math.log2(self.mask_unit))  # unroll steps of the (pooled) query order
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim_out, bias=qkv_bias)
        self.proj = nn.Linear(dim_out, dim_out)

    def _side(self) -> int:
        """The side of a unit of the keys' order (twice the query unit's in a pooling call)."""
        return self.mask_unit * (2 if self.q_stride > 1 else 1)

    def _fits(self, L: int, feat_size: Any) -> bool:
        """Whether ``L`` grid tokens hold whole units: without ``feat_size`` by their count, with it by both sides."""
        side = self._side()
        if L % (side * side):
            return False
        if feat_size is None:
            return True
        H, W = grid_of(L, feat_size)
        return H % side == 0 and W % side == 0

    def _layout(self, L: int, P: int, feat_size: Any, kind: str) -> AttentionLayout | None:
        """Where the rows sit on the grid (observers only): ``"units"``, a group per unit at its window's cells;
        ``"unrolled"`` / ``"rows"``, one group, the prefix tokens then the grid cells in the unrolled / row-major
        order. None for a pooling call."""
        if not attention_observed() or self.q_stride > 1:
            return None
        grid = grid_of(L, feat_size)
        if kind == "units":
            pos = unit_positions(grid, self.steps)  # [nW, w]
            return AttentionLayout(grid, pos, pos)
        cells = unrolled_positions(grid, self.steps) if kind == "unrolled" else torch.arange(L)
        pos = torch.cat([torch.tensor([prefix_code(p) for p in range(P)], dtype=torch.long), cells])
        return AttentionLayout(grid, pos, pos)

    def _attention(self, x: Tensor, call: AttentionCall) -> Tensor:
        """``x [B, P + L, C]`` -> heads merged ``[B, P + L / q_stride, C']`` (before the output projection)."""
        B, N, C, P = check_map_tokens_call(self, x, call)
        L = N - P
        s, nh, hd = self.q_stride, self.num_heads, self.head_dim
        fits = self._fits(L, call.feat_size)
        if not fits and s > 1:
            raise ValueError(f"{L} tokens (feat_size={call.feat_size}) do not hold whole {self._side()}x"
                             f"{self._side()} mask units: the pooling attention needs a grid whose sides are "
                             f"multiples of {self._side()}")
        w = self.mask_unit ** 2
        nW = L // (s * w)
        qkv = apply_linear(self.qkv, x)  # [B, N, 3C']
        if self.mask_unit_attn and not P and fits:
            # unrolled token t·nW + u is token t of unit u: [B, s·w, nW, 3, nh, hd] -> [3, B, nW, nh, s·w, hd]
            q, k, v = qkv.view(B, s * w, nW, 3, nh, hd).permute(3, 0, 2, 4, 1, 5).unbind(0)
            if s > 1:  # the unrolled 2x2 max-pool: the s quarters of each unit
                q = q.reshape(B, nW, nh, s, w, hd).amax(dim=3)  # [B, nW, nh, w, hd]
            if use_flex(self.attention_backend, self.fused_attention, x.device, "mask_unit"):
                seq = [t.transpose(1, 2).reshape(B, nh, -1, hd) for t in (q, k, v)]  # unit-major [B, nh, nW·w', hd]
                out = self.attend(*seq, scale=self.scale, pattern=mask_unit_pattern(nW, w, s * w))
                out = out.view(B, nh, nW, w, hd).permute(0, 3, 2, 1, 4)  # [B, w, nW, nh, hd]
            else:
                out = self.attend(q.reshape(B * nW, nh, w, hd), k.reshape(B * nW, nh, s * w, hd),
                                  v.reshape(B * nW, nh, s * w, hd), scale=self.scale,
                                  layout=self._layout(L, P, call.feat_size, "units"))  # [B·nW, nh, w, hd]
                out = out.view(B, nW, nh, w, hd).permute(0, 3, 1, 2, 4)  # [B, w, nW, nh, hd]
            return out.reshape(B, w * nW, nh * hd)
        q, k, v = split_packed(qkv, nh, 3, "qkv")  # each [B, nh, N, hd]
        if s > 1:  # prefix tokens are refused by the pooling block
            q = q.reshape(B, nh, s, N // s, hd).amax(dim=2)
        pattern = None
        if self.mask_unit_attn:
            pattern = mask_unit_pattern(nW, w, w, P) if fits else \
                window_rows_pattern(grid_of(L, call.feat_size), self.mask_unit, P, device=x.device)
        out = self.attend(q, k, v, scale=self.scale, pattern=pattern,
                          layout=self._layout(L, P, call.feat_size, "unrolled" if fits else "rows"))
        return merge_heads(out)  # [B, N', C']

    def _flops(self, input_shape: tuple[int, ...], feat_size: Any) -> int:
        """Multiply-adds of one call on ``(B, P + L, C)`` (``P = N - H·W`` with ``feat_size``, else 0)."""
        B, N, C = input_shape
        P = 0 if feat_size is None else N - int(feat_size[0]) * int(feat_size[1])
        L = N - P
        Co, s = self.dim_out, self.q_stride
        Nq = P + L // s
        units = self.mask_unit_attn and not P and self._fits(L, feat_size)
        keys = s * self.mask_unit ** 2 if units else N
        return B * (N * C * 3 * Co + 2 * Nq * keys * Co + Nq * Co * Co)


@register_attention(
    "mask_unit", layout="tokens", needs_feat_size=True,
    description="Hiera mask-unit attention: windows of the unrolled token order (or global), no position term",
    paper="https://arxiv.org/abs/2306.00989",
    formula=(
        "Hiera's mask-unit attention (Ryali et al. 2023) on tokens in Hiera's unrolled order: with `k = "
        "log2(mask_unit)` unroll steps, token `n` belongs to mask unit `n mod nMU`, a `mask_unit x mask_unit` "
        "window of the map; attention runs inside each unit (or over all tokens, `mask_unit_attn=False`):\n\n"
        "    q, k, v = split_heads(x W_qkv + b)\n"
        "    A = softmax(q kᵀ · hd^-½ + M),  M[i, j] = 0 if i ≡ j (mod nMU) else -inf\n"
        "    out = merge_heads(A v) W_proj\n\n"
        "No position term of any kind (Hiera adds an absolute embedding once, before the unroll). At a stage "
        "transition the queries are max-pooled 2x2 (in the unrolled order: the max over the four quarters of a "
        "unit) and the width changes: the family's pooling block. Recorded maps are placed on the image grid "
        "(the unroll undone)."),
    cost="4·N·C² + 2·N·w·C multiply-adds (w = mask_unit² keys per query; N instead of w when global)",
    example_kwargs={"mask_unit": 2}, example_shape=(2, 16, 32),
    doc_example=({"mask_unit": 8}, (1, 56 * 56, 96)),
    grid_kwargs=lambda grid: {"mask_unit": _largest_unit(grid)},
    global_kwargs=lambda grid: {"mask_unit": 1, "mask_unit_attn": False})
class MaskUnitAttention(_MaskUnitCore):
    """Hiera's mask-unit (or global) attention, ``[B, P + H·W, C] -> [B, P + H·W, C]``, tokens in Hiera's unrolled
    order of ``log2(mask_unit)`` steps.

    Args:
        dim: the width ``C``; num_heads: ``nh`` (must divide ``dim``).
        mask_unit: the side of a mask unit in tokens (a power of 2; Hiera: 8 in stage 1, 4 in stage 2, ...); on a
            grid whose sides are not multiples of it the tokens are row-major and the units border-cut windows.
        mask_unit_attn: attention inside each unit (True) or over all tokens (False: the order matters only for
            where the recorded maps are placed).
        qkv_bias: a bias on ``qkv`` (Hiera: yes); attn_drop, proj_drop: dropouts.
    """

    transfer_slots = PACKED_QKV_SLOTS
    flex_pattern = PatternDoc(
        families="Hiera",
        keys="a key of the query's mask unit (unrolled position ≡ mod nMU), or a prefix token",
        term="-",
        order="unit-major (Hiera's unrolled order transposed)",
        example=(dict(mask_unit=8), (1, 56 * 56, 96)))

    def __init__(self, dim: int, num_heads: int = 1, *, mask_unit: int = 8, mask_unit_attn: bool = True,
                 qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self._build(dim, dim, num_heads, q_stride=1, mask_unit=mask_unit, mask_unit_attn=mask_unit_attn,
                    qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, P + H·W, C] -> [B, P + H·W, C]`` (grid tokens in the unrolled order); ``call.residual``: added
        to the output (fused into the projection at inference)."""
        return self.project_out(self._attention(x, call), call.residual)

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``(B, N, C)``: ``4·N·C² + 2·N·K·C``, ``K`` = ``mask_unit²`` keys per query in units
        without prefix tokens, else ``N`` (global attention, or units with prefix tokens: one masked call)."""
        return self._flops(input_shape, feat_size)


class MaskUnitPoolAttention(_MaskUnitCore):
    """The pooling block's attention that opens a Hiera stage: ``[B, L, C] -> [B, L / q_stride, C']``.

    Queries max-pooled over the ``q_stride`` quarters (4: a 2x2 max-pool of the map), keys and values of the
    pre-pool unit, the width ``C -> C'`` (``qkv: Linear(C, 3C')``, ``proj: Linear(C', C')``). ``mask_unit``: the
    unit side AFTER pooling (timm's ``window_size`` is its square). No prefix tokens. Not registered (it changes the
    token count and width); it runs the attention core with the captured switches as :class:`MaskUnitAttention`,
    and tools that name mechanisms (recorded maps, FLOPs by kind, backend sweeps) see the ``mask_unit`` mechanism.
    """

    attention_name = "mask_unit"  # the pooling call of the registered mechanism (its spec is MaskUnitAttention's)

    def __init__(self, dim: int, dim_out: int, num_heads: int = 1, *, q_stride: int = 4, mask_unit: int = 4,
                 mask_unit_attn: bool = True, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        if q_stride not in (1, 4):
            raise ValueError(f"q_stride must be 1 or 4 (a 2x2 max-pool in the unrolled order), got {q_stride!r}")
        check_heads(dim_out, num_heads, "dim_out")
        self._build(dim, dim_out, num_heads, q_stride=q_stride, mask_unit=mask_unit, mask_unit_attn=mask_unit_attn,
                    qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, L, C] -> [B, L / q_stride, C']`` (no prefix tokens; ``residual`` of the output's shape)."""
        if call.num_prefix_tokens:
            raise ValueError(f"num_prefix_tokens={call.num_prefix_tokens}: the pooling attention takes no prefix "
                             "tokens")
        return self.project_out(self._attention(x, call), call.residual)

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``(B, L, C)``: ``3·L·C·C' + 2·(L/s)·K·C' + (L/s)·C'²`` (``K = s·mask_unit²`` in units,
        else ``L``; the max-pool is no multiply-add)."""
        return self._flops(input_shape, feat_size)


def _largest_unit(grid: tuple[int, int]) -> int:
    """The largest power of 2 at most half the smaller side that divides both sides (several units on a grid)."""
    m = 1
    while (m * 2) <= max(1, min(grid) // 2) and grid[0] % (m * 2) == 0 and grid[1] % (m * 2) == 0:
        m *= 2
    return m
