"""Normalisation over the channels of ``NCHW`` maps (detection necks: ViTDet's simple feature pyramid)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LayerNorm2d"]


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a map, ``[B, C, H, W] -> [B, C, H, W]``.

    The same statistics as detectron2's / ConvNeXt's channels-first ``LayerNorm`` (mean and biased
    variance over ``C`` at each position, then ``weight[c]·x + bias[c]``); keys ``weight``, ``bias``.
    """

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__(num_channels, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, C, H, W]``."""
        if x.dim() != 4 or x.shape[1] != self.normalized_shape[0]:
            raise ValueError(f"LayerNorm2d expects a map [B, {self.normalized_shape[0]}, H, W], got {tuple(x.shape)}")
        x = x.permute(0, 2, 3, 1)  # [B, H, W, C]
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)  # [B, C, H, W]
