"""EfficientViT-MSRA checkpoints onto ours (:mod:`vit_attention.models.efficientvit_msra`, whose keys are timm
1.0.31's).

* ``timm``: timm's files load as they are; files that persist the ``attention_bias_idxs`` buffers (older timm,
  microsoft/Cream's ``CascadedGroupAttention``) have them dropped: the index is rebuilt from the window (timm's
  ``checkpoint_filter_fn`` drops them too).
* ``original``: microsoft/Cream's files (``EfficientViT/classification/model/efficientvit.py`` @ 4a13c40,
  ``{"model": state}``): the stem ``patch_embed.{0, 2, 4, 6}`` is ``patch_embed.conv{1..4}``, ``Conv2d_BN``'s ``c``
  our ``conv`` and ``BN_Linear``'s ``l`` the head's ``linear``; the flat ``blocks{s+1}`` lists map in order onto
  stage ``s``: a stage after the first opens with the subsample triple (``blocks{s+1}.{0, 1, 2}`` ->
  ``downsample.{res1, patchmerge, res2}``), then its blocks (the walk timm's commented-out filter makes); the
  persistent ``attention_bias_idxs`` are dropped.

The adapter resamples ``attention_biases`` tables of another square window (the published 224 px checkpoints loaded
into a model built for another ``img_size``, whose windows ``min(7, resolution)`` differ) to each module's window
(bicubic with antialiasing: timm's ``checkpoint_filter_fn`` with ``resize_rel_pos_bias_table_levit``,
:func:`~vit_attention.functional.attention_bias.resize_attention_bias_table`) and drops a classifier of another
class count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from .layouts import register_adapter, register_converter
from .levit import resample_bias_tables
from .vit import drop_mismatched_heads

State = dict[str, Tensor]


def _has_index(state: Mapping[str, Tensor]) -> bool:
    return any(k.endswith(".attention_bias_idxs") for k in state)


def _drop_index(state: State, model: nn.Module) -> State:
    return {k: v for k, v in state.items() if not k.endswith(".attention_bias_idxs")}


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return any(k.startswith("patch_embed.0.c.") or re.match(r"blocks[123]\.", k) for k in state)


def _from_original(state: State, model: nn.Module) -> State:
    out: State = {}
    for key, value in state.items():
        if key.endswith("attention_bias_idxs"):
            continue
        key = re.sub(r"\.c\.(weight|bias)$", r".conv.\1", key)
        if (m := re.fullmatch(r"patch_embed\.(\d+)\.(.+)", key)) is not None:
            key = f"patch_embed.conv{int(m.group(1)) // 2 + 1}.{m.group(2)}"
        elif (m := re.fullmatch(r"head\.l\.(.+)", key)) is not None:
            key = f"head.linear.{m.group(1)}"
        elif (m := re.fullmatch(r"blocks(\d+)\.(\d+)\.(.+)", key)) is not None:
            s, j, rest = int(m.group(1)) - 1, int(m.group(2)), m.group(3)
            if s == 0:
                key = f"stages.0.blocks.{j}.{rest}"
            elif j < 3:
                key = f"stages.{s}.downsample.{('res1', 'patchmerge', 'res2')[j]}.{rest}"
            else:
                key = f"stages.{s}.blocks.{j - 3}.{rest}"
        out[key] = value
    return out


def _adapt(state: State, model: nn.Module, report: Any) -> State:
    """Tables of another square window resampled to each mechanism's ``window_size``; a classifier of another class
    count dropped."""
    state = resample_bias_tables(state, model, "window_size", report, what="windows")
    return drop_mismatched_heads(state, model.state_dict(), ("head.linear.",), report)


register_converter("efficientvit_msra", "original", _is_original, _from_original)
register_converter("efficientvit_msra", "timm", _has_index, _drop_index)
register_adapter("efficientvit_msra", _adapt)
