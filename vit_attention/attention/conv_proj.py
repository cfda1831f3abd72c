"""CvT's convolutional projection attention (Wu et al., 2021) on tokens ``[B, P + H·W, C]``.

Before the usual linear projections, q, k and v each get a depthwise ``k x k`` convolution and a
BatchNorm over the token map (the original's ``dw_bn``): stride 1 for q, ``stride_kv`` (2) for k
and v, so the keys live on a coarser ``h x w`` grid and attention costs ``N · (N / s²)``. Prefix
(class) tokens skip the convolutions and join q, k and v in front. The logit scale is
``dim^-1/2`` (the full width, not the head dim), as in microsoft/CvT and Hugging Face's
``CvtSelfAttention``.

State-dict keys are the original repository's: ``conv_proj_{q,k,v}.conv`` / ``.bn``,
``proj_{q,k,v}``, ``proj``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_heads
from ..functional.batch_norm import conv_bn
from ..functional.layout import token_layout
from ..functional.linear import apply_linear
from ..functional.observers import attention_observed
from .base import AttentionCall, AttentionModule, check_map_tokens_call, grid_of
from .registry import register_attention

__all__ = ["ConvProjection", "ConvProjectionAttention", "CONV_PROJ_METHODS"]

CONV_PROJ_METHODS: tuple[str, ...] = ("dw_bn", "avg", "linear")


def _conv_out(n: int, kernel: int, stride: int) -> int:
    """Output length of a ``kernel`` / ``stride`` convolution with ``kernel // 2`` padding (floor)."""
    return (n + 2 * (kernel // 2) - kernel) // stride + 1


def _pool_out(n: int, kernel: int, stride: int) -> int:
    """Output length of ``AvgPool`` with ``kernel // 2`` padding and ``ceil_mode=True`` (torch's rule)."""
    pad = kernel // 2
    out = (n + 2 * pad - kernel + stride - 1) // stride + 1  # ceil (ONNX-safe form)
    return out - 1 if (out - 1) * stride >= n + pad else out


class ConvProjection(nn.Module):
    """Depthwise ``k x k`` conv (no bias, padding ``k // 2``) + BatchNorm: map ``[B, C, H, W] -> [B, h·w, C]``.

    Keys ``conv.weight [C, 1, k, k]`` and ``bn.*`` (the original's ``conv_proj_*``).
    """

    def __init__(self, dim: int, kernel_size: int, stride: int, *, bn_eps: float = 1e-5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, kernel_size, stride=stride, padding=kernel_size // 2, groups=dim, bias=False)
        self.bn = nn.BatchNorm2d(dim, eps=bn_eps)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, h·w, C]`` (``h = ⌊(H - 1) / s⌋ + 1``).

        At inference (eval mode, no hook on ``conv`` / ``bn``) the BatchNorm is folded into the
        convolution's weight and bias: one pass over the map instead of two, the same numbers.
        """
        y = conv_bn(self.conv, self.bn, x)  # [B, C, h, w]
        return y.flatten(2).transpose(1, 2)  # [B, h·w, C]


class _AvgProjection(nn.AvgPool2d):
    """The original's ``avg`` k / v: ``AvgPool(k, s, k // 2, ceil_mode)``, ``[B, C, H, W] -> [B, h·w, C]``."""

    def __init__(self, kernel_size: int, stride: int) -> None:
        super().__init__(kernel_size, stride=stride, padding=kernel_size // 2, ceil_mode=True)

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return super().forward(x).flatten(2).transpose(1, 2)  # [B, h·w, C]


@register_attention(
    "conv_proj", layout="tokens", description="convolutional projection attention (CvT)",
    paper="https://arxiv.org/abs/2103.15808", needs_feat_size=True, prefix_tokens="attend",
    formula=(
        "CvT's convolutional projection (Wu et al. 2021): the tokens are laid out on their `H x W` map and each of "
        "q, k, v gets its own depthwise `k x k` convolution + BatchNorm before its linear projection; k and v use "
        "stride `s` (2), so the keys sit on a coarser `h x w = ⌈H/s⌉ x ⌈W/s⌉` grid:\n\n"
        "    m = tokens → map [B, C, H, W]\n"
        "    q = split_heads(BN(DWConv_q(m)) W_q)              # [B, nh, N, hd]   (stride 1)\n"
        "    k = split_heads(BN(DWConv_k(m)) W_k)              # [B, nh, M, hd]   (stride s, M = h·w)\n"
        "    v = split_heads(BN(DWConv_v(m)) W_v)              # [B, nh, M, hd]\n"
        "    out = merge_heads(softmax(q kᵀ · C^-1/2) v) W_proj  # [B, N, C]\n\n"
        "The scale is `C^-1/2` (the full width, as in both references), not `hd^-1/2`. Class tokens skip the "
        "convolutions and are prepended to q, k and v (they attend and are attended to). `method='avg'` "
        "(average-pooled k, v; plain q) and `'linear'` (no convolutions) are the original's other two options."),
    cost="k²·C·(N + 2M) + 5·C·(N + 2M) (convs, BatchNorm) + 2·N·C² + 2·M·C² (linears) + 2·N·M·C (attention), "
         "M = N / s²: with s = 2, 2.5·N·C² + 0.5·N²·C",
    example_shape=(2, 16, 32), doc_example=({}, (1, 196, 96)),
    global_kwargs=lambda grid: {"stride_kv": 1})  # keys on the full grid; the logit scale is made up in q
class ConvProjectionAttention(AttentionModule):
    """Convolutional projection attention, tokens ``[B, P + H·W, C] -> [B, P + H·W, C]``.

    Args:
        dim: channels ``C``; num_heads: ``nh``.
        kernel_size: the depthwise kernel ``k`` (odd; padding ``k // 2``).
        stride_kv: stride of the k / v projections (q always uses stride 1, so the output keeps the grid).
        method: ``"dw_bn"`` (depthwise conv + BatchNorm, CvT's), ``"avg"`` (k / v average-pooled
            with ``ceil_mode``, q plain) or ``"linear"`` (no convolution: ordinary attention with
            separate q / k / v projections).
        qkv_bias: biases of ``proj_q/k/v``; qk_scale: logit scale (default ``dim^-1/2``).
        bn_eps: BatchNorm eps; attn_drop, proj_drop: dropouts.

    Cost: see :meth:`flops`.
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = {"q": "proj_q", "k": "proj_k", "v": "proj_v", "o": "proj"}

    accepts = frozenset({"residual"})

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        kernel_size: int = 3,
        stride_kv: int = 2,
        method: str = "dw_bn",
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        bn_eps: float = 1e-5,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        if not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be an odd positive int (padding k // 2 keeps the grid), "
                             f"got {kernel_size!r}")
        if not isinstance(stride_kv, int) or stride_kv < 1:
            raise ValueError(f"stride_kv must be a positive int, got {stride_kv!r}")
        if method not in CONV_PROJ_METHODS:
            raise ValueError(f"method must be one of {', '.join(map(repr, CONV_PROJ_METHODS))}; got {method!r}")
        self.kernel_size, self.stride_kv, self.method = kernel_size, stride_kv, method
        self.scale = qk_scale if qk_scale is not None else dim ** -0.5  # the full width, as in CvT
        self.conv_proj_q: nn.Module | None = None
        self.conv_proj_k: nn.Module | None = None
        self.conv_proj_v: nn.Module | None = None
        if method == "dw_bn":
            self.conv_proj_q = ConvProjection(dim, kernel_size, 1, bn_eps=bn_eps)
            self.conv_proj_k = ConvProjection(dim, kernel_size, stride_kv, bn_eps=bn_eps)
            self.conv_proj_v = ConvProjection(dim, kernel_size, stride_kv, bn_eps=bn_eps)
        elif method == "avg":
            self.conv_proj_k = _AvgProjection(kernel_size, stride_kv)
            self.conv_proj_v = _AvgProjection(kernel_size, stride_kv)
        self.proj_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj_k = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj_v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def transfer_init(self) -> list[str]:
        """Each depthwise conv + BatchNorm as the identity at inference (centre tap 1, BatchNorm undoing its eps),
        so the queries are the carried projection's; keys and values keep the stride ``stride_kv``."""
        done = []
        with torch.no_grad():
            for name in ("conv_proj_q", "conv_proj_k", "conv_proj_v"):
                m = getattr(self, name)
                if isinstance(m, ConvProjection):
                    k = m.conv.kernel_size[0] // 2
                    m.conv.weight.zero_()
                    m.conv.weight[:, :, k, k] = 1.0
                    m.bn.running_mean.zero_()
                    m.bn.running_var.fill_(1.0)
                    m.bn.weight.fill_((1.0 + m.bn.eps) ** 0.5)
                    m.bn.bias.zero_()
                    done.append(name)
        return [f"{', '.join(done)}: identity at inference (depthwise centre tap 1, BatchNorm neutral; keys / values "
                f"still subsampled by stride_kv={self.stride_kv})"] if done else []

    def key_grid(self, H: int, W: int) -> tuple[int, int]:
        """The keys' grid ``(h, w)`` for a query grid ``(H, W)``."""
        if self.method == "dw_bn":
            return _conv_out(H, self.kernel_size, self.stride_kv), _conv_out(W, self.kernel_size, self.stride_kv)
        if self.method == "avg":
            return _pool_out(H, self.kernel_size, self.stride_kv), _pool_out(W, self.kernel_size, self.stride_kv)
        return H, W

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, P + H·W, C] -> [B, P + H·W, C]``.

        ``call.feat_size=(H, W)``: the grid of the tokens after the ``P = num_prefix_tokens`` prefix
        tokens. Blocks and the adapter always pass it (and the adapter refuses to call without it);
        called directly without it, the tokens must fill a square map (else ``ValueError`` naming
        ``feat_size``). No ``context`` (keys come from ``x``'s own map).
        ``call.residual [B, N, C]``, when given, is added to the output (fused into ``proj`` at inference).
        """
        B, N, C, P = check_map_tokens_call(self, x, call)
        H, W = grid_of(N - P, call.feat_size)
        prefix, grid = x[:, :P], x[:, P:]  # [B, P, C], [B, H·W, C]
        if P and self.conv_proj_q is not None:
            grid = grid.contiguous()  # one copy, so the three convolutions read a dense channels-last map
        fmap = grid.reshape(B, H, W, C).permute(0, 3, 1, 2)  # [B, C, H, W] (channels-last memory)
        q_t, k_t, v_t = (grid if proj is None else proj(fmap)  # [B, H·W | h·w, C]
                         for proj in (self.conv_proj_q, self.conv_proj_k, self.conv_proj_v))
        if P:  # prefix tokens skip the convolutions and join q, k and v in front
            q_t, k_t, v_t = (torch.cat([prefix, t], dim=1) for t in (q_t, k_t, v_t))  # [B, P + n, C]
        q = split_heads(apply_linear(self.proj_q, q_t), self.num_heads)  # [B, nh, N, hd]
        k = split_heads(apply_linear(self.proj_k, k_t), self.num_heads)  # [B, nh, M, hd]
        v = split_heads(apply_linear(self.proj_v, v_t), self.num_heads)  # [B, nh, M, hd]
        layout = token_layout(N, (H, W), P, key_grid=self.key_grid(H, W)) \
            if attention_observed() else None  # where the rows sit on the grid (observers only; cached)
        out = self.attend(q, k, v, scale=self.scale, layout=layout)  # [B, nh, N, hd]
        return self.project_out(merge_heads(out), call.residual)  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds for one forward on ``input_shape = (B, N, C)`` with grid ``feat_size``.

        With ``P = N - H·W`` prefix tokens, ``M = P + h·w`` keys: depthwise convs ``k²·C`` per
        output position and BatchNorm ``5·C`` (fvcore's rule, as ``vit_attention.analysis.flops``
        counts every norm) on ``H·W + 2·h·w`` positions (``dw_bn`` only), linears
        ``(2N + 2M)·C²``, attention ``2·N·M·C``. Average pooling and biases are not counted.
        """
        B, N, C = input_shape
        Ng = N if feat_size is None else int(feat_size[0]) * int(feat_size[1])
        H, W = grid_of(Ng, feat_size)
        P = N - H * W
        h, w = self.key_grid(H, W)
        M = P + h * w
        convs = 0
        if self.method == "dw_bn":
            convs = (self.kernel_size ** 2 + 5) * C * (H * W + 2 * h * w)
        return B * (convs + (2 * N + 2 * M) * C * C + 2 * N * M * C)

    def extra_repr(self) -> str:
        return f"method={self.method!r}, kernel_size={self.kernel_size}, stride_kv={self.stride_kv}"

