"""MViTv2 checkpoint layouts onto ours (:mod:`vit_attention.models.mvitv2`, whose keys are timm 1.0.31's).

* timm's files (``timm/mvitv2_*.fb_in1k`` / ``fb_inw21k`` on the Hugging Face hub): our own keys, nothing renamed.
* ``original``: facebookresearch/mvit's state dicts (``mvit/models/mvit.py``, HEAD dfbdfdf; the published ``.pyth``
  files keep them under ``model_state``, which a caller takes out): one flat ``blocks.{i}`` list, split into the
  stages by the model's depths, each block's width projection ``proj`` named ``shortcut_proj_attn`` (widening in the
  attention, ``expand_attn``) or ``shortcut_proj_mlp`` (in the MLP: ``mvitv2_large``), and the classifier
  ``head.projection`` as ``head.fc`` (timm's ``checkpoint_filter_fn`` renames the same). The original head applies a
  softmax in eval mode; these models return logits, as timm's.

The adapter resizes ``rel_pos_h`` / ``rel_pos_w`` tables of another length (a checkpoint made for another image
size) linearly to the model's (``align_corners=False``: timm's ``checkpoint_filter_fn`` rule,
:func:`~vit_attention.functional.rel_pos.resize_rel_pos`) and drops a classifier of another class count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..functional.rel_pos import resize_rel_pos
from .layouts import register_adapter, register_converter
from .vit import drop_mismatched_heads

State = dict[str, Tensor]


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return "blocks.0.attn.qkv.weight" in state and "patch_embed.proj.weight" in state \
        and not any(k.startswith("stages.") for k in state)


def _from_original(state: State, model: nn.Module) -> State:
    """Flat ``blocks.{i}`` -> ``stages.{s}.blocks.{j}``; ``proj`` -> ``shortcut_proj_attn`` / ``shortcut_proj_mlp``;
    ``head.projection`` -> ``head.fc``."""
    cfg = getattr(model, "cfg", None)
    depths = tuple(getattr(cfg, "depths", ()))
    mlp = not getattr(cfg, "expand_attn", True)
    where: dict[int, tuple[int, int]] = {}
    for s, d in enumerate(depths):
        for j in range(d):
            where[len(where)] = (s, j)
    out: State = {}
    for key, value in state.items():
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)", key)
        if m is not None and int(m.group(1)) in where:
            s, j = where[int(m.group(1))]
            rest = m.group(2)
            if rest.startswith("proj."):
                rest = ("shortcut_proj_mlp." if mlp else "shortcut_proj_attn.") + rest[len("proj."):]
            key = f"stages.{s}.blocks.{j}.{rest}"
        elif key.startswith("head.projection."):
            key = "head.fc." + key[len("head.projection."):]
        out[key] = value
    return out


def _adapt_mvitv2(state: State, model: nn.Module, report: Any) -> State:
    """Relative-position tables of another length resized linearly to the model's; a classifier of another class
    count dropped."""
    own = model.state_dict()
    resized = 0
    for key, table in list(state.items()):
        if (key.endswith(".rel_pos_h") or key.endswith(".rel_pos_w")) and key in own and table.dim() == 2 \
                and table.shape[1] == own[key].shape[1] and table.shape[0] != own[key].shape[0]:
            state[key] = resize_rel_pos(table, own[key].shape[0])
            resized += 1
    if resized:
        report.notes.append(f"{resized} rel_pos tables resized linearly to the model's grids (timm's "
                            "checkpoint_filter_fn rule)")
    return drop_mismatched_heads(state, own, ("head.fc.",), report)


register_converter("mvitv2", "original", _is_original, _from_original)
register_adapter("mvitv2", _adapt_mvitv2)
