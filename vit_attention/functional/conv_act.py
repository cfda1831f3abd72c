"""2-D convolution with its activation fused: ``act(conv2d(x, w, b))`` in one oneDNN kernel at CPU inference.

The companion of :func:`.linear.linear` for convolutions (PVTv2's depthwise-conv MLP: ``GELU(dwconv(h))``
on a ``[B, hidden, H, W]`` map, one full sweep fewer over the largest activation of the block). Used
for inference on CPU only (no autograd, fp32 or bf16, no autocast, eager: :func:`.linear.can_fuse`'s
rules) on channels-last input; everywhere else it is exactly ``F.conv2d`` then the activation. The oneDNN
operator is a private torch API, called through :mod:`.fast_paths` (with its public fallback; off with
:data:`.runtime.FAST_PATHS`, which :func:`.linear.can_fuse` reads).

Shapes: ``x [B, Cin, H, W]``, ``weight [Cout, Cin/groups, kh, kw]``, ``bias [Cout]`` -> ``[B, Cout, H', W']``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import fast_paths as _fp
from .fast_paths import ACTIVATIONS, activation
from .linear import can_fuse
from .runtime import FAST_PATHS, capturing

__all__ = ["conv2d_act", "channels_last_on_cpu"]


def channels_last_on_cpu(x: Tensor) -> Tensor:
    """``x [B, C, H, W]`` in channels-last memory on the CPU (the same tensor values and shape), else ``x`` as it is.

    oneDNN runs convolutions on NHWC memory natively and on NCHW through reorders: a convolution network fed
    channels-last keeps that layout from layer to layer (each convolution's output follows its input). Eager only
    (graph capture: unchanged, the compiler picks layouts) and off with the fast paths' switch
    (:data:`.runtime.FAST_PATHS`)."""
    if x.dim() != 4 or x.device.type != "cpu" or capturing() or not FAST_PATHS.get():
        return x
    return x.contiguous(memory_format=torch.channels_last)


def conv2d_act(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, stride: int = 1, padding: int = 0,
               groups: int = 1, act: str | None = None) -> Tensor:
    """``act(conv2d(x, weight, bias, stride, padding, groups=groups))``: ``[B, Cin, H, W] -> [B, Cout, H', W']``.

    ``act``: None or a name in :data:`.fast_paths.ACTIVATIONS`. The fused path needs ``x`` in channels-last
    memory (``x.permute(0, 3, 1, 2)`` of a ``[B, H, W, C]`` map) and returns channels-last output.
    """
    if act is not None and act not in ACTIVATIONS:
        raise ValueError(f"act must be None or one of {sorted(ACTIVATIONS)}, got {act!r}")
    if (_fp.HAS_CONV_POINTWISE and act is not None and x.dim() == 4
            and x.is_contiguous(memory_format=torch.channels_last)
            and can_fuse(x.permute(0, 2, 3, 1), weight.flatten(1), bias)):
        return _fp.conv2d_pointwise(x, weight, bias, stride=stride, padding=padding, groups=groups, act=act)
    return activation(F.conv2d(x, weight, bias, stride=stride, padding=padding, groups=groups), act)
