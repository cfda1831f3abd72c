"""Convolutional building blocks of mobile backbones: conv + BatchNorm + activation, MobileNetV2's
inverted residual, and the channel-rounding rule. NCHW maps ``[B, C, H, W]`` in and out.

Key names follow timm's ByobNet (MobileViT's host in timm): ``conv`` / ``bn`` inside
:class:`ConvNormAct`, ``conv1_1x1`` / ``conv2_kxk`` / ``conv3_1x1`` inside :class:`InvertedResidual`.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ..functional.batch_norm import conv_bn
from ..functional.linear import act_fresh
from ..functional.sizes import make_divisible
from .drop_path import DropPath

__all__ = ["ConvNormAct", "InvertedResidual"]

class ConvNormAct(nn.Module):
    """``Conv2d`` (no bias, ``k // 2`` padding) -> ``BatchNorm2d`` -> act, ``[B, Cin, H, W] -> [B, Cout, H', W']``.

    Args:
        in_chs, out_chs: channels; kernel_size, stride, groups: of the convolution.
        act_layer: activation class (None = none); eps: BatchNorm epsilon.
    """

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 1, *, stride: int = 1, groups: int = 1,
                 act_layer: Callable[[], nn.Module] | None = nn.SiLU, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride=stride, padding=kernel_size // 2, groups=groups,
                              bias=False)
        self.bn = nn.BatchNorm2d(out_chs, eps=eps)
        self.act = act_layer() if act_layer is not None else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, Cout, H / stride, W / stride]``.

        At inference (eval mode, no hooks) the BatchNorm is folded into the convolution and a SiLU /
        ReLU activation runs in place on the fresh output: the same numbers, one pass less over the map.
        """
        return act_fresh(self.act, conv_bn(self.conv, self.bn, x))  # [B, Cout, H', W']


class InvertedResidual(nn.Module):
    """MobileNetV2 inverted residual (Sandler et al. 2018): 1x1 expand -> kxk depthwise -> 1x1 linear project.

    ``[B, Cin, H, W] -> [B, Cout, H / stride, W / stride]``; the input is added back when the shape is
    kept (``Cin == Cout`` and ``stride == 1``). Hidden width ``make_divisible(Cin · expand_ratio)``.
    """

    def __init__(self, in_chs: int, out_chs: int, *, stride: int = 1, expand_ratio: float = 4.0,
                 kernel_size: int = 3, act_layer: Callable[[], nn.Module] = nn.SiLU, drop_path: float = 0.0,
                 eps: float = 1e-5) -> None:
        super().__init__()
        mid = make_divisible(in_chs * expand_ratio)
        self.conv1_1x1 = ConvNormAct(in_chs, mid, 1, act_layer=act_layer, eps=eps)
        self.conv2_kxk = ConvNormAct(mid, mid, kernel_size, stride=stride, groups=mid, act_layer=act_layer, eps=eps)
        self.conv3_1x1 = ConvNormAct(mid, out_chs, 1, act_layer=None, eps=eps)
        self.has_skip = in_chs == out_chs and stride == 1
        self.drop_path = DropPath(drop_path) if drop_path > 0 and self.has_skip else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, Cout, H', W']``."""
        out = self.conv3_1x1(self.conv2_kxk(self.conv1_1x1(x)))
        return x + self.drop_path(out) if self.has_skip else out
