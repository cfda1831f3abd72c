"""MobileViT v2 separable self-attention (Mehta & Rastegari 2022b), linear in the tokens, on maps ``[B, H, W, C]``.

One projection gives, per pixel, a context score ``s`` (one per head), a key ``k`` and a value
``v``. The scores are softmaxed over the tokens of a group, the keys summed with those weights
into ONE context vector per group, and every pixel's ``ReLU(v)`` is gated by it:

    c_g = Σ_{j ∈ g} softmax_{j ∈ g}(s_j) · k_j       # [B, groups, C]: no N x N anywhere
    out_i = W_out (ReLU(v_i) ⊙ c_{g(i)})

The context is ONE call of the library's attention core: an all-ones query (``hd = 1``) against
the scores as ``hd = 1`` keys, with the keys as values and ``scale = 1``, so
``softmax(1 · sᵀ) k`` is exactly ``c``. Groups are MobileViT v2's unfolded patches: the pixels at
the same offset inside ``p x p`` patches (``patch_size = 1``: one group, the whole map). A map
that is not a patch multiple is zero-padded with the padded slots masked out of the softmax
(MobileViT v2 models resize before their local convolution instead, as timm does, so inside the
models this never happens).
"""

from __future__ import annotations

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..functional import scaled_dot_product_attention
from ..functional.linear import apply_linear
from ..functional.observers import attention_observed
from ..functional.unfold import patch_grid, patch_key_mask, separable_layout
from .base import AttentionCall, AttentionModule, check_spatial_call
from .registry import register_attention
from .unfold import check_patch_size

__all__ = ["SeparableAttention"]


@register_attention(
    "separable", layout="spatial", description="MobileViT v2 separable self-attention (linear in the tokens)",
    example_kwargs=dict(patch_size=2), paper="https://arxiv.org/abs/2206.02680",
    formula=(
        "Separable self-attention (MobileViT v2, Mehta & Rastegari 2022). One projection gives per pixel a "
        "context score `s` (one per head), a key `k` and a value `v`. Within each group of tokens (the pixels at "
        "the same offset of `p x p` patches; `p = 1`: the whole map) the scores are softmaxed over the tokens and "
        "pool the keys into one context vector, which gates every pixel's ReLU(value):\n\n"
        "    s, k, v = x W_qkv                              # [B, H, W, nh], [B, H, W, C] x 2\n"
        "    c = softmax(1 · sᵀ) k                          # [B, P·nh, 1, hd]: ONE all-ones query per group\n"
        "    out = (ReLU(v) ⊙ c[group]) W_out               # [B, H, W, C]\n\n"
        "The context is one call of the attention core with an all-ones query and `hd = 1` keys, so no "
        "`N x N` matrix exists: cost and memory grow linearly with the tokens."),
    cost="HW·C·(2C + nh) + HW·C² + HW·(C + nh) multiply-adds (linear in the tokens HW)",
    doc_example=(dict(patch_size=2), (1, 16, 16, 96)))
