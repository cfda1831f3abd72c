"""Stage scaffolding for hierarchical backbones (Swin, SwinV2; next PVT, Twins, CvT, DaViT, NAT, ViL).

What every hierarchical family shares, written once:

* :class:`Stage`: optional downsampling, a stack of blocks, an optional stage norm, on
  channels-last maps ``[B, H, W, C]``; gradient checkpointing, and CPU inference in batch chunks
  (``functional/chunking.py``). Keys: ``downsample.*``, ``blocks.{j}.*``, ``norm.*`` (timm's).
* :func:`drop_path_schedule`: the linear stochastic-depth rule over all blocks, split per stage.
* :func:`run_blocks`: blocks in order, each recomputed in backward when checkpointing.
* :class:`HierarchicalMixin`: ``forward_features``, ``forward_head``, ``forward``,
  ``forward_intermediates`` and ``set_grad_checkpointing`` for a model whose stages are one
  ``nn.Sequential`` of :class:`Stage` (named by ``stages_attr``), embedded by ``_embed``, closed
  by ``norm`` and classified by ``head(x, pre_logits=)``; :func:`stage_feature_info` its
  ``feature_info``.

A family file keeps only what is its own: the stem (``_embed``), what goes into each stage,
the final norm and the head.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import torch
import torch.utils.checkpoint
from einops import rearrange
from torch import Tensor, nn

from ..functional.chunking import batch_chunk_size, run_in_batch_chunks

__all__ = ["Stage", "HierarchicalMixin", "drop_path_schedule", "resolve_indices", "run_blocks", "stage_feature_info"]


def resolve_indices(indices: int | Sequence[int] | None, n: int, what: str = "block") -> list[int]:
    """``forward_intermediates`` indices -> sorted list in ``0..n-1``.

    ``None`` = all; an int ``k`` = the last ``k``; a sequence may use negative indices.
    """
    if indices is None:
        return list(range(n))
    if isinstance(indices, int):
        if not 0 < indices <= n:
            raise ValueError(f"indices={indices} must be in 1..{n}")
        return list(range(n - indices, n))
    take = [i + n if i < 0 else i for i in indices]
    if any(not 0 <= i < n for i in take):
        raise ValueError(f"{what} indices {list(indices)} out of range for {n} {what}s")
    return take


def drop_path_schedule(rate: float, depths: Sequence[int]) -> list[list[float]]:
    """Per-block drop-path rates rising linearly from 0 to ``rate`` over all blocks, one list per stage."""
    total = sum(depths)
    rates = [rate * i / max(total - 1, 1) for i in range(total)]
    out, start = [], 0
    for d in depths:
        out.append(rates[start:start + d])
        start += d
    return out


def run_blocks(blocks: Iterable[nn.Module], x: Tensor, *args: Any, checkpoint: bool = False) -> Tensor:
    """``x = blk(x, *args)`` for each block; with ``checkpoint`` (training) activations are recomputed in backward."""
    checkpoint = checkpoint and not torch.jit.is_scripting()
    for blk in blocks:
        if checkpoint:
            x = torch.utils.checkpoint.checkpoint(blk, x, *args, use_reentrant=False)
        else:
            x = blk(x, *args)
    return x


class Stage(nn.Module):
    """Downsample, then ``depth`` blocks, then an optional norm: ``[B, H, W, C] -> [B, H', W', C']``.

    Args:
        blocks: the stage's blocks (each ``[B, H', W', C'] -> [B, H', W', C']``).
        downsample: ``[B, H, W, C] -> [B, H', W', C']`` at the start of the stage (None = identity).
        norm: applied to the stage output (PVTv2's per-stage norm; None = identity).
        pos: a position layer on the map (PEG, :class:`~.pos_embed.PosConv`) run on the output of
            block ``pos_index`` (Twins: after the first block of every stage). Key: ``pos.*``.
    """

    def __init__(self, blocks: Sequence[nn.Module], downsample: nn.Module | None = None,
                 norm: nn.Module | None = None, *, pos: nn.Module | None = None, pos_index: int = 0) -> None:
        super().__init__()
        self.downsample = downsample if downsample is not None else nn.Identity()
        self.blocks = nn.Sequential(*blocks)
        if pos is not None and not 0 <= pos_index < len(self.blocks):
            raise ValueError(f"pos_index={pos_index} must name one of the stage's {len(self.blocks)} blocks")
        self.pos = pos
        self.pos_index = pos_index
        self.norm = norm if norm is not None else nn.Identity()
        self.grad_checkpointing = False

    def _run(self, x: Tensor) -> Tensor:
        """The blocks, with the position layer after block ``pos_index``: ``[B, H', W', C'] -> same``."""
        checkpoint = self.grad_checkpointing and self.training
        if self.pos is None:
            return run_blocks(self.blocks, x, checkpoint=checkpoint)
        k = self.pos_index + 1
        x = self.pos(run_blocks(self.blocks[:k], x, checkpoint=checkpoint))
        return run_blocks(self.blocks[k:], x, checkpoint=checkpoint)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, H', W', C']``."""
        x = self.downsample(x)
        # inference on CPU: a few images at a time (cache-sized)
        chunk = batch_chunk_size(x, self.blocks if self.pos is None else (self.blocks, self.pos))
        if chunk < x.shape[0]:
            x = run_in_batch_chunks(self.blocks if self.pos is None else self._run, x, chunk)
        else:
            x = self._run(x)
        return self.norm(x)


def stage_feature_info(dims: Sequence[int], reductions: Sequence[int], module: str = "stages"
                       ) -> list[dict[str, Any]]:
    """``feature_info``: channels, stride and module name per stage (``f"{module}.{i}"``)."""
    return [dict(num_chs=c, reduction=r, module=f"{module}.{i}") for i, (c, r) in enumerate(zip(dims, reductions))]


class HierarchicalMixin:
    """The forward API of a backbone made of :class:`Stage` s, ``[B, Cin, H, W] -> [B, num_classes]``.

    The model provides ``stages_attr`` (the name of its ``nn.Sequential`` of stages), ``_embed``
    (images -> the first stage's input map ``[B, H, W, C]``), ``norm`` (on the last map) and
    ``head`` (``head(x [B, H', W', C'], pre_logits=False)``, e.g. :class:`~.head.ClassifierHead`).
    """

    stages_attr: str = "stages"
    norm: nn.Module
    head: nn.Module

    def _embed(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _stages(self) -> nn.Sequential:
        return getattr(self, self.stages_attr)

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> normalised last map ``[B, H', W', C']``."""
        return self.norm(self._stages()(self._embed(x)))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Map ``[B, H', W', C']`` -> logits ``[B, num_classes]`` (or pooled ``[B, C']`` with ``pre_logits``)."""
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> logits ``[B, num_classes]``."""
        return self.forward_head(self.forward_features(x))

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in backward to save memory (training only)."""
        for stage in self._stages():
            stage.grad_checkpointing = enable

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
                              output_fmt: Literal["NCHW", "NHWC"] = "NCHW", intermediates_only: bool = False,
                              ) -> Any:
        """Final normalised map plus each chosen stage's output map.

        ``indices``: an int ``n`` = the last ``n`` stages, or stage indices (negative allowed);
        default all. Stage ``i`` gives ``[B, C_i, H_i, W_i]`` (``NCHW``, channels and stride in
        ``feature_info``) or the channels-last map (``NHWC``); ``norm`` applies the final norm to
        the last stage's map. Returns ``(final [B, H', W', C'], [maps])`` or only the list.
        """
        stages = self._stages()
        n = len(stages)
        take = resolve_indices(indices, n, "stage")
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        x = self._embed(x)  # [B, H, W, C]
        outs: list[Tensor] = []
        for i, stage in enumerate(stages):
            x = stage(x)  # [B, H_i, W_i, C_i]
            if i in take:
                y = self.norm(x) if norm and i == n - 1 else x
                outs.append(rearrange(y, "b h w c -> b c h w") if output_fmt == "NCHW" else y)
        if intermediates_only:
            return outs
        return self.norm(x), outs
