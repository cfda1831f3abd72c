"""Position embeddings as modules, for users building their own token models.

The backbones keep their table as a plain ``pos_embed`` parameter (the timm key layout) and
call the same functions from ``vit_attention.functional``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional import resample_abs_pos_embed, sincos_2d_pos_embed

__all__ = ["LearnedPosEmbed", "SinCosPosEmbed2d", "resample_abs_pos_embed", "sincos_2d_pos_embed"]


class LearnedPosEmbed(nn.Module):
    """Learnable 1-D table added to tokens, ``[B, P + H·W, C] -> [B, P + H·W, C]``.

    Built for ``grid_size``; other grids are served by bicubic resampling of the table.
    """

    def __init__(self, dim: int, grid_size: tuple[int, int], num_prefix_tokens: int = 0, std: float = 0.02) -> None:
        super().__init__()
        self.grid_size, self.num_prefix_tokens = tuple(grid_size), num_prefix_tokens
        self.weight = nn.Parameter(torch.randn(1, num_prefix_tokens + grid_size[0] * grid_size[1], dim) * std)

    def forward(self, x: Tensor, feat_size: tuple[int, int] | None = None) -> Tensor:
        """Add the (resampled if ``feat_size`` differs) table to ``x [B, P + H·W, C]``."""
        pos = self.weight
        if feat_size is not None and tuple(feat_size) != self.grid_size:
            pos = resample_abs_pos_embed(pos, tuple(feat_size), self.grid_size,
                                         num_prefix_tokens=self.num_prefix_tokens)
        return x + pos


class SinCosPosEmbed2d(nn.Module):
    """Fixed 2-D sin-cos embedding added to grid tokens, ``[B, H·W, C] -> [B, H·W, C]``."""

    def __init__(self, dim: int, temperature: float = 10000.0) -> None:
        super().__init__()
        self.dim, self.temperature = dim, temperature

    def forward(self, x: Tensor, feat_size: tuple[int, int]) -> Tensor:
        """``x [B, H·W, C]`` with ``feat_size=(H, W)`` -> ``[B, H·W, C]``."""
        return x + sincos_2d_pos_embed(self.dim, feat_size, temperature=self.temperature,
                                       dtype=x.dtype, device=x.device)
