"""Neighbourhood attention (NAT, Hassani et al. 2023) with dilation (DiNAT, Hassani & Shi 2022), in pure PyTorch.

Channels-last maps ``[B, H, W, C]`` in and out. Each query attends to its ``K x K`` neighbourhood
(dilation ``d``: every ``d``-th token), the window clamped inside the map at borders (NATTEN's
rule, see :mod:`vit_attention.functional.neighborhood`), with a learned relative-position bias
``rpb [nh, 2K-1, 2K-1]``. Maps with a side smaller than ``K·d`` are zero-padded bottom / right to
``K·d`` before the projection and cropped after, unmasked, as the original module and Hugging
Face do: there a query's window holds zero-padding keys (most of them on a map much smaller than
``K·d``), and the module warns once (:class:`SmallMapWarning`, the first call on such a map).

No ``N x N`` matrix is ever built: queries are processed in tiles that share a key region (the
tile plan), each tile one small dense problem for the library's single attention function (the
fused kernel when no weights are asked for). Memory is linear in the map size. On the ``"flex"``
backend the whole map is one block-sparse FlexAttention pattern instead
(:func:`~vit_attention.functional.neighborhood.neighborhood_pattern`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.flex import PatternDoc, use_flex
from ..functional.linear import apply_linear
from ..functional.neighborhood import default_tile_size, neighborhood_attention, neighborhood_bias, neighborhood_plan
from ..functional.runtime import capturing
from ..functional.window import to_pair
from .base import AttentionCall, PackedQKVAttention, ParamCache, check_spatial_call, uncacheable
from .registry import register_attention
from .transfer import PACKED_QKV_SLOTS

__all__ = ["NeighborhoodAttention", "SmallMapWarning"]


class SmallMapWarning(UserWarning):
    """Neighbourhood attention ran on a map smaller than ``kernel_size · dilation``: it attends to zero padding."""


def _grid_kernel(grid: tuple[int, int]) -> dict[str, Any]:
    """The largest odd kernel <= 7 that fits the grid (``compare`` on small maps)."""
    k = max(1, min(7, min(grid)))
    return {"kernel_size": k if k % 2 else k - 1}


@register_attention(
    "neighborhood", layout="spatial",
    description="NAT / DiNAT neighbourhood attention: each token attends to its K x K (dilated) neighbourhood",
    example_kwargs=dict(kernel_size=3), paper="https://arxiv.org/abs/2204.07143",
    formula=(
        "Neighbourhood attention (NAT, Hassani et al. 2023; dilated: DiNAT, Hassani & Shi 2022). Query "
        "`(i, j)` attends to the `K x K` keys of its neighbourhood ρ(i, j), every `d`-th token with "
        "dilation `d`, the window centred and clamped inside the map at borders (NATTEN's rule):\n\n"
        "    A_ij = softmax_{(k, l) ∈ ρ(i, j)}( q_ij · k_kl · hd^-1/2 + rpb[h, (k-i)/d + K-1, (l-j)/d + K-1] )\n"
        "    out_ij = Σ A_ij,kl v_kl\n\n"
        "Computed in tiles of `T x T` queries that share a key region of at most `(T + K - 1)²` keys "
        "(a mask keeps each query to its window): small dense problems for the fused kernel, never an "
        "`N x N` matrix.\n\n"
        "**Maps smaller than `K·d`.** A side shorter than `kernel_size · dilation` is zero-padded "
        "bottom / right to `K·d` and the padding is attended, unmasked (the original NAT / DiNAT module "
        "and Hugging Face do the same): part of every window, most of it on a map much smaller than "
        "`K·d`, is zero keys (e.g. `K = 7` on a 3×3 map: on average 82 % of a query's 49 keys). Each module "
        "warns the first time it runs on such a map (`SmallMapWarning`, a `UserWarning`, once per module instance; "
        "not while torch compiles or exports), naming the map, the kernel, the dilation and the padded "
        "share of the keys; a larger input or a smaller `kernel_size` / `dilation` for that stage avoids it."),
    cost="4·N·C² + 2·N·K²·C multiply-adds for the mechanism (linear in N); the tiles compute "
         "2·nT·T²·R²·C for the logits and values (R ≤ T + K − 1), about (T + K − 1)²/K² of that",
    doc_example=(dict(kernel_size=7, dilation=1), (1, 14, 14, 96)), grid_kwargs=_grid_kernel,
    global_kwargs=lambda grid: {"kernel_size": max(grid) | 1})  # one odd K x K window covers the map
class NeighborhoodAttention(PackedQKVAttention):
    """Neighbourhood attention, ``[B, H, W, C] -> [B, H, W, C]`` (any ``H, W``).

    Keys as the original NAT module: ``qkv`` (Linear C -> 3C), ``rpb`` ``[nh, 2K-1, 2K-1]``, ``proj``.
    q is scaled by ``hd^-1/2`` before the bias is added.

    Args:
        dim: channels ``C``; num_heads: ``nh`` (must divide ``dim``).
        kernel_size: ``K`` (odd) or ``(Kh, Kw)``. dilation: ``d`` or ``(dh, dw)``.
        qkv_bias: bias on the qkv projection. qk_scale: logit scale (default ``hd ** -0.5``).
        rel_pos_bias: learn ``rpb`` (NAT / DiNAT); False for none.
        tile_size: query tile side ``T`` (default :func:`~vit_attention.functional.neighborhood.default_tile_size`):
            a speed knob, the output does not depend on it.

    A map with a side below ``K·d`` is zero-padded to ``K·d`` and the padding attended (the
    original's behaviour); the first such call of each instance warns (:class:`SmallMapWarning`).
    """

    # docs/flex.md's row of patterns (analysis.docs.pattern_table); skipped blocks counted on `example`
    flex_pattern = PatternDoc(
        families="NAT, DiNAT",
        keys="same residue mod the dilation, inside the query's clamped K x K window",
        term="`rpb[h, Δr/d + K-1, Δc/d + K-1]`",
        order="row-major (d = 1), residue-major (d > 1), 8 x 8 tiles for wide maps",
        example=(dict(kernel_size=7), (1, 28, 28, 96)))

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    def __init__(self, dim: int, num_heads: int, *, kernel_size: int | tuple[int, int] = 7,
                 dilation: int | tuple[int, int] = 1, qkv_bias: bool = True, qk_scale: float | None = None,
                 rel_pos_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 tile_size: int | None = None) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.kernel_size = to_pair(kernel_size, "kernel_size")
        self.dilation = to_pair(dilation, "dilation")
        if any(k < 1 or k % 2 == 0 for k in self.kernel_size):
            raise ValueError(f"kernel_size must be odd and positive (the window is centred), got {kernel_size!r}")
        if min(self.dilation) < 1:
            raise ValueError(f"dilation must be >= 1, got {dilation!r}")
        if tile_size is not None and (not isinstance(tile_size, int) or tile_size < 1):
            raise ValueError(f"tile_size must be a positive int or None, got {tile_size!r}")
        self.tile_size = tile_size if tile_size is not None else default_tile_size(max(self.kernel_size))
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        kh, kw = self.kernel_size
        self.rpb = nn.Parameter(torch.zeros(num_heads, 2 * kh - 1, 2 * kw - 1)) if rel_pos_bias else None
        if self.rpb is not None:
            nn.init.trunc_normal_(self.rpb, std=0.02)
        self.proj = nn.Linear(dim, dim)
        self._bias_cache = ParamCache()  # the tiles' bias, while rpb holds the same values
        self._warned_small_map = False  # SmallMapWarning: once per instance

    # ---- attention.transfer: another mechanism's weights into this one
    offset_bias_params = ("rpb",)

    def transfer_init(self) -> list[str]:
        """A zero ``rpb``: no position term beyond what the carried projections compute."""
        if self.rpb is None:
            return []
        with torch.no_grad():
            self.rpb.zero_()
        return ["rpb: zeros (no position term)"]

    def get_offset_bias(self) -> Tensor | None:
        """``rpb`` ``[nh, 2Kh-1, 2Kw-1]`` is already an offset grid (key minus query) when undilated; None with
        dilation (its entries are offsets in steps of ``d``) or without ``rpb``."""
        if self.rpb is None or self.dilation != (1, 1):
            return None
        return self.rpb.detach().clone()

    def set_offset_bias(self, grid: Tensor) -> bool:
        """Read ``rpb`` off an offset grid ``[nh, 2a-1, 2b-1]``: entry ``(i, j)`` is the offset
        ``((i - Kh + 1)·dh, (j - Kw + 1)·dw)``, zero beyond the grid's reach -> whether it was written."""
        if self.rpb is None or grid.shape[0] != self.num_heads:
            return False
        (kh, kw), (dh, dw) = self.kernel_size, self.dilation
        a, b = (grid.shape[1] + 1) // 2, (grid.shape[2] + 1) // 2
        rows = torch.arange(-(kh - 1), kh) * dh + a - 1  # grid rows of this table's offsets
        cols = torch.arange(-(kw - 1), kw) * dw + b - 1
        ok = ((rows >= 0) & (rows < grid.shape[1]))[:, None] & ((cols >= 0) & (cols < grid.shape[2]))[None, :]
        picked = grid[:, rows.clamp(0, grid.shape[1] - 1)][:, :, cols.clamp(0, grid.shape[2] - 1)]
        with torch.no_grad():
            self.rpb.copy_(torch.where(ok.to(grid.device), picked, torch.zeros_like(picked)))
        return True

    def padded_size(self, H: int, W: int) -> tuple[int, int]:
        """The map size attention runs on: each side at least ``K·d`` (zero padding bottom / right)."""
        return max(H, self.kernel_size[0] * self.dilation[0]), max(W, self.kernel_size[1] * self.dilation[1])

    def padding_share(self, H: int, W: int) -> float:
        """The share of a query's ``Kh·Kw`` keys that are zero padding on an ``H x W`` map, averaged over the queries.

        0 when both sides are at least ``K·d``. A padded side is exactly ``K·d`` long, so query row ``i``'s
        window holds every row ``≡ i (mod d)``: ``|{r < H: r ≡ i}|`` real ones of its ``K``.
        """
        real = 1.0
        for side, k, d in ((H, self.kernel_size[0], self.dilation[0]), (W, self.kernel_size[1], self.dilation[1])):
            if side < k * d:
                real *= sum(len(range(i % d, side, d)) for i in range(side)) / (side * k)
        return 1.0 - real

    def _warn_small_map(self, H: int, W: int) -> None:
        """:class:`SmallMapWarning` for an ``H x W`` map, once per instance (never while torch records a graph)."""
        if self._warned_small_map or capturing():
            return
        self._warned_small_map = True
        (kh, kw), (dh, dw) = self.kernel_size, self.dilation
        Hp, Wp = self.padded_size(H, W)
        warnings.warn(
            f"neighbourhood attention with kernel_size={(kh, kw)} and dilation={(dh, dw)} runs on a {H}x{W} map, "
            f"smaller than kernel_size·dilation = {kh * dh}x{kw * dw}: the map is zero-padded to {Hp}x{Wp} and "
            f"the padding is attended, unmasked (as the original NAT / DiNAT module): "
            f"{self.padding_share(H, W):.0%} of each query's keys are zeros on average. A larger input or a "
            "smaller kernel_size / dilation for this stage avoids it (warned once per module)",
            SmallMapWarning, stacklevel=2)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``; ``call.feat_size`` must match the map when given."""
        B, H, W, C = check_spatial_call(self, x, call)
        Hp, Wp = self.padded_size(H, W)
        if (Hp, Wp) != (H, W):
            self._warn_small_map(H, W)
            x = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H))  # zeros bottom / right, unmasked (the references)
        out = self.attend_packed(apply_linear(self.qkv, x), grid=(H, W))[:, :H, :W]  # [B, H, W, C]
        return self.project_out(out)  # [B, H, W, C]

    def attend_packed(self, qkv: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """The attention between the projections: packed ``[B, Hp, Wp, 3C] -> [B, Hp, Wp, C]``.

        On FlexAttention (:func:`~vit_attention.functional.flex.use_flex`) the whole map is one pattern
        whose score_mod reads ``rpb`` itself (no tiles' bias is built)."""
        if use_flex(self.attention_backend, self.fused_attention, qkv.device, mechanism="neighborhood"):
            return neighborhood_attention(qkv, self.num_heads, self.kernel_size, self.dilation, rpb=self.rpb,
                                          scale=self.scale, **self.core_options())
        return neighborhood_attention(qkv, self.num_heads, self.kernel_size, self.dilation,
                                      bias=self._bias(qkv.shape[1], qkv.shape[2], qkv.device),
                                      scale=self.scale, tile_size=self.tile_size, grid=grid, **self.core_options())

    def _bias(self, Hp: int, Wp: int, device: torch.device) -> Tensor:
        """Window mask + gathered ``rpb`` of every tile ``[nT, nh|1, T², R²]``; cached while no gradient is
        recorded, for one map size and tile size, while ``rpb`` holds the same values, dtype and device
        (compared on each call: an optimizer step, ``load_state_dict``, an in-place edit or ``.to()``
        refresh it; :class:`.base.ParamCache`); recomputed under autograd, graph capture or on meta."""
        def compute() -> Tensor:
            return neighborhood_bias(self.rpb, Hp, Wp, self.kernel_size, self.dilation, self.tile_size, device=device)

        if self.rpb is None:
            return compute()  # the cached window mask
        params = [self.rpb]
        if uncacheable(params):
            self._bias_cache.clear()
            return compute()
        key = (Hp, Wp, self.tile_size, device, torch.is_inference_mode_enabled())
        if not self._bias_cache.lookup(params, key):
            self._bias_cache.store(params, key, compute())
        return self._bias_cache.value

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``(B, H, W, C)``: qkv on the (padded) map, the tiles' ``2·nT·T²·R²·C``, proj on ``H·W``."""
        B, H, W, C = input_shape
        Hp, Wp = self.padded_size(H, W)
        plan = neighborhood_plan(Hp, Wp, self.kernel_size, self.dilation, self.tile_size)
        nT, T2, R2 = plan.mask.shape
        return B * (3 * Hp * Wp * C * C + 2 * nT * T2 * R2 * C + H * W * C * C)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}, tile_size={self.tile_size}")
