"""MaxViT checkpoint layouts onto ours (:mod:`vit_attention.models.maxvit`).

* ``timm``: timm 1.0.31 ``MaxxVit`` files of the ``maxvit_*_tf_*`` presets (``timm/models/maxxvit.py``): every
  name is ours except the relative-position tables, ``...attn.rel_pos.relative_position_bias_table`` ->
  ``...attn.relative_position_bias_table`` (the same ``[nh, 2P-1, 2P-1]`` TF layout; timm's ``height_lookup`` /
  ``width_lookup`` are not persistent and never in a file).

The adapter resamples tables of another partition to each layer's (timm's ``checkpoint_filter_fn`` rule,
:func:`~vit_attention.attention.multi_axis.resize_tf_bias_table`) and drops a classifier of another class count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..attention.multi_axis import resize_tf_bias_table
from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads

State = dict[str, Tensor]

TIMM_RULES = [(r"\.attn\.rel_pos\.relative_position_bias_table$", ".attn.relative_position_bias_table")]


def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return any(k.endswith(".attn.rel_pos.relative_position_bias_table") for k in state)


def _from_timm(state: State, model: nn.Module) -> State:
    """timm's names -> ours (the tables' ``rel_pos.`` dropped; lookups, if any, left out)."""
    state = {k: v for k, v in state.items() if not k.endswith((".height_lookup", ".width_lookup"))}
    return rename(state, TIMM_RULES)


def _adapt_maxvit(state: State, model: nn.Module, report: Any) -> State:
    """Tables of another partition side are resampled to the layer's (timm's rule); a classifier for another class
    count is dropped."""
    own = model.state_dict()
    resized = 0
    for key, table in list(state.items()):
        if not key.endswith(".relative_position_bias_table") or key not in own:
            continue
        want = own[key].shape
        if (table.dim() == 3 and table.shape != want and table.shape[0] == want[0]
                and table.shape[1] % 2 == 1 and table.shape[2] % 2 == 1):  # a TF table [nh, 2P-1, 2Q-1]
            state[key] = resize_tf_bias_table(table, ((want[1] + 1) // 2, (want[2] + 1) // 2))
            resized += 1
    if resized:
        report.notes.append(f"{resized} relative-position tables resampled to the model's partitions (timm's "
                            "resize_rel_pos_bias_table rule)")
    return drop_mismatched_heads(state, own, ("head.fc.",), report)


register_converter("maxvit", "timm", _is_timm, _from_timm)
register_adapter("maxvit", _adapt_maxvit)
