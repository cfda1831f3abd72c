"""Twins checkpoints (timm and the original Meituan-AutoML/Twins ``gvt.py``) onto our stage layout.

timm's ``twins.py`` kept the original repository's key names, so one table serves both (the
original's ``{'model': sd}`` wrapper is removed by the loader):

=====================================  ==========================================
timm / original                        ours (``vit_attention.models.twins``)
=====================================  ==========================================
``patch_embeds.{i}.{proj,norm}.*``     ``stages.{i}.downsample.{proj,norm}.*``
``blocks.{i}.{j}.*``                   ``stages.{i}.blocks.{j}.*`` (same inside)
``pos_block.{i}.proj.0.*``             ``stages.{i}.pos.proj.0.*``
``norm.*``                             ``norm.*``
``head.{weight,bias}``                 ``head.fc.{weight,bias}``
=====================================  ==========================================

Inside a block the names are the same: ``norm1``, ``attn.qkv`` / ``attn.proj`` (LSA, timm
``LocallyGroupedAttn`` = original ``GroupAttention``), ``attn.q`` / ``attn.kv`` / ``attn.sr`` /
``attn.norm`` / ``attn.proj`` (GSA), ``norm2``, ``mlp.fc1`` / ``mlp.fc2``. The original's
``alt_gvt_*`` / ``pcpvt_*_v0`` are timm's ``twins_svt_*`` / ``twins_pcpvt_*``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads

__all__ = ["TIMM_TO_OURS", "from_timm"]

State = dict[str, Tensor]

TIMM_TO_OURS: tuple[tuple[str, str], ...] = (
    (r"^patch_embeds\.(\d+)\.", r"stages.\1.downsample."),
    (r"^blocks\.(\d+)\.(\d+)\.", r"stages.\1.blocks.\2."),
    (r"^pos_block\.(\d+)\.", r"stages.\1.pos."),
    (r"^head\.(weight|bias)$", r"head.fc.\1"),
)


def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return "patch_embeds.0.proj.weight" in state and any(k.startswith("pos_block.0.proj.0.") for k in state)


def from_timm(state: State, model: nn.Module) -> State:
    """timm / original Twins keys -> ours (:data:`TIMM_TO_OURS`)."""
    return rename(state, TIMM_TO_OURS)


def _adapt(state: State, model: nn.Module, report: Any) -> State:
    """A classifier for another number of classes is dropped (left freshly initialised)."""
    return drop_mismatched_heads(state, model.state_dict(), ("head.fc.",), report)


register_converter("twins", "timm", _is_timm, from_timm)
register_converter("twins", "original", _is_timm, from_timm)  # Meituan-AutoML/Twins gvt.py: timm's names
register_adapter("twins", _adapt)
