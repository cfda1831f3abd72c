"""Stage scaffolding for hierarchical backbones (Swin, SwinV2; next PVT, Twins, CvT, DaViT, NAT, ViL).

What every hierarchical family shares, written once:

* :class:`Tokens`: what a stage carries when its embedding adds prefix tokens (PVT's and CvT's
  class token, ViL's global tokens): ``(x [B, P + H·W, C], feat_size (H, W), num_prefix_tokens P)``.
* :class:`Stage`: optional downsampling (or a token embedding), a stack of blocks, an optional
  stage norm, on channels-last maps ``[B, H, W, C]`` or on :class:`Tokens`; gradient
  checkpointing, and CPU inference in batch chunks (``functional/chunking.py``). Keys:
  ``downsample.*``, ``blocks.{j}.*``, ``norm.*`` (timm's).
* :func:`drop_path_schedule`: the linear stochastic-depth rule over all blocks, split per stage.
* :func:`run_blocks`: blocks in order, each recomputed in backward when checkpointing;
  :func:`run_blocks_with_taps` also keeps chosen blocks' outputs and runs a layer after chosen
  blocks (a PEG): the one block loop of staged and isotropic models (ViT, CaiT, ViTDet, iGPT).
* :func:`run_stages`: the stages in order with their taps as maps (``forward_intermediates``).
* :func:`staged_intermediates`: ``forward_intermediates`` of a model whose stages are one
  ``nn.Sequential`` of :class:`Stage`; :func:`stage_feature_info` its ``feature_info``. The
  forward API itself (config, classifier reset, pooling) is
  :class:`vit_attention.models.backbone.Backbone`'s, the staged forward
  :class:`~vit_attention.models.backbone.StagedBackbone`'s.

A family file keeps only what is its own: the stem (``_embed``), what goes into each stage,
the final norm and the head.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import torch
import torch.utils.checkpoint
from einops import rearrange
from torch import Tensor, nn

from ..functional.chunking import batch_chunk_size, run_in_batch_chunks

__all__ = ["Stage", "Tokens", "as_map", "drop_path_schedule", "resolve_indices", "run_blocks",
           "run_blocks_with_taps", "run_stages", "stage_feature_info", "staged_intermediates"]


class Tokens(NamedTuple):
    """Tokens on a grid after prefix tokens: ``x [B, P + H·W, C]``, ``feat_size (H, W)``, ``num_prefix_tokens P``.

    What a :class:`Stage` whose embedding adds prefix tokens takes and gives (PVT's and CvT's class
    token, ViL's global tokens); the next stage and the taps see :meth:`to_map`.
    """

    x: Tensor
    feat_size: tuple[int, int]
    num_prefix_tokens: int

    def to_map(self) -> Tensor:
        """The grid tokens as a channels-last map ``[B, H, W, C]`` (prefix tokens dropped).

        Every size is spelled out: ``B`` may be 0, and ONNX keeps ``B`` symbolic (``unflatten`` bakes it in).
        """
        x = self.x
        return x[:, self.num_prefix_tokens:].reshape(x.shape[0], self.feat_size[0], self.feat_size[1], x.shape[-1])


def as_map(x: Tensor | Tokens) -> Tensor:
    """A stage's output as a channels-last map ``[B, H, W, C]``: :meth:`Tokens.to_map`, or the map itself."""
    return x.to_map() if isinstance(x, Tokens) else x


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


def run_blocks_with_taps(blocks: Sequence[nn.Module], x: Tensor, *args: Any, checkpoint: bool = False,
                         taps: Collection[int] | None = None, after: Mapping[int, Callable[..., Tensor]] | None = None,
                         stop_at_last_tap: bool = False) -> tuple[Tensor, list[Tensor]]:
    """:func:`run_blocks` that also returns the outputs of blocks ``taps`` (in order) and runs ``after[i](x, *args)``
    on the output of block ``i`` (a PEG: CPVT, Twins), before it is tapped: ``x -> (x, [tapped x])``.
    ``stop_at_last_tap``: the blocks after the last tap (and PEG) are not run (``forward_intermediates(...,
    intermediates_only=True)``, features models); ``x`` is then the last tapped output."""
    if not taps and not after:
        return run_blocks(blocks, x, *args, checkpoint=checkpoint), []
    seq = list(blocks)
    saved: list[Tensor] = []
    start = 0
    for i in sorted({*(taps or ()), *(after or {})}):
        x = run_blocks(seq[start:i + 1], x, *args, checkpoint=checkpoint)
        if after and i in after:
            x = after[i](x, *args)
        if taps and i in taps:
            saved.append(x)
        start = i + 1
    if stop_at_last_tap and taps:
        return x, saved
    return run_blocks(seq[start:], x, *args, checkpoint=checkpoint), saved


class Stage(nn.Module):
    """Downsample, then ``depth`` blocks, then an optional norm: ``[B, H, W, C] -> [B, H', W', C']``.

    With a token embedding as ``downsample`` (one that returns :class:`Tokens`: a class token or
    global tokens in front of the grid), the blocks run on ``(tokens, feat_size, num_prefix_tokens)``
    and the stage gives :class:`Tokens`; a stage given :class:`Tokens` starts from their map.

    Args:
        blocks: the stage's blocks (each ``[B, H', W', C'] -> [B, H', W', C']``, or
            ``(tokens, feat_size, num_prefix_tokens) -> tokens`` after a token embedding).
        downsample: ``[B, H, W, C] -> [B, H', W', C']`` (or :class:`Tokens`) at the start of the stage
            (None = identity).
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

    def _run(self, x: Tensor, *args: Any) -> Tensor:
        """The blocks, with the position layer after block ``pos_index``: ``[B, H', W', C'] -> same``
        (tokens ``[B, P + N, C]`` with ``args = (feat_size, P)``)."""
        after = None if self.pos is None else {self.pos_index: self.pos}
        return run_blocks_with_taps(self.blocks, x, *args, checkpoint=self.grad_checkpointing and self.training,
                                    after=after)[0]

    def embed(self, x: Tensor | Tokens) -> Tensor | Tokens:
        """The stage's input (a map, or the previous stage's :class:`Tokens`, taken as their map) -> its blocks'
        input: ``downsample(map)``, a map ``[B, H', W', C']`` or :class:`Tokens`."""
        return self.downsample(as_map(x))

    def forward(self, x: Tensor | Tokens) -> Tensor | Tokens:
        """``[B, H, W, C] -> [B, H', W', C']``; :class:`Tokens` after a token embedding."""
        x = self.embed(x)
        tokens = x if isinstance(x, Tokens) else None
        t = x.x if tokens is not None else x
        args = (tokens.feat_size, tokens.num_prefix_tokens) if tokens is not None else ()
        # inference on CPU: a few images at a time (cache-sized); never in training, where BatchNorm (CvT's
        # conv projections) normalises over the whole batch, even without autograd
        chunk = t.shape[0] if self.training else batch_chunk_size(
            t, self.blocks if self.pos is None else (self.blocks, self.pos))
        if chunk < t.shape[0]:
            t = run_in_batch_chunks(lambda c: self._run(c, *args), t, chunk)
        else:
            t = self._run(t, *args)
        t = self.norm(t)
        return t if tokens is None else Tokens(t, tokens.feat_size, tokens.num_prefix_tokens)


def run_stages(stages: Iterable[nn.Module], x: Tensor | Tokens, take: Collection[int] = (), *,
               last_norm: Callable[[Tensor], Tensor] | None = None,
               output_fmt: Literal["NCHW", "NHWC"] = "NCHW", stop_at_last_tap: bool = False,
               ) -> tuple[Tensor | Tokens, list[Tensor]]:
    """The stages in order, ``x -> (last stage's output, [maps of stages take])``.

    A tapped stage gives its map (:func:`as_map`: prefix tokens left out), ``[B, C_i, H_i, W_i]``
    (``NCHW``) or ``[B, H_i, W_i, C_i]`` (``NHWC``); ``last_norm`` is applied to the last stage's map.
    ``stop_at_last_tap``: the stages after the last one in ``take`` are not run (then ``x`` is its output).
    """
    if output_fmt not in ("NCHW", "NHWC"):
        raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
    stages = list(stages)
    outs: list[Tensor] = []
    last = max(take) if stop_at_last_tap and take else None
    for i, stage in enumerate(stages):
        x = stage(x)
        if i in take:
            y = as_map(x)  # [B, H_i, W_i, C_i]
            if last_norm is not None and i == len(stages) - 1:
                y = last_norm(y)
            outs.append(rearrange(y, "b h w c -> b c h w") if output_fmt == "NCHW" else y)
            if i == last:
                break
    return x, outs


def staged_intermediates(stages: Sequence[nn.Module], x: Tensor | Tokens, indices: int | Sequence[int] | None,
                         final_norm: Callable[[Tensor], Tensor], *, norm: bool = False,
                         output_fmt: Literal["NCHW", "NHWC"] = "NCHW", intermediates_only: bool = False,
                         stop_early: bool = False) -> Any:
    """``forward_intermediates`` of a staged model, given its embedded input ``x``: ``(final, [maps])`` or the list.

    ``indices`` as :func:`resolve_indices` (stages); maps as :func:`run_stages` (``norm``: ``final_norm`` on the
    last stage's map); ``final``: ``final_norm`` of the last stage's output (its tokens when it gives
    :class:`Tokens`, else its map). With ``intermediates_only`` or ``stop_early`` (timm's keyword) the stages after
    the last chosen one do not run; ``final`` is then that stage's output, through ``final_norm`` only when it is the
    last stage (the norm has the last stage's width).
    """
    take = resolve_indices(indices, len(stages), "stage")
    stop = intermediates_only or stop_early
    x, outs = run_stages(stages, x, take, last_norm=final_norm if norm else None, output_fmt=output_fmt,
                         stop_at_last_tap=stop)
    if intermediates_only:
        return outs
    x = x.x if isinstance(x, Tokens) else x
    return (x if stop and max(take) < len(stages) - 1 else final_norm(x)), outs


def stage_feature_info(dims: Sequence[int], reductions: Sequence[int], module: str = "stages"
                       ) -> list[dict[str, Any]]:
    """``feature_info``: channels, stride and module name per stage (``f"{module}.{i}"``)."""
    return [dict(num_chs=c, reduction=r, module=f"{module}.{i}") for i, (c, r) in enumerate(zip(dims, reductions))]

