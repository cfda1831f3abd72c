"""LeViT checkpoint layouts onto ours (:mod:`vit_attention.models.levit`, whose keys are timm 1.0.31's linear mode).

* ``timm_conv``: timm's ``levit_conv_*`` files (``use_conv=True``): the same keys with every 1x1 convolution
  weight ``[O, I, 1, 1]`` where ours is a linear weight ``[O, I]`` (46 of them in ``levit_128s``); they are
  reshaped, nothing else changes (1x1 convolutions on NCHW maps and linear layers on tokens compute the same
  numbers).
* ``original``: facebookresearch/LeViT's files (``levit.py``, HEAD 3772b8e; ``{"model": state}``): one flat
  ``blocks.{k}`` list per model, in forward order, that maps position by position onto ours: per stage, after the
  shrink pair that opens it (``AttentionSubsample`` ``blocks.{k}.{kv, q.1, proj.1}``, ``attention_biases``, then its
  residual MLP), each block's attention (``blocks.{k}.m.{qkv, proj.1}``, ``m.attention_biases``) and MLP
  (``blocks.{k}.m.{0, 2}``); ``Linear_BN`` / ``Conv2d_BN``'s ``c`` is our ``linear``, the stem
  ``patch_embed.{0, 2, 4, 6}`` is ``stem.conv{1..4}`` and ``BN_Linear``'s ``l`` the heads' ``linear`` (timm's own
  conversion of these files was the same walk).
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


_ORIGINAL_ATTN = (("m.qkv.", "qkv."), ("m.proj.1.", "proj.ln."), ("m.attention_biases", "attention_biases"))
_ORIGINAL_MLP = (("m.0.", "ln1."), ("m.2.", "ln2."))
_ORIGINAL_SHRINK = (("kv.", "kv."), ("q.1.", "q.ln."), ("proj.1.", "proj.ln."),
                    ("attention_biases", "attention_biases"))


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return any(k.startswith("patch_embed.0.c.") or re.fullmatch(r"blocks\.\d+\.m\.qkv\.c\.weight", k) for k in state)


def _original_units(model: nn.Module) -> list[tuple[tuple[tuple[str, str], ...], str]]:
    """The original's flat blocks in order: ``(key rules, our module prefix)`` for each."""
    units: list[tuple[tuple[tuple[str, str], ...], str]] = []
    for i, stage in enumerate(getattr(model, "stages", ())):
        if hasattr(stage.downsample, "attn_downsample"):
            units += [(_ORIGINAL_SHRINK, f"stages.{i}.downsample.attn_downsample"),
                      (_ORIGINAL_MLP, f"stages.{i}.downsample.mlp")]
        for j in range(len(stage.blocks)):
            units += [(_ORIGINAL_ATTN, f"stages.{i}.blocks.{j}.attn"), (_ORIGINAL_MLP, f"stages.{i}.blocks.{j}.mlp")]
    return units


def _from_original(state: State, model: nn.Module) -> State:
    state = {re.sub(r"\.c\.weight$", ".linear.weight", k): v for k, v in state.items()
             if not k.endswith("attention_bias_idxs")}
    out: State = {}
    units = _original_units(model)
    for key, value in state.items():
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)", key)
        if m is not None and int(m.group(1)) < len(units):
            rules, prefix = units[int(m.group(1))]
            rest = m.group(2)
            for old, new in rules:
                if rest.startswith(old):
                    key = f"{prefix}.{new}{rest[len(old):]}"
                    break
        elif (m := re.fullmatch(r"patch_embed\.(\d+)\.(.+)", key)) is not None:
            key = f"stem.conv{int(m.group(1)) // 2 + 1}.{m.group(2)}"
        elif (m := re.fullmatch(r"(head|head_dist)\.l\.(.+)", key)) is not None:
            key = f"{m.group(1)}.linear.{m.group(2)}"
        out[key] = value
    return out


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


register_converter("levit", "original", _is_original, _from_original)
register_converter("levit", "timm_conv", _is_conv, _from_conv)
register_converter("levit", "timm", _has_index, _drop_index)
register_adapter("levit", _adapt_levit)
