"""The NCHW part of a convolutional (ByobNet-style) backbone: stem -> stages -> final conv -> head.

Hybrid CNN-transformer families hosted by timm's ByobNet (MobileViT, HaloNet) are
``class Net(ConvStagesMixin, StagedBackbone)``: :class:`ConvStagesMixin` gives what differs on NCHW maps
(``forward_features``, ``forward_head``, ``forward_intermediates``) and
:class:`~vit_attention.models.backbone.StagedBackbone` the rest (config, ``forward``,
``reset_classifier``, the pooling rule, ``set_grad_checkpointing``, ``no_weight_decay``). The
model has ``stem``, ``stages`` (an ``nn.Sequential`` of stages), ``final_conv`` (``nn.Identity``
when absent) and ``head`` (:class:`~.head.ClassifierHead` built with ``global_pool=""``: the model
pools). ``feature_info`` has one level per stage; the last level is the ``final_conv`` output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from torch import Tensor, nn

from .stage import resolve_indices

__all__ = ["ConvStagesMixin"]


class ConvStagesMixin:
    """``[B, Cin, H, W] -> [B, num_classes]`` through ``stem``, ``stages``, ``final_conv`` and ``head`` on NCHW maps.

    Put it before :class:`~vit_attention.models.backbone.StagedBackbone` in the bases, whose ``pool``
    (on the channels-last map), ``forward`` and ``reset_classifier`` it relies on.
    """

    stem: nn.Module
    stages: nn.Sequential
    final_conv: nn.Module
    head: nn.Module
    pool: Callable[[Tensor], Tensor]

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> last map ``[B, num_features, H', W']``."""
        return self.final_conv(self.stages(self.stem(x)))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Map ``[B, C, H', W']`` -> logits ``[B, num_classes]`` (pooled ``[B, C]`` with ``pre_logits``;
        with ``global_pool=""`` the channels-last map, per position)."""
        return self.head(self.pool(x.permute(0, 2, 3, 1)), pre_logits=pre_logits)

    def _prune_after(self, last: int) -> None:
        """Keep stages ``0..last`` (``prune_intermediate_layers``); ``final_conv`` goes with the last stage."""
        if last < len(self.stages) - 1:
            self.stages = self.stages[:last + 1]
            self.final_conv = nn.Identity()

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
                              output_fmt: Literal["NCHW", "NHWC"] = "NCHW", intermediates_only: bool = False,
                              stop_early: bool = False) -> Any:
        """Final map plus the map of each chosen stage (the last one after ``final_conv``).

        ``indices``: an int ``n`` = the last ``n`` stages, or stage indices (negative allowed); default
        all. ``norm`` has no effect (no final norm). Maps ``[B, C_i, H_i, W_i]`` (``NCHW``) or
        channels-last (``NHWC``). Returns ``(final [B, C, H', W'], [maps])`` or only the list.
        ``stop_early`` (timm): no stage after the last chosen one runs, ``final`` is its map;
        ``intermediates_only`` always stops there.
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
                if (intermediates_only or stop_early) and i == max(take):
                    break  # the stages after the last chosen one are not needed
        if intermediates_only:
            return outs
        return x, outs
