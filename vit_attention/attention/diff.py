"""Differential attention (Ye et al., "Differential Transformer", ICLR 2025) on tokens ``[B, N, C]``.

Each head splits its queries and keys into two halves of width ``hd = C / nh / 2`` and takes the
difference of their two softmax maps over one value of width ``2·hd``, weighted by a learned scalar
``λ`` (one per layer, re-parameterised as ``exp(λq1·λk1) − exp(λq2·λk2) + λ_init``). The result is
RMS-normalised per head and scaled by ``1 − λ_init``, where ``λ_init = 0.8 − 0.6·exp(−0.3·i)`` depends
on the 0-based index ``i`` of the block (``depth_index``). Key names and layout follow timm 1.0.31's
``timm/layers/diff_attention.py`` ``DiffAttention``: ``qkv`` (``[q | k | v]``; inside q and k the two
halves of head ``h`` are the adjacent ``hd``-blocks ``2h`` and ``2h + 1``), ``lambda_q1`` / ``lambda_k1`` /
``lambda_q2`` / ``lambda_k2`` (or ``lambda_a`` / ``lambda_b`` with ``dual_lambda``), ``sub_norm``, ``proj``.

Both maps are one call of the library's core on ``2·nh`` half-heads, so every backend, the attention
observers and FLOP counting apply; the observers record the two softmax maps, not their difference:
half-head ``2h`` is head ``h``'s first map, ``2h + 1`` its second. What that call computes depends on the
path the core takes (:meth:`DifferentialAttention.flops` counts each exactly):

* fused kernel (backends ``"auto"`` / ``"sdpa"``): each half-head attends over its head's ``2·hd``-wide value
  and the two outputs are subtracted, ``A1·v − λ·(A2·v)``; q and k are zero-padded to ``2·hd`` so that torch's
  fused CPU / flash kernels run (unpadded, the CPU falls back to its math path, measured 1.3-2.4x slower at
  vit_dwee's sizes, B 8, N 257, hd 32, torch 2.13 CPU);
* ``"flex"``: the same without padding;
* explicit (``fused_attention`` off, or backend ``"explicit"``) with no weight observer: the maps are
  subtracted first and ``(A1 − λ·A2)`` multiplies the value once, as timm's explicit path does: each
  half-head ``2h + j`` takes the ``j``-th ``hd``-wide half of its head's value (the core's ``weights_fn``).

timm's published GMACs (timm 1.0.31 ``results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv``, counted by fvcore
on timm's explicit path) are the explicit count: ``vit_dwee_patch16_reg1_gap_256`` 3.83 (the plain ``vit_wee``'s),
4.31 on the fused kernel (``+ 2·N²·C`` per block).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.attention import scaled_dot_product_attention
from ..functional.linear import apply_linear, linear
from ..functional.observers import WEIGHT_HOOKS
from ..functional.runtime import ATTENTION_BACKEND, FUSED_ATTENTION
from .base import AttentionCall, AttentionModule, check_tokens_call, merged_frame, observed_layout
from .registry import register_attention
from .transfer import PACKED_QKV_SLOTS

__all__ = ["DifferentialAttention", "HeadRmsNorm", "lambda_init_at"]


def lambda_init_at(depth_index: int) -> float:
    """``λ_init = 0.8 − 0.6·exp(−0.3·i)`` of the block with 0-based index ``i`` (the paper's ``l − 1``)."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth_index)


def _pairs(t: Tensor) -> Tensor:
    """``[B, nh, ...] -> [B, 2nh, ...]``, each head twice in a row (``repeat_interleave(2, 1)`` written as an
    expand, which ONNX export keeps free of the traced batch size)."""
    return t.unsqueeze(2).expand(-1, -1, 2, *([-1] * (t.dim() - 2))).flatten(1, 2)


class HeadRmsNorm(nn.Module):
    """RMSNorm over the last axis with a learned weight (key ``weight``), ``[..., D] -> [..., D]``.

    ``x · rsqrt(mean(x²) + eps) · weight``, written out rather than ``nn.RMSNorm``: ONNX opset 17 has no
    ``rms_norm`` operator, and these elementwise operators export everywhere (the same values).
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., D] -> [..., D]``."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


@register_attention(
    "diff", layout="tokens", description="differential attention: the difference of two softmax maps (DIFF "
    "Transformer)", paper="https://arxiv.org/abs/2410.05258",
    formula=(
        "Two softmax maps per head from split queries and keys, subtracted (Ye et al., ICLR 2025):\n\n"
        "    q, k = split_heads(x W_q, 2·nh), split_heads(x W_k, 2·nh)   # [B, 2nh, N, hd], hd = C/nh/2\n"
        "    v = split_heads(x W_v, nh)                                # [B, nh, N, 2hd]\n"
        "    A1, A2 = softmax(q1 k1ᵀ·hd^-1/2), softmax(q2 k2ᵀ·hd^-1/2) # half-heads 2h and 2h+1\n"
        "    λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init                 # one scalar per layer\n"
        "    O = RMSNorm((A1 − λ·A2) v) · (1 − λ_init)                 # per head, over 2hd\n"
        "    out = merge_heads(O) W_proj                               # [B, N, C]\n\n"
        "`λ_init = 0.8 − 0.6·exp(−0.3·i)` for the block of 0-based index `i` (`depth_index`). The "
        "difference cancels attention that both maps give to irrelevant tokens (common-mode noise). Both "
        "maps are one core call on 2·nh half-heads; recorded maps are the two softmax maps (half-head "
        "2h: A1 of head h, 2h+1: A2)."),
    cost="4·N·C² + 2·N²·C multiply-adds on the explicit path (the maps subtracted, then one A·V: global "
    "attention's count); 4·N·C² + 4·N²·C on the fused kernel (two A·V, q and k zero-padded to v's width), "
    "4·N·C² + 3·N²·C on flex (two A·V)",
    example_shape=(2, 11, 32))
class DifferentialAttention(AttentionModule):
    """Differential self-attention, ``[B, N, C] -> [B, N, C]`` (timm 1.0.31 ``DiffAttention``'s keys).

    ``dim`` must split into ``2·num_heads`` half-heads of width ``hd = dim / num_heads / 2``; the logit
    scale is ``hd^-0.5``. ``depth_index``: the block's 0-based index, fixing the constant
    ``lambda_init`` (the blocks pass it). ``dual_lambda``: two scalars ``lambda_a`` / ``lambda_b``
    (``λ = exp(a) − exp(b) + λ_init``, initialised 0) instead of the four ``hd``-vectors (N(0, 0.1)).
    ``sub_norm``: RMSNorm over each head's ``2·hd`` channels, eps 1e-5 (the reference code's norm; the
    paper's text says GroupNorm). timm's optional ``qk_norm`` / ``scale_norm`` (off in its presets) are not
    offered. Cost: ``4·N·C² + 2·N²·C`` multiply-adds on the explicit path, ``+ 2·N²·C`` on the fused kernel,
    ``+ N²·C`` on flex (:meth:`flops`).
    """

    transfer_slots = PACKED_QKV_SLOTS
    accepts = frozenset({"context", "mask", "tome", "residual"})

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        depth_index: int = 0,
        dual_lambda: bool = False,
    ) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        if self.head_dim % 2:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads} into heads of even width (each "
                             f"head splits into two halves); dim / num_heads = {self.head_dim}")
        if isinstance(depth_index, bool) or not isinstance(depth_index, int) or depth_index < 0:
            raise ValueError(f"depth_index must be the block's 0-based index (an int >= 0), got {depth_index!r}")
        hd = self.head_dim // 2
        self.half_dim = hd
        self.scale = hd ** -0.5
        self.depth_index = depth_index
        self.lambda_init = lambda_init_at(depth_index)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.dual_lambda = dual_lambda
        if dual_lambda:
            self.lambda_a = nn.Parameter(torch.zeros((), dtype=torch.float32))
            self.lambda_b = nn.Parameter(torch.zeros((), dtype=torch.float32))
        else:
            self.lambda_q1 = nn.Parameter(torch.empty(hd, dtype=torch.float32).normal_(0, 0.1))
            self.lambda_k1 = nn.Parameter(torch.empty(hd, dtype=torch.float32).normal_(0, 0.1))
            self.lambda_q2 = nn.Parameter(torch.empty(hd, dtype=torch.float32).normal_(0, 0.1))
            self.lambda_k2 = nn.Parameter(torch.empty(hd, dtype=torch.float32).normal_(0, 0.1))
        self.sub_norm = HeadRmsNorm(2 * hd, eps=1e-5)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def lambda_full(self) -> Tensor:
        """The layer's ``λ`` (a 0-d tensor, at least fp32 whatever the parameters' dtype, as timm computes it):
        ``exp(λq1·λk1) − exp(λq2·λk2) + λ_init``, or ``exp(λa) − exp(λb) + λ_init`` with ``dual_lambda``."""
        if self.dual_lambda:
            a, b = self.lambda_a, self.lambda_b
        else:
            a = torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1)
            b = torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1)
        dt = torch.promote_types(a.dtype, torch.float32)
        return torch.exp(a.to(dt)) - torch.exp(b.to(dt)) + self.lambda_init

    def _path(self) -> str:
        """How the core runs this module's maps (module docstring): ``"fused"`` (q and k zero-padded to v's width
        ``2·hd``: torch's CPU kernel and CUDA's flash kernel take q, k and v of one width only; given ``Ev = 2·E``
        the CPU falls back to the math path, which holds the ``[B, 2nh, N, M]`` weights), ``"flex"`` (the widths
        as they are) or ``"explicit"`` (the maps subtracted before one A·V). This thread's open switch overrides
        win over the captured switches, as in the core."""
        backend = ATTENTION_BACKEND.get(self.attention_backend)
        if not FUSED_ATTENTION.get(self.fused_attention) or backend == "explicit":
            return "explicit"
        return "flex" if backend == "flex" else "fused"

    def _difference(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                    layout: object) -> Tensor:
        """The explicit path: ``q [B, 2nh, N, hd]``, ``k [B, 2nh, M, hd]``, ``v [B, M, C]`` ->
        ``(A1 − λ·A2) v_h`` per head ``[B, nh, N, 2hd]``, one A·V (timm's explicit path, its dropout on each map).

        The core's ``weights_fn`` turns the ``[B, 2nh, N, M]`` softmax maps into the difference of each head's
        pair, given to both its half-heads; half-head ``2h + j`` multiplies it by the ``j``-th ``hd``-wide half
        of head ``h``'s value, so the two halves side by side are head ``h``'s ``2·hd`` output."""
        B, M, C = v.shape
        nh, hd = self.num_heads, self.half_dim
        lam = self.lambda_full()
        p = self.attn_drop if self.training else 0.0

        def difference(w: Tensor) -> Tensor:  # [B, 2nh, N, M] -> [B, 2nh, N, M]
            if p > 0.0:
                w = F.dropout(w, p=p)  # on each map, before the difference (timm)
            w = w.unflatten(1, (nh, 2))  # [B, nh, 2, N, M]
            return _pairs(w[:, :, 0] - lam.to(w.dtype) * w[:, :, 1])  # [B, 2nh, N, M]

        halves = v.reshape(B, M, 2 * nh, hd).transpose(1, 2)  # [B, 2nh, M, hd]: half-head 2h + j, v_h's j-th half
        options = {**self.core_options(), "dropout_p": 0.0}  # dropout inside weights_fn instead
        out = scaled_dot_product_attention(q, k, halves, mask=mask, bias=bias, scale=self.scale, layout=layout,
                                           weights_fn=difference, **options)  # [B, 2nh, N, hd]
        return out.unflatten(1, (nh, 2)).transpose(2, 3).flatten(3)  # [B, nh, N, 2hd]

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, N, C] -> [B, N, C]``.

        ``context [B, M, C]``: keys and values from it (the ``k | v`` rows of ``qkv``). ``mask``: bool,
        broadcastable to ``[B, nh, N, M]``, True = may attend (both maps of a head get its mask).
        ``tome``: token merging's state: ``log(size)`` joins the logits of both maps (proportional
        attention) and the keys averaged over the ``2·nh`` half-heads become its merge metric.
        ``residual [B, N, C]``: added to the output (fused into ``proj`` at inference).
        """
        check_tokens_call(self, x, call)
        context, tome, mask = call.context, call.tome, call.mask
        B, N, C = x.shape
        nh, hd = self.num_heads, self.half_dim
        if context is None:
            q, k, v = apply_linear(self.qkv, x).split(C, dim=-1)  # each [B, N, C]
        else:
            w, b = self.qkv.weight, self.qkv.bias
            q = linear(x, w[:C], None if b is None else b[:C])  # [B, N, C]
            k, v = linear(context, w[C:], None if b is None else b[C:]).split(C, dim=-1)  # each [B, M, C]
        M = k.shape[1]
        path = self._path()
        q = q.reshape(B, N, 2 * nh, hd).transpose(1, 2)  # [B, 2nh, N, hd]: half-heads 2h = q1, 2h+1 = q2 of head h
        k = k.reshape(B, M, 2 * nh, hd).transpose(1, 2)  # [B, 2nh, M, hd]
        if mask is not None and mask.dim() == 4 and mask.shape[1] > 1:
            mask = _pairs(mask)  # [B, nh, N, M] -> [B, 2nh, N, M]: both half-heads of each head
        bias = None
        if tome is not None:
            if context is not None:
                raise ValueError("token merging runs on self-attention over the model's own tokens (no context)")
            bias = tome.read_keys(k)  # metric: keys averaged over the half-heads; [B, 1, 1, N] log(size) or None
        layout = observed_layout(x, call, num_context=None if context is None else M)  # observers only
        if path == "explicit" and not WEIGHT_HOOKS:
            with merged_frame(call):
                out = self._difference(q, k, v, mask, bias, layout)  # [B, nh, N, 2hd]
        else:  # observers see the two softmax maps, so both maps multiply the value (the explicit core, if observed)
            v = _pairs(v.reshape(B, M, nh, 2 * hd).transpose(1, 2))  # [B, 2nh, M, 2hd]: head h's v for both halves
            if path == "fused":
                q, k = F.pad(q, (0, hd)), F.pad(k, (0, hd))  # [B, 2nh, N | M, 2hd]: zero channels, same logits
            with merged_frame(call):  # observers place merged tokens' weights on the original ones
                out = self.attend(q, k, v, mask=mask, bias=bias, scale=self.scale, layout=layout)  # [B, 2nh, N, 2hd]
            out = out.unflatten(1, (nh, 2))  # [B, nh, 2, N, 2hd]
            out = out[:, :, 0] - self.lambda_full().to(out.dtype) * out[:, :, 1]  # (A1 − λ·A2) v: [B, nh, N, 2hd]
        out = self.sub_norm(out) * (1.0 - self.lambda_init)
        out = out.transpose(1, 2).flatten(2)  # heads merged [B, N, C] (flatten: no traced sizes in an ONNX graph)
        return self.project_out(out, call.residual)  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds for one forward on ``input_shape = (B, N, C)``, on the path the core takes (:meth:`_path`).

        The projections ``4·N·C²``, then: explicit ``2·N²·C`` (``q·kᵀ`` on ``2·nh`` half-heads of width ``hd``,
        ``N²·C``; the difference of each pair of maps times the value, ``N²·C``: timm's explicit path, whose count
        timm's model tables publish); flex ``3·N²·C`` (both maps times the ``2·hd``-wide value); fused ``4·N²·C``
        (q and k zero-padded to ``2·hd`` as well). A weight observer (attention maps) moves the explicit path to
        the fused path's products without the padding (``3·N²·C``); counting registers none. The RMS norms are
        not counted (as :mod:`vit_attention.analysis.flops` counts only LayerNorm / GroupNorm / BatchNorm).
        """
        B, N, C = input_shape
        maps = {"explicit": 2, "flex": 3, "fused": 4}[self._path()]
        return B * (4 * N * C * C + maps * N * N * C)
