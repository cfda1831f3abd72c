"""Classifier heads: average pooling + linear over a map, and multi-head attention pooling (MAP)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from .mlp import Mlp

__all__ = ["ClassifierHead", "AttentionPoolHead"]


class ClassifierHead(nn.Module):
    """Global average pool over ``H, W`` + dropout + ``fc``: ``[B, H, W, C] -> [B, num_classes]``.

    ``global_pool=""`` keeps the input unpooled. Keys: ``fc`` (timm layout).
    """

    def __init__(self, in_features: int, num_classes: int, *, global_pool: str = "avg", drop: float = 0.0) -> None:
        super().__init__()
        self.global_pool = global_pool
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(in_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """``[B, H, W, C]`` -> ``[B, num_classes]`` (or pooled ``[B, C]`` with ``pre_logits``)."""
        if self.global_pool == "avg":
            x = x.mean(dim=(1, 2))  # [B, C]
        x = self.drop(x)
        return x if pre_logits else self.fc(x)


class AttentionPoolHead(nn.Module):
    """Multi-head attention pooling (MAP, Zhai et al. 2022): a learned query attends to the tokens.

    ``[B, N, C] -> [B, C]``: ``latent`` query -> :class:`MultiHeadAttention` -> ``+ mlp(norm(.))``.
    Keys: ``latent``, ``attn.*``, ``norm``, ``mlp.*``.
    """

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, *,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 act_layer: Callable[[], nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.attn = MultiHeadAttention(dim, num_heads)
        self.norm = norm_layer(dim)
        self.mlp = Mlp(dim, mlp_dim, act_layer=act_layer)
        nn.init.trunc_normal_(self.latent, std=dim ** -0.5)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, N, C] -> [B, C]``."""
        q = self.latent.expand(x.shape[0], -1, -1)  # [B, 1, C]
        x, _ = self.attn(q, x, x)  # [B, 1, C]
        x = x + self.mlp(self.norm(x))
        return x[:, 0]  # [B, C]
