"""MaxViT checkpoint layouts onto ours (:mod:`vit_attention.models.maxvit`).

* ``timm``: timm 1.0.31 ``MaxxVit`` files (``timm/models/maxxvit.py``): every name is ours except the
  relative-position tables, ``...attn.rel_pos.relative_position_bias_table`` ->
  ``...attn.relative_position_bias_table``.
  The ``maxvit_*_tf_*`` files hold TF tables ``[nh, 2P-1, 2P-1]`` (ours; timm's ``height_lookup`` /
  ``width_lookup`` are not persistent). The ``maxvit_*_rw_*`` files hold Swin-layout tables ``[(2P-1)², nh]``
  (``RelPosBias``, query minus key), flipped to the TF layout, or (``maxvit_rmlp_*``) the MLP
  ``...attn.rel_pos.mlp.fc1/fc2`` -> ``...attn.rel_pos_mlp.fc1/fc2``, and per-head qkv rows (``head_first=True``:
  ``[q_h | k_h | v_h]`` per head), reordered to ``[q | k | v]``; a 2-D table or an MLP marks such a file.

The adapter resamples tables of another partition to each layer's (timm's ``checkpoint_filter_fn`` rule,
:func:`~vit_attention.attention.multi_axis.resize_tf_bias_table`) and drops a classifier of another class count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..attention.multi_axis import resize_tf_bias_table
from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads

State = dict[str, Tensor]

TIMM_RULES = [(r"\.attn\.rel_pos\.relative_position_bias_table$", ".attn.relative_position_bias_table"),
              (r"\.attn\.rel_pos\.mlp\.", ".attn.rel_pos_mlp.")]


def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return any(k.endswith(".attn.rel_pos.relative_position_bias_table") or ".attn.rel_pos.mlp." in k for k in state)


def _from_timm(state: State, model: nn.Module) -> State:
    """timm's names -> ours (the tables' ``rel_pos.`` dropped; lookups, if any, left out); ``rw`` files' Swin-layout
    tables to the TF layout and their per-head qkv rows to ``[q | k | v]``."""
    state = {k: v for k, v in state.items()
             if not k.endswith((".height_lookup", ".width_lookup", ".relative_position_index"))}
    rw = any((k.endswith(".attn.rel_pos.relative_position_bias_table") and v.dim() == 2) or ".attn.rel_pos.mlp." in k
             for k, v in state.items())  # timm's own models: per-head qkv rows
    state = rename(state, TIMM_RULES)
    if not rw:
        return state
    for key in [k for k in state if k.endswith(".attn.qkv.weight")]:
        prefix = key[: -len("qkv.weight")]
        table, fc2 = state.get(prefix + "relative_position_bias_table"), state.get(prefix + "rel_pos_mlp.fc2.weight")
        if table is not None and table.dim() == 2:
            nh = _swin_table_to_tf(state, prefix + "relative_position_bias_table")
        else:
            nh = fc2.shape[0] if fc2 is not None and fc2.dim() == 2 else 0
        for part in ("weight", "bias"):
            qkv = state.get(f"{prefix}qkv.{part}")
            if nh and qkv is not None and qkv.shape[0] % (3 * nh) == 0:
                hd = qkv.shape[0] // (3 * nh)
                state[f"{prefix}qkv.{part}"] = qkv.reshape(nh, 3, hd, *qkv.shape[1:]).transpose(0, 1).reshape(
                    qkv.shape).contiguous()  # [nh, 3, hd, ...] -> [3, nh, hd, ...]
    return state


def _swin_table_to_tf(state: State, key: str) -> int:
    """``state[key]``, a Swin-layout table ``[(2P-1)², nh]`` (query minus key), as a TF table ``[nh, 2P-1, 2P-1]``
    (key minus query: both offset axes flipped) -> ``nh``; 0 (left as it is) when it is not a square table."""
    table = state[key]
    side = math.isqrt(table.shape[0])
    if side * side != table.shape[0] or side % 2 == 0:
        return 0
    nh = table.shape[1]
    state[key] = table.reshape(side, side, nh).permute(2, 0, 1).flip(1, 2).contiguous()
    return nh


_TV_BLOCK = r"^blocks\.(\d+)\.layers\.(\d+)\.layers\."
TORCHVISION_RULES = [
    (r"^stem\.0\.0\.", "stem.conv1."), (r"^stem\.0\.1\.", "stem.norm1."), (r"^stem\.1\.0\.", "stem.conv2."),
    (_TV_BLOCK + r"MBconv\.proj\.1\.", r"stages.\1.blocks.\2.conv.shortcut.expand."),
    (_TV_BLOCK + r"MBconv\.layers\.pre_norm\.", r"stages.\1.blocks.\2.conv.pre_norm."),
    (_TV_BLOCK + r"MBconv\.layers\.conv_a\.0\.", r"stages.\1.blocks.\2.conv.conv1_1x1."),
    (_TV_BLOCK + r"MBconv\.layers\.conv_a\.1\.", r"stages.\1.blocks.\2.conv.norm1."),
    (_TV_BLOCK + r"MBconv\.layers\.conv_b\.0\.", r"stages.\1.blocks.\2.conv.conv2_kxk."),
    (_TV_BLOCK + r"MBconv\.layers\.conv_b\.1\.", r"stages.\1.blocks.\2.conv.norm2."),
    (_TV_BLOCK + r"MBconv\.layers\.squeeze_excitation\.", r"stages.\1.blocks.\2.conv.se."),
    (_TV_BLOCK + r"MBconv\.layers\.conv_c\.", r"stages.\1.blocks.\2.conv.conv3_1x1."),
    (_TV_BLOCK + r"window_attention\.", r"stages.\1.blocks.\2.attn_block."),
    (_TV_BLOCK + r"grid_attention\.", r"stages.\1.blocks.\2.attn_grid."),
    (r"\.attn_layer\.0\.", ".norm1."), (r"\.attn_layer\.1\.to_qkv\.", ".attn.qkv."),
    (r"\.attn_layer\.1\.merge\.", ".attn.proj."),
    (r"\.attn_layer\.1\.relative_position_bias_table$", ".attn.relative_position_bias_table"),
    (r"\.mlp_layer\.0\.", ".norm2."), (r"\.mlp_layer\.1\.", ".mlp.fc1."), (r"\.mlp_layer\.3\.", ".mlp.fc2."),
    (r"^classifier\.2\.", "head.norm."), (r"^classifier\.3\.", "head.pre_logits.fc."),
    (r"^classifier\.5\.", "head.fc."),
]


def _is_torchvision(state: Mapping[str, Tensor]) -> bool:
    return any(".layers.MBconv." in k or k.endswith(".attn_layer.1.to_qkv.weight") for k in state)


def _from_torchvision(state: State, model: nn.Module) -> State:
    """torchvision's names -> ours; tables to the TF layout, q rows rescaled from ``C^-1/2`` to ``hd^-1/2``."""
    state = rename({k: v for k, v in state.items() if not k.endswith(".relative_position_index")}, TORCHVISION_RULES)
    for key in [k for k in state if k.endswith(".attn.relative_position_bias_table")]:
        if state[key].dim() != 2:
            continue  # not a Swin-layout table: the shape check reports it
        nh = _swin_table_to_tf(state, key)
        if not nh:
            continue
        prefix = key[: -len("relative_position_bias_table")]
        for part in ("weight", "bias"):
            qkv = state.get(f"{prefix}qkv.{part}")
            if qkv is None or qkv.shape[0] % 3:
                continue
            C = qkv.shape[0] // 3
            if C % nh:
                continue
            qkv = qkv.clone()
            qkv[:C] *= math.sqrt((C // nh) / C)  # q · k · C^-1/2 = (q · sqrt(hd / C)) · k · hd^-1/2
            state[f"{prefix}qkv.{part}"] = qkv
    return state


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
register_converter("maxvit", "torchvision", _is_torchvision, _from_torchvision)
register_adapter("maxvit", _adapt_maxvit)
