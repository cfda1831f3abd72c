"""LayerScale (Touvron et al., CaiT 2021): a learnable per-channel residual-branch scale."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["LayerScale"]


class LayerScale(nn.Module):
    """``x * gamma`` with ``gamma [C]`` initialised to ``init_values``; ``[..., C] -> [..., C]``."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """``[..., C] -> [..., C]``."""
        return x * self.gamma
