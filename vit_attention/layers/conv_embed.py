"""Convolutional patch embedding + LayerNorm for pyramid stages (PVT v1 / PVTv2 stems and downsampling)."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["ConvEmbed"]


class ConvEmbed(nn.Module):
    """``Conv2d -> LayerNorm``: images ``[B, Cin, H, W]`` or a map ``[B, H, W, Cin]`` -> ``[B, H', W', C]``.

    PVT v1 / Twins: non-overlapping patches (``kernel_size = stride = p``, no padding); PVTv2's
    overlapping embedding: ``kernel_size=7, stride=4, padding=3`` (stem) and ``3, 2, 1`` (between
    stages). ``channels_last_input``: the input is a stage's channels-last map (else NCHW images).
    Keys: ``proj``, ``norm`` (timm's ``OverlapPatchEmbed`` and PVT v1's ``PatchEmbed``).
    """

    def __init__(self, in_chans: int, embed_dim: int, *, kernel_size: int, stride: int, padding: int = 0,
                 norm_eps: float = 1e-5, channels_last_input: bool = False) -> None:
        super().__init__()
        for name, value, low in (("in_chans", in_chans, 1), ("embed_dim", embed_dim, 1),
                                 ("kernel_size", kernel_size, 1), ("stride", stride, 1), ("padding", padding, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"ConvEmbed {name} must be an int >= {low}, got {value!r}")
        self.in_chans, self.embed_dim = in_chans, embed_dim
        self.channels_last_input = channels_last_input
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size, stride=stride, padding=padding)
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W]`` (or ``[B, H, W, Cin]`` with ``channels_last_input``) -> ``[B, H', W', C]``."""
        c = x.shape[-1] if self.channels_last_input else x.shape[1]
        if x.dim() != 4 or c != self.in_chans:
            layout = "[B, H, W, C]" if self.channels_last_input else "[B, C, H, W]"
            raise ValueError(f"expected {layout} input with C = in_chans = {self.in_chans}, got {tuple(x.shape)}")
        if self.channels_last_input:
            x = x.permute(0, 3, 1, 2)  # [B, Cin, H, W] (channels-last memory: no copy)
        return self.norm(self.proj(x).permute(0, 2, 3, 1))  # [B, H', W', C]
