"""BatchNorm folded into the convolution before it (inference): one pass over the map instead of two.

``BN(conv(x)) = conv'(x)`` with ``w' = w · γ / sqrt(σ² + ε)`` per output channel and
``b' = β + (b - μ) · γ / sqrt(σ² + ε)``, using the running statistics: the same numbers up to
rounding, valid only while the BatchNorm uses its running statistics (eval mode).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["can_fold_batch_norm", "fold_batch_norm", "conv_bn"]


def can_fold_batch_norm(conv: nn.Module, bn: nn.Module) -> bool:
    """The pair may run folded: both in eval mode, BatchNorm with running statistics, no forward hooks."""
    from .linear import hookless

    return (not conv.training and not bn.training and isinstance(bn, nn.modules.batchnorm._BatchNorm)
            and bn.track_running_stats and bn.running_var is not None and hookless(conv, bn))


def fold_batch_norm(conv: nn.Conv2d, bn: nn.modules.batchnorm._BatchNorm) -> tuple[Tensor, Tensor]:
    """``(weight [Cout, Cin/g, kh, kw], bias [Cout])`` of the convolution with ``bn`` folded in."""
    assert bn.running_var is not None and bn.running_mean is not None
    scale = bn.running_var.add(bn.eps).rsqrt()  # [Cout]
    if bn.weight is not None:
        scale = scale * bn.weight
    mean = bn.running_mean if conv.bias is None else bn.running_mean - conv.bias
    shift = -mean * scale if bn.bias is None else bn.bias - mean * scale  # [Cout]
    return conv.weight * scale.view(-1, *([1] * (conv.weight.dim() - 1))), shift


def conv_bn(conv: nn.Conv2d, bn: nn.Module, x: Tensor) -> Tensor:
    """``bn(conv(x))``: ``[B, Cin, H, W] -> [B, Cout, H', W']``, one convolution when :func:`can_fold_batch_norm`."""
    if not can_fold_batch_norm(conv, bn) or conv.padding_mode != "zeros":
        return bn(conv(x))
    weight, bias = fold_batch_norm(conv, bn)  # type: ignore[arg-type]
    return F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups)
