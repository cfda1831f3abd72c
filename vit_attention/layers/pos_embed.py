"""Position layers that live inside blocks: the conditional position encoding generator (PEG / CPE).

Absolute tables (ViT's ``pos_embed``, Swin's ``absolute_pos_embed``) stay plain parameters of
their models (the timm key layout) and use ``vit_attention.functional``'s
``resample_abs_pos_embed`` / ``sincos_2d_pos_embed``; there is no module copy of them here.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

__all__ = ["PosConv"]


class PosConv(nn.Module):
    """PEG (Chu et al. 2021, CPVT): ``x + DWConv_{k x k}(x)`` on the grid; prefix tokens pass unchanged.

    ``[B, P + H·W, C]`` (with ``feat_size=(H, W)``) or ``[B, H, W, C]`` -> same shape. A block's
    ``pos_layer``: ``Block(..., pos_layer=PosConv)``. Keys: ``proj.{weight,bias}``.

    The conv is depthwise, stride 1, zero padding ``k // 2``, with bias, as timm's Twins ``PosConv``
    and the original ``PosCNN`` (tests/layers/test_peg.py checks it against timm). Placements:
    before a block (``Block(pos_layer=)``), after block ``i`` of a stage (``Stage(pos=, pos_index=i)``,
    Twins), after blocks of a ViT (``VisionTransformerConfig(peg_after=(0,))``, CPVT). Cost ``9·H·W·C``
    multiply-adds, ``10·C`` parameters.
    """

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.proj = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def _map(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``."""
        return x + rearrange(self.proj(rearrange(x, "b h w c -> b c h w")), "b c h w -> b h w c")

    def forward(self, x: Tensor, feat_size: tuple[int, int] | None = None, num_prefix_tokens: int = 0) -> Tensor:
        """Tokens ``[B, P + H·W, C]`` or a map ``[B, H, W, C]`` -> same shape."""
        if x.dim() == 4:
            return self._map(x)
        if feat_size is None:
            raise ValueError("PosConv on tokens needs the token grid feat_size=(H, W)")
        H, W = feat_size
        prefix, grid = x[:, :num_prefix_tokens], x[:, num_prefix_tokens:]
        grid = rearrange(self._map(rearrange(grid, "b (h w) c -> b h w c", h=H, w=W)), "b h w c -> b (h w) c")
        return torch.cat([prefix, grid], dim=1) if num_prefix_tokens else grid  # [B, P + H·W, C]
