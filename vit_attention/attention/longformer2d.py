"""ViL's 2-D Longformer attention (Zhang et al. 2021) on tokens ``[B, G + H·W, C]``.

The ``G`` global tokens come first (the contract's prefix tokens), then an ``H x W`` map. A map
query attends to the ``3 x 3`` block of ``w x w`` chunks around its own chunk (chunks on a fixed
grid, ``w = window_size``) and to every global token; a global query attends to every token. Keys
outside the map or in the bottom / right padding are masked (the original's ``exact=0``, see
:mod:`vit_attention.functional.longformer2d`).

Key names as ``microsoft/vision-longformer``'s ``Long2DSCSelfAttention``: ``query`` (C -> C),
``kv`` (C -> 2C, packed ``[k | v]``), ``proj``; the global tokens' ``query_global``, ``kv_global``,
``proj_global`` are the same modules with ``share_weights=True`` (the original's ``sharew``, ViL's
default; then stored once, under the local names) and their own otherwise. Optional relative-position
bias (the original's ``rpe``):
``local_relative_position_bias_table [(4w-1)², nh]``, ``g2l_relative_position_bias [2, nh, G]``,
``g2g_relative_position_bias [nh, G, G]``. Training-time chunk sampling (``mode > 0``) is not
implemented: the module always computes the original's evaluation mode 0 (all nine chunks).

No ``N x N`` matrix for the map queries: each chunk's ``w²`` queries against its gathered ``G + 9w²``
keys, all chunks in one call of the library's attention function (the fused kernel when no weights
are observed); the ``G`` global queries in a second call against all ``N`` keys.

On the ``"flex"`` backend the whole sequence runs in ONE call with the pattern of
:func:`~vit_attention.functional.longformer2d.longformer2d_pattern` (chunk rule and globals as the
``mask_mod``, the relative-position tables read in the ``score_mod``), the map tokens in the chunk-major
``flex_order`` (default ``"snake"``: the block mask skips the most blocks, 64.5 % at ViL-S's 56x56 stage 1).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_heads
from ..functional.flex import PatternDoc, use_flex
from ..functional.heads import split_packed
from ..functional.linear import apply_linear
from ..functional.longformer2d import (
    DEFAULT_ORDER,
    longformer2d_device_plan,
    longformer2d_layouts,
    longformer2d_pattern,
    longformer2d_rel_index,
    longformer2d_sequence_index,
)
from ..functional.observers import attention_observed
from .base import AttentionCall, AttentionModule, check_map_tokens_call, grid_of
from .registry import covering_window_kwargs, register_attention

__all__ = ["Longformer2DAttention", "longformer2d_macs"]

_GLOBAL_ALIASES = {"query_global": "query", "kv_global": "kv", "proj_global": "proj"}


def longformer2d_macs(H: int, W: int, G: int, C: int, window_size: int, shared: bool = True) -> int:
    """Multiply-adds of one image: ``4·N·C²`` projections (``+ 2·N·C²`` for separate global
    projections when ``G > 0``), ``2·nc·w²·(G + 9w²)·C`` for the chunks and ``2·G·N·C`` for the
    global queries (``N = G + H·W``, ``nc = ceil(H / w)·ceil(W / w)`` chunks)."""
    N, w = G + H * W, window_size
    nc = math.ceil(H / w) * math.ceil(W / w)
    proj = 4 * N * C * C + (0 if shared or not G else 2 * N * C * C)
    return proj + 2 * nc * w * w * (G + 9 * w * w) * C + 2 * G * N * C


def _vil_stage_table() -> str:
    """Markdown: 2-D Longformer vs global attention on ViL-Small's two Longformer stages at 224."""
    rows = ["| stage map H×W×C | w | keys per query | longformer2d (MMACs) | global (MMACs) | saving |",
            "|---|---:|---:|---:|---:|---:|"]
    for side, C in ((56, 96), (28, 192)):
        lf = longformer2d_macs(side, side, 1, C, 7)
        N = 1 + side * side
        full = 4 * N * C * C + 2 * N * N * C
        rows.append(f"| {side}×{side}×{C} | 7 | 1 + 441 | {lf / 1e6:,.1f} | {full / 1e6:,.1f} | {full / lf:.1f}× |")
    return "\n".join(rows)


