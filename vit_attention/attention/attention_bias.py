"""LeViT's attention (Graham et al., "LeViT: a Vision Transformer in ConvNet's Clothing for Faster Inference",
ICCV 2021): global attention with a learned bias per head and absolute offset ``(|Δy|, |Δx|)``, narrow queries and
keys (``key_dim`` per head), wider values (``attn_ratio · key_dim``), a hardswish before the output projection, and
every projection a linear layer followed by a BatchNorm over the tokens (:class:`LinearNorm`).

Per block, on tokens ``[B, N, C]`` of an ``H x W`` grid (timm 1.0.31 ``timm/models/levit.py`` ``Attention``;
facebookresearch/LeViT ``levit.py`` ``Attention``)::

    qkv = BN(x W_qkv)                                  # per head interleaved [q_h | k_h | v_h], widths kd, kd, vd
    A   = softmax(q kᵀ · kd^-1/2 + T[h, idx])          # T [nh, H·W], idx[i, j] = |Δy|·W + |Δx|
    out = BN(hardswish(merge_heads(A v)) W_proj)       # [B, N, C]

The shrink attention that opens LeViT's later stages (:class:`AttentionBiasShrink`, timm's ``AttentionDownsample``)
is the same mechanism with its queries on every second grid point and another output width. It is not registered
as a mechanism of its own: the registry's contract maps tokens to tokens of the same count and width (what lets any
mechanism replace another in a block), and the shrink attention changes both. It lives here, sharing the index,
the table rule and the projections, and the family builds it.

The bias reaches the attention core as one dense ``[1, nh, N, M]`` term
(:func:`~vit_attention.functional.attention_bias.attention_bias_index`); on the ``"flex"`` backend a ``score_mod``
reads the table at the index computed from the query and key positions instead
(:func:`~vit_attention.functional.attention_bias.attention_bias_pattern`), with no ``[N, M]`` tensor. The table
belongs to the grid it was built for (``resolution``); another grid reads it resampled
(:func:`~vit_attention.functional.attention_bias.resize_attention_bias_table`, bicubic with antialiasing as timm's
``resize_rel_pos_bias_table_levit``), and :meth:`AttentionBias.set_window_size` resamples it for good. Prefix tokens
(a class token, where a model has one) get no bias: they have no place on the grid.

BatchNorm folding is an inference transform: :meth:`LinearNorm.fuse` folds the BatchNorm into the linear layer in
place (the same numbers in eval mode, one layer less per projection); a LeViT model's ``fuse()`` does it everywhere.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import merge_heads, scaled_dot_product_attention
from ..functional.attention_bias import (
    attention_bias_index,
    attention_bias_pattern,
    query_grid,
    resize_attention_bias_table,
)
from ..functional.batch_norm import can_fold_batch_norm, fold_batch_norm
from ..functional.fast_paths import activation
from ..functional.flex import PatternDoc, use_flex
from ..functional.layout import token_layout
from ..functional.linear import act_fresh, apply_linear, hookless, linear
from ..functional.observers import attention_observed
from ..functional.runtime import ATTENTION_BACKEND, FUSED_ATTENTION
from ..functional.window import to_pair
from .base import (
    AttentionCall,
    AttentionModule,
    ParamCache,
    VersionCache,
    check_heads,
    check_map_tokens_call,
    check_prob,
    grid_of,
    uncacheable,
)
from .registry import register_attention

__all__ = ["AttentionBias", "AttentionBiasShrink", "LinearNorm", "LEVIT_ACTIVATIONS",
           "norm_rows", "project_heads"]

LEVIT_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "hard_swish": nn.Hardswish, "silu": nn.SiLU, "gelu": nn.GELU, "relu": nn.ReLU}
"""The activations LeViT's presets use (timm's names): ``hard_swish`` (the published models), ``silu`` (timm's
untrained 512 / deeper experiments); ``gelu`` and ``relu`` for experiments."""


def levit_act(name: str, what: str = "act_layer") -> Callable[[], nn.Module]:
    """The activation class named ``name`` (:data:`LEVIT_ACTIVATIONS`); unknown names raise naming ``what``."""
    if not isinstance(name, str) or name not in LEVIT_ACTIVATIONS:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, LEVIT_ACTIVATIONS))}; got {name!r}")
    return LEVIT_ACTIVATIONS[name]


def norm_rows(bn: nn.Module, x: Tensor) -> Tensor:
    """``bn`` (a BatchNorm1d) over every leading position of ``x [..., C]`` (LeViT's token statistics).

    A training call on a single row has no batch statistics to take (torch raises): it is normalised with the
    running statistics, which it leaves unchanged, as in eval mode.
    """
    rows = x.reshape(-1, x.shape[-1])  # [B·N, C]
    if bn.training and rows.shape[0] == 1 and isinstance(bn, nn.BatchNorm1d) and bn.track_running_stats:
        y = F.batch_norm(rows, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    else:
        y = bn(rows)
    return y.reshape(x.shape)


class LinearNorm(nn.Module):
    """A linear layer without bias, then a BatchNorm over every token: ``[..., Cin] -> [..., Cout]``.

    LeViT's ``LinearNorm`` (keys ``linear.weight``, ``bn.*``; timm 1.0.31): the BatchNorm normalises each channel
    over all ``B·N`` tokens (:func:`norm_rows`). ``bn_weight_init``: the BatchNorm's initial scale (0 on the layers
    that end a residual branch, so it starts at zero). :meth:`fuse` folds the BatchNorm into the linear layer
    (eval-mode numbers).
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = False,
                 bn_weight_init: float = 1.0) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.bn: nn.Module = nn.BatchNorm1d(out_features)
        nn.init.constant_(self.bn.weight, bn_weight_init)
        self._folded = VersionCache()

    @property
    def fused(self) -> bool:
        """Whether the BatchNorm has been folded into ``linear`` (:meth:`fuse`)."""
        return not isinstance(self.bn, nn.BatchNorm1d)

    def forward(self, x: Tensor, residual: Tensor | None = None, *, act: str | None = None) -> Tensor:
        """``[..., Cin] -> [..., Cout]``: the linear layer, then the BatchNorm over every leading position; ``act``
        (None or a name of :data:`~vit_attention.functional.fast_paths.ACTIVATIONS`) on the result, then
        ``residual [..., Cout]`` added (both inside the GEMM when the BatchNorm runs folded on the CPU).

        At inference (eval mode, no hook on ``linear`` / ``bn``) the BatchNorm runs folded into the linear layer's
        weight and bias: one pass over the tokens instead of two, the same numbers (as the convolutions'
        :func:`~vit_attention.functional.batch_norm.conv_bn`); the folded weight and bias are kept while the
        layer's tensors are unchanged (:class:`~vit_attention.attention.base.VersionCache`).
        """
        if not self.fused and can_fold_batch_norm(self.linear, self.bn):  # inference: one layer, the same numbers
            lin, bn = self.linear, self.bn
            weight, bias = self._folded.fold(lin, bn)
            return linear(x, weight, bias, act=act, residual=residual)
        if self.fused and type(self.linear) is nn.Linear and hookless(self.linear):
            return linear(x, self.linear.weight, self.linear.bias, act=act, residual=residual)  # [..., Cout]
        y = apply_linear(self.linear, x)  # [..., Cout]
        y = activation(y if self.fused else norm_rows(self.bn, y), act)
        return y if residual is None else residual + y

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm (its running statistics) into ``linear`` in place: ``linear`` gets the bias, ``bn``
        becomes the identity. The same outputs as before in eval mode; training would no longer normalise."""
        if self.fused:
            return
        weight, bias = fold_batch_norm(self.linear, self.bn)  # type: ignore[arg-type]
        folded = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
        folded.weight.copy_(weight)
        folded.bias.copy_(bias)
        self.linear, self.bn = folded, nn.Identity()
        self._folded.clear()


def project_heads(proj: nn.Module, drop: nn.Module | None, x: Tensor, residual: Tensor | None = None) -> Tensor:
    """``residual + drop(proj(x))`` for LeViT's output projection ``proj = Sequential(act, ln: LinearNorm)`` on the
    merged heads ``x [..., nh·vd]`` (a fresh tensor of the caller's) ``-> [..., C]``.

    At inference (no hook on ``proj`` or ``proj.ln``, dropout off) the activation runs in place
    (:func:`~vit_attention.functional.linear.act_fresh`) and the residual is added inside the projection's GEMM;
    otherwise the modules run and the residual is added after them."""
    ln = getattr(proj, "ln", None)
    if isinstance(ln, LinearNorm) and hookless(proj, ln) and (drop is None or not (
            drop.training and getattr(drop, "p", 0) > 0)):
        return ln(act_fresh(proj.act, x), residual=residual)
    out = proj(x) if drop is None else drop(proj(x))
    return out if residual is None else residual + out


def _norm_macs(layer: LinearNorm, rows: int) -> int:
    """fvcore's BatchNorm cost (5 per element, affine) of ``layer`` on ``rows`` tokens; 0 once folded."""
    return 0 if layer.fused else 5 * rows * layer.linear.out_features


def _identity_norm(layer: LinearNorm) -> None:
    """The BatchNorm of ``layer`` as the identity at inference (scale 1, shift 0, mean 0, variance 1 - eps)."""
    bn = layer.bn
    if isinstance(bn, nn.BatchNorm1d):
        bn.weight.fill_(1.0)
        bn.bias.zero_()
        bn.running_mean.zero_()  # type: ignore[union-attr]
        bn.running_var.fill_(1.0 - bn.eps)  # type: ignore[union-attr]


def _grid_table(table: Tensor, resolution: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """A table built for ``resolution`` on the key grid ``grid`` ``[nh, H·W]`` (resampled when the grids differ)."""
    return table if tuple(grid) == tuple(resolution) else resize_attention_bias_table(table, resolution, grid)


def _table_bias(table: Tensor, resolution: tuple[int, int], grid: tuple[int, int], stride: int) -> Tensor:
    """The logit bias ``[nh, Nq, H·W]`` of a table built for ``resolution`` on the key grid ``grid`` with queries
    every ``stride``-th point (the table resampled when the grids differ)."""
    table = _grid_table(table, resolution, grid)  # [nh, H·W]
    return table[:, attention_bias_index(grid, stride, device=table.device)]  # [nh, Nq, H·W]


def _cached_table_bias(cache: ParamCache, table: Tensor, resolution: tuple[int, int], grid: tuple[int, int],
                       stride: int) -> Tensor:
    """:func:`_table_bias` ``[nh, Nq, H·W]``, kept in ``cache`` while the table holds the same values (compared with
    a snapshot each call: the table has ``nh·H·W`` entries, the gather ``nh·Nq·H·W``). Computed anew where
    :func:`~vit_attention.attention.base.uncacheable` says so (autograd through the table, graph capture, an
    accelerator, the fast paths off)."""
    if uncacheable([table]):
        cache.clear()
        return _table_bias(table, resolution, grid, stride)
    key = (torch.is_inference_mode_enabled(), tuple(resolution), tuple(grid), stride)
    if not cache.lookup([table], key):
        cache.store([table], key, _table_bias(table, resolution, grid, stride))
    return cache.value


def _check_resolution(resolution: Any) -> tuple[int, int]:
    grid = to_pair(resolution, "resolution")
    if min(grid) <= 0:
        raise ValueError(f"resolution must be positive (the token grid (H, W) of the bias table), got {resolution!r}")
    return grid


def _check_key_dim(key_dim: Any, attn_ratio: Any) -> tuple[int, int]:
    """``(key_dim, value_dim)``: positive ints, ``value_dim = int(attn_ratio · key_dim)`` (timm's rule)."""
    if not isinstance(key_dim, int) or isinstance(key_dim, bool) or key_dim < 1:
        raise ValueError(f"key_dim must be an int >= 1 (the query / key width of one head), got {key_dim!r}")
    if not isinstance(attn_ratio, (int, float)) or isinstance(attn_ratio, bool) or int(attn_ratio * key_dim) < 1:
        raise ValueError(f"attn_ratio must be a number > 0 with attn_ratio * key_dim >= 1 (the value width of one "
                         f"head), got {attn_ratio!r}")
    return key_dim, int(attn_ratio * key_dim)


@register_attention(
    "attention_bias", layout="tokens", needs_feat_size=True, dense_bias=True,
    description="LeViT attention: a learned bias per head and |offset|, narrow q / k, hardswish before proj, "
                "BatchNorm after each linear",
    paper="https://arxiv.org/abs/2104.01136",
    formula=(
        "LeViT's attention (Graham et al. 2021): global multi-head attention with narrow queries and keys "
        "(`kd` per head), wider values (`vd = attn_ratio·kd`) and a learned bias per head indexed by the absolute "
        "offset between a query and a key:\n\n"
        "    q, k, v = split_per_head(BN(x W_qkv))          # [q_h | k_h | v_h] widths kd, kd, vd\n"
        "    A = softmax(q kᵀ · kd^-1/2 + T[h, |Δy|·W + |Δx|])  # T [nh, H·W]\n"
        "    out = BN(hardswish(merge_heads(A v)) W_proj)\n\n"
        "Each BatchNorm normalises over all tokens and folds into its linear layer at inference. The table belongs "
        "to one grid `H x W`: another grid reads it resampled (bicubic, antialiased); prefix tokens get no bias. "
        "LeViT's shrink attention (queries every second grid point, a wider output) opens its later stages."),
    cost="N·C·nh(2kd+vd) + nh·N²·(kd+vd) + N·nh·vd·C multiply-adds (+ 5 per BatchNorm element; the bias is a "
         "gather)",
    example_kwargs={"resolution": 4}, example_shape=(2, 16, 32),
    doc_example=({"key_dim": 16, "resolution": 14}, (1, 196, 96)),
    grid_kwargs=lambda grid: {"resolution": grid})
class AttentionBias(AttentionModule):
    """LeViT self-attention on ``[B, P + H·W, C] -> [B, P + H·W, C]``, the table built for the grid ``resolution``.

    Args:
        dim: the width ``C``; num_heads: ``nh``.
        key_dim: the query / key width ``kd`` of one head (LeViT: 16 or 32, independent of ``dim``); None:
            ``dim // num_heads`` (then ``dim`` must be divisible by ``num_heads``).
        attn_ratio: value width per head over ``key_dim`` (LeViT's blocks: 2).
        resolution: the token grid ``(H, W)`` the table ``[nh, H·W]`` is built for.
        act_layer: the activation before the output projection (:data:`LEVIT_ACTIVATIONS`).
        qkv_bias: a bias on the q / k / v linear layer (LeViT: none; its BatchNorm shifts).
        attn_drop, proj_drop: dropouts.

    Keys (timm 1.0.31): ``qkv.linear.weight``, ``qkv.bn.*``, ``proj.ln.linear.weight``, ``proj.ln.bn.*``,
    ``attention_biases``. Every BatchNorm starts at scale 1; LeViT's blocks set the output projection's to 0 (the
    residual branch starts at zero), which is the family's init.
    """

    accepts = frozenset({"residual"})
    # docs/flex.md's row of patterns (analysis.docs.pattern_table)
    flex_pattern = PatternDoc(
        families="LeViT", keys="every key",
        term="`T[h, |Δy|·W + |Δx|]`, the entry computed from the two positions (prefix tokens: none), never an "
             "`N x N` bias",
        order="row-major, prefix tokens first", example=(dict(resolution=7), (1, 49, 96)))

    def __init__(self, dim: int, num_heads: int = 8, *, key_dim: int | None = None, attn_ratio: float = 2.0,
                 resolution: int | Sequence[int] = 14, act_layer: str = "hard_swish", qkv_bias: bool = False,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        if key_dim is None:
            key_dim = check_heads(dim, num_heads)
        kd, vd = _check_key_dim(key_dim, attn_ratio)
        check_heads(dim, 1)  # a positive int width
        self.init_attention(num_heads * kd, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.dim = dim  # the heads are kd wide whatever the width (LeViT: 288 channels, 5 heads of 32)
        self.key_dim, self.val_dim = kd, vd
        self.attn_ratio = float(attn_ratio)
        self.resolution = _check_resolution(resolution)
        if not isinstance(qkv_bias, bool):
            raise ValueError(f"qkv_bias must be a bool, got {qkv_bias!r}")
        self.scale = kd ** -0.5
        self.qkv = LinearNorm(dim, num_heads * (2 * kd + vd), bias=qkv_bias)
        self.proj = nn.Sequential(OrderedDict([
            ("act", levit_act(act_layer)()), ("ln", LinearNorm(num_heads * vd, dim))]))
        H, W = self.resolution
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, H * W))
        self._bias_cache = ParamCache()  # the gathered [nh, N, N] bias, while the table is unchanged

    # ---- attention.transfer: another mechanism's weights into this one
    @property
    def transfer_slots(self) -> dict[str, str]:  # type: ignore[override]
        """``o`` is ``proj.ln.linear``; ``q`` and ``k`` are the first two ``kd``-row blocks of each head's rows of
        ``qkv.linear`` when ``vd`` is a multiple of ``kd``, and ``v`` the third when ``vd == kd``."""
        slots = {"o": "proj.ln.linear"}
        kd, vd = self.key_dim, self.val_dim
        if vd % kd == 0:
            n = 2 + vd // kd
            slots.update(q=f"qkv.linear:0/{n}h", k=f"qkv.linear:1/{n}h")
            if n == 3:
                slots["v"] = "qkv.linear:2/3h"
        return slots

    def transfer_init(self) -> list[str]:
        """A zero table and BatchNorms that pass their input through at inference; the hardswish before the output
        projection stays (it has no neutral setting)."""
        with torch.no_grad():
            self.attention_biases.zero_()
            _identity_norm(self.qkv)
            _identity_norm(self.proj.ln)
        return ["attention_biases: zeros (no position term)",
                "qkv.bn, proj.ln.bn: identity at inference (scale 1, shift 0, running mean 0, variance 1 - eps)"]

    def grid(self, num_grid_tokens: int, feat_size: Any = None) -> tuple[int, int]:
        """The token grid of a call: ``feat_size``, else ``resolution`` when it holds the tokens, else a square."""
        if feat_size is None and self.resolution[0] * self.resolution[1] == num_grid_tokens:
            return self.resolution
        return grid_of(num_grid_tokens, feat_size)

    def position_bias(self, grid: tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
        """The logit bias ``[1, nh, P + H·W, P + H·W]`` on ``grid`` (prefix rows and columns zero); a grid other
        than ``resolution`` reads the table resampled to it. At CPU inference the gathered bias is kept while the
        table is unchanged (do not modify the result)."""
        bias = _cached_table_bias(self._bias_cache, self.attention_biases, self.resolution, grid, 1)  # [nh, N, N]
        if num_prefix_tokens:
            bias = F.pad(bias, (num_prefix_tokens, 0, num_prefix_tokens, 0))
        return bias.unsqueeze(0)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, P + H·W, C] -> [B, P + H·W, C]``.

        ``call.feat_size`` is the grid (default: ``resolution`` when it holds the tokens, else a square);
        ``residual``: added to the output.
        """
        B, N, C, P = check_map_tokens_call(self, x, call)
        grid = self.grid(N - P, call.feat_size)
        nh, kd, vd = self.num_heads, self.key_dim, self.val_dim
        qkv = self.qkv(x).view(B, N, nh, 2 * kd + vd).transpose(1, 2)  # [B, nh, N, 2kd + vd]
        q, k, v = qkv.split([kd, kd, vd], dim=-1)
        layout = token_layout(N, grid, P) if attention_observed() else None  # observers only
        if use_flex(self.attention_backend, self.fused_attention, x.device):  # the table read in a score_mod
            pattern = attention_bias_pattern(_grid_table(self.attention_biases, self.resolution, grid), grid, 1, P)
            out = self.attend(q, k, v, pattern=pattern, scale=self.scale, layout=layout)  # [B, nh, N, vd]
        else:
            out = self.attend(q, k, v, bias=self.position_bias(grid, P), scale=self.scale, layout=layout)
        return project_heads(self.proj, self.proj_drop, merge_heads(out), call.residual)  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds for one forward on ``(B, N, C)``: ``N·C·nh(2kd+vd) + nh·N²·(kd+vd) + N·nh·vd·C``, plus
        fvcore's 5 per BatchNorm element while the BatchNorms are not folded (the bias is a gather)."""
        B, N, C = input_shape
        nh, kd, vd = self.num_heads, self.key_dim, self.val_dim
        macs = N * C * nh * (2 * kd + vd) + nh * N * N * (kd + vd) + N * nh * vd * C
        return B * (macs + _norm_macs(self.qkv, N) + _norm_macs(self.proj.ln, N))

    def set_window_size(self, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0) -> None:
        """Rebuild the table for another grid ``(H', W')`` in place (bicubic, antialiased: timm's LeViT rule); the
        attention is global, so ``shift_size`` must be 0."""
        if to_pair(shift_size, "shift_size") != (0, 0):
            raise ValueError(f"shift_size must be 0: LeViT's attention is global, got {shift_size!r}")
        grid = _check_resolution(window_size)
        if grid != self.resolution:
            old = self.attention_biases
            with torch.no_grad():
                table = resize_attention_bias_table(old.detach(), self.resolution, grid).clone()
            self.attention_biases = nn.Parameter(table, requires_grad=old.requires_grad)
        self.resolution = grid


class _Subsample(nn.Module):
    """Every ``stride``-th row and column of a map, then a :class:`LinearNorm`: ``[B, H, W, C] -> [B, h·w, C']``.
    Key ``ln.*`` (timm's ``q = Sequential(down, ln)``)."""

    def __init__(self, stride: int, ln: LinearNorm) -> None:
        super().__init__()
        self.stride = stride
        self.ln = ln

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, ceil(H/s)·ceil(W/s), C']``."""
        s = self.stride
        x = x[:, ::s, ::s]
        B, h, w, C = x.shape  # every size spelled out: B may be 0
        return self.ln(x.reshape(B, h * w, C))


class AttentionBiasShrink(nn.Module):
    """LeViT's shrink attention (timm's ``AttentionDownsample``): ``[B, H, W, Cin] -> [B, h, w, Cout]``,
    ``h = ceil(H/s)``, queries on every ``stride``-th grid point, keys and values on the whole grid, no residual.

    ::

        k, v = split_per_head(BN(x W_kv))                 # [k_h | v_h] per head, widths kd, vd
        q    = BN(x[::s, ::s] W_q)                        # head-major
        A    = softmax(q kᵀ · kd^-1/2 + T[h, |s·yq - y|·W + |s·xq - x|])
        out  = BN(hardswish(merge_heads(A v)) W_proj)     # [B, h·w, Cout]

    Keys (timm 1.0.31 ``stages.{i}.downsample.attn_downsample``): ``kv.linear`` / ``kv.bn``, ``q.ln.linear`` /
    ``q.ln.bn``, ``proj.ln.linear`` / ``proj.ln.bn``, ``attention_biases [nh, H·W]`` (of the key grid). Not a
    registered mechanism (it changes the token count and width); it runs through the same attention core with the
    captured ``fused_attention`` / ``attention_backend`` switches. Another grid than ``resolution`` reads the table
    resampled, as :class:`AttentionBias`.
    """

    def __init__(self, in_dim: int, out_dim: int, key_dim: int, num_heads: int = 8, *, attn_ratio: float = 4.0,
                 stride: int = 2, resolution: int | Sequence[int] = 14, act_layer: str = "hard_swish",
                 attn_drop: float = 0.0) -> None:
        super().__init__()
        kd, vd = _check_key_dim(key_dim, attn_ratio)
        check_heads(in_dim, 1, "in_dim")
        check_heads(out_dim, 1, "out_dim")
        check_heads(num_heads * kd, num_heads)
        if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
            raise ValueError(f"stride must be an int >= 1, got {stride!r}")
        self.fused_attention = FUSED_ATTENTION.default  # captured when built (runtime.switched flips it)
        self.attention_backend = ATTENTION_BACKEND.default
        self.in_dim, self.out_dim, self.num_heads, self.stride = in_dim, out_dim, num_heads, stride
        self.key_dim, self.val_dim = kd, vd
        self.attn_drop = check_prob(attn_drop, "attn_drop")
        self.resolution = _check_resolution(resolution)
        self.scale = kd ** -0.5
        self.kv = LinearNorm(in_dim, num_heads * (kd + vd))
        self.q = _Subsample(stride, LinearNorm(in_dim, num_heads * kd))
        self.proj = nn.Sequential(OrderedDict([("act", levit_act(act_layer)()),
                                               ("ln", LinearNorm(num_heads * vd, out_dim))]))
        H, W = self.resolution
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, H * W))
        self._bias_cache = ParamCache()  # the gathered [nh, h·w, H·W] bias, while the table is unchanged

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, Cin] -> [B, ceil(H/s), ceil(W/s), Cout]``."""
        if x.dim() != 4 or x.shape[-1] != self.in_dim:
            raise ValueError(f"expected a channels-last map [B, H, W, {self.in_dim}], got {tuple(x.shape)}")
        B, H, W, C = x.shape
        h, w = query_grid((H, W), self.stride)
        nh, kd, vd = self.num_heads, self.key_dim, self.val_dim
        kv = self.kv(x.reshape(B, H * W, C)).view(B, H * W, nh, kd + vd).transpose(1, 2)  # [B, nh, H·W, kd + vd]
        k, v = kv.split([kd, vd], dim=-1)
        q = self.q(x).view(B, h * w, nh, kd).transpose(1, 2)  # [B, nh, h·w, kd]
        options = dict(scale=self.scale, dropout_p=self.attn_drop if self.training else 0.0,
                       fused=self.fused_attention, backend=self.attention_backend)
        if use_flex(self.attention_backend, self.fused_attention, x.device):  # the table read in a score_mod
            table = _grid_table(self.attention_biases, self.resolution, (H, W))
            out = scaled_dot_product_attention(q, k, v, pattern=attention_bias_pattern(table, (H, W), self.stride),
                                               **options)  # type: ignore[arg-type]
        else:
            bias = _cached_table_bias(self._bias_cache, self.attention_biases, self.resolution, (H, W),
                                      self.stride).unsqueeze(0)  # [1, nh, h·w, H·W]
            out = scaled_dot_product_attention(q, k, v, bias=bias, **options)  # type: ignore[arg-type]
        out = project_heads(self.proj, None, merge_heads(out))  # [B, h·w, Cout]
        return out.reshape(B, h, w, self.out_dim)

    def set_window_size(self, window_size: int | Sequence[int]) -> None:
        """Rebuild the table for another key grid ``(H', W')`` in place (bicubic, antialiased)."""
        grid = _check_resolution(window_size)
        if grid != self.resolution:
            old = self.attention_biases
            with torch.no_grad():
                table = resize_attention_bias_table(old.detach(), self.resolution, grid).clone()
            self.attention_biases = nn.Parameter(table, requires_grad=old.requires_grad)
        self.resolution = grid
