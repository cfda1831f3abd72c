"""Cascaded group attention (Liu et al., "EfficientViT: Memory Efficient Vision Transformer with Cascaded Group
Attention", CVPR 2023): window attention whose heads each see their own channel split of the input plus the
previous head's output, with a depthwise convolution on each head's queries and LeViT's learned bias per head and
absolute offset ``(|Δy|, |Δx|)`` inside the window.

On a channels-last map ``[B, H, W, C]`` zero-padded at the bottom / right to ``ws x ws`` windows (timm 1.0.31
``timm/models/efficientvit_msra.py`` ``LocalWindowAttention`` + ``CascadedGroupAttention``; microsoft/Cream
``EfficientViT/classification/model/efficientvit.py`` @ 4a13c40, unchanged since 74fb8c5), per window
``x [C, ws, ws]``::

    x_1 .. x_nh = split(x, C / nh channels each)
    f_1 = x_1;  f_i = x_i + o_{i-1}                            # the cascade: the previous head's output
    q, k, v = split(BN(Conv1x1_i(f_i)), [kd, kd, vd])          # per head, vd = C / nh
    q = BN(DWConv_{k_i}(q))                                    # the head's own kernel size k_i
    o_i = softmax(q kᵀ · kd^-1/2 + T[i, |Δy|·ws + |Δx|]) v     # T [nh, ws²]
    y = BN(Conv1x1(relu(cat[o_1 .. o_nh])))                    # [C, ws, ws]

The padded zeros take part in the softmax unmasked (timm's and the original's rule). The heads are sequential (head
``i`` needs head ``i - 1``'s output), so the attention core runs once per head with the windows in the batch: one
head of ``[B·nW, 1, ws², ·]`` per call, the table's row as a dense ``[ws², ws²]`` bias. While attention
weights are observed (recording maps), the per-head calls are hidden from the observers (``observed=False``) and the
core then runs once more over all ``nh`` heads with the window layout: a recording holds one call, a map per head on
the image.
It runs on the fused, sdpa and explicit backends, not on FlexAttention (the spec's ``backend_note`` says why).

The table belongs to the window it was built for; :meth:`CascadedGroupAttention.set_window_size` resamples it
(bicubic with antialiasing on the ``(|Δy|, |Δx|)`` grid, timm's ``resize_rel_pos_bias_table_levit``). The 1x1 and
depthwise projections are :class:`ConvNorm` (a bias-free convolution and a BatchNorm, timm's keys ``conv`` /
``bn``) whose :meth:`ConvNorm.fuse` folds the BatchNorm in place for inference.

Speed (CPU inference): everything runs channels-last, the map's own layout, so no window, head or projection
needs a transpose: a 1x1 :class:`ConvNorm` is a linear layer on the channels (oneDNN's GEMM, its activation or
residual add fused), the depthwise ones run on the channels-last view, each head's queries / keys / values are
views of its projection, and its output ``[B', h, w, vd]`` is the next head's input as it comes. A map that is one
window is not partitioned; the output projection then adds a ``residual`` in its GEMM. With the backend ``"auto"``
each head runs on the core's explicit path on CPU (torch's fused kernel is slower on these small heads). At
inference the folded BatchNorm weights and the gathered bias are kept while their tensors are unchanged
(:class:`~vit_attention.attention.base.VersionCache`), and ``x + dw(x)`` of a depthwise :class:`ConvNorm` is one
convolution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.attention import scaled_dot_product_attention
from ..functional.attention_bias import attention_bias_index, resize_attention_bias_table
from ..functional.batch_norm import fold_batch_norm
from ..functional.conv_act import conv2d_act
from ..functional.fast_paths import activation
from ..functional.layout import window_layout
from ..functional.linear import hookless, linear
from ..functional.observers import WEIGHT_HOOKS
from ..functional.runtime import capturing
from ..functional.window import pad_to_window, to_pair, window_partition, window_reverse
from .base import AttentionCall, AttentionModule, VersionCache, check_spatial_call
from .registry import register_attention

__all__ = ["CascadedGroupAttention", "ConvNorm"]


def _centre_identity(weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """A depthwise kernel ``[C, 1, kh, kw]`` plus the identity (1 added to the centre tap): ``conv(x) + x``."""
    kh, kw = weight.shape[-2:]
    weight = weight.clone()
    weight[:, :, kh // 2, kw // 2] += 1.0
    return weight, bias


class ConvNorm(nn.Module):
    """``Conv2d`` (padding ``k // 2``, bias only with ``bias``), ``BatchNorm2d`` on a channels-last map:
    ``[B, H, W, Cin] -> [B, H', W', Cout]``.

    timm 1.0.31's EfficientViT-MSRA ``ConvNorm`` (keys ``conv.weight``, ``bn.*``; timm runs it on ``NCHW``, the
    numbers are the same); ``bn_weight_init``: the BatchNorm's initial scale (0 where a residual branch ends). In
    eval mode the BatchNorm runs folded into the convolution (its folded weights kept while the tensors are
    unchanged); a 1x1 convolution is then a linear layer on the channels, with ``act`` and ``residual`` fused into
    it (:func:`~vit_attention.functional.linear.linear`). :meth:`fuse` folds the BatchNorm for good.
    """

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 1, stride: int = 1, *, groups: int = 1,
                 bn_weight_init: float = 1.0, bias: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride, kernel_size // 2, groups=groups, bias=bias)
        self.bn: nn.Module = nn.BatchNorm2d(out_chs)
        nn.init.constant_(self.bn.weight, bn_weight_init)
        self._folded = VersionCache()
        self._folded_identity = VersionCache()  # the same with the identity in the centre tap (x + dw(x))

    @property
    def fused(self) -> bool:
        """Whether the BatchNorm has been folded into ``conv`` (:meth:`fuse`)."""
        return not isinstance(self.bn, nn.BatchNorm2d)

    def folded_weights(self, *, identity: bool = False) -> tuple[Tensor, Tensor | None] | None:
        """The convolution's ``(weight [Cout, Cin/g, kh, kw], bias [Cout])`` with the BatchNorm folded in (eval
        mode, running statistics, no hooks on ``conv`` / ``bn``), or None where the two must run as modules.
        ``identity``: plus the identity in the kernel's centre tap, ``x + BN(conv(x))`` as one convolution (only
        for a depthwise layer of stride 1 that keeps the width: :attr:`identity_foldable`)."""
        modules = self._modules  # (not nn.Module.__getattr__: this runs for every layer on every call)
        conv, bn = modules["conv"], modules["bn"]
        if conv.padding_mode != "zeros" or not hookless(conv, bn):  # type: ignore[union-attr]
            return None
        cache = self._folded_identity if identity else self._folded
        if not isinstance(bn, nn.BatchNorm2d):  # fused
            if not identity:
                return conv.weight, conv.bias  # type: ignore[union-attr]
            tensors: tuple[Tensor | None, ...] = (conv.weight, conv.bias)  # type: ignore[union-attr]
            return cache.get([t for t in tensors if t is not None],
                             lambda: _centre_identity(conv.weight, conv.bias))  # type: ignore[union-attr]
        if conv.training or bn.training or not bn.track_running_stats or bn.running_var is None:  # type: ignore
            return None
        params, stats = bn._parameters, bn._buffers  # type: ignore[union-attr]
        tensors = (conv._parameters["weight"], params["weight"], params["bias"], stats["running_mean"],  # type: ignore
                   stats["running_var"]) + ((conv.bias,) if conv.bias is not None else ())  # type: ignore[union-attr]
        if identity:
            return cache.get([t for t in tensors if t is not None],
                             lambda: _centre_identity(*fold_batch_norm(conv, bn)))  # type: ignore[arg-type]
        return cache.get([t for t in tensors if t is not None],
                         lambda: fold_batch_norm(conv, bn))  # type: ignore[arg-type]

    @property
    def identity_foldable(self) -> bool:
        """Whether ``x + layer(x)`` is one convolution with the identity added to the centre tap: depthwise
        (``groups = Cin = Cout``), stride 1, an odd kernel (the output keeps the map's size)."""
        c = self.conv
        return (c.groups == c.in_channels == c.out_channels and c.stride == (1, 1)
                and c.kernel_size[0] % 2 == 1 and c.kernel_size[1] % 2 == 1)

    def forward(self, x: Tensor, *, act: str | None = None, residual: Tensor | None = None) -> Tensor:
        """``residual + act(BN(conv(x)))``: ``[B, H, W, Cin] -> [B, H', W', Cout]`` (``act``: None or an activation
        name of :data:`~vit_attention.functional.fast_paths.ACTIVATIONS`; ``residual``: None or
        ``[B, H', W', Cout]``). ``residual=x`` on a depthwise layer at inference is one convolution (the identity
        folded into its centre tap)."""
        c = self._modules["conv"]
        wb = None
        if residual is x and act is None and self.identity_foldable:
            wb = self.folded_weights(identity=True)
            if wb is not None:
                residual = None
        if wb is None:
            wb = self.folded_weights()
        if wb is None:  # training statistics or hooks: the modules themselves, on the NCHW view
            y = activation(self.bn(c(x.permute(0, 3, 1, 2))), act).permute(0, 2, 3, 1)
            return y if residual is None else residual + y
        weight, bias = wb
        if c.kernel_size == (1, 1) and c.stride == (1, 1) and c.groups == 1:  # a linear layer on the channels
            return linear(x, weight.flatten(1), bias, act=act, residual=residual)
        y = conv2d_act(x.permute(0, 3, 1, 2), weight, bias, stride=c.stride[0], padding=c.padding[0],  # type: ignore
                       groups=c.groups, act=act).permute(0, 2, 3, 1)
        return y if residual is None else residual + y

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm (its running statistics) into ``conv`` in place: ``conv`` gets a bias, ``bn`` becomes
        the identity. The same outputs in eval mode; training afterwards no longer normalises."""
        if self.fused:
            return
        weight, bias = fold_batch_norm(self.conv, self.bn)  # type: ignore[arg-type]
        c = self.conv
        conv = nn.Conv2d(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding, groups=c.groups,
                         device=weight.device, dtype=weight.dtype)
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)  # type: ignore[union-attr]
        self.conv, self.bn = conv, nn.Identity()
        self._folded, self._folded_identity = VersionCache(), VersionCache()

    def center_tap(self, x: Tensor) -> Tensor:
        """The layer on lone points (tokens off the grid): only the kernel's centre tap sees each, the rest reads
        the zero padding: ``[B, M, 1, Cin] -> [B, M, 1, Cout]`` (stride 1)."""
        kh, kw = self.conv.kernel_size
        w = self.conv.weight[:, :, kh // 2:kh // 2 + 1, kw // 2:kw // 2 + 1]
        y = F.conv2d(x.permute(0, 3, 1, 2), w, self.conv.bias, groups=self.conv.groups)
        return (y if self.fused else self.bn(y)).permute(0, 2, 3, 1)


_NO_FLEX = ("each head is its own call on windows of at most a few dozen tokens with a dense bias, so FlexAttention "
            "has no block sparsity to use; and each head's output feeds a pointwise operation (the next head's "
            "input, the ReLU), which inductor's CPU FlexAttention kernel cannot take as an epilogue (torch 2.x): "
            "the other backends run the same softmax attention")


def _explicit_heads(q: Tensor) -> bool:
    """Whether the backend ``"auto"`` runs a head's core call on the explicit path: eager on CPU (see
    :meth:`CascadedGroupAttention._attend_head`)."""
    return q.device.type == "cpu" and not capturing()


def _check_kernels(kernels: Any, num_heads: int) -> tuple[int, ...]:
    if kernels is None:
        return (5,) * num_heads
    if isinstance(kernels, (str, bytes)) or not isinstance(kernels, Sequence) or len(kernels) < num_heads or not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1 and k % 2 for k in kernels):
        raise ValueError(f"kernels must be a sequence of at least num_heads={num_heads} odd ints >= 1 (the depthwise "
                         f"kernel on each head's queries), got {kernels!r}")
    return tuple(kernels[:num_heads])


def _check_window(window_size: Any) -> tuple[int, int]:
    ws = to_pair(window_size, "window_size")
    if min(ws) < 1:
        raise ValueError(f"window_size must be positive (the window (h, w) the table is built for), got "
                         f"{window_size!r}")
    return ws


@register_attention(
    "cascaded_group", layout="spatial",
    description="EfficientViT-MSRA cascaded group attention: per-head channel splits fed the previous head's "
                "output, a depthwise conv on q, LeViT's |offset| bias, in windows",
    paper="https://arxiv.org/abs/2305.07027",
    formula=(
        "Cascaded group attention (EfficientViT-MSRA, Liu et al. 2023; timm's `LocalWindowAttention`). In each "
        "`ws x ws` window (the map zero-padded at the bottom / right), head `i` reads its own `C/nh` channels "
        "plus the previous head's output:\n\n"
        "    f_i = x_i + o_{i-1}                                  # f_1 = x_1\n"
        "    q, k, v = split(BN(Conv1x1_i(f_i)), [kd, kd, C/nh])\n"
        "    q = BN(DWConv_{k_i}(q))\n"
        "    o_i = softmax(q kᵀ · kd^-1/2 + T[i, |Δy|·ws + |Δx|]) v   # T [nh, ws²]\n"
        "    y = BN(Conv1x1(relu(cat[o_1 .. o_nh])))\n\n"
        "Each head is a narrow projection of a slice, so the cost of the projections falls `nh` times and the "
        "heads see different inputs. The heads run one after another (one attention call per head); padded "
        "zeros take part in the softmax. The table belongs to the window; another window resamples it."),
    cost="nW·[Σ_i N·(C/nh)(2kd + C/nh) + N·kd·k_i² + nh·N²·(kd + C/nh) + N·C²] multiply-adds, N = ws², "
         "nW = ceil(H/ws)·ceil(W/ws): linear in the pixels (+ 5 per BatchNorm element until folded)",
    example_kwargs=dict(key_dim=8, window_size=4, kernels=(5, 3, 3, 3)),
    doc_example=(dict(key_dim=16, window_size=7), (1, 14, 14, 96)),
    grid_kwargs=lambda grid: {"window_size": tuple(grid)},
    # rows keep weight on the zero-padded keys past the border (unmasked, as timm): a border window's map on the
    # image sums to less than 1
    normalized_weights=False, backends=("auto", "sdpa", "explicit"), backend_note=_NO_FLEX)
class CascadedGroupAttention(AttentionModule):
    """Cascaded group attention in ``ws x ws`` windows, ``[B, H, W, C] -> [B, H, W, C]`` (any ``H, W``).

    Args:
        dim: the width ``C``; num_heads: ``nh`` (must divide ``dim``: each head reads ``C / nh`` channels and
            gives as many, ``vd = C / nh``, which the cascade adds to the next head's slice).
        key_dim: ``kd``, the query / key width of one head (EfficientViT: 16).
        window_size: the window ``ws`` (int or ``(h, w)``) the table ``[nh, h·w]`` is built for; maps are padded
            to multiples of it (the models pass ``min(7, stage resolution)``, timm's rule).
        kernels: the depthwise kernel on each head's queries (odd; at least ``nh``, the first ``nh`` used; None:
            5 for every head).
        qkv_bias: a bias on each head's q / k / v convolution (EfficientViT: none, its BatchNorm shifts).
        attn_drop, proj_drop: dropouts.

    Keys (timm 1.0.31, ``mixer.m.attn.*``): ``qkvs.{i}.conv`` / ``.bn`` (``C/nh -> 2kd + vd``), ``dws.{i}.conv``
    / ``.bn`` (depthwise ``kd``), ``proj.1.conv`` / ``.bn`` (``nh·vd -> C``, after ``proj.0`` the ReLU),
    ``attention_biases [nh, h·w]`` (zeros). Every BatchNorm starts at scale 1; EfficientViT's blocks set the output
    projection's to 0 (the residual branch starts at zero), which is the family's init.
    """

    # the output projection is a 1x1 convolution nh·vd -> C = C -> C; the per-head q / k / v convolutions read a
    # C / nh slice plus the previous head's output, which no packed projection of another mechanism has
    transfer_slots = {"o": "proj.1.conv"}
    accepts = frozenset({"residual"})
    merging_note = ("each head's input is its own channel slice plus the previous head's output on the same "
                    "windows of the map: merged tokens fill no window")

    def __init__(self, dim: int, num_heads: int = 4, *, key_dim: int = 16, window_size: int | Sequence[int] = 7,
                 kernels: Sequence[int] | None = None, qkv_bias: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        vd = self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        if not isinstance(key_dim, int) or isinstance(key_dim, bool) or key_dim < 1:
            raise ValueError(f"key_dim must be an int >= 1 (the query / key width of one head), got {key_dim!r}")
        self.key_dim, self.val_dim = key_dim, vd
        self.kernels = _check_kernels(kernels, num_heads)
        self.window_size = _check_window(window_size)
        self.scale = key_dim ** -0.5
        if not isinstance(qkv_bias, bool):
            raise ValueError(f"qkv_bias must be a bool, got {qkv_bias!r}")
        self.qkvs = nn.ModuleList([ConvNorm(vd, 2 * key_dim + vd, bias=qkv_bias) for _ in range(num_heads)])
        self.dws = nn.ModuleList([ConvNorm(key_dim, key_dim, k, groups=key_dim) for k in self.kernels])
        self.proj = nn.Sequential(nn.ReLU(), ConvNorm(num_heads * vd, dim))
        wh, ww = self.window_size
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, wh * ww))
        self._bias = VersionCache()  # the gathered [nh, N, N] bias while the table is unchanged

    def transfer_init(self) -> list[str]:
        """A zero table (no position term); the per-head projections, the depthwise convolutions and the
        BatchNorms have no counterpart and keep their values."""
        with torch.no_grad():
            self.attention_biases.zero_()
        return ["attention_biases: zeros (no position term)"]

    def window_bias(self) -> Tensor:
        """The logit bias of every head in one window: ``[nh, h·w, h·w]`` (a gather of the table; kept at inference
        while the table is unchanged)."""
        table = self.attention_biases
        return self._bias.get([table], lambda: table[:, attention_bias_index(self.window_size, device=table.device)])

    def _attend_head(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, *, observed: bool) -> Tensor:
        """One head's core call, ``q, k [B', 1, N, kd]``, ``v [B', 1, N, vd]``, ``bias [N, N]`` -> ``[B', 1, N, vd]``.

        With the backend ``"auto"``, eager on CPU, it is the explicit path: on these heads (a few dozen tokens,
        16-wide keys) torch's fused CPU kernel took twice its time on two threads (its flash kernel where
        ``vd = kd``, its math path otherwise); an open ``ATTENTION_BACKEND.override`` still wins."""
        options = self.core_options()
        if options["backend"] == "auto" and _explicit_heads(q):
            options["backend"] = "explicit"
        return scaled_dot_product_attention(q, k, v, bias=bias, scale=self.scale, observed=observed, **options)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]`` (plus ``call.residual`` when given); ``call.feat_size`` must match the
        map."""
        B, H, W, C = check_spatial_call(self, x, call)
        wh, ww = self.window_size
        nh, kd, vd = self.num_heads, self.key_dim, self.val_dim
        x, (pad_h, pad_w) = pad_to_window(x, (wh, ww))  # zeros at the bottom / right
        nWh, nWw = (H + pad_h) // wh, (W + pad_w) // ww
        Bw, N = B * nWh * nWw, wh * ww
        one = nWh * nWw == 1  # the map is one window: no partition
        win = x if one else window_partition(x, (wh, ww)).view(Bw, wh, ww, C)  # [B', h, w, C]
        slices = win.split(vd, dim=-1)  # nh x [B', h, w, vd]
        bias = self.window_bias().to(x.dtype)  # [nh, N, N]
        observed = bool(WEIGHT_HOOKS)  # maps recorded: one observed core call of every head
        qkv: list[tuple[Tensor, Tensor, Tensor]] = []
        outs: list[Tensor] = []
        feat = slices[0]
        for i in range(nh):
            if i:
                feat = slices[i] + feat  # the cascade: the previous head's output joins this head's slice
            q, k, v = self.qkvs[i](feat).split([kd, kd, vd], dim=-1)  # [B', h, w, ·]
            q = self.dws[i](q)
            q, k, v = (t.reshape(Bw, 1, N, t.shape[-1]) for t in (q, k, v))  # [B', 1, N, ·]
            if observed:  # the heads' inputs, unobserved; the observed core call runs once over all heads below
                qkv.append((q, k, v))
            out = self._attend_head(q, k, v, bias[i], observed=not observed)  # [B', 1, N, vd]
            feat = out.view(Bw, wh, ww, vd)
            outs.append(feat)
        if observed:  # one call of nh heads: the observers get one map per head, placed on the image by the windows
            q, k, v = (torch.cat(t, dim=1) for t in zip(*qkv))  # [B', nh, N, ·]
            out = self.attend(q, k, v, bias=bias[None], scale=self.scale, layout=window_layout(H, W, (wh, ww)))
            outs = list(out.view(Bw, nh, wh, ww, vd).unbind(1))
        residual = call.residual
        dropped = self.training and self.proj_drop.p > 0
        y = torch.cat(outs, dim=-1)  # [B', h, w, nh·vd], a new tensor: the ReLU may run in place
        y = torch.relu_(y) if type(self.proj[0]) is nn.ReLU and hookless(self.proj[0]) else self.proj[0](y)
        if one and not (pad_h or pad_w) and not dropped:  # the residual add fused into the output projection
            return self.proj[1](y, residual=residual)
        y = self.proj_drop(self.proj[1](y))  # [B', h, w, C]
        if not one:
            if residual is not None and not (pad_h or pad_w):  # the window reverse and the add in one pass
                y = y.view(B, nWh, nWw, wh, ww, C).transpose(2, 3)  # [B, nWh, h, nWw, w, C], a view
                return (residual.reshape(y.shape) + y).reshape(B, H, W, C)
            y = window_reverse(y, (wh, ww), H + pad_h, W + pad_w)  # [B, H', W', C]
        if pad_h or pad_w:
            y = y[:, :H, :W]
        return y.contiguous() if residual is None else residual + y

    def attend_prefix(self, prefix: Tensor, tokens: Tensor) -> Tensor:
        """Prefix tokens ``[B, P, C]`` attend globally to ``tokens [B, P + H·W, C]`` (all of them) -> ``[B, P, C]``.

        The cascade over every token as one group, through the same projections, with no position term (prefix
        tokens have no place on the grid): each token is a lone point, so the depthwise convolution on the queries
        reads only its centre tap.
        """
        B, M, C = tokens.shape
        P, nh, kd, vd = prefix.shape[1], self.num_heads, self.key_dim, self.val_dim
        slices = tokens.unsqueeze(2).split(vd, dim=-1)  # nh x [B, M, 1, vd]
        outs: list[Tensor] = []
        feat = slices[0]
        for i in range(nh):
            if i:
                feat = slices[i] + feat
            q, k, v = self.qkvs[i](feat).split([kd, kd, vd], dim=-1)  # [B, M, 1, ·]
            q = self.dws[i].center_tap(q)
            q, k, v = (t.reshape(B, 1, M, t.shape[-1]) for t in (q, k, v))  # [B, 1, M, ·]
            out = self.attend(q, k, v, scale=self.scale)  # [B, 1, M, vd]
            feat = out.view(B, M, 1, vd)
            outs.append(feat[:, :P])
        y = self.proj(torch.cat(outs, dim=-1))  # [B, P, 1, C]
        return self.proj_drop(y.squeeze(2))  # [B, P, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``(B, H, W, C)`` over the padded windows: per window and head the 1x1 projection
        (``N·(C/nh)(2kd + vd)``), the depthwise convolution (``N·kd·k_i²``) and attention (``N²·(kd + vd)``), then
        the output projection (``N·C²``), ``N = h·w``; plus fvcore's 5 per BatchNorm element while the BatchNorms
        are not folded (:meth:`ConvNorm.fuse`)."""
        B, H, W, C = input_shape
        wh, ww = self.window_size
        N, nh, kd, vd = wh * ww, self.num_heads, self.key_dim, self.val_dim
        per_window = sum(N * vd * (2 * kd + vd) + N * kd * k * k for k in self.kernels)
        per_window += nh * N * N * (kd + vd) + N * nh * vd * C
        for layer in (*self.qkvs, *self.dws, self.proj[1]):  # fvcore's 5 per BatchNorm element, until folded
            per_window += 0 if layer.fused else 5 * N * layer.conv.out_channels
        return B * math.ceil(H / wh) * math.ceil(W / ww) * per_window

    def set_window_size(self, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0) -> None:
        """Rebuild the table for another window ``(h', w')`` in place (bicubic, antialiased on the
        ``(|Δy|, |Δx|)`` grid: timm's ``resize_rel_pos_bias_table_levit``); the windows are never shifted, so
        ``shift_size`` must be 0."""
        if to_pair(shift_size, "shift_size") != (0, 0):
            raise ValueError(f"shift_size must be 0: cascaded group attention's windows are not shifted, got "
                             f"{shift_size!r}")
        ws = _check_window(window_size)
        if ws != self.window_size:
            old = self.attention_biases
            with torch.no_grad():
                table = resize_attention_bias_table(old.detach(), self.window_size, ws).clone()
            self.attention_biases = nn.Parameter(table, requires_grad=old.requires_grad)
        self.window_size = ws

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, key_dim={self.key_dim}, "
                f"window_size={self.window_size}, kernels={self.kernels}")