@register_attention(
    "longformer2d", layout="tokens", needs_feat_size=True, prefix_tokens="attend",
    description="ViL's 2-D Longformer: each token attends to the 3x3 chunks of w x w tokens around its own "
                "plus global tokens; global tokens attend to all",
    paper="https://arxiv.org/abs/2103.15358", example_kwargs=dict(window_size=3),
    formula=(
        "2-D Longformer attention (Vision Longformer, Zhang et al. 2021). Tokens are `[g_1..g_G; x_1..x_HW]`; the "
        "`H x W` map is cut into `w x w` chunks on a fixed grid (padded bottom / right). A map query in chunk "
        "`(m, n)` attends to the global tokens and to the keys of the 3x3 chunks `(m+a, n+b)`, `a, b ∈ {-1, 0, 1}`; "
        "keys outside the map are masked. Global queries attend to everything:\n\n"
        "    q, [k | v] = x W_query, x W_kv                          # [B, nh, N, hd] each\n"
        "    out_i = softmax_{j ∈ globals ∪ 3x3 chunks(i)}(q_i · k_j · hd^-1/2 (+ rpe)) v     # map token i\n"
        "    out_g = softmax_{j ∈ all N}(q_g · k_j · hd^-1/2 (+ rpe)) v                       # global token g\n"
        "    y = [out_g W_proj_global; out W_proj]\n\n"
        "Computed per chunk (`w²` queries against `G + 9w²` gathered keys, one batched call), never an "
        "`N x N` matrix. Against global attention on ViL-Small's Longformer stages at 224 (batch 1):\n\n"
        + _vil_stage_table()),
    cost="4·N·C² + 2·nc·w²·(G + 9w²)·C + 2·G·N·C multiply-adds (nc = ceil(H/w)·ceil(W/w) chunks): linear in N, "
         "about 2·N·9w²·C for the attention",
    example_shape=(2, 16, 32), doc_example=(dict(window_size=3), (1, 14 * 14, 96)),
    global_kwargs=covering_window_kwargs)
