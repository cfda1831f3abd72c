"""ViT multi-head self-attention (Dosovitskiy et al., 2021) on tokens ``[B, N, C]``."""

from __future__ import annotations

from torch import Tensor, nn

from ..functional import merge_heads, scaled_dot_product_attention, split_qkv
from ..functional.linear import apply_linear
from ._common import check_heads, check_prob
from .registry import register_attention

__all__ = ["MultiHeadSelfAttention"]


@register_attention("mhsa", layout="tokens", description="global multi-head self-attention (ViT)",
                    paper="https://arxiv.org/abs/2010.11929")
class MultiHeadSelfAttention(nn.Module):
    """Global self-attention, ``[B, N, C] -> [B, N, C]``.

    ``qkv`` is one packed ``Linear(C, 3C)`` (timm layout); ``qk_norm`` applies a LayerNorm over
    each head's ``hd`` channels of q and k (ViT-22B). Cost: ``4·N·C² + 2·N²·C`` multiply-adds.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        qk_norm: bool = False,
        proj_bias: bool = True,
        norm_eps: float = 1e-6,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.head_dim = check_heads(dim, num_heads)
        self.dim, self.num_heads = dim, num_heads
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.attn_drop = check_prob(attn_drop, "attn_drop")
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(check_prob(proj_drop, "proj_drop"))

    accepts_residual = True  # forward(x, residual=r) returns r + attn(x) (blocks fuse the add into proj)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, residual: Tensor | None = None) -> Tensor:
        """``x [B, N, C]`` (optional ``mask`` broadcastable to ``[B, nh, N, N]``) -> ``[B, N, C]``.

        ``residual [B, N, C]``, when given, is added to the output (fused into ``proj`` at inference).
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected tokens [B, N, {self.dim}], got {tuple(x.shape)}")
        q, k, v = split_qkv(apply_linear(self.qkv, x), self.num_heads)  # each [B, nh, N, hd]
        q, k = self.q_norm(q), self.k_norm(k)
        x = scaled_dot_product_attention(q, k, v, mask=mask, scale=self.scale,
                                         dropout_p=self.attn_drop if self.training else 0.0)  # [B, nh, N, hd]
        x = merge_heads(x)  # [B, N, C]
        if not self.training:  # proj_drop is the identity
            return apply_linear(self.proj, x, residual=residual)  # [B, N, C]
        x = self.proj_drop(apply_linear(self.proj, x))  # [B, N, C]
        return x if residual is None else residual + x

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Multiply-adds for one forward on ``input_shape = (B, N, C)``.

        ``4·N·C² + 2·N²·C``, plus the QK-norm LayerNorms when on (fvcore's 5 per element, as
        ``vit_attention.analysis.flops`` counts every norm).
        """
        B, N, C = input_shape
        qk_norm = 2 * 5 * N * C if isinstance(self.q_norm, nn.LayerNorm) else 0
        return B * (4 * N * C * C + 2 * N * N * C + qk_norm)
