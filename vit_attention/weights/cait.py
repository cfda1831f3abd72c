"""CaiT checkpoint layouts: timm's and the original facebookresearch/deit ``cait_models.py`` onto ours.

Both name every tensor as we do (``cls_token``, ``pos_embed`` ``[1, N, C]`` over the patches only,
``patch_embed.proj``, ``blocks.N.attn.{qkv,proj_l,proj_w,proj}``,
``blocks_token_only.N.attn.{q,k,v,proj}``, ``norm``, ``head``) except LayerScale: theirs is
``blocks.N.gamma_1`` / ``gamma_2``, ours the one Block's ``blocks.N.ls1.gamma`` / ``ls2.gamma``.
The original repository's files are ``{"model": {"module.<key>": ...}, "optimizer": ...}``; the
wrapper and the ``module.`` prefix are stripped by ``unwrap_state_dict`` before conversion, which
leaves exactly timm's layout (timm's own filter does the same). The rename runs as the converter
(detected by the ``gamma_N`` names) and again in the adapter, so ``format="timm"`` loads too.

The adapter resamples a ``pos_embed`` of another grid to the model's (bicubic, patches only) and
drops a classifier for another number of classes with a warning.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..functional import resample_abs_pos_embed
from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads

State = dict[str, Tensor]

_GAMMA = re.compile(r"^(blocks(?:_token_only)?\.\d+)\.gamma_([12])$")
RENAMES: list[tuple[str, str]] = [(_GAMMA.pattern, r"\1.ls\2.gamma")]  # timm / deit -> ours


def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return any(_GAMMA.match(k) for k in state)


def from_timm(state: State, model: nn.Module | None = None) -> State:
    """timm / original deit CaiT keys -> ours (``gamma_1`` / ``gamma_2`` -> ``ls1.gamma`` / ``ls2.gamma``)."""
    return rename(state, RENAMES)


def to_timm(state: Mapping[str, Tensor]) -> State:
    """Our CaiT keys -> timm's (the inverse of :func:`from_timm`), e.g. to load ours into ``timm.create_model``."""
    return rename(state, [(r"^(blocks(?:_token_only)?\.\d+)\.ls([12])\.gamma$", r"\1.gamma_\2")])


def _adapt_cait(state: State, model: nn.Module, report: Any) -> State:
    """LayerScale names (when the converter was bypassed), ``pos_embed`` to the model's grid, heads."""
    if _is_timm(state):
        state = from_timm(state)
        report.notes.append("LayerScale gamma_1 / gamma_2 renamed to ls1.gamma / ls2.gamma")
    own = model.state_dict()
    pos = state.get("pos_embed")
    if pos is not None and "pos_embed" in own and pos.shape != own["pos_embed"].shape \
            and pos.dim() == 3 and pos.shape[-1] == own["pos_embed"].shape[-1]:
        side = math.isqrt(pos.shape[1])
        if side * side == pos.shape[1]:
            grid = tuple(model.grid_size)
            state["pos_embed"] = resample_abs_pos_embed(pos, grid, (side, side), num_prefix_tokens=0)
            report.notes.append(f"pos_embed resampled from {side}x{side} to {grid[0]}x{grid[1]}")
    return drop_mismatched_heads(state, own, ("head.",), report)


register_converter("cait", "original", _is_timm, from_timm)
register_adapter("cait", _adapt_cait)
