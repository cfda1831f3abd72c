"""GroupNorm with one group on channels-last maps (MobileViT v2's "LayerNorm2d" / timm's ``GroupNorm1``)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GroupNorm1"]


class GroupNorm1(nn.GroupNorm):
    """``GroupNorm(1, C)`` on a channels-last map, ``[B, H, W, C] -> [B, H, W, C]``.

    Mean and variance over all of ``H, W, C`` of each sample (not per token, unlike LayerNorm),
    then a per-channel affine transform. Keys ``weight`` / ``bias`` (timm's ``GroupNorm1``).
    """

    def __init__(self, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__(1, num_channels, eps=eps, affine=affine)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``."""
        if x.dim() != 4 or x.shape[-1] != self.num_channels:
            raise ValueError(f"GroupNorm1 expects a channels-last map [B, H, W, {self.num_channels}], "
                             f"got {tuple(x.shape)}")
        out = F.group_norm(x.permute(0, 3, 1, 2), 1, self.weight, self.bias, self.eps)  # [B, C, H, W] view
        return out.permute(0, 2, 3, 1)  # [B, H, W, C]