class SeparableAttention(AttentionModule):
    """Separable self-attention, ``[B, H, W, C] -> [B, H, W, C]``, cost linear in ``H·W``.

    Keys: ``qkv_proj`` (``Linear(C, nh + 2C)``, rows ``[scores | keys | values]``) and ``out_proj``
    (timm's ``LinearSelfAttention`` as 1x1 convolutions; the converters squeeze them). MobileViT v2
    is ``num_heads=1, patch_size=2``; more heads give one context score and one context vector
    per head (``hd = C / nh`` channels each).

    Args:
        dim: channels ``C``; num_heads: context heads ``nh`` (must divide ``dim``).
        patch_size: ``p``: tokens at the same offset of ``p x p`` patches share a context (1: one context).
        qkv_bias: bias of both projections (timm's ``bias``). attn_drop: dropout on the context scores;
            proj_drop: after ``out_proj``.
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = {"o": "out_proj"}

    accepts = frozenset({"residual"})

    def __init__(self, dim: int, num_heads: int = 1, *, patch_size: int = 1, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.patch_size = check_patch_size(patch_size)
        self.qkv_proj = nn.Linear(dim, num_heads + 2 * dim, bias=qkv_bias)
        self.out_proj = nn.Linear(dim, dim, bias=qkv_bias)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``; any ``H, W`` (padded to the patch with the padding masked).

        The call: ``feat_size`` is the map's own ``(H, W)`` when given; no prefix tokens, no context.
        ``residual [B, H, W, C]`` is added to the output (fused into ``out_proj`` at inference).
        """
        B, H, W, C = check_spatial_call(self, x, call)
        p, nh = self.patch_size, self.num_heads
        gh, gw = patch_grid(H, W, p)
        Hp, Wp = gh * p, gw * p
        qkv = apply_linear(self.qkv_proj, x)  # [B, H, W, nh + 2C]
        mask = None
        if (Hp, Wp) != (H, W):  # padded slots: zero projections, masked out of the softmax
            qkv = F.pad(qkv, (0, 0, 0, Wp - W, 0, Hp - H))  # [B, Hp, Wp, nh + 2C]
            mask = patch_key_mask(H, W, p, nh, device=x.device)  # [1, P·nh, 1, N]
        scores, keys, values = qkv.split([nh, C, C], dim=-1)
        s = rearrange(scores, "b (gh ph) (gw pw) h -> b (ph pw h) (gh gw) 1", ph=p, pw=p)  # [B, P·nh, N, 1]
        k = rearrange(keys, "b (gh ph) (gw pw) (h d) -> b (ph pw h) (gh gw) d", ph=p, pw=p, h=nh)  # [B, P·nh, N, hd]
        ones = s.new_ones(1, 1, 1, 1).expand(B, p * p * nh, 1, 1)  # [B, P·nh, 1, 1]: the all-ones query
        ctx = self.attend(ones, s, k, mask=mask, scale=1.0,
                          layout=(lambda: separable_layout(H, W, p)) if attention_observed() else None
                          )  # [B, P·nh, 1, hd]
        ctx = ctx.reshape(B, 1, p, 1, p, C)  # [B, 1, p, 1, p, C]: one context per offset, broadcast over patches
        out = (F.relu(values).reshape(B, gh, p, gw, p, C) * ctx).reshape(B, Hp, Wp, C)  # [B, Hp, Wp, C]
        if (Hp, Wp) != (H, W):
            out = out[:, :H, :W]  # [B, H, W, C]
        return self.project_out(out, call.residual, proj=self.out_proj)  # [B, H, W, C]

    def attend_prefix(self, prefix: Tensor, tokens: Tensor) -> Tensor:
        """Prefix tokens ``[B, P, C]`` read one context vector of all ``tokens [B, P + H·W, C]``: ``[B, P, C]``.

        The adapter's rule for class / register tokens in front of the grid: the separable attention of
        the whole sequence (per head, the softmax of the scores over every token weighs the keys), gating
        the prefix tokens' ReLU values, through the same ``qkv_proj`` / ``out_proj``.
        """
        B, N, C = tokens.shape
        P, nh = prefix.shape[1], self.num_heads
        scores, keys, values = apply_linear(self.qkv_proj, tokens).split([nh, C, C], dim=-1)
        s = scores.transpose(1, 2).unsqueeze(-1)  # [B, nh, N, 1]
        k = keys.reshape(B, N, nh, C // nh).transpose(1, 2)  # [B, nh, N, hd]
        ones = s.new_ones(1, 1, 1, 1).expand(B, nh, 1, 1)  # the all-ones query: softmax over the scores
        backend = "sdpa" if self.attention_backend == "flex" else self.attention_backend  # no sparsity to use
        ctx = scaled_dot_product_attention(ones, s, k, scale=1.0, dropout_p=self.attn_drop if self.training else 0.0,
                                           fused=self.fused_attention, backend=backend)
        ctx = ctx.reshape(B, 1, C)  # [B, 1, C]: one context vector of the whole sequence
        return self.project_out(F.relu(values[:, :P]) * ctx, proj=self.out_proj)  # [B, P, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``input_shape = (B, H, W, C)``: ``hw·C·(2C + nh) + hw·C² + hw_p·(nh + C)``.

        The two projections on the ``hw = H·W`` pixels, and the core's two products on the map
        padded to a patch multiple (``hw_p``): scores against the all-ones query (``nh`` per pixel)
        and the weighted sum of the keys (``C`` per pixel). The gating product is elementwise.
        """
        B, H, W, C = input_shape
        gh, gw = patch_grid(H, W, self.patch_size)
        hw, hwp = H * W, gh * gw * self.patch_size ** 2
        return B * (hw * C * (2 * C + self.num_heads) + hw * C * C + hwp * (self.num_heads + C))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, patch_size={self.patch_size}"
