"""XCiT cross-covariance attention (El-Nouby et al., NeurIPS 2021) on tokens ``[B, N, C]``.

Attention over channels: inside each head the ``hd`` channels attend to each other, the dot products
taken over the ``N`` tokens, so the weights are ``[B, nh, hd, hd]`` and the cost is linear in ``N``.
Before the product the queries and keys are L2-normalised along the tokens (each channel's token
vector has unit length: the logits are cosine similarities) and the logits are scaled by a learned
per-head temperature ``τ_h`` (``temperature [nh, 1, 1]``, init 1):

    q, k, v = split(x W_qkv + b) -> [B, nh, hd, N]          (channels are the rows, tokens the feature axis)
    A = softmax(τ_h · q̂ k̂ᵀ)  [B, nh, hd, hd],   q̂ = q / max(‖q‖₂, 1e-12) along N, k̂ likewise
    out = merge_heads(A v) W_proj

How it differs from the library's ``channel`` attention (DaViT, :mod:`.channel`): the same transposed
operands and the same cost, but (1) the usual orientation (queries make the rows, values are mixed;
DaViT's original form mixes the queries by a keys x values matrix), (2) q and k normalised along the
tokens, (3) a learned temperature in place of a fixed ``hd^-1/2`` or ``N^-1/2``. Both call the one
attention core on ``[B, nh, hd, N]`` operands, here ``core(q̂ · τ, k̂, v, scale=1)``: the temperature
folded into the queries, which is how the core takes a tensor scale. The recorded maps share
``channel``'s layout (:func:`~vit_attention.attention.channel.channel_layout`).

Reference: timm 1.0.31 ``timm/models/xcit.py`` (``XCA``), equal to facebookresearch/xcit ``xcit.py``.
Key names: ``temperature``, ``qkv`` (one packed ``Linear(C, 3C)``), ``proj`` (timm's and the original's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import merge_heads, split_qkv
from ..functional.linear import apply_linear, hookless
from ..functional.observers import attention_observed
from .base import AttentionCall, AttentionModule, check_tokens_call
from .channel import channel_layout
from .registry import register_attention
from .transfer import PACKED_QKV_SLOTS

__all__ = ["CrossCovarianceAttention"]


@register_attention(
    "xca", layout="tokens", description="XCiT cross-covariance attention (channels attend, cosine logits, learned τ)",
    paper="https://arxiv.org/abs/2106.09681", example_shape=(2, 11, 32),
    formula=(
        "Cross-covariance attention (XCiT, El-Nouby et al. 2021): attention over the channels of each head, "
        "with dot products taken over all `N` tokens. Queries and keys are L2-normalised along the tokens "
        "and the logits scaled by a learned per-head temperature `τ_h`:\n\n"
        "    q, k, v = split_heads(x W_qkv)                 # each [B, nh, hd, N] (channels are the rows)\n"
        "    q̂, k̂ = q / ‖q‖₂, k / ‖k‖₂                     # norms along the N tokens\n"
        "    A = softmax(τ_h · q̂ k̂ᵀ)                        # [B, nh, hd, hd], |logits| ≤ τ_h\n"
        "    out = merge_heads(A v) W_proj                  # [B, N, C]\n\n"
        "Unlike DaViT's `channel` attention (keys x values mixing the queries, fixed scale, no "
        "normalisation) the logits are cosine similarities bounded by `τ_h`; one call of the attention core "
        "on the transposed operands, `core(q̂ · τ, k̂, v, scale=1)`.\n\n"
        "**What the map means.** There is no spatial map: the recorded weights are `[C/nh, C/nh]` per "
        "head. Row `i` of head `h` says which channels of that head channel `i`'s output is made of, the "
        "same mixture at every position of the image (XCiT's LPI convolutions carry the local "
        "interactions). `query_map` on such a record raises (no query position exists)."),
    cost="4·N·C² + 2·N·C·hd multiply-adds (linear in the tokens N; hd = C / nh)",
    doc_example=(dict(), (1, 196, 96)))
class CrossCovarianceAttention(AttentionModule):
    """Cross-covariance attention, ``[B, N, C] -> [B, N, C]``.

    Args:
        dim: channels ``C``; num_heads: heads ``nh`` (must divide ``dim``), each of ``hd = C/nh`` channels.
        qkv_bias: bias on the packed qkv projection (XCiT: True).
        attn_drop, proj_drop: dropout on the ``[hd, hd]`` weights and after ``proj``.

    Parameters: ``temperature [nh, 1, 1]`` (init 1), ``qkv``, ``proj``.
    Prefix tokens (and ``feat_size``) change nothing: every token is one coordinate of the channel
    vectors. Cost: ``4·N·C² + 2·N·C·hd`` multiply-adds (the normalisation and temperature are elementwise).
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    accepts = frozenset({"residual"})

    def __init__(self, dim: int, num_heads: int = 8, *, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def _qkv_channels_major(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x [B, N, C]`` -> q, k, v each ``[B, nh, hd, N]`` (channels the rows, tokens the feature axis)."""
        B, N, _ = x.shape
        if type(self.qkv) is nn.Linear and hookless(self.qkv):  # straight into [B, 3C, N]: no transpose copies
            w = self.qkv.weight.expand(B, -1, -1)  # [B, 3C, C]
            xt = x.transpose(1, 2)  # [B, C, N]
            qkv_t = torch.bmm(w, xt) if self.qkv.bias is None else torch.baddbmm(self.qkv.bias[:, None], w, xt)
            q, k, v = qkv_t.view(B, 3, self.num_heads, self.head_dim, N).unbind(1)
            return q, k, v
        q, k, v = (t.transpose(-2, -1) for t in split_qkv(apply_linear(self.qkv, x), self.num_heads))
        return q, k, v

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, N, C] -> [B, N, C]``.

        ``call.feat_size`` and ``num_prefix_tokens`` change nothing (channels attend over all tokens; no
        ``context``). ``call.residual [B, N, C]``, when given, is added to the output (fused into ``proj`` at
        inference).
        """
        check_tokens_call(self, x, call)
        q, k, v = self._qkv_channels_major(x)  # each [B, nh, hd, N]
        q = F.normalize(q, dim=-1) * self.temperature.to(q.dtype)  # unit token vectors, then τ_h: core scale 1
        k = F.normalize(k, dim=-1)
        layout = channel_layout(self.head_dim) if attention_observed() else None
        out = self.attend(q, k, v, scale=1.0, layout=layout)  # [B, nh, hd, N]
        return self.project_out(merge_heads(out.transpose(-2, -1)), call.residual)  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``input_shape = (B, N, C)``: ``4·N·C² + 2·N·C·hd`` (qkv, proj, two ``hd x hd`` products)."""
        B, N, C = input_shape
        return B * (4 * N * C * C + 2 * N * C * self.head_dim)

    def transfer_init(self) -> list[str]:
        """Temperature 1 in every head (its initial value): the logits are the plain cosine similarities."""
        with torch.no_grad():
            self.temperature.fill_(1.0)
        return ["temperature: 1 (plain cosine logits)"]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}"
