"""LeViT checkpoint layouts onto ours (:mod:`vit_attention.models.levit`, whose keys are timm 1.0.31's linear mode).

* ``timm_conv``: timm's ``levit_conv_*`` files (``use_conv=True``): the same keys with every 1x1 convolution
  weight ``[O, I, 1, 1]`` where ours is a linear weight ``[O, I]`` (46 of them in ``levit_128s``); they are
  reshaped, nothing else changes (1x1 convolutions on NCHW maps and linear layers on tokens compute the same
  numbers).
* Either layout may carry the ``attention_bias_idxs`` buffers older files persisted (facebookresearch/LeViT): they
  are dropped, the index is rebuilt from the grid (timm's ``checkpoint_filter_fn`` drops them too).

The adapter resamples ``attention_biases`` tables of another square grid (the published checkpoints', loaded into a
model built for another ``img_size``; a table of a non-square grid does not say which way it lies) to the model's
grids (bicubic with antialiasing: timm's ``resize_rel_pos_bias_table_levit`` rule,
:func:`~vit_attention.functional.attention_bias.resize_attention_bias_table`) and drops classifiers of another
class count.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..functional.attention_bias import resize_attention_bias_table
from .layouts import register_adapter, register_converter
from .vit import drop_mismatched_heads

State = dict[str, Tensor]

_CONV_1X1 = re.compile(r"^stages\.\d+\..*\.linear\.weight$")


def _is_conv(state: Mapping[str, Tensor]) -> bool:
    return any(_CONV_1X1.match(k) and v.dim() == 4 and tuple(v.shape[2:]) == (1, 1) for k, v in state.items())


def _from_conv(state: State, model: nn.Module) -> State:
    out = {}
    for k, v in state.items():
        if k.endswith(".attention_bias_idxs"):
            continue
        out[k] = v.flatten(1) if _CONV_1X1.match(k) and v.dim() == 4 and tuple(v.shape[2:]) == (1, 1) else v
    return out


def _has_index(state: Mapping[str, Tensor]) -> bool:
    return any(k.endswith(".attention_bias_idxs") for k in state)


def _drop_index(state: State, model: nn.Module) -> State:
    return {k: v for k, v in state.items() if not k.endswith(".attention_bias_idxs")}


def _adapt_levit(state: State, model: nn.Module, report: Any) -> State:
    """Tables of another square grid resampled to each module's ``resolution``; a classifier of another class
    count dropped."""
    own = model.state_dict()
    resized = 0
    for name, module in model.named_modules():
        key = f"{name}.attention_biases"
        table, grid = state.get(key), getattr(module, "resolution", None)
        if table is None or key not in own or grid is None or table.dim() != 2 or table.shape == own[key].shape:
            continue
        side = math.isqrt(table.shape[1])
        if side * side == table.shape[1] and table.shape[0] == own[key].shape[0]:
            state[key] = resize_attention_bias_table(table, (side, side), tuple(grid))
            resized += 1
    if resized:
        report.notes.append(f"{resized} attention_biases tables resampled to the model's grids (timm's "
                            "resize_rel_pos_bias_table_levit rule)")
    return drop_mismatched_heads(state, own, ("head.linear.", "head_dist.linear."), report)


register_converter("levit", "timm_conv", _is_conv, _from_conv)
register_converter("levit", "timm", _has_index, _drop_index)
register_adapter("levit", _adapt_levit)
