"""XCiT checkpoint layouts onto ours (:mod:`vit_attention.models.xcit`): timm's and the original
facebookresearch/xcit ``xcit.py`` (read at 9a7df94).

Ours is timm's except inside the blocks, where the one ``Block`` names LayerScale ``ls1.gamma`` / ``ls2.gamma``
and the local patch interaction branch is its ``pos2``:

* ``timm`` (timm 1.0.31 ``xcit.py``): ``blocks.N.gamma1`` / ``gamma2`` -> ``ls1.gamma`` / ``ls2.gamma``;
  ``blocks.N.norm3`` -> ``pos2.norm``; ``blocks.N.local_mp.*`` -> ``pos2.lpi.*``; ``blocks.N.gamma3`` ->
  ``pos2.ls.gamma``; ``cls_attn_blocks.N.gamma1`` / ``gamma2`` -> ``ls1.gamma`` / ``ls2.gamma``.
* ``original`` (the authors' files, ``{"model": {...}}``, unwrapped before conversion): timm's names except
  ``pos_embeder.*`` (sic) for ``pos_embed.*`` and one packed ``cls_attn_blocks.N.attn.qkv`` that timm (and we)
  split into ``q``, ``k``, ``v`` (rows in that order), as timm's ``checkpoint_filter_fn``; then timm's renames.

:func:`to_timm` gives timm's names back (load ours into ``timm.create_model``). The adapter drops a classifier
of another class count with a warning; nothing else depends on the input size (the Fourier encoding is
recomputed for every grid).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads

__all__ = ["TIMM_RULES", "from_timm", "from_original", "to_timm"]

State = dict[str, Tensor]

# timm -> ours
TIMM_RULES: list[tuple[str, str]] = [
    (r"^((?:cls_attn_)?blocks\.\d+)\.gamma([12])$", r"\1.ls\2.gamma"),
    (r"^(blocks\.\d+)\.gamma3$", r"\1.pos2.ls.gamma"),
    (r"^(blocks\.\d+)\.norm3\.", r"\1.pos2.norm."),
    (r"^(blocks\.\d+)\.local_mp\.", r"\1.pos2.lpi."),
]
# ours -> timm (the inverse)
_TO_TIMM: list[tuple[str, str]] = [
    (r"^((?:cls_attn_)?blocks\.\d+)\.ls([12])\.gamma$", r"\1.gamma\2"),
    (r"^(blocks\.\d+)\.pos2\.ls\.gamma$", r"\1.gamma3"),
    (r"^(blocks\.\d+)\.pos2\.norm\.", r"\1.norm3."),
    (r"^(blocks\.\d+)\.pos2\.lpi\.", r"\1.local_mp."),
]
_TIMM_KEY = re.compile(r"^(?:cls_attn_)?blocks\.\d+\.(?:gamma[123]$|norm3\.|local_mp\.)")
_ORIGINAL_QKV = re.compile(r"^(cls_attn_blocks\.\d+\.attn)\.qkv\.(weight|bias)$")


def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return any(_TIMM_KEY.match(k) for k in state)


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return any(k.startswith("pos_embeder.") or _ORIGINAL_QKV.match(k) for k in state)


def from_timm(state: State, model: nn.Module | None = None) -> State:
    """timm XCiT keys -> ours (LayerScale names, the LPI branch under ``pos2``)."""
    return rename(state, TIMM_RULES)


def from_original(state: State, model: nn.Module | None = None) -> State:
    """facebookresearch/xcit keys -> ours: ``pos_embeder`` renamed, class-attention ``qkv`` split into ``q`` /
    ``k`` / ``v`` (``[3C, C] -> 3 x [C, C]``, biases ``[3C] -> 3 x [C]``), then :func:`from_timm`."""
    out: State = {}
    for key, value in state.items():
        m = _ORIGINAL_QKV.match(key)
        if m:
            prefix, what = m.groups()
            for name, part in zip("qkv", value.reshape(3, -1, *value.shape[1:]).unbind(0)):
                out[f"{prefix}.{name}.{what}"] = part.clone()
            continue
        out[re.sub(r"^pos_embeder\.", "pos_embed.", key)] = value
    return from_timm(out)


def to_timm(state: Mapping[str, Tensor]) -> State:
    """Our XCiT keys -> timm's (the inverse of :func:`from_timm`), e.g. to load ours into ``timm.create_model``."""
    return rename(state, _TO_TIMM)


def _adapt_xcit(state: State, model: nn.Module, report: Any) -> State:
    """timm's names when the converter was bypassed (``format="timm"`` is ours otherwise), a head of another
    class count dropped."""
    if _is_timm(state):
        state = from_timm(state)
        report.notes.append("timm block names (gamma1/2/3, norm3, local_mp) renamed to ours")
    return drop_mismatched_heads(state, model.state_dict(), ("head.",), report)


register_converter("xcit", "original", _is_original, from_original)
register_converter("xcit", "timm", _is_timm, from_timm)
register_adapter("xcit", _adapt_xcit)
