"""ViT multi-head self-attention (Dosovitskiy et al., 2021) on tokens ``[B, N, C]``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_heads, split_qkv
from ..functional.heads import split_packed
from ..functional.linear import apply_linear, linear
from ..functional.rope import apply_rope
from .base import AttentionCall, AttentionModule, check_tokens_call, merged_frame, observed_layout
from .registry import global_as_built, register_attention
from .rope import make_rope
from .transfer import PACKED_QKV_SLOTS

__all__ = ["MultiHeadSelfAttention"]


@register_attention(
    "mhsa", layout="tokens", description="global multi-head self-attention (ViT)",
    paper="https://arxiv.org/abs/2010.11929",
    formula=(
        "Global multi-head self-attention over all `N` tokens (Vaswani et al. 2017; ViT, Dosovitskiy et al. 2021):\n\n"
        "    q, k, v = split_heads(x W_qkv)                 # each [B, nh, N, hd]\n"
        "    A = softmax(q kᵀ · hd^-1/2)                    # [B, nh, N, N]\n"
        "    out = merge_heads(A v) W_proj                  # [B, N, C]\n\n"
        "Every token attends to every token: cost grows with `N²`. Optional QK-norm (ViT-22B) "
        "normalises q and k per head before the product; optional 2-D rotary positions (`rope='axial'` "
        "as EVA-02 / DINOv3 / RoPE-ViT, `rope='mixed'` with learned frequencies) rotate q and k of the grid "
        "tokens after it, prefix tokens unrotated."),
    cost="4·N·C² + 2·N²·C multiply-adds (quadratic in the tokens N)",
    example_shape=(2, 11, 32), global_kwargs=global_as_built)
class MultiHeadSelfAttention(AttentionModule):
    """Global self-attention, ``[B, N, C] -> [B, N, C]``.

    ``qkv`` is one packed ``Linear(C, 3C)`` (timm layout); ``qkv_bias="qv"`` gives it no bias and
    learned ``q_bias`` / ``v_bias`` instead, the key bias fixed at zero (EVA-02, DINOv3; timm Eva's
    keys). ``qk_norm`` applies a LayerNorm over each head's ``hd`` channels of q and k (ViT-22B).
    ``rope`` (``"axial"`` | ``"mixed"``) with ``rope_kwargs``: a
    :class:`~vit_attention.attention.rope.RotaryEmbedding` (key ``rope``) turns q and k of the grid
    tokens after the qk-norm. ``inner_norm`` adds a LayerNorm over the merged heads ``[B, N, C]`` after
    attention, before ``proj`` (EVA-CLIP's ``inner_attn_ln``; timm Eva ``scale_attn_inner=True``, key
    ``norm``). Cost: ``4·N·C² + 2·N²·C`` multiply-adds (+ ``4·N·C`` with RoPE).
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool | str = True,
        qk_scale: float | None = None,
        qk_norm: bool = False,
        proj_bias: bool = True,
        inner_norm: bool = False,
        norm_eps: float = 1e-6,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        rope: str | None = None,
        rope_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        if qkv_bias not in (True, False, "qv"):
            raise ValueError(f"qkv_bias must be True, False or 'qv' (q and v biases, none on k), got {qkv_bias!r}")
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias is True)
        if qkv_bias == "qv":
            self.q_bias: nn.Parameter | None = nn.Parameter(torch.zeros(dim))
            self.v_bias: nn.Parameter | None = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = self.v_bias = None
        self.q_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.rope = make_rope(rope, rope_kwargs, self.head_dim, num_heads)
        self.norm = nn.LayerNorm(dim, eps=norm_eps) if inner_norm else nn.Identity()  # [B, N, C] before proj
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def _qkv_bias(self) -> Tensor | None:
        """The packed ``[3C]`` bias of ``qkv``: its own, or ``[q_bias | 0 | v_bias]`` with ``qkv_bias="qv"``."""
        if self.q_bias is None or self.v_bias is None:
            return self.qkv.bias
        return torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])  # k has none

    accepts = frozenset({"context", "mask", "rope_coords", "rope_valid", "tome", "residual"})

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, N, C] -> [B, N, C]``.

        ``call.feat_size`` is not needed and prefix tokens attend like every other token.
        ``context [B, M, C]``: keys and values come from it (the ``k | v`` rows of ``qkv``).
        ``mask``: bool, broadcastable to ``[B, nh, N, M]``, True = may attend.
        ``residual [B, N, C]``, when given, is added to the output (fused into ``proj`` at inference).
        With ``rope``, the grid is ``feat_size`` (a square without it) after ``num_prefix_tokens``, or per
        sample ``rope_coords [B, N - P, 2]`` int ``(y, x)`` with ``rope_valid [B, N - P]`` bool (a packed
        NaFlex batch; padding rows unrotated; :meth:`RotaryEmbedding.forward`).
        ``tome``: token merging's state (:class:`~vit_attention.functional.tome.TokenMergeState`): ``log(size)``
        is added to the logits (proportional attention), the keys averaged over heads become its merge
        metric, and RoPE turns each token by its (merged) grid position ``tome.coords`` on ``feat_size``.
        """
        check_tokens_call(self, x, call)
        feat_size, num_prefix_tokens, context, tome = call.feat_size, call.num_prefix_tokens, call.context, call.tome
        rope_coords, rope_valid = call.rope_coords, call.rope_valid
        if (rope_coords is not None or rope_valid is not None) and self.rope is None:
            raise ValueError("rope_coords / rope_valid given, but this module was built without rope "
                             "(pass rope='axial' or 'mixed')")
        if context is not None and self.rope is not None:
            raise ValueError("rope needs self-attention on the grid: this module was built with rope, so it "
                             "takes no context")
        if context is None and self.q_bias is not None:
            q, k, v = split_qkv(linear(x, self.qkv.weight, self._qkv_bias()), self.num_heads)  # each [B, nh, N, hd]
        elif context is None:
            q, k, v = split_qkv(apply_linear(self.qkv, x), self.num_heads)  # each [B, nh, N, hd]
        else:
            C, w, b = self.dim, self.qkv.weight, self._qkv_bias()
            q = split_heads(linear(x, w[:C], None if b is None else b[:C]), self.num_heads)  # [B, nh, N, hd]
            kv = linear(context, w[C:], None if b is None else b[C:])  # [B, M, 2C]
            k, v = split_packed(kv, self.num_heads, 2, "packed kv")  # each [B, nh, M, hd]
        q, k = self.q_norm(q), self.k_norm(k)
        bias = None
        if tome is not None:
            if context is not None or rope_coords is not None:
                raise ValueError("token merging runs on self-attention over the model's own tokens (no context, "
                                 "no packed rope_coords)")
            bias = tome.read_keys(k)  # [B, 1, 1, N] log(size), or None; the keys become the merge metric
        if self.rope is not None and tome is not None and tome.coords is not None and feat_size is not None:
            cos, sin = self.rope.tables_at(tome.coords, feat_size)  # [B, 1 | nh, N - P, hd] at merged positions
            q = apply_rope(q, cos, sin, num_prefix_tokens=num_prefix_tokens, layout=self.rope.layout)
            k = apply_rope(k, cos, sin, num_prefix_tokens=num_prefix_tokens, layout=self.rope.layout)
        elif self.rope is not None:
            if rope_coords is None and rope_valid is None:
                q, k = self.rope(q, k, feat_size, num_prefix_tokens)  # grid tokens turned, prefix kept
            else:
                if rope_coords is None:
                    raise ValueError("rope_valid needs rope_coords [B, L, 2]")
                q, k = self.rope(q, k, feat_size, num_prefix_tokens, coords=rope_coords,
                                 valid=rope_valid)  # each sample on its own grid
        layout = observed_layout(x, call, num_context=None if context is None else context.shape[1])
        with merged_frame(call):  # observers place merged tokens' weights on the original ones
            x = self.attend(q, k, v, mask=call.mask, bias=bias, scale=self.scale, layout=layout)  # [B, nh, N, hd]
        return self.project_out(self.norm(merge_heads(x)), call.residual)  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds for one forward on ``input_shape = (B, N, C)``.

        ``4·N·C² + 2·N²·C``, plus the QK-norm LayerNorms when on (fvcore's 5 per element, as
        ``vit_attention.analysis.flops`` counts every norm), the inner norm's ``5·N·C`` when on, and the RoPE
        products (``4·N·C``).
        """
        B, N, C = input_shape
        qk_norm = 2 * 5 * N * C if isinstance(self.q_norm, nn.LayerNorm) else 0
        qk_norm += 5 * N * C if isinstance(self.norm, nn.LayerNorm) else 0
        rope = self.rope.flops(N) if self.rope is not None else 0  # prefix rows counted too (a bound; P << N)
        return B * (4 * N * C * C + 2 * N * N * C + qk_norm + rope)
