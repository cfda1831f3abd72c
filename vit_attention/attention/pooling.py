"""MViTv2's pooling attention (Li et al., "MViTv2: Improved Multiscale Vision Transformers for Classification and
Detection", CVPR 2022, arXiv 2112.01526; MViT: Fan et al., ICCV 2021).

Per block, on tokens ``[B, P + H·W, C]`` of an ``H x W`` grid (timm 1.0.31 ``timm/models/mvitv2.py``
``MultiScaleAttention``; facebookresearch/mvit ``mvit/models/attention.py``)::

    q, k, v = split_heads(x W_qkv)                         # [B, nh, P + H·W, hd]
    t̃ = LN_hd(Pool_t(t)),  t ∈ {q, k, v}                   # depthwise conv k x k, stride s_t, pad k // 2, one
                                                           # (hd, 1, k, k) kernel shared by the heads; prefix
                                                           # tokens skip the conv, the LayerNorm includes them
    A = softmax(q̃ k̃ᵀ · hd^-1/2 + Rel(q̃))                  # Rel: on the grid rows x grid columns only
    out = (A ṽ + q̃) W_proj                                 # residual pooling: the pooled query added back

``Rel`` is the decomposed relative position term of
:func:`~vit_attention.functional.rel_pos.decomposed_rel_pos_bias` (the function ViTDet's ``rel_pos`` uses): the
same math, read on the *pooled* grids, whose query and key sizes differ (``q`` 56 x 56 and ``k`` 14 x 14 in the first
stage at 224 px), so the coordinates are stretched as that function does. What differs from ViTDet: the term covers
only the grid block of the logits (prefix rows and columns get none), and the tables belong to the grid the block
was built for, ``2·max(H // s_q, H // s_kv) - 1`` rows (timm's rule). Another grid reads them resized linearly
(``align_corners=False``, torchvision's ``mvit`` and timm's checkpoint filter rule); timm 1.0.31 and the original
read them unresized, off-centre on a smaller grid and out of range on a larger one, so their outputs at another
size than the model was built for are not a reference.

Residual pooling: timm adds ``q̃`` to every row, the class token's included (``residual_cls=True``, the default);
the original repository and torchvision leave the class row out (``residual_cls=False``).

:class:`PoolingAttention` (registered ``pooling``) keeps the token count and width: queries are not strided. The
block that opens an MViTv2 stage strides the queries and widens the heads (``[B, P + H·W, C] -> [B, P + h·w, C']``,
``h = ceil(H / s_q)``): :class:`PoolingAttentionTransition`, the same mechanism with ``stride_q`` and ``dim_out``,
not registered on its own because the registry's contract maps tokens to tokens of the same count and width (what
lets a mechanism replace another in any block); the family builds it.

On the ``"flex"`` backend a call without prefix tokens adds the term as the ``score_mod`` of
:func:`~vit_attention.functional.rel_pos.decomposed_rel_pos_pattern` (``Q_LEN != KV_LEN``, no mask); with a class
token the dense bias goes through the flex call as a score modification.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import merge_heads, split_qkv
from ..functional.flex import PatternDoc, use_flex
from ..functional.layout import token_layout
from ..functional.linear import apply_linear
from ..functional.observers import attention_observed
from ..functional.rel_pos import decomposed_rel_pos_bias, decomposed_rel_pos_pattern, resize_rel_pos
from ..functional.window import to_pair
from .base import AttentionCall, AttentionModule, check_heads, check_map_tokens_call, grid_of
from .registry import register_attention
from .transfer import PACKED_QKV_SLOTS

__all__ = ["PoolingAttention", "PoolingAttentionTransition", "pooled_size", "rel_pos_length"]


def pooled_size(size: int, stride: int, kernel_size: int = 3) -> int:
    """The side of a grid of ``size`` cells after a pooling conv of ``kernel_size`` (padding ``k // 2``) and
    ``stride``: ``(size + 2·(k // 2) - k) // stride + 1`` (``ceil(size / stride)`` for odd kernels)."""
    return (size + 2 * (kernel_size // 2) - kernel_size) // stride + 1


def rel_pos_length(size: int, stride_q: int, stride_kv: int) -> int:
    """Rows of a table built for a grid side ``size``: ``2·max(size // s_q, size // s_kv) - 1`` (timm 1.0.31 and
    facebookresearch/mvit size the tables with floor divisions)."""
    return 2 * max(size // stride_q, size // stride_kv, 1) - 1


def _check_int(value: Any, name: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _check_pair(value: Any, name: str) -> tuple[int, int]:
    pair = to_pair(value, name)
    for v in pair:
        _check_int(v, name)
    return pair


class _PoolingCore(AttentionModule):
    """The shared pooling attention, ``[B, P + H·W, C_in] -> [B, P + h·w, C_out]`` (see the module docstring)."""

    transfer_slots = PACKED_QKV_SLOTS
    accepts = frozenset({"residual"})
    # docs/flex.md's row of patterns (analysis.docs.pattern_table)
    flex_pattern = PatternDoc(
        families="MViTv2",
        keys="every pooled key (Q_LEN = the pooled query grid, KV_LEN = the pooled key grid)",
        term="the query-dependent decomposed term `rel_h[b, h, q, kv // wk] + rel_w[b, h, q, kv % wk]` on the "
             "pooled grids (with a class token: its dense bias)",
        order="row-major pooled grids",
        example=(dict(stride_kv=2, input_size=8), (1, 64, 96)))
    merging_note = ("its queries, keys and values are pooled by convolutions over the token grid and its relative "
                    "positions read each token's grid cell: merged tokens have neither")

    def _build(self, dim: int, dim_out: int, num_heads: int, *, stride_q: Any, stride_kv: Any, kernel_size: Any,
               input_size: Any, use_rel_pos: bool, residual_pooling: bool, residual_cls: bool, qkv_bias: bool,
               norm_eps: float, attn_drop: float, proj_drop: float) -> None:
        check_heads(dim, 1, "dim")
        self.init_attention(dim_out, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.dim, self.dim_out = dim, dim_out  # the input width (checked on the call) and the attention width
        self.stride_q = _check_pair(stride_q, "stride_q")
        self.stride_kv = _check_pair(stride_kv, "stride_kv")
        self.kernel_size = _check_pair(kernel_size, "kernel_size")
        self.input_size = _check_pair(input_size, "input_size")
        for name, flag in (("use_rel_pos", use_rel_pos), ("residual_pooling", residual_pooling),
                           ("residual_cls", residual_cls), ("qkv_bias", qkv_bias)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        self.use_rel_pos, self.residual_pooling, self.residual_cls = use_rel_pos, residual_pooling, residual_cls
        hd = self.head_dim
        self.scale = hd ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim_out, bias=qkv_bias)
        self.proj = nn.Linear(dim_out, dim_out)
        pad = tuple(k // 2 for k in self.kernel_size)
        for t, stride in (("q", self.stride_q), ("k", self.stride_kv), ("v", self.stride_kv)):
            setattr(self, f"pool_{t}", nn.Conv2d(hd, hd, self.kernel_size, stride=stride, padding=pad, groups=hd,
                                                 bias=False))
            setattr(self, f"norm_{t}", nn.LayerNorm(hd, eps=norm_eps))
        if use_rel_pos:
            lh, lw = self.rel_pos_lengths(self.input_size)
            self.rel_pos_h = nn.Parameter(torch.zeros(lh, hd))
            self.rel_pos_w = nn.Parameter(torch.zeros(lw, hd))
            nn.init.trunc_normal_(self.rel_pos_h, std=0.02)
            nn.init.trunc_normal_(self.rel_pos_w, std=0.02)

    # ---- sizes
    def rel_pos_lengths(self, grid: Sequence[int]) -> tuple[int, int]:
        """Rows of ``rel_pos_h`` / ``rel_pos_w`` for a model built on the input grid ``(H, W)``
        (:func:`rel_pos_length` per axis)."""
        return (rel_pos_length(int(grid[0]), self.stride_q[0], self.stride_kv[0]),
                rel_pos_length(int(grid[1]), self.stride_q[1], self.stride_kv[1]))

    def q_grid(self, grid: Sequence[int]) -> tuple[int, int]:
        """The pooled query grid (the output grid) for an input grid ``(H, W)``: ``ceil(H / s_q)`` per side."""
        return tuple(pooled_size(int(g), s, k) for g, s, k in zip(grid, self.stride_q, self.kernel_size))  # type: ignore[return-value]

    def kv_grid(self, grid: Sequence[int]) -> tuple[int, int]:
        """The pooled key / value grid for an input grid ``(H, W)``: ``ceil(H / s_kv)`` per side."""
        return tuple(pooled_size(int(g), s, k) for g, s, k in zip(grid, self.stride_kv, self.kernel_size))  # type: ignore[return-value]

    def set_input_size(self, grid: int | Sequence[int]) -> None:
        """Rebuild the tables for another input grid ``(H, W)`` in place (resized linearly, ``align_corners=False``:
        timm's checkpoint filter and torchvision's rule); ``input_size`` records it."""
        grid = _check_pair(grid, "grid")
        if self.use_rel_pos:
            for name, length in zip(("rel_pos_h", "rel_pos_w"), self.rel_pos_lengths(grid)):
                old = getattr(self, name)
                if old.shape[0] != length:
                    with torch.no_grad():
                        table = resize_rel_pos(old.detach(), length).clone()
                    setattr(self, name, nn.Parameter(table, requires_grad=old.requires_grad))
        self.input_size = grid

    def transfer_init(self) -> list[str]:
        """Pooling convs that pass each token through (centre tap 1, stride kept) and zero tables; the LayerNorms
        over each head (no neutral setting) and the residual pooling stay."""
        with torch.no_grad():
            for t in ("q", "k", "v"):
                conv = getattr(self, f"pool_{t}")
                conv.weight.zero_()
                conv.weight[:, :, self.kernel_size[0] // 2, self.kernel_size[1] // 2] = 1.0
            if self.use_rel_pos:
                self.rel_pos_h.zero_()
                self.rel_pos_w.zero_()
        return ["pool_q, pool_k, pool_v: the identity kernel (centre tap 1; strides kept)",
                "rel_pos_h, rel_pos_w: zeros (no position term)",
                "norm_q, norm_k, norm_v and the residual pooling (+ q) stay: they have no neutral setting"]

    # ---- forward
    def _pool(self, t: Tensor, which: str, grid: tuple[int, int], P: int) -> tuple[Tensor, tuple[int, int]]:
        """Pool one of q / k / v: ``[B, nh, P + H·W, hd] -> [B, nh, P + h·w, hd]`` (prefix tokens skip the conv,
        the LayerNorm includes them) and the pooled grid ``(h, w)``."""
        B, nh, _, hd = t.shape
        H, W = grid
        m = t[:, :, P:].reshape(B * nh, H, W, hd).permute(0, 3, 1, 2)  # [B·nh, hd, H, W]
        m = getattr(self, f"pool_{which}")(m)  # [B·nh, hd, h, w]
        h, w = m.shape[-2], m.shape[-1]
        m = m.reshape(B, nh, hd, h * w).transpose(2, 3)  # [B, nh, h·w, hd]
        if P:
            m = torch.cat([t[:, :, :P], m], dim=2)
        return getattr(self, f"norm_{which}")(m), (h, w)

    def _attention(self, x: Tensor, call: AttentionCall) -> Tensor:
        """``x [B, P + H·W, C_in] -> [B, P + h·w, C_out]`` (the projection and ``call.residual`` included)."""
        B, N, _, P = check_map_tokens_call(self, x, call)
        grid = grid_of(N - P, call.feat_size)
        q, k, v = split_qkv(apply_linear(self.qkv, x), self.num_heads)  # [B, nh, N, hd] each
        q, qg = self._pool(q, "q", grid, P)  # [B, nh, P + hq·wq, hd]
        k, kg = self._pool(k, "k", grid, P)
        v, _ = self._pool(v, "v", grid, P)
        bias = pattern = None
        if self.use_rel_pos:
            if P == 0 and use_flex(self.attention_backend, self.fused_attention, x.device, mechanism="pooling"):
                pattern = decomposed_rel_pos_pattern(q, self.rel_pos_h, self.rel_pos_w, qg, kg)
            else:
                bias = decomposed_rel_pos_bias(q[:, :, P:], self.rel_pos_h, self.rel_pos_w, qg, kg)
                if P:
                    bias = F.pad(bias, (P, 0, P, 0))  # [B, nh, P + Nq, P + Nk]: no term on prefix rows / columns
        layout = token_layout(q.shape[2], qg, P, key_grid=kg) if attention_observed() and kg != qg else (
            token_layout(q.shape[2], qg, P) if attention_observed() else None)
        out = self.attend(q, k, v, bias=bias, scale=self.scale, layout=layout, pattern=pattern)  # [B, nh, Nq, hd]
        if self.residual_pooling:
            if P and not self.residual_cls:
                out = torch.cat([out[:, :, :P], out[:, :, P:] + q[:, :, P:]], dim=2)
            else:
                out = out + q
        return self.project_out(merge_heads(out), call.residual)  # [B, P + hq·wq, C_out]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds for one forward on ``(B, P + H·W, C_in)``: the qkv projection ``N·C_in·3C``, the three
        depthwise pooling convs ``k²·hd`` per pooled cell and head, attention ``2·Nq·Nk·hd`` per head, the position
        term ``(hk + wk)·hd`` per pooled grid query and head, the output projection ``Nq·C²`` (``C`` the
        attention width) and the LayerNorms after pooling at fvcore's 5 per element (adds uncounted)."""
        B, N, C = input_shape
        if feat_size is None:
            H, W = grid_of(N)
        else:
            H, W = int(feat_size[0]), int(feat_size[1])
        P = N - H * W
        nh, hd, Co = self.num_heads, self.head_dim, self.dim_out
        (hq, wq), (hk, wk) = self.q_grid((H, W)), self.kv_grid((H, W))
        kk = self.kernel_size[0] * self.kernel_size[1]
        nq, nk = P + hq * wq, P + hk * wk
        macs = N * C * 3 * Co + nh * hd * kk * (hq * wq + 2 * hk * wk) + 2 * nh * nq * nk * hd + nq * Co * Co
        macs += 5 * nh * hd * (nq + 2 * nk)  # norm_q, norm_k, norm_v
        if self.use_rel_pos:
            macs += nh * hq * wq * (hk + wk) * hd
        return B * macs

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, dim_out={self.dim_out}, num_heads={self.num_heads}, stride_q={self.stride_q}, "
                f"stride_kv={self.stride_kv}, input_size={self.input_size}")


@register_attention(
    "pooling", layout="tokens", needs_feat_size=True, dense_bias=True,
    description="MViTv2 pooling attention: conv-pooled q / k / v with their norms, decomposed relative positions "
                "on the pooled grids, the pooled query added back",
    paper="https://arxiv.org/abs/2112.01526",
    formula=(
        "MViTv2's pooling attention (Li et al. 2022). The queries, keys and values are pooled on the token grid by a "
        "depthwise convolution (one `k x k` kernel per head channel, shared by the heads) and normalised over each "
        "head; the keys and values with stride `s_kv`:\n\n"
        "    q, k, v = split_heads(x W_qkv)                  # [B, nh, P + H·W, hd]\n"
        "    t̃ = LN_hd(Conv_{k, s_t}(t))                     # t ∈ {q, k, v}; prefix tokens skip the conv\n"
        "    rel[i, j] = q̃_i · R_h[Δrow] + q̃_i · R_w[Δcol]   # pooled grids, stretched coordinates\n"
        "    A = softmax(q̃ k̃ᵀ · hd^-1/2 + rel)\n"
        "    out = (A ṽ + q̃) W_proj                          # residual pooling\n\n"
        "The tables `R_h`, `R_w` are built for one grid (`2·max(H // s_q, H // s_kv) - 1` rows) and read resized "
        "linearly on another. Prefix (class) tokens get no position term. MViTv2's stage-opening blocks also "
        "stride the queries and widen the heads (the family's transition blocks)."),
    cost="3·N·C² (qkv) + 9·C·(N + 2·M) (pooling) + 2·N·M·C (attention) + (hk + wk)·N·C (positions) + N·C² "
         "(proj) + 5·C·(N + 2·M) (norms), M = P + hk·wk pooled keys",
    example_kwargs=dict(stride_kv=2, input_size=4), example_shape=(2, 16, 32),
    doc_example=(dict(stride_kv=2, input_size=14), (1, 196, 96)),
    grid_kwargs=lambda grid: {"input_size": grid})
class PoolingAttention(_PoolingCore):
    """MViTv2 pooling attention, ``[B, P + H·W, C] -> [B, P + H·W, C]`` (grid ``feat_size = (H, W)``).

    Args:
        dim: channels ``C``; num_heads: ``nh`` (must divide ``dim``).
        stride_kv: the key / value pooling stride (an int or a pair; MViTv2: 4, 2, 1, 1 by stage at 224 px).
        kernel_size: the pooling conv's kernel (3 in MViTv2; padding ``k // 2``).
        input_size: the token grid ``(H, W)`` the tables are built for (``2·max(H, H // s_kv) - 1`` rows).
        use_rel_pos: add the decomposed relative positions. residual_pooling: add the pooled query to the output.
        residual_cls: the residual pooling includes the prefix rows (timm) or leaves them out (False: the original
            repository, torchvision).
        qkv_bias: bias on ``qkv``; norm_eps: eps of the LayerNorms after pooling.
        attn_drop, proj_drop: dropouts.

    Keys (timm 1.0.31 ``MultiScaleAttention``): ``qkv``, ``proj``, ``pool_{q,k,v}.weight [hd, 1, k, k]``,
    ``norm_{q,k,v}``, ``rel_pos_h``, ``rel_pos_w``.
    """

    def __init__(self, dim: int, num_heads: int = 1, *, stride_kv: int | Sequence[int] = 1,
                 kernel_size: int | Sequence[int] = 3, input_size: int | Sequence[int] = 14,
                 use_rel_pos: bool = True, residual_pooling: bool = True, residual_cls: bool = True,
                 qkv_bias: bool = True, norm_eps: float = 1e-6, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        self._build(dim, dim, num_heads, stride_q=1, stride_kv=stride_kv, kernel_size=kernel_size,
                    input_size=input_size, use_rel_pos=use_rel_pos, residual_pooling=residual_pooling,
                    residual_cls=residual_cls, qkv_bias=qkv_bias, norm_eps=norm_eps, attn_drop=attn_drop,
                    proj_drop=proj_drop)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, P + H·W, C] -> [B, P + H·W, C]``; ``call.feat_size`` the grid (default a square),
        ``num_prefix_tokens`` the class tokens in front, ``residual`` added to the output."""
        return self._attention(x, call)


class PoolingAttentionTransition(_PoolingCore):
    """The pooling attention that opens an MViTv2 stage: ``[B, P + H·W, C_in] -> [B, P + h·w, C_out]`` with
    ``h = ceil(H / s_q)``: queries pooled with stride ``stride_q``, heads ``C_out / nh`` wide (timm's
    ``MultiScaleAttention`` with ``dim != dim_out`` or ``stride_q > 1``). The other arguments and the keys are
    :class:`PoolingAttention`'s. Not a registered mechanism (it changes the token count and width); it runs through
    the same attention core with the captured switches."""

    # the pooling mechanism at a stage transition: what reads a model's mechanisms (backends, maps, FLOPs) counts it
    # as ``pooling``, whose spec (backends, pattern, refusals) it shares
    attention_name = "pooling"

    def __init__(self, dim: int, dim_out: int, num_heads: int = 1, *, stride_q: int | Sequence[int] = 1,
                 stride_kv: int | Sequence[int] = 1, kernel_size: int | Sequence[int] = 3,
                 input_size: int | Sequence[int] = 14, use_rel_pos: bool = True, residual_pooling: bool = True,
                 residual_cls: bool = True, qkv_bias: bool = True, norm_eps: float = 1e-6, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        self._build(dim, dim_out, num_heads, stride_q=stride_q, stride_kv=stride_kv, kernel_size=kernel_size,
                    input_size=input_size, use_rel_pos=use_rel_pos, residual_pooling=residual_pooling,
                    residual_cls=residual_cls, qkv_bias=qkv_bias, norm_eps=norm_eps, attn_drop=attn_drop,
                    proj_drop=proj_drop)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, P + H·W, C_in] -> [B, P + h·w, C_out]`` (:meth:`q_grid` gives ``(h, w)``)."""
        return self._attention(x, call)
