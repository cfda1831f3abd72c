"""Spatial-reduction attention (PVT v1 / PVTv2, Twins GSA) on tokens ``[B, P + H·W, C]``.

Queries come from every token; keys and values from a reduced copy of the ``H x W`` map:

* ``sr_ratio = R > 1``: a strided conv (kernel = stride = ``R``, no padding: the last ``H % R``
  rows / ``W % R`` columns do not reach the keys, as in timm and the original) then a LayerNorm:
  ``h x w = (H // R) x (W // R)`` keys;
* ``linear=True`` (PVTv2-Li): ``AdaptiveAvgPool2d(pool_size)`` (it also upsamples smaller maps),
  a 1x1 conv, LayerNorm and GELU: ``pool_size²`` keys whatever the input size;
* ``sr_ratio = 1``: plain global attention (no conv, no norm).

Prefix tokens (PVT v1's class token) are queries like every other token and join the keys
unreduced, in front of the reduced map (no conv, no norm). Key names follow timm's
``pvt_v2.Attention`` and the original ``whai362/PVT``: ``q``, ``kv`` (packed ``[k | v]``), ``sr``,
``norm``, ``proj``. The LayerNorm's eps is ``norm_eps`` (timm and the original: 1e-5; Hugging Face:
1e-6).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_heads
from ..functional.heads import split_packed
from ..functional.layout import token_layout
from ..functional.linear import apply_linear
from ..functional.observers import attention_observed
from .base import AttentionCall, AttentionModule, check_map_tokens_call, grid_of
from .registry import register_attention

__all__ = ["SpatialReductionAttention", "sra_macs"]


def sra_macs(N: int, C: int, key_grid: tuple[int, int] | None, num_prefix_tokens: int = 0, kernel: int = 1) -> int:
    """Multiply-adds of one image: ``N`` queries of width ``C``; keys from a ``key_grid`` map reduced by a
    ``kernel x kernel`` conv (plus the LayerNorm, fvcore's 5 per element) and the prefix tokens, or from
    all ``N`` tokens when ``key_grid`` is None (global attention: ``4·N·C² + 2·N²·C``)."""
    if key_grid is None:
        return 4 * N * C * C + 2 * N * N * C
    hw = key_grid[0] * key_grid[1]
    M = num_prefix_tokens + hw
    return 2 * N * C * C + hw * kernel * kernel * C * C + 5 * hw * C + 2 * M * C * C + 2 * N * M * C


def _pvt_stage_table() -> str:
    """Markdown: SRA vs global attention on PVT-Small's four stages at 224 (MMACs per layer, batch 1)."""
    rows = ["| stage map H×W×C | R | keys h×w | SRA (MMACs) | global (MMACs) | saving |",
            "|---|---:|---:|---:|---:|---:|"]
    for side, C, R in ((56, 64, 8), (28, 128, 4), (14, 320, 2), (7, 512, 1)):
        N = side * side
        g = side // R
        sra = sra_macs(N, C, (g, g) if R > 1 else None, kernel=R)
        full = sra_macs(N, C, None)
        rows.append(f"| {side}×{side}×{C} | {R} | {g}×{g} | {sra / 1e6:,.1f} | {full / 1e6:,.1f} | {full / sra:.1f}× |")
    return "\n".join(rows)


@register_attention(
    "sra", layout="tokens", needs_feat_size=True,
    description="spatial-reduction attention: keys / values from a strided-conv (or pooled) map (PVT, PVTv2, Twins)",
    paper="https://arxiv.org/abs/2102.12122", example_shape=(2, 16, 32),
    example_kwargs=dict(linear=True, pool_size=4),  # pooled keys cover every cell at any size (query-map tests)
    formula=(
        "Spatial-reduction attention (PVT, Wang et al. 2021; PVTv2 2022; Twins' GSA). Queries come from all "
        "`N = P + H·W` tokens, keys and values from the map reduced `R` times per side:\n\n"
        "    q = split_heads(x W_q)                                   # [B, nh, N, hd]\n"
        "    r = LN(Conv_{k=R, s=R}(x_grid as [B, C, H, W]))          # [B, h·w, C],  h, w = H//R, W//R\n"
        "    k, v = split_heads([x_prefix; r] W_kv)                   # each [B, nh, P + h·w, hd]\n"
        "    out = merge_heads(softmax(q kᵀ · hd^-1/2) v) W_proj      # [B, N, C]\n\n"
        "`linear=True` (PVTv2-Li) reduces with `GELU(LN(Conv_1x1(AdaptiveAvgPool_7(x_grid))))`: 49 keys at any "
        "input size. `sr_ratio=1` is global attention. Prefix (class) tokens join the keys unreduced.\n\n"
        "Against global attention on PVT's pyramid (PVT-Small at 224, `sr_ratios = (8, 4, 2, 1)`; from "
        "`SpatialReductionAttention.flops`' formula):\n\n" + _pvt_stage_table()),
    cost=("N·C² (q) + h·w·R²·C² (sr conv) + 2·M·C² (kv) + N·C² (proj) + 2·N·M·C (attention), M = P + h·w keys: "
          "3·N·C² + 2·N·C²/R² + 2·N²·C/R² for a map of N tokens; linear: 2·N·C² + 147·C² + 98·N·C"),
    doc_example=(dict(sr_ratio=2), (1, 196, 96)), global_kwargs=lambda grid: {"sr_ratio": 1})  # no reduction
class SpatialReductionAttention(AttentionModule):
    """Spatial-reduction attention, ``[B, P + H·W, C] -> [B, P + H·W, C]`` (grid ``feat_size = (H, W)``).

    Args:
        dim: channels ``C``; num_heads: ``nh`` (must divide ``dim``).
        sr_ratio: reduction ``R`` of the key / value map per side (conv kernel = stride = ``R``);
            1 = global attention.
        linear: PVTv2-Li's linear SRA (pool to ``pool_size x pool_size``, 1x1 conv, LN, GELU).
        pool_size: output side of the adaptive pool (``linear`` only; 7 in PVTv2).
        qkv_bias: biases of ``q`` and ``kv``; qk_scale: logit scale (default ``hd ** -0.5``).
        proj_bias: bias of ``proj``; norm_eps: eps of the reduction's LayerNorm.
        attn_drop, proj_drop: dropout on the weights / after ``proj``.

    Cost: ``N·C² + h·w·R²·C² + 2·M·C² + N·C² + 2·N·M·C`` multiply-adds with ``M = P + h·w`` keys
    (plus the LayerNorm), see :meth:`flops`.
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = {"q": "q", "k": "kv:0/2", "v": "kv:1/2", "o": "proj"}

    accepts = frozenset({"residual"})

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        sr_ratio: int = 1,
        linear: bool = False,
        pool_size: int = 7,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        proj_bias: bool = True,
        norm_eps: float = 1e-5,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        if not isinstance(sr_ratio, int) or isinstance(sr_ratio, bool) or sr_ratio < 1:
            raise ValueError(f"sr_ratio must be a positive int, got {sr_ratio!r}")
        if not isinstance(pool_size, int) or isinstance(pool_size, bool) or pool_size < 1:
            raise ValueError(f"pool_size must be a positive int, got {pool_size!r}")
        self.sr_ratio, self.linear, self.pool_size = sr_ratio, bool(linear), pool_size
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.pool: nn.Module | None = None
        self.sr: nn.Conv2d | None = None
        self.norm: nn.LayerNorm | None = None
        self.act: nn.Module | None = None
        if self.linear:
            self.pool = nn.AdaptiveAvgPool2d(pool_size)
            self.sr = nn.Conv2d(dim, dim, kernel_size=1, stride=1)
            self.norm = nn.LayerNorm(dim, eps=norm_eps)
            self.act = nn.GELU()
        elif sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim, eps=norm_eps)

    @property
    def reduces(self) -> bool:
        """Whether keys come from a reduced map (``sr_ratio > 1`` or ``linear``)."""
        return self.sr is not None

    def key_grid(self, feat_size: tuple[int, int]) -> tuple[int, int]:
        """The reduced key map ``(h, w)`` for a query grid ``(H, W)``."""
        H, W = int(feat_size[0]), int(feat_size[1])
        if self.linear:
            return self.pool_size, self.pool_size
        return H // self.sr_ratio, W // self.sr_ratio

    def _grid(self, N: int, feat_size: tuple[int, int] | None, P: int) -> tuple[int, int]:
        H, W = grid_of(N - P, feat_size)  # feat_size, or a square map of the N - P grid tokens
        if feat_size is not None and not self.linear and (H < self.sr_ratio or W < self.sr_ratio):
            raise ValueError(f"feat_size {(H, W)} is smaller than sr_ratio={self.sr_ratio} on a side: "
                             "no key would remain")
        return H, W

    def reduce(self, x: Tensor, feat_size: tuple[int, int]) -> Tensor:
        """The grid tokens ``[B, H·W, C]`` -> reduced keys' input ``[B, h·w, C]`` (conv or pool, LN, GELU)."""
        assert self.sr is not None and self.norm is not None
        B, _, C = x.shape
        H, W = feat_size
        m = x.reshape(B, H, W, C).permute(0, 3, 1, 2)  # [B, C, H, W] (channels-last memory: no copy)
        if self.pool is not None:
            m = self.pool(m)  # [B, C, 7, 7]
        m = self.sr(m)  # [B, C, h, w]
        r = m.permute(0, 2, 3, 1).reshape(B, m.shape[2] * m.shape[3], C)  # [B, h·w, C] (no -1: B may be 0)
        r = self.norm(r)
        return self.act(r) if self.act is not None else r

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, P + H·W, C] -> [B, P + H·W, C]``.

        ``call.feat_size = (H, W)``: the grid of the last ``H·W`` tokens (default: a square map of them;
        a non-square count raises naming ``feat_size``); ``num_prefix_tokens = P`` tokens in front
        query every key and are keys themselves, unreduced. No ``context``.
        ``call.residual [B, N, C]``, when given, is added to the output (fused into ``proj`` at inference).
        """
        B, N, C, P = check_map_tokens_call(self, x, call)
        feat_size = call.feat_size
        q = split_heads(apply_linear(self.q, x), self.num_heads)  # [B, nh, N, hd]
        key_grid = None
        if self.reduces:
            grid = self._grid(N, feat_size, P)
            r = self.reduce(x[:, P:], grid)  # [B, h·w, C]
            src = torch.cat([x[:, :P], r], dim=1) if P else r  # [B, M, C], M = P + h·w
            key_grid = self.key_grid(grid)
            feat_size = grid
        else:
            if feat_size is not None:
                self._grid(N, feat_size, P)
            src = x  # [B, N, C]
        k, v = split_packed(apply_linear(self.kv, src), self.num_heads, 2, "packed kv")  # each [B, nh, M, hd]
        layout = token_layout(N, feat_size, P, key_grid=key_grid) \
            if attention_observed() else None  # where the rows sit on the grid (observers only; cached)
        x = self.attend(q, k, v, scale=self.scale, layout=layout)  # [B, nh, N, hd]
        return self.project_out(merge_heads(x), call.residual)  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds for one forward on ``input_shape = (B, N, C)`` (grid ``feat_size``, default square).

        ``N·C²`` (q) ``+ h·w·k²·C²`` (sr conv, ``k = R``, or 1 when linear) ``+ 5·h·w·C`` (LayerNorm,
        fvcore's rule) ``+ 2·M·C²`` (kv) ``+ 2·N·M·C`` (attention) ``+ N·C²`` (proj), ``M = P + h·w``.
        """
        B, N, C = input_shape
        if feat_size is None:
            if not self.reduces:
                return B * sra_macs(N, C, None)
            feat_size = grid_of(N)
        H, W = int(feat_size[0]), int(feat_size[1])
        P = N - H * W
        if not self.reduces:
            return B * sra_macs(N, C, None)
        return B * sra_macs(N, C, self.key_grid((H, W)), P, 1 if self.linear else self.sr_ratio)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, sr_ratio={self.sr_ratio}, linear={self.linear}"
                + (f", pool_size={self.pool_size}" if self.linear else ""))
