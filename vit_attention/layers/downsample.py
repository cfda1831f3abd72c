"""Downsampling between hierarchical stages: Swin's patch merging.

``[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), C']``, channels-last like the stages around it.
"""

from __future__ import annotations

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..functional.linear import apply_linear

__all__ = ["PatchMerging"]


class PatchMerging(nn.Module):
    """2x2 neighbourhood concat + linear reduction, ``[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), 2C]``.

    Concat order ``[x(0,0), x(1,0), x(0,1), x(1,1)]`` (row offset first; timm = torchvision =
    original). Odd sizes are zero-padded bottom/right. v1: ``norm(4C)`` then ``reduction``;
    ``norm_after=True`` (SwinV2): ``reduction`` then ``norm(2C)``. Keys: ``reduction``, ``norm``.
    """

    def __init__(self, dim: int, out_dim: int | None = None, *, norm_after: bool = False, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim, self.out_dim = dim, out_dim or 2 * dim
        self.norm_after = norm_after
        self.reduction = nn.Linear(4 * dim, self.out_dim, bias=False)
        self.norm = nn.LayerNorm(self.out_dim if norm_after else 4 * dim, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), out_dim]``."""
        H, W = x.shape[1:3]
        if H % 2 or W % 2:
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))  # [B, H + H%2, W + W%2, C]
        # the column offset j varies slowest, then the row offset i, then channels
        x = rearrange(x, "b (h i) (w j) c -> b h w (j i c)", i=2, j=2)  # [B, H/2, W/2, 4C]
        if self.norm_after:
            return self.norm(apply_linear(self.reduction, x))
        return apply_linear(self.reduction, self.norm(x))  # [B, H/2, W/2, 2C]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, out_dim={self.out_dim}, norm_after={self.norm_after}"