class Longformer2DAttention(AttentionModule):
    """2-D Longformer attention, ``[B, G + H·W, C] -> [B, G + H·W, C]`` (grid ``feat_size = (H, W)``).

    Args:
        dim: channels ``C``; num_heads: ``nh`` (must divide ``dim``).
        window_size: chunk side ``w`` (the original's ``w``; ViL: 7).
        share_weights: global tokens use ``query`` / ``kv`` / ``proj`` too (the original's ``sharew``).
        rel_pos_bias: the original's ``rpe`` tables (then ``num_global_tokens`` fixes ``G``).
        num_global_tokens: ``G`` of the RPE tables (the call's ``num_prefix_tokens`` must match it).
        qkv_bias: biases of ``query`` / ``kv``; qk_scale: logit scale (default ``hd ** -0.5``).
        attn_drop, proj_drop: dropout on the weights / after the projection.
    """

    # docs/flex.md's row of patterns (analysis.docs.pattern_table); skipped blocks counted on `example`
    flex_pattern = PatternDoc(
        families="ViL",
        keys="a global query or key, or a map key in the 3 x 3 neighbouring chunks",
        term="local table, global-to-global and global-to-local biases",
        order="chunk-major \"snake\"",
        example=(dict(window_size=7), (1, 28 * 28, 96)))

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = {"q": ("query", "query_global"), "k": ("kv:0/2", "kv_global:0/2"),
                      "v": ("kv:1/2", "kv_global:1/2"), "o": ("proj", "proj_global")}

    def __init__(self, dim: int, num_heads: int = 8, *, window_size: int = 7, share_weights: bool = True,
                 rel_pos_bias: bool = False, num_global_tokens: int = 1, qkv_bias: bool = True,
                 qk_scale: float | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        if not isinstance(window_size, int) or isinstance(window_size, bool) or window_size < 1:
            raise ValueError(f"window_size must be a positive int, got {window_size!r}")
        if not isinstance(num_global_tokens, int) or num_global_tokens < 0:
            raise ValueError(f"num_global_tokens must be an int >= 0, got {num_global_tokens!r}")
        self.window_size = window_size
        self.share_weights, self.num_global_tokens = bool(share_weights), num_global_tokens
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.query = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        if not self.share_weights:  # shared: the *_global properties below are query / kv / proj
            self.query_global = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv_global = nn.Linear(dim, 2 * dim, bias=qkv_bias)
            self.proj_global = nn.Linear(dim, dim)
        self.rel_pos_bias = bool(rel_pos_bias)
        if self.rel_pos_bias:
            w = window_size
            self.local_relative_position_bias_table = nn.Parameter(torch.zeros((4 * w - 1) ** 2, num_heads))
            nn.init.trunc_normal_(self.local_relative_position_bias_table, std=0.02)
            if num_global_tokens:
                self.g2l_relative_position_bias = nn.Parameter(torch.zeros(2, num_heads, num_global_tokens))
                self.g2g_relative_position_bias = nn.Parameter(
                    torch.zeros(num_heads, num_global_tokens, num_global_tokens))
                nn.init.trunc_normal_(self.g2l_relative_position_bias, std=0.02)
                nn.init.trunc_normal_(self.g2g_relative_position_bias, std=0.02)
            self.register_buffer("relative_position_index", longformer2d_rel_index(w).clone(), persistent=False)

    flex_order: str = DEFAULT_ORDER  # token order of the map in the flex call ("row", "tiled", "snake")

    def __getattr__(self, name: str) -> Any:
        """With ``share_weights`` the global tokens' ``query_global`` / ``kv_global`` / ``proj_global`` are
        ``query`` / ``kv`` / ``proj`` (one set of keys in the state dict; the original lists both names)."""
        if name in _GLOBAL_ALIASES and self.__dict__.get("share_weights"):
            return super().__getattr__(_GLOBAL_ALIASES[name])
        return super().__getattr__(name)

    def _local_bias(self, G: int) -> Tensor | None:
        """RPE of the map queries ``[nh, w², G + 9w²]`` (None without ``rel_pos_bias``)."""
        if not self.rel_pos_bias:
            return None
        w2 = self.window_size ** 2
        local = self.local_relative_position_bias_table[self.relative_position_index.reshape(-1)]  # [w²·9w², nh]
        local = local.view(w2, 9 * w2, -1).permute(2, 0, 1)  # [nh, w², 9w²]
        if not G:
            return local
        g2l = self.g2l_relative_position_bias[1][:, None, :].expand(-1, w2, -1)  # [nh, w², G]
        return torch.cat([g2l, local], dim=-1)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, G + H·W, C] -> [B, G + H·W, C]``; ``call.num_prefix_tokens = G`` global tokens in front,
        ``call.feat_size = (H, W)`` the map of the rest (default: a square map). No optional field."""
        B, N, C, G = check_map_tokens_call(self, x, call)
        if self.rel_pos_bias and G != self.num_global_tokens:
            raise ValueError(f"num_prefix_tokens={G} does not match num_global_tokens={self.num_global_tokens} "
                             "of the relative-position tables")
        H, W = grid_of(N - G, call.feat_size)  # feat_size, or a square map of the N - G map tokens
        nh, hd, w = self.num_heads, self.head_dim, self.window_size
        shared = self.share_weights
        if use_flex(self.attention_backend, self.fused_attention, x.device, mechanism="longformer2d"):
            return self._forward_flex(x, H, W, G)
        q = apply_linear(self.query, x if shared else x[:, G:])  # [B, N | H·W, C]
        kv = apply_linear(self.kv, x)  # [B, N, 2C]
        layouts = longformer2d_layouts(H, W, w, G) if attention_observed() else (None, None)

        # map queries: each chunk's w² queries against its G + 9w² gathered keys
        qi, ki, mask, back = longformer2d_device_plan(H, W, w, G, x.device)
        nc, K, w2 = mask.shape[0], mask.shape[-1], w * w
        def chunked(t: Tensor, index: Tensor, n: int) -> Tensor:  # [B, *, C] gathered -> [B, nc·nh, n, hd]
            return t[:, index].unflatten(1, (nc, n)).unflatten(-1, (nh, hd)).transpose(2, 3).flatten(1, 2)

        # k and v gathered apart: the largest tensor is [B, nc·K, C] (about 9·N·C), never 2C wide
        ql = chunked(q[:, G:] if shared else q, qi, w2)  # [B, nc·nh, w², hd]
        kl, vl = chunked(kv[..., :C], ki, K), chunked(kv[..., C:], ki, K)  # each [B, nc·nh, K, hd]
        rpe = self._local_bias(G)  # [nh, w², K] or None
        bias = mask.expand(-1, nh, -1, -1) if rpe is None else mask + rpe  # [nc, nh, 1 | w², K]: window mask (+ RPE)
        # chunks folded into the heads: 4-D for the fused kernel, the bias broadcast over the batch only
        out = self.attend(ql, kl, vl, bias=bias.flatten(0, 1), scale=self.scale,
                          layout=layouts[0])  # [B, nc·nh, w², hd]
        out = out.unflatten(1, (nc, nh)).transpose(2, 3).flatten(3).flatten(1, 2)[:, back]  # [B, H·W, C] map order
        if not G:
            return self.project_out(out)

        # global queries: against all N keys
        qg = split_heads(q[:, :G] if shared else apply_linear(self.query_global, x[:, :G]), nh)  # [B, nh, G, hd]
        k, v = split_packed(kv if shared else apply_linear(self.kv_global, x), nh, 2, "kv")  # each [B, nh, N, hd]
        bias = None
        if self.rel_pos_bias:
            g2l = self.g2l_relative_position_bias[0][:, :, None].expand(-1, -1, H * W)  # [nh, G, H·W]
            bias = torch.cat([self.g2g_relative_position_bias, g2l], dim=-1)  # [nh, G, N]
        og = self.attend(qg, k, v, bias=bias, scale=self.scale, layout=layouts[1])  # [B, nh, G, hd]
        og = merge_heads(og)  # [B, G, C]
        if shared:
            return self.project_out(torch.cat([og, out], dim=1))  # [B, N, C]
        return self.proj_drop(torch.cat([apply_linear(self.proj_global, og), apply_linear(self.proj, out)], dim=1))

    def _forward_flex(self, x: Tensor, H: int, W: int, G: int) -> Tensor:
        """The flex backend: ``x [B, G + H·W, C] -> [B, G + H·W, C]`` in one attention call over the sequence
        (tokens in ``flex_order``; with separate global projections the global queries read their own keys,
        appended after the map queries' ones)."""
        nh, w = self.num_heads, self.window_size
        gathers = longformer2d_sequence_index(H, W, w, G, self.flex_order, x.device)  # (index, inverse) or None
        if gathers is not None:
            x = x[:, gathers[0]]  # [B, N, C] in flex_order
        split = not self.share_weights and G > 0
        q = apply_linear(self.query, x)  # [B, N, C]
        kv = apply_linear(self.kv, x)  # [B, N, 2C]
        if split:
            q = torch.cat([apply_linear(self.query_global, x[:, :G]), q[:, G:]], dim=1)
            kv = torch.cat([kv, apply_linear(self.kv_global, x)], dim=1)  # [B, 2N, 2C]
        k, v = split_packed(kv, nh, 2, "kv")  # each [B, nh, N | 2N, hd]
        rpe = self.rel_pos_bias
        pattern = longformer2d_pattern(
            H, W, w, G, order=self.flex_order, split_globals=split,
            local_table=self.local_relative_position_bias_table if rpe else None,
            g2l=self.g2l_relative_position_bias if rpe and G else None,
            g2g=self.g2g_relative_position_bias if rpe and G else None, device=x.device)
        out = merge_heads(self.attend(split_heads(q, nh), k, v, scale=self.scale, pattern=pattern))  # [B, N, C]
        if split:
            out = torch.cat([apply_linear(self.proj_global, out[:, :G]), apply_linear(self.proj, out[:, G:])], dim=1)
        else:
            out = apply_linear(self.proj, out)  # [B, N, C]
        if gathers is not None:
            out = out[:, gathers[1]]  # back to the module's token order
        return self.proj_drop(out)

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``(B, N, C)``: :func:`longformer2d_macs` with ``G = N - H·W`` globals.

        ``feat_size = (H, W)``; default a square map and no globals."""
        B, N, C = input_shape
        H, W = grid_of(N) if feat_size is None else (int(feat_size[0]), int(feat_size[1]))
        return B * longformer2d_macs(H, W, N - H * W, C, self.window_size, self.share_weights)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, "
                f"share_weights={self.share_weights}, rel_pos_bias={self.rel_pos_bias}")
