"""Multi-head attention with separate query / key / value widths (cross-attention).

A batch-first counterpart of ``torch.nn.MultiheadAttention`` that computes through the
library's single attention function. It loads an ``nn.MultiheadAttention`` state dict (packed
``in_proj_weight`` or separate ``q/k/v_proj_weight``) and reproduces its outputs; masks follow
``nn.MultiheadAttention``'s conventions so it is a drop-in replacement.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..functional import merge_heads, scaled_dot_product_attention, split_heads
from ._common import check_heads, check_prob
from .registry import register_attention

__all__ = ["MultiHeadAttention"]


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Bool mask (True = may attend) -> additive float mask; float masks pass through."""
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


@register_attention("mha", layout="tokens", description="multi-head attention with kdim/vdim (cross-attention)",
                    paper="https://arxiv.org/abs/1706.03762")
class MultiHeadAttention(nn.Module):
    """Multi-head attention, query ``[B, N, E]``, key ``[B, M, kdim]``, value ``[B, M, vdim]`` -> ``[B, N, E]``.

    Called with one tensor it is self-attention (``[B, N, E] -> [B, N, E]``), which is how the
    registry's plug-and-play contract uses it. Masks use ``nn.MultiheadAttention`` conventions:
    ``key_padding_mask [B, M]`` bool with True = ignore this key (or additive float);
    ``attn_mask [N, M]`` or ``[B*nh, N, M]``, bool True = not allowed (or additive float).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int = 8,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        qkv_bias: bool | None = None,
        attn_drop: float | None = None,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.head_dim = check_heads(embed_dim, num_heads, "embed_dim")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        in_bias = bias if qkv_bias is None else qkv_bias
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=in_bias)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=in_bias)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=in_bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.dropout = check_prob(dropout if attn_drop is None else attn_drop, "dropout")
        self.proj_drop = nn.Dropout(check_prob(proj_drop, "proj_drop"))

    def _build_mask(self, B: int, N: int, M: int, key_padding_mask: Tensor | None,
                    attn_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
        """Combine both masks into one additive/bool mask ``[B, nh | 1, N, M]`` (True = may attend)."""
        mask: Tensor | None = None
        if attn_mask is not None:
            if attn_mask.dim() == 2:
                if attn_mask.shape != (N, M):
                    raise ValueError(f"attn_mask must be [N, M] = [{N}, {M}], got {tuple(attn_mask.shape)}")
                attn_mask = attn_mask.view(1, 1, N, M)
            elif attn_mask.dim() == 3:
                if attn_mask.shape != (B * self.num_heads, N, M):
                    raise ValueError(f"attn_mask must be [B*nh, N, M] = [{B * self.num_heads}, {N}, {M}], "
                                     f"got {tuple(attn_mask.shape)}")
                attn_mask = attn_mask.view(B, self.num_heads, N, M)
            else:
                raise ValueError(f"attn_mask must be 2-D or 3-D, got {attn_mask.dim()}-D")
            mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(dtype)
        if key_padding_mask is not None:
            if key_padding_mask.shape != (B, M):
                raise ValueError(f"key_padding_mask must be [B, M] = [{B}, {M}], got {tuple(key_padding_mask.shape)}")
            kpm = key_padding_mask.view(B, 1, 1, M)
            kpm = ~kpm if kpm.dtype == torch.bool else kpm.to(dtype)
            if mask is None:
                mask = kpm
            elif mask.dtype == torch.bool and kpm.dtype == torch.bool:
                mask = mask & kpm
            else:
                mask = _additive(mask, dtype) + _additive(kpm, dtype)
        return mask

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        average_attn_weights: bool = True,
    ) -> Any:
        """Attend ``query [B, N, E]`` to ``key [B, M, kdim]`` / ``value [B, M, vdim]``.

        Returns ``[B, N, E]`` when called as self-attention with only ``query`` and no
        ``need_weights``; otherwise ``(out [B, N, E], weights)`` like ``nn.MultiheadAttention``
        (weights ``[B, N, M]`` averaged over heads, ``[B, nh, N, M]`` if not averaged, or None).
        """
        self_attention_call = key is None and value is None and not need_weights
        key = query if key is None else key
        value = key if value is None else value
        if query.dim() != 3 or query.shape[-1] != self.embed_dim:
            raise ValueError(f"query must be [B, N, {self.embed_dim}], got {tuple(query.shape)}")
        if key.dim() != 3 or key.shape[-1] != self.kdim:
            raise ValueError(f"key must be [B, M, kdim={self.kdim}], got {tuple(key.shape)}")
        if value.dim() != 3 or value.shape[-1] != self.vdim or value.shape[:2] != key.shape[:2]:
            raise ValueError(f"value must be [B, M, vdim={self.vdim}] with key's B, M; got {tuple(value.shape)}")
        B, N, _ = query.shape
        M = key.shape[1]
        q = split_heads(self.q_proj(query), self.num_heads)  # [B, nh, N, hd]
        k = split_heads(self.k_proj(key), self.num_heads)  # [B, nh, M, hd]
        v = split_heads(self.v_proj(value), self.num_heads)  # [B, nh, M, hd]
        mask = self._build_mask(B, N, M, key_padding_mask, attn_mask, q.dtype)
        drop = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=drop, return_weights=True)
        else:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=drop), None
        out = self.proj_drop(self.out_proj(merge_heads(out)))  # [B, N, E]
        if self_attention_call:
            return out
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # [B, N, M]
        return out, weights

    def _load_from_state_dict(self, state_dict: dict[str, Tensor], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Accept ``nn.MultiheadAttention`` keys: packed ``in_proj_*`` or ``{q,k,v}_proj_weight``."""
        E = self.embed_dim
        packed_w = state_dict.pop(prefix + "in_proj_weight", None)
        if packed_w is not None:
            for i, name in enumerate("qkv"):
                state_dict[f"{prefix}{name}_proj.weight"] = packed_w[i * E:(i + 1) * E]
        for name in "qkv":
            sep = state_dict.pop(f"{prefix}{name}_proj_weight", None)
            if sep is not None:
                state_dict[f"{prefix}{name}_proj.weight"] = sep
        packed_b = state_dict.pop(prefix + "in_proj_bias", None)
        if packed_b is not None:
            for i, name in enumerate("qkv"):
                state_dict[f"{prefix}{name}_proj.bias"] = packed_b[i * E:(i + 1) * E]
        for unsupported in ("bias_k", "bias_v"):
            if prefix + unsupported in state_dict:
                raise ValueError(f"{prefix}{unsupported}: add_bias_kv checkpoints are not supported")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def flops(self, input_shape: tuple[int, ...]) -> int:
        """Multiply-adds for self-attention on ``input_shape = (B, N, E)``."""
        B, N, C = input_shape
        return B * (4 * N * C * C + 2 * N * N * C)
