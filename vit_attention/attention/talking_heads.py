"""Talking-heads self-attention (Shazeer et al., 2020; CaiT, Touvron et al., 2021) on tokens ``[B, N, C]``.

The heads exchange information twice: a learned ``nh x nh`` mixing of the logits before the
softmax (``proj_l``) and of the weights after it (``proj_w``). Both go through the core's
``logits_fn`` / ``weights_fn`` hooks, so the package's one softmax stays in the core; the hooks
force the explicit path (the fused kernel never sees the weights). Key names follow timm's
``cait.TalkingHeadAttn``: ``qkv``, ``proj_l``, ``proj_w``, ``proj``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_qkv
from ..functional.linear import apply_linear, hookless
from .base import AttentionCall, AttentionModule, check_tokens_call, merged_frame, observed_layout
from .registry import global_as_built, register_attention
from .transfer import PACKED_QKV_SLOTS

__all__ = ["TalkingHeadsAttention", "mix_heads"]


def mix_heads(a: Tensor, mix: nn.Linear, *, scale: float = 1.0, before_softmax: bool = False) -> Tensor:
    """Mix the heads of ``scale · a [*b, nh, N, M]`` with ``mix`` (``Linear(nh, nh)``): ``[*b, nh, N, M]``.

    ``before_softmax``: the result only feeds a softmax over its last axis, which ignores a
    constant per head and row, so the fast path leaves out ``mix``'s bias at inference (the same
    weights, one pass fewer; with autograd it stays, so the bias gets its (zero) gradient).
    ``scale`` is folded into the ``nh x nh`` weight (no pass over ``a``).

    A plain hookless ``nn.Linear`` runs as one batched ``W @ a + b`` over ``a``'s own layout
    ``[B', nh, N·M]`` (contiguous in, contiguous out: no transposed copies, and the softmax that
    follows reads contiguous rows); any other module (a subclass, one with hooks) is called on
    the heads-last view, as timm does. Same values either way.
    """
    h, last = a.dim() - 3, a.dim() - 1  # non-negative axes: ONNX's Transpose takes no negative perm
    if type(mix) is nn.Linear and mix.bias is not None and hookless(mix):
        nh, N, M = a.shape[-3:]
        a3 = a.reshape(-1, nh, N * M)  # [B', nh, N·M]
        w = (mix.weight if scale == 1.0 else mix.weight * scale).expand(a3.shape[0], nh, nh)  # [B', nh, nh]
        if before_softmax and not (torch.is_grad_enabled() and mix.bias.requires_grad):  # keep the bias's grad
            return torch.bmm(w, a3).view(a.shape)  # [*b, nh, N, M]
        return torch.baddbmm(mix.bias.view(1, nh, 1), w, a3).view(a.shape)  # [*b, nh, N, M]
    a = a if scale == 1.0 else a * scale
    return mix(a.movedim(h, last)).movedim(last, h)  # [*b, N, M, nh] -> [*b, nh, N, M]


@register_attention(
    "talking_heads", layout="tokens", description="talking-heads self-attention (CaiT)",
    paper="https://arxiv.org/abs/2003.02436", fused=False, normalized_weights=False,
    backends=("auto", "explicit"),
    backend_note="it mixes the heads before and after the softmax; SDPA and FlexAttention see one head at a time",
    formula=(
        "Self-attention whose heads talk before and after the softmax (Shazeer et al. 2020; CaiT, "
        "Touvron et al. 2021):\n\n"
        "    q, k, v = split_heads(x W_qkv)                 # each [B, nh, N, hd]\n"
        "    L = mix_l(q kᵀ · hd^-1/2)                      # [B, nh, N, N], Linear(nh, nh) over heads\n"
        "    A = mix_w(softmax(L))                          # [B, nh, N, N], rows no longer sum to 1\n"
        "    out = merge_heads(A v) W_proj                  # [B, N, C]\n\n"
        "The mixings need the weights, so the fused kernel does not apply (explicit path)."),
    cost="4·N·C² + 2·N²·C + 2·N²·nh² multiply-adds (quadratic in the tokens N)",
    example_shape=(2, 11, 32), global_kwargs=global_as_built)
class TalkingHeadsAttention(AttentionModule):
    """Talking-heads self-attention, ``[B, N, C] -> [B, N, C]``.

    ``qkv`` is one packed ``Linear(C, 3C)``; ``proj_l`` and ``proj_w`` are ``Linear(nh, nh)`` (with
    bias) over the heads axis of the logits and of the weights. Cost:
    ``4·N·C² + 2·N²·C + 2·N²·nh²`` multiply-adds.
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj_l = nn.Linear(num_heads, num_heads)
        self.proj_w = nn.Linear(num_heads, num_heads)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def _mix_logits(self, a: Tensor) -> Tensor:
        """``proj_l`` over the heads of the unscaled ``q kᵀ``; the ``hd^-1/2`` scale rides on its weight."""
        return mix_heads(a, self.proj_l, scale=self.scale, before_softmax=True)  # [B, nh, N, N]

    def _mix_weights(self, a: Tensor) -> Tensor:
        return mix_heads(a, self.proj_w)  # [B, nh, N, N]

    accepts = frozenset({"tome"})

    def transfer_init(self) -> list[str]:
        """The head mixings before and after the softmax as the identity: the attention of the carried projections."""
        with torch.no_grad():
            for layer in (self.proj_l, self.proj_w):
                layer.weight.copy_(torch.eye(self.num_heads))
                layer.bias.zero_()
        return ["proj_l, proj_w: identity (no mixing of the heads)"]

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, N, C] -> [B, N, C]``.

        ``call.feat_size`` is not needed and prefix tokens attend like every other token (talking heads is
        self-attention: no ``context``). ``call.tome``: token merging's state; ``log(size)`` is added to the
        mixed logits (proportional attention after the heads talk) and the keys averaged over heads become its
        merge metric.
        """
        check_tokens_call(self, x, call)
        q, k, v = split_qkv(apply_linear(self.qkv, x), self.num_heads)  # each [B, nh, N, hd]
        logits_fn = self._mix_logits
        size_bias = None if call.tome is None else call.tome.read_keys(k)  # [B, 1, 1, N] or None
        if size_bias is not None:
            def logits_fn(a: Tensor) -> Tensor:
                return self._mix_logits(a) + size_bias  # [B, nh, N, N]
        with merged_frame(call):  # observers place merged tokens' weights on the original ones
            x = self.attend(q, k, v, scale=1.0, logits_fn=logits_fn,  # scale: in _mix_logits
                            weights_fn=self._mix_weights, layout=observed_layout(x, call))  # [B, nh, N, hd]
        return self.project_out(merge_heads(x))  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds for one forward on ``input_shape = (B, N, C)``: ``4·N·C² + 2·N²·C + 2·N²·nh²``."""
        B, N, C = input_shape
        return B * (4 * N * C * C + 2 * N * N * C + 2 * N * N * self.num_heads ** 2)
