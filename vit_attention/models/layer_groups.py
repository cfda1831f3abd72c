"""Layer-wise learning-rate decay's grouping of a model's parameters: stem, each block in forward order, head.

The layer-wise decay of BEiT, MAE, DINOv2 and EVA fine-tuning gives each block its own learning-rate scale.
:func:`layer_ids` numbers every parameter by the block it belongs to, reading the model's
:meth:`~vit_attention.models.backbone.Backbone.block_names` (``{container}.{j}`` for a run of blocks,
``{stages}.{s}.…`` for the blocks of stage ``s``); ``train``'s AdamW groups
(:func:`vit_attention.train.optim.param_groups`) scale by it, and :func:`group_matcher` writes the same grouping
in timm's format (``model.group_matcher()``, what ``timm.optim``'s ``param_groups_layer_decay`` reads).
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

__all__ = ["group_matcher", "layer_ids"]


def _stage_of(block: str) -> str | None:
    """The stage holding block ``block`` (``layers.1`` of ``layers.1.blocks.0``; ``stages.2`` of ``stages.2.3``), or
    None for a block of a run of blocks (``blocks.3``)."""
    parts = block.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else None


def layer_ids(model: nn.Module) -> tuple[dict[str, int], int]:
    """``({parameter name: layer}, L)`` for ``L`` = ``len(model.block_names())``.

    Layer ``i`` (1..L) is the i-th block; 0 the stem (top-level parameters such as class / register tokens and
    position tables, the top-level modules registered before the blocks: patch embedding, pre-norm, and those the
    model lists in ``late_stem_modules``); ``L + 1`` what comes after (final norm, pooling, neck, head). A stage's
    own modules go with its first block when registered before its blocks (a downsampling; the stage's own
    parameters, such as CvT's class token, too; in the first stage they are the stem: the patch embedding of CvT,
    Twins, ViL) and with its last block otherwise (a closing norm, a positional conv).
    """
    blocks: list[str] = model.block_names()  # type: ignore[operator]
    layer_of = {name: i + 1 for i, name in enumerate(blocks)}
    containers = {name.split(".")[0] for name in blocks}
    top = [name for name, _ in model.named_children()]
    first_container = min(top.index(c) for c in containers if c in top)
    late_stem = tuple(getattr(model, "late_stem_modules", ()))
    stage_blocks: dict[str, list[str]] = {}
    for name in blocks:
        stage = _stage_of(name)
        if stage is not None:
            stage_blocks.setdefault(stage, []).append(name)
    ids: dict[str, int] = {}
    for pname, _ in model.named_parameters():
        parts = pname.split(".")
        block = next((".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1)
                      if ".".join(parts[:k]) in layer_of), None)
        if block is not None:
            ids[pname] = layer_of[block]
        elif len(parts) > 2 and ".".join(parts[:2]) in stage_blocks:  # a stage's own module
            stage = ".".join(parts[:2])
            mine = stage_blocks[stage]
            children = [n for n, _ in model.get_submodule(stage).named_children()]
            # a parameter of the stage itself (CvT's class token) goes in with the stage's input
            before = parts[2] not in children or children.index(parts[2]) < children.index(mine[0].split(".")[2])
            # the first stage's input modules are the stem (CvT, Twins and ViL embed the patches there)
            ids[pname] = 0 if before and layer_of[mine[0]] == 1 else layer_of[mine[0] if before else mine[-1]]
        elif len(parts) == 1 or parts[0] in late_stem or top.index(parts[0]) < first_container:
            ids[pname] = 0
        else:
            ids[pname] = len(blocks) + 1
    return ids, len(blocks)


def group_matcher(model: nn.Module, coarse: bool = False) -> dict[str, Any]:
    """timm's parameter grouping of ``model``: ``{"stem": regex, "blocks": [(regex, (ordinal,)), ...]}`` from
    :func:`layer_ids`, one group per block (``coarse``: per stage for staged models), the parameters after the
    blocks in a group of their own, last. (Not timm's ``(99999,)``, which means "join the previous group": our
    head keeps its own rate.)"""
    ids, n = layer_ids(model)
    blocks: list[str] = model.block_names()  # type: ignore[operator]

    def ordinal(layer: int) -> int:
        block = blocks[min(layer, n) - 1]
        last = int(block.split(".")[1]) if coarse and _stage_of(block) is not None else min(layer, n) - 1
        return last + 1 if layer > n else last  # after the blocks: one past the last block's (or stage's)

    by: dict[int, list[str]] = {}
    for name, layer in ids.items():
        by.setdefault(-1 if layer == 0 else ordinal(layer), []).append(name)

    def pattern(names: list[str]) -> str:
        return "^(?:" + "|".join(re.escape(x) for x in names) + ")$"

    return {"stem": pattern(by.pop(-1, [])),
            "blocks": [(pattern(names), (o,)) for o, names in sorted(by.items())]}
