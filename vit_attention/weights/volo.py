"""VOLO checkpoint layouts: timm's (``timm/models/volo.py``, 1.0.31), which is the original sail-sg/volo one (timm
loads the original ``.pth.tar`` files without a filter), onto ours.

Every key is ours already (``patch_embed.conv.*``, ``patch_embed.proj``, ``network.{i}.{j}.{norm1,attn,norm2,mlp}``,
``network.1.proj``, ``pos_embed`` ``[1, h, w, C]``, ``cls_token``, ``norm``, ``head``, ``aux_head``) except the
class blocks' fused key / value projection: theirs is ``post_network.{j}.attn.kv`` (``Linear(C, 2C)``, the key rows
first), ours the class-attention mechanism's ``attn.k`` and ``attn.v``. The split runs as the converter (detected
by the ``kv`` names) and again in the adapter, so ``format="timm"`` loads too.

The adapter resamples a ``pos_embed`` of another grid to the model's with the original repository's rule (bicubic,
no antialias: sail-sg/volo ``utils/utils.py`` ``load_pretrained_weights``) and drops classifiers (``head`` and
``aux_head``) for another number of classes with a warning.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..functional import resample_abs_pos_embed
from .layouts import register_adapter, register_converter
from .vit import drop_mismatched_heads

State = dict[str, Tensor]

_KV = re.compile(r"^(post_network\.\d+\.attn)\.kv\.(weight|bias)$")
_KV_OURS = re.compile(r"^(post_network\.\d+\.attn)\.([kv])\.(weight|bias)$")


def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return any(_KV.match(k) for k in state)


def from_timm(state: State, model: nn.Module | None = None) -> State:
    """timm / sail-sg VOLO keys -> ours: each class block's ``attn.kv`` ``[2C, ...]`` split into ``attn.k`` (the
    first ``C`` rows) and ``attn.v``."""
    out: State = {}
    for key, value in state.items():
        m = _KV.match(key)
        if m is None:
            out[key] = value
            continue
        k, v = value.chunk(2, dim=0)
        out[f"{m.group(1)}.k.{m.group(2)}"], out[f"{m.group(1)}.v.{m.group(2)}"] = k, v
    return out


def to_timm(state: Mapping[str, Tensor]) -> State:
    """Our VOLO keys -> timm's (the inverse of :func:`from_timm`: ``attn.k`` / ``attn.v`` joined into ``attn.kv``),
    e.g. to load ours into ``timm.create_model``."""
    import torch

    out: State = {}
    for key, value in state.items():
        m = _KV_OURS.match(key)
        if m is None:
            out[key] = value
        elif m.group(2) == "k":
            out[f"{m.group(1)}.kv.{m.group(3)}"] = torch.cat([value, state[f"{m.group(1)}.v.{m.group(3)}"]], dim=0)
    return out


def _adapt_volo(state: State, model: nn.Module, report: Any) -> State:
    """``kv`` split (when the converter was bypassed), ``pos_embed`` to the model's grid, heads of another size."""
    if _is_timm(state):
        state = from_timm(state)
        report.notes.append("class blocks' attn.kv split into attn.k / attn.v")
    own = model.state_dict()
    pos = state.get("pos_embed")
    if pos is not None and "pos_embed" in own and pos.dim() == 4 and pos.shape != own["pos_embed"].shape \
            and pos.shape[-1] == own["pos_embed"].shape[-1]:
        old, new = tuple(pos.shape[1:3]), tuple(own["pos_embed"].shape[1:3])
        flat = resample_abs_pos_embed(pos.flatten(1, 2), new, old, num_prefix_tokens=0, rule="bicubic")
        state["pos_embed"] = flat.reshape(1, *new, pos.shape[-1])
        report.notes.append(f"pos_embed resampled from {old[0]}x{old[1]} to {new[0]}x{new[1]} (bicubic, no "
                            "antialias, as the original repository)")
    return drop_mismatched_heads(state, own, ("head.", "aux_head."), report)


register_converter("volo", "timm", _is_timm, from_timm)
register_adapter("volo", _adapt_volo)
