"""DaViT channel group attention (Ding et al. 2022) on tokens ``[B, N, C]``.

Attention with the roles of tokens and channels exchanged: the ``C`` channels are cut into
``nh`` groups (the heads) of ``hd = C / nh`` channels, and inside each group every channel
attends to every channel, with the dot products taken over the ``N`` tokens. The weights are
``[B, nh, hd, hd]``: row ``i`` says how much channel ``i``'s output mixes in each channel of the
group. The cost is linear in ``N`` (``2·N·C·hd`` for the two products), so DaViT pairs it with
window attention to get a global receptive field at linear cost.

Two published forms, both ONE call of the library's attention function on transposed q, k, v
(``[B, nh, hd, N]``: channels are the rows, tokens the feature axis):

* ``form="davit"`` (the original repository and timm ``ChannelAttention``):
  ``A = softmax((k·hd^-1/2)ᵀ v)`` and ``out = (A qᵀ)ᵀ``: keys make the matrix, queries are the
  values, i.e. ``SDPA(query=kᵀ, key=vᵀ, value=qᵀ, scale=hd^-1/2)ᵀ``;
* ``form="florence2"`` (Florence-2, timm ``ChannelAttentionV2``, HF ``Florence2VisionChannelAttention``):
  the usual orientation ``softmax((q·s)ᵀ k) vᵀ`` with ``s = N^-1/2`` (``dynamic_scale``, the
  default) or ``hd^-1/2``.

Key names: ``qkv`` (one packed ``Linear(C, 3C)``), ``proj`` (timm's).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_qkv
from ..functional.layout import AttentionLayout
from ..functional.linear import apply_linear, hookless
from ..functional.observers import attention_observed
from ..functional.window import _CPU, _cached
from .base import AttentionCall, AttentionModule, check_tokens_call
from .registry import register_attention
from .transfer import PACKED_QKV_SLOTS

__all__ = ["ChannelAttention", "channel_layout", "CHANNEL_FORMS"]

ChannelForm = Literal["davit", "florence2"]
CHANNEL_FORMS: tuple[str, ...] = ("davit", "florence2")


@_cached(maxsize=32)
def _channel_layout(hd: int) -> AttentionLayout:
    pos = torch.arange(hd, device=_CPU)
    return AttentionLayout(None, pos, pos, axis="channels")


def channel_layout(head_dim: int) -> AttentionLayout:
    """Layout of channel attention inside groups of ``head_dim`` channels: rows are channels
    ``0 .. hd-1`` of each group (``axis="channels"``: no place on the image grid). Cached."""
    return _channel_layout(int(head_dim))


@register_attention(
    "channel", layout="tokens", description="DaViT channel group attention (channels attend to channels)",
    paper="https://arxiv.org/abs/2204.03645", example_shape=(2, 11, 32),
    formula=(
        "Channel group attention (DaViT, Ding et al. 2022): the roles of tokens and channels are exchanged. "
        "The `C` channels form `nh` groups of `hd` channels; inside a group each channel attends to every "
        "channel, with dot products taken over all `N` tokens:\n\n"
        "    q, k, v = split_heads(x W_qkv)                 # each [B, nh, N, hd]\n"
        "    A = softmax((k · hd^-1/2)ᵀ v)                  # [B, nh, hd, hd]   (form='davit')\n"
        "    out = merge_heads((A qᵀ)ᵀ) W_proj              # [B, N, C]\n\n"
        "Florence-2's form (`form='florence2'`, the `davit_*_fl` models) is the usual orientation with "
        "the scale `N^-1/2`: `A = softmax((q · N^-1/2)ᵀ k)`, `out = (A vᵀ)ᵀ`. Both are one call of the "
        "attention core on transposed `[B, nh, hd, N]` operands.\n\n"
        "**What the map means.** There is no spatial map: the recorded weights are `[C/nh, C/nh]` per "
        "group (head). Row `i` of group `g` says which channels of that group channel `i`'s output is "
        "made of, the same mixture at every position of the image. Each channel already summarises the "
        "whole image (its dot products run over all tokens), which is how DaViT gets a global receptive "
        "field at a cost linear in `N`. `query_map` on such a record raises (no query position exists)."),
    cost="4·N·C² + 2·N·C·hd multiply-adds (linear in the tokens N; hd = C / nh)",
    doc_example=(dict(), (1, 196, 96)))
class ChannelAttention(AttentionModule):
    """Channel group attention, ``[B, N, C] -> [B, N, C]``.

    Args:
        dim: channels ``C``; num_heads: groups ``nh`` (must divide ``dim``), each of ``hd = C/nh`` channels.
        form: ``"davit"`` (original: keys x values make the ``hd x hd`` matrix, queries are mixed,
            scale ``hd^-1/2``) or ``"florence2"`` (``softmax((q·s)ᵀ k) vᵀ``).
        dynamic_scale: ``form="florence2"`` only: ``s = N^-1/2`` (default, Florence-2) or ``hd^-1/2``.
        qkv_bias: bias on the packed qkv projection. qk_scale: override the logit scale (a float).
        attn_drop, proj_drop: dropout on the ``[hd, hd]`` weights and after ``proj``.

    Prefix tokens (and ``feat_size``) change nothing: every token is one coordinate of the channel
    vectors. Cost: ``4·N·C² + 2·N·C·hd`` multiply-adds.
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    accepts = frozenset({"residual"})

    def __init__(self, dim: int, num_heads: int = 8, *, form: ChannelForm = "davit", dynamic_scale: bool = True,
                 qkv_bias: bool = True, qk_scale: float | None = None, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        if form not in CHANNEL_FORMS:
            raise ValueError(f"form must be one of {', '.join(map(repr, CHANNEL_FORMS))}; got {form!r}")
        if qk_scale is not None and not isinstance(qk_scale, (int, float)):
            raise ValueError(f"qk_scale must be a float or None, got {qk_scale!r}")
        self.form = form
        self.dynamic_scale = bool(dynamic_scale)
        self.qk_scale = qk_scale
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def scale_for(self, num_tokens: int) -> float:
        """The logit scale for ``N = num_tokens``: ``hd^-1/2``, or ``N^-1/2`` (Florence-2, dynamic)."""
        if self.qk_scale is not None:
            return float(self.qk_scale)
        if self.form == "florence2" and self.dynamic_scale:
            return float(num_tokens) ** -0.5
        return self.head_dim ** -0.5

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, N, C] -> [B, N, C]``.

        ``call.feat_size`` and ``num_prefix_tokens`` change nothing (channels attend over all tokens; no
        ``context``). ``call.residual [B, N, C]``, when given, is added to the output (fused into ``proj`` at
        inference).
        """
        B, N, C = check_tokens_call(self, x, call)
        residual = call.residual
        plain = type(self.qkv) is nn.Linear and type(self.proj) is nn.Linear and hookless(self.qkv, self.proj)
        if plain:  # project straight into the channels-major layout: contiguous [B, 3C, N], no transpose copies
            w = self.qkv.weight.expand(B, -1, -1)  # [B, 3C, C]
            xt = x.transpose(1, 2)  # [B, C, N]
            qkv_t = torch.bmm(w, xt) if self.qkv.bias is None else torch.baddbmm(self.qkv.bias[:, None], w, xt)
            q, k, v = qkv_t.view(B, 3, self.num_heads, self.head_dim, N).unbind(1)  # each [B, nh, hd, N]
        else:  # a wrapped / hooked projection runs as a module
            q, k, v = (t.transpose(-2, -1) for t in split_qkv(apply_linear(self.qkv, x), self.num_heads))
        if self.form == "davit":  # keys x values make the matrix, the queries are what is mixed
            q, k, v = k, v, q
        layout = channel_layout(self.head_dim) if attention_observed() else None
        out = self.attend(q, k, v, scale=self.scale_for(N), layout=layout)  # [B, nh, hd, N]
        if plain and not (self.training and self.proj_drop.p > 0):
            return self._project_channels_major(out.reshape(B, C, N), residual)  # [B, N, C]
        return self.project_out(merge_heads(out.transpose(-2, -1)), residual)  # [B, N, C]

    def _project_channels_major(self, out: Tensor, residual: Tensor | None) -> Tensor:
        """``proj`` of the attention output held channels-major ``[B, C, N]``: ``[B, N, C]`` (+ residual).

        One batched GEMM reads the transposed operand in place (no transpose copy); the residual,
        when given, is its accumulator.
        """
        B = out.shape[0]
        ot, w, b = out.transpose(1, 2), self.proj.weight.t().expand(B, -1, -1), self.proj.bias  # [B, N, C], [B, C, C]
        if residual is not None:
            y = torch.baddbmm(residual, ot, w)  # [B, N, C]
            return y if b is None else y + b
        return torch.bmm(ot, w) if b is None else torch.baddbmm(b, ot, w)  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``input_shape = (B, N, C)``: ``4·N·C² + 2·N·C·hd`` (qkv, proj, two ``hd x hd`` products)."""
        B, N, C = input_shape
        return B * (4 * N * C * C + 2 * N * C * self.head_dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, form={self.form!r}, dynamic_scale={self.dynamic_scale}"
