"""EfficientViT-MSRA checkpoints onto ours (:mod:`vit_attention.models.efficientvit_msra`, whose keys are timm
1.0.31's).

* ``timm``: timm's files load as they are; files that persist the ``attention_bias_idxs`` buffers (older timm,
  microsoft/Cream's ``CascadedGroupAttention``) have them dropped: the index is rebuilt from the window (timm's
  ``checkpoint_filter_fn`` drops them too).

The adapter resamples ``attention_biases`` tables of another square window (the published 224 px checkpoints loaded
into a model built for another ``img_size``, whose windows ``min(7, resolution)`` differ) to each module's window
(bicubic with antialiasing: timm's ``checkpoint_filter_fn`` with ``resize_rel_pos_bias_table_levit``,
:func:`~vit_attention.functional.attention_bias.resize_attention_bias_table`) and drops a classifier of another
class count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..functional.attention_bias import resize_attention_bias_table
from .layouts import register_adapter, register_converter
from .vit import drop_mismatched_heads

State = dict[str, Tensor]


def _has_index(state: Mapping[str, Tensor]) -> bool:
    return any(k.endswith(".attention_bias_idxs") for k in state)


def _drop_index(state: State, model: nn.Module) -> State:
    return {k: v for k, v in state.items() if not k.endswith(".attention_bias_idxs")}


def _adapt(state: State, model: nn.Module, report: Any) -> State:
    """Tables of another square window resampled to each mechanism's ``window_size``; a classifier of another class
    count dropped."""
    own = model.state_dict()
    resized = 0
    for name, module in model.named_modules():
        key = f"{name}.attention_biases"
        table, window = state.get(key), getattr(module, "window_size", None)
        if table is None or key not in own or window is None or table.dim() != 2 or table.shape == own[key].shape:
            continue
        side = math.isqrt(table.shape[1])
        if side * side == table.shape[1] and table.shape[0] == own[key].shape[0]:
            state[key] = resize_attention_bias_table(table, (side, side), tuple(window))
            resized += 1
    if resized:
        report.notes.append(f"{resized} attention_biases tables resampled to the model's windows (timm's "
                            "resize_rel_pos_bias_table_levit rule)")
    return drop_mismatched_heads(state, own, ("head.linear.",), report)


register_converter("efficientvit_msra", "timm", _has_index, _drop_index)
register_adapter("efficientvit_msra", _adapt)
