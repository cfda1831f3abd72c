"""ViL checkpoints in the original ``microsoft/vision-longformer`` ``MsViT`` layout -> ours.

The original stage ``i`` is one ``nn.Sequential`` ``layer{i+1}``: index 0 the patch embedding
(``proj``, ``norm_embed``, ``cls_token``, ``cls_pos_embed``, ``x_pos_embed``, ``y_pos_embed``), then
alternating ``AttnBlock`` (odd index ``2j+1``: ``norm``, ``attn.*``) and ``MlpBlock`` (even index
``2j+2``: ``norm``, ``mlp.fc1``, ``mlp.fc2``) of block ``j``; then ``norm`` and ``head``. The
attention keys (``query``, ``kv``, ``proj`` and, shared or not, their ``*_global`` names; ``qkv`` /
``proj`` in the full-attention stages) are ours already; with ``sharew`` the ``*_global`` copies
(equal to the local tensors) are dropped, as our module stores shared projections once.
``relative_position_index`` buffers (RPE variants) are rebuilt here and dropped; so is an empty
``cls_pos_embed`` (a stage without globals).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .layouts import register_adapter, register_converter
from .vit import drop_mismatched_heads

__all__: list[str] = ["from_original_vil"]

State = dict[str, Tensor]

_BLOCK = re.compile(r"^layer(\d+)\.(\d+)\.(.*)$")
_SHARED = re.compile(r"\.attn\.(query|kv|proj)_global\.")


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return any(re.match(r"^layer\d+\.0\.proj\.weight$", k) for k in state)


def _rename(key: str) -> str | None:
    """One original key -> ours (None = drop)."""
    if key.endswith("relative_position_index"):
        return None
    if key.startswith("head."):
        return "head.fc." + key[len("head."):]
    m = _BLOCK.match(key)
    if m is None:
        return key  # norm.*
    stage, index, rest = int(m.group(1)) - 1, int(m.group(2)), m.group(3)
    prefix = f"stages.{stage}"
    if index == 0:
        return f"{prefix}.downsample.{rest.replace('norm_embed.', 'norm.')}"
    j = (index - 1) // 2
    if index % 2:  # AttnBlock
        return f"{prefix}.blocks.{j}.{rest.replace('norm.', 'norm1.', 1) if rest.startswith('norm.') else rest}"
    return f"{prefix}.blocks.{j}.{rest.replace('norm.', 'norm2.', 1) if rest.startswith('norm.') else rest}"


def from_original_vil(state: Mapping[str, Tensor], model: nn.Module | None = None) -> State:
    """``MsViT`` state dict -> :class:`~vit_attention.models.vil.VisionLongformer` keys (see the module docstring)."""
    out: State = {}
    for k, v in state.items():
        new = _rename(k)
        if new is None or (new.endswith("cls_pos_embed") and v.numel() == 0):
            continue
        out[new] = v
    for k in [k for k in out if _SHARED.search(k)]:  # sharew: the global names repeat the local tensors
        local = _SHARED.sub(r".attn.\1.", k)
        if local in out and torch.equal(out[local], out[k]):
            del out[k]
    return out


_POS_TABLE = re.compile(r"^stages\.(\d+)\.downsample\.[xy]_pos_embed$")


def _adapt_vil(state: State, model: nn.Module, report: Any) -> State:
    """Each stage's row / column position tables ``[1, L, C/2]`` resampled to the model's grid (weights trained
    at another image size: the rule of :meth:`~vit_attention.models.vil.VilEmbed._table`, linear, which
    ``set_input_size`` and the forward at another size use too); a classifier for a different number of
    classes dropped (left freshly initialised)."""
    from ..models.vil import VilEmbed  # weights sits above models

    own = model.state_dict()
    resized = []
    for key in [k for k in state if _POS_TABLE.match(k)]:
        table, want = state[key], own.get(key)
        if want is not None and table.dim() == want.dim() == 3 and table.shape[::2] == want.shape[::2] \
                and table.shape[1] != want.shape[1]:
            state[key] = VilEmbed._table(table, want.shape[1]).contiguous()
            resized.append(f"{key.split('.')[-1]} of stage {key.split('.')[1]} {table.shape[1]} -> {want.shape[1]}")
    if resized:
        report.notes.append("position tables resampled (linear): " + ", ".join(resized))
    return drop_mismatched_heads(state, own, ("head.",), report)


register_converter("vil", "original", _is_original, from_original_vil)
register_adapter("vil", _adapt_vil)
