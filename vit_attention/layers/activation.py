"""Activations the references use beyond ``torch.nn``: QuickGELU (GPT-2 / iGPT, CLIP, the original CvT)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["QuickGELU", "get_act_layer", "ACT_LAYERS"]


class QuickGELU(nn.Module):
    """``x · sigmoid(1.702 · x)``, a fast approximation of GELU, ``[*] -> [*]`` (no parameters).

    The one class of the library (iGPT and CvT use it): :class:`~vit_attention.layers.Mlp` recognises it by
    type and fuses it with ``fc1`` in CPU inference (oneDNN ``silu`` of the scaled projection).
    """

    alpha: float = 1.702

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(self.alpha * x)


ACT_LAYERS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "quick_gelu": QuickGELU,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
}


def get_act_layer(name: str) -> Callable[[], nn.Module]:
    """The activation constructor registered under ``name`` (``ACT_LAYERS``); unknown names raise listing them."""
    try:
        return ACT_LAYERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"act_layer must be one of {', '.join(map(repr, ACT_LAYERS))}; got {name!r}") from None
