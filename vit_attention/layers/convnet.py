"""The forward API of a convolutional (ByobNet-style) backbone: stem -> stages -> final conv -> head, NCHW.

Hybrid CNN-transformer families hosted by timm's ByobNet (MobileViT, HaloNet) share it:
:class:`ConvStagesMixin` gives ``forward_features``, ``forward_head``, ``forward``,
``forward_intermediates`` and ``reset_classifier`` to a model with ``stem``, ``stages`` (an
``nn.Sequential`` of stages), ``final_conv`` (``nn.Identity`` when absent) and ``head``
(:class:`~.head.ClassifierHead`, pooling a channels-last map). ``feature_info`` has one level per
stage; the last level is the ``final_conv`` output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from torch import Tensor, nn

from .head import reset_head
from .stage import resolve_indices

__all__ = ["ConvStagesMixin"]


class ConvStagesMixin:
    """``[B, Cin, H, W] -> [B, num_classes]`` through ``stem``, ``stages``, ``final_conv`` and ``head``."""

    stem: nn.Module
    stages: nn.Sequential
    final_conv: nn.Module
    head: nn.Module
    num_features: int
    num_classes: int
    global_pool: str
    cfg: Any

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> last map ``[B, num_features, H', W']``."""
        return self.final_conv(self.stages(self.stem(x)))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Map ``[B, C, H', W']`` -> logits ``[B, num_classes]`` (pooled ``[B, C]`` with ``pre_logits``)."""
        return self.head(x.permute(0, 2, 3, 1), pre_logits=pre_logits)

    def forward(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> logits ``[B, num_classes]``."""
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
                              output_fmt: Literal["NCHW", "NHWC"] = "NCHW", intermediates_only: bool = False,
                              ) -> Any:
        """Final map plus the map of each chosen stage (the last one after ``final_conv``).

        ``indices``: an int ``n`` = the last ``n`` stages, or stage indices (negative allowed); default
        all. ``norm`` has no effect (no final norm). Maps ``[B, C_i, H_i, W_i]`` (``NCHW``) or
        channels-last (``NHWC``). Returns ``(final [B, C, H', W'], [maps])`` or only the list.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        n = len(self.stages)
        take = resolve_indices(indices, n, "stage")
        x = self.stem(x)  # [B, C0, H0, W0]
        outs: list[Tensor] = []
        for i, stage in enumerate(self.stages):
            x = stage(x)  # [B, C_i, H_i, W_i]
            if i == n - 1:
                x = self.final_conv(x)
            if i in take:
                outs.append(x if output_fmt == "NCHW" else x.permute(0, 2, 3, 1))
        if intermediates_only:
            return outs
        return x, outs

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh classifier for ``num_classes`` (0 = no head); ``global_pool``: ``"avg"`` or ``""``."""
        reset_head(self, num_classes, global_pool)
