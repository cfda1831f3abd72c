"""Halo attention (HaloNet, Vaswani et al. 2021, "Scaling Local Self-Attention for Parameter Efficient
Visual Backbones"), as timm's ``HaloAttn``: channels-last maps ``[B, H, W, C]`` in,
``[B, H/stride, W/stride, dim_out]`` out.

The map is cut into ``b x b`` query blocks; each block attends to the ``(b + 2h) x (b + 2h)`` window
around it (its halo), with timm's factorised relative logits (``pos_embed.height_rel`` /
``pos_embed.width_rel``) as a q-dependent additive bias; see :mod:`vit_attention.functional.halo`.
Keys past the border are the zeros of the halo padding, attended to as timm does, or masked with
``pad_mask=True`` (lucidrains' halonet-pytorch). timm asserts that ``H`` and ``W`` are multiples of
``b``; here other sizes are zero-padded bottom / right after the projections (the same zeros as the
halo) and cropped after, so a multiple of ``b`` gives timm's numbers exactly.

On the ``"flex"`` backend the whole map is one block-sparse FlexAttention pattern instead of gathered
windows (:func:`~vit_attention.functional.halo.halo_pattern`: the query map against the halo-padded key
map, the relative logits read from per-query tables in the score_mod).

There is no output projection: HaloNet's bottleneck block has the 1x1 convs around it. Keys follow
timm: ``q`` / ``kv`` are 1x1 convs (``kv`` holds per head the key then the value channels).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.flex import PatternDoc
from ..functional.halo import halo_attention
from ..functional.runtime import ATTENTION_BACKEND, FUSED_ATTENTION
from ..functional.sizes import make_divisible
from .base import AttentionCall, AttentionModule, check_heads, check_prob, check_spatial_call, prefix_attention
from .registry import register_attention

__all__ = ["HaloAttention"]


def _grid_block(grid: tuple[int, int]) -> dict[str, Any]:
    """A block of half the smaller side (at least 1) and a halo of 1 (``compare`` on small maps)."""
    return {"block_size": max(1, min(grid) // 2), "halo_size": 1}


def _conv1x1(x: Tensor, conv: nn.Conv2d) -> Tensor:
    """A 1x1 conv (weight ``[Cout, Cin, 1, 1]``) on a channels-last map: ``[B, H, W, Cin] -> [B, H, W, Cout]``."""
    return F.linear(x, conv.weight.flatten(1), conv.bias)


@register_attention(
    "halo", layout="spatial",
    description="HaloNet blocked local attention: b x b query blocks attend to their (b + 2h)² halo window",
    example_kwargs=dict(block_size=4, halo_size=1, pad_mask=True), paper="https://arxiv.org/abs/2103.12731",
    formula=(
        "Halo attention (HaloNet, Vaswani et al. 2021; timm's `HaloAttn`). The map is cut into `b x b` "
        "query blocks; every query of a block attends to the `win x win` window (`win = b + 2h`) centred on "
        "its block, keys past the border being the zeros of the halo padding (masked with `pad_mask=True`). "
        "With the query `(qy, qx)` inside its block and the key `(ky, kx)` inside the window:\n\n"
        "    A = softmax_{(ky, kx) ∈ window}( q · k · hd^-1/2 + q · R_h[ky - qy + win - 1]\n"
        "                                              + q · R_w[kx - qx + win - 1] )\n"
        "    out = Σ A v\n\n"
        "`R_h`, `R_w` `[2·win - 1, hd]` are the factorised relative embeddings (`pos_embed.height_rel`, "
        "`pos_embed.width_rel`); their logits are one small contraction per axis, handed to the attention "
        "function as an additive bias. `stride=2` subsamples the queries (a strided 1x1 `q` conv: `b/2 x b/2` "
        "query blocks); no output projection (the bottleneck block has it)."),
    cost="N·C·C_qk (q) + N·C·(C_qk + C_v) (kv) + N_q·win²·(C_qk + C_v) (logits and values) + "
         "2·N_q·win·C_qk (relative logits) multiply-adds: linear in N, win²/N of global attention",
    doc_example=(dict(block_size=8, halo_size=3), (1, 16, 16, 96)), grid_kwargs=_grid_block)
class HaloAttention(AttentionModule):
    """Halo attention, ``[B, H, W, C] -> [B, ceil(H/stride), ceil(W/stride), dim_out]`` (any ``H, W``).

    Keys as timm's ``HaloAttn``: ``q`` (1x1 conv ``C -> nh·hd_qk``, stride = the block stride), ``kv``
    (1x1 conv ``C -> nh·(hd_qk + hd_v)``), ``pos_embed.height_rel`` / ``pos_embed.width_rel``
    ``[2·win - 1, hd_qk]``.

    Args:
        dim: input channels ``C``; num_heads: ``nh`` (must divide ``dim_out``).
        dim_out: output channels (default ``dim``); ``hd_v = dim_out / nh``.
        stride: 1 or 2: query subsampling (strided ``q`` when ``block_size`` is even, else 2x2 average pool after).
        dim_head: ``hd_qk`` (default ``make_divisible(dim_out · qk_ratio, 8) / nh``).
        block_size: ``b``; halo_size: ``h``; qk_ratio: see ``dim_head``.
        qkv_bias: bias on ``q`` / ``kv``. avg_down: always pool for ``stride=2``.
        scale_pos_embed: the ``hd_qk^-1/2`` scale multiplies the relative logits too.
        pad_mask: mask the padded keys (default False: attend to the zero padding, as timm).
        attn_drop: dropout on the attention weights.
    """

    # docs/flex.md's row of patterns (analysis.docs.pattern_table); skipped blocks counted on `example`
    flex_pattern = PatternDoc(
        families="HaloNet",
        keys="key inside the query block's halo window (and inside the image with `pad_mask`)",
        term="relative logits from per-query tables `q·R_hᵀ`, `q·R_wᵀ` `[B, nh, Nq, 2·win-1]`",
        order="queries block-major, keys tiled",
        example=(dict(block_size=8, halo_size=3), (1, 32, 32, 96)))

    def __init__(self, dim: int, num_heads: int = 8, *, dim_out: int | None = None, stride: int = 1,
                 dim_head: int | None = None, block_size: int = 8, halo_size: int = 3, qk_ratio: float = 1.0,
                 qkv_bias: bool = False, avg_down: bool = False, scale_pos_embed: bool = False,
                 pad_mask: bool = False, attn_drop: float = 0.0) -> None:
        super().__init__()
        self.fused_attention = FUSED_ATTENTION.default  # captured when built (runtime.switched flips it)
        self.attention_backend = ATTENTION_BACKEND.default  # "auto" | "sdpa" | "explicit" | "flex" (captured)
        dim_out = dim_out or dim
        check_heads(dim_out, num_heads, "dim_out")
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride!r}")
        if not isinstance(block_size, int) or block_size < 1 or not isinstance(halo_size, int) or halo_size < 0:
            raise ValueError(f"block_size must be a positive int and halo_size a non-negative int, got "
                             f"block_size={block_size!r}, halo_size={halo_size!r}")
        self.dim, self.dim_out, self.num_heads = dim, dim_out, num_heads
        self.dim_head_qk = dim_head or make_divisible(dim_out * qk_ratio, divisor=8) // num_heads
        if self.dim_head_qk < 1:
            raise ValueError(f"dim_head / qk_ratio give {self.dim_head_qk} q / k channels per head; expected >= 1")
        self.dim_head_v = dim_out // num_heads
        self.dim_out_qk, self.dim_out_v = num_heads * self.dim_head_qk, num_heads * self.dim_head_v
        self.scale = self.dim_head_qk ** -0.5
        self.scale_pos_embed, self.pad_mask = scale_pos_embed, pad_mask
        self.block_size, self.halo_size = block_size, halo_size
        self.win_size = block_size + 2 * halo_size
        use_pool = stride > 1 and (avg_down or block_size % stride != 0)
        self.stride, self.block_stride = stride, (1 if use_pool else stride)
        self.attn_drop = check_prob(attn_drop, "attn_drop")
        self.q = nn.Conv2d(dim, self.dim_out_qk, 1, stride=self.block_stride, bias=qkv_bias)
        self.kv = nn.Conv2d(dim, self.dim_out_qk + self.dim_out_v, 1, bias=qkv_bias)
        self.pos_embed = nn.Module()
        self.pos_embed.height_rel = nn.Parameter(torch.empty(2 * self.win_size - 1, self.dim_head_qk))
        self.pos_embed.width_rel = nn.Parameter(torch.empty(2 * self.win_size - 1, self.dim_head_qk))
        self.pool = nn.AvgPool2d(2, 2) if use_pool else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """timm's init: q / kv truncated normal with std fan-in^-1/2, the tables with std ``hd_qk^-1/2``."""
        std = self.dim ** -0.5
        nn.init.trunc_normal_(self.q.weight, std=std)
        nn.init.trunc_normal_(self.kv.weight, std=std)
        nn.init.trunc_normal_(self.pos_embed.height_rel, std=self.scale)
        nn.init.trunc_normal_(self.pos_embed.width_rel, std=self.scale)

    # ---- attention.transfer: another mechanism's weights into this one
    @property
    def transfer_slots(self) -> dict[str, str]:
        """``q``, and the key / value rows of ``kv`` (per head: the key then the value channels) when they are
        the same size; no output projection (HaloNet's blocks have it outside the mechanism)."""
        if self.dim_head_qk != self.dim_head_v:
            return {"q": "q"}
        return {"q": "q", "k": "kv:0/2h", "v": "kv:1/2h"}

    def transfer_init(self) -> list[str]:
        """Zero relative tables: no position term beyond what the carried projections compute."""
        with torch.no_grad():
            self.pos_embed.height_rel.zero_()
            self.pos_embed.width_rel.zero_()
        return ["pos_embed: zeros (no position term)"]

    def padded_size(self, H: int, W: int) -> tuple[int, int]:
        """The map size attention runs on: each side rounded up to a multiple of ``block_size``."""
        b = self.block_size
        return (H + b - 1) // b * b, (W + b - 1) // b * b

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, H, W, C] -> [B, ceil(H/s), ceil(W/s), dim_out]``; ``call.feat_size`` must match the map."""
        B, H, W, C = check_spatial_call(self, x, call)
        s = self.block_stride
        Hp, Wp = self.padded_size(H, W)
        q = _conv1x1(x[:, ::s, ::s] if s > 1 else x, self.q)  # [B, ceil(H/s), ceil(W/s), nh·hd_qk]
        kv = _conv1x1(x, self.kv)  # [B, H, W, nh·(hd_qk + hd_v)]
        if (Hp, Wp) != (H, W):  # zeros bottom / right after the projections: the halo's own zeros
            q = F.pad(q, (0, 0, 0, Wp // s - q.shape[2], 0, Hp // s - q.shape[1]))
            kv = F.pad(kv, (0, 0, 0, Wp - W, 0, Hp - H))
        out = halo_attention(q, kv, self.num_heads, self.block_size, self.halo_size,
                             height_rel=self.pos_embed.height_rel, width_rel=self.pos_embed.width_rel,
                             scale=self.scale, scale_pos_embed=self.scale_pos_embed, pad_mask=self.pad_mask,
                             grid=(H, W), **self.core_options())
        out = out[:, :(H + s - 1) // s, :(W + s - 1) // s]  # [B, ceil(H/s), ceil(W/s), dim_out]
        if not isinstance(self.pool, nn.Identity):
            out = self.pool(out.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return out

    def attend_prefix(self, prefix: Tensor, tokens: Tensor) -> Tensor:
        """Prefix tokens ``[B, P, C]`` attend globally to ``tokens [B, P + H·W, C]`` (all of them): ``[B, P, dim_out]``.

        The adapter's rule for class / register tokens in front of the grid (the blocks keep their
        halo pattern): the same ``q`` / ``kv`` projections, no relative position term (stride 1 only).
        """
        if self.stride != 1:
            raise ValueError(f"halo with stride={self.stride} downsamples the map: it cannot run with prefix tokens")
        nh, dqk, dv = self.num_heads, self.dim_head_qk, self.dim_head_v
        B, N, _ = tokens.shape
        q = _conv1x1(prefix, self.q)  # [B, P, nh·hd_qk]
        kv = _conv1x1(tokens, self.kv).reshape(B, N, nh, dqk + dv)  # per head k then v
        k, v = kv[..., :dqk].flatten(2), kv[..., dqk:].flatten(2)
        return prefix_attention(q, k, v, nh, scale=self.scale, **self.core_options())

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``(B, H, W, C)``: q, kv, the blocks' logits and values, the relative logits."""
        B, H, W, C = input_shape
        s = self.block_stride
        Hp, Wp = self.padded_size(H, W)
        Nq = (Hp // s) * (Wp // s)  # padded query positions: every block is computed
        win = self.win_size
        Hq, Wq = (H + s - 1) // s, (W + s - 1) // s  # strided queries (ceil)
        proj = Hq * Wq * C * self.dim_out_qk + H * W * C * (self.dim_out_qk + self.dim_out_v)
        return B * (proj + Nq * win * win * (self.dim_out_qk + self.dim_out_v) + 2 * Nq * win * self.dim_out_qk)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, dim_out={self.dim_out}, num_heads={self.num_heads}, block_size={self.block_size}, "
                f"halo_size={self.halo_size}, stride={self.stride}, dim_head_qk={self.dim_head_qk}, "
                f"pad_mask={self.pad_mask}")
