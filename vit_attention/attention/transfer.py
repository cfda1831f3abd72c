"""Carry one mechanism's learned weights into another (pretrained weights under a swapped mechanism).

Every mechanism projects its input to queries, keys and values and its result back through an
output projection; only where those matrices sit differs (one packed ``qkv``, ``q`` + ``kv``,
four ``Linear``\\ s, 1x1 convolutions, per-head interleaved ``kv``). A mechanism says where in its
file, as ``transfer_slots`` (declared with their defaults on
:class:`~vit_attention.attention.base.AttentionModule`): role (``"q"``, ``"k"``, ``"v"``, ``"o"``) -> the
parameters holding it,
each ``"attr"`` (the whole weight) or ``"attr:i/n"`` (the i-th of n equal row blocks of a packed
projection) or ``"attr:i/nh"`` (per head interleaved: row block ``i`` of each head's ``n`` blocks,
HaloNet's ``kv``); several paths write the same role (ViL's local and global projections). Biases
sit in the same rows, or in ``q_bias`` / ``v_bias`` (SwinV2, EVA: no key bias). Two more optional
hooks, also in the mechanism's file:

* ``transfer_init()``: set the parameters that have no counterpart in another mechanism to the value
  that adds nothing to what the carried projections compute, where one exists (position tables zero,
  talking-heads mixing the identity, CvT's depthwise convolution the identity), and say what it did;
* ``get_offset_bias()`` / ``set_offset_bias(grid)``: a learned bias by relative offset in one form,
  ``[nh, 2a-1, 2b-1]`` whose entry ``[h, dr + a-1, dc + b-1]`` is the bias of a key ``(dr, dc)`` away from
  its query (key minus query): Swin's table <-> NAT's ``rpb``, exact on the offsets both cover.

:func:`carry_attention` moves one module's weights into another with them;
:func:`vit_attention.weights.transfer_weights` does it for a whole model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .base import AttentionModule

__all__ = ["PACKED_QKV_SLOTS", "ROLES", "Projections", "carry_attention", "describe_transfer", "fit_offset_grid",
           "get_projections", "set_projections"]

ROLES = ("q", "k", "v", "o")
_BIAS_ATTR = {"q": "q_bias", "v": "v_bias"}  # separate biases (qkv_bias="qv"); the key has none


@dataclass
class Projections:
    """A mechanism's projections in one form: ``weight[role]`` ``[C_out, C_in]`` and ``bias[role]`` ``[C_out]``
    (None = no bias) for the roles it has (``q``, ``k``, ``v``: input -> heads·hd; ``o``: heads·hd -> output)."""

    weight: dict[str, Tensor] = field(default_factory=dict)
    bias: dict[str, Tensor | None] = field(default_factory=dict)
    scale: float | None = None  # the logit scale q·k is multiplied by (``hd^-1/2``; CvT's ``C^-1/2``), if fixed


def _parse(slot: str) -> tuple[str, int, int, bool]:
    """``"attr"`` | ``"attr:i/n"`` | ``"attr:i/nh"`` -> ``(attr, i, n, per_head)``."""
    if ":" not in slot:
        return slot, 0, 1, False
    attr, part = slot.split(":", 1)
    per_head = part.endswith("h")
    i, n = part.rstrip("h").split("/")
    return attr, int(i), int(n), per_head


def _rows(param: Tensor, i: int, n: int, per_head: bool, num_heads: int) -> Tensor:
    """The rows of role ``i`` of ``n`` in a packed weight / bias ``[n·R, ...]`` (a view: writes go through)."""
    if not per_head:
        return param.view(n, param.shape[0] // n, *param.shape[1:])[i]
    return param.view(num_heads, n, param.shape[0] // (num_heads * n), *param.shape[1:])[:, i]


def _has(module: AttentionModule, attr: str) -> bool:
    try:
        module.get_submodule(attr)
    except AttributeError:
        return False
    return True


def _slots(module: AttentionModule) -> Mapping[str, tuple[str, ...]]:
    """``module.transfer_slots`` with each role's paths as a tuple, those the module has (ViL's global projections
    exist only with separate global weights)."""
    out: dict[str, tuple[str, ...]] = {}
    for role, paths in module.transfer_slots.items():
        have = tuple(p for p in ((paths,) if isinstance(paths, str) else paths) if _has(module, p.split(":")[0]))
        if have:
            out[role] = have
    return out


def _weight_2d(w: Tensor) -> Tensor:
    return w.reshape(w.shape[0], -1) if w.dim() == 4 and w.shape[2:] == (1, 1) else w  # 1x1 conv == Linear


def get_projections(module: AttentionModule) -> Projections:
    """``module``'s q / k / v / o weights and biases as :class:`Projections` (copies; the roles its
    ``transfer_slots`` name, the first path of each)."""
    scale = getattr(module, "scale", None)
    out = Projections(scale=float(scale) if isinstance(scale, (int, float)) else None)
    heads = int(getattr(module, "num_heads", 1))
    for role, paths in _slots(module).items():
        attr, i, n, per_head = _parse(paths[0])
        layer = module.get_submodule(attr)
        w = _weight_2d(layer.weight.detach())
        out.weight[role] = _rows(w, i, n, per_head, heads).reshape(-1, w.shape[-1]).clone()
        bias = getattr(layer, "bias", None)
        if bias is not None:
            out.bias[role] = _rows(bias.detach(), i, n, per_head, heads).reshape(-1).clone()
        elif isinstance(getattr(module, _BIAS_ATTR.get(role, ""), None), Tensor):
            out.bias[role] = getattr(module, _BIAS_ATTR[role]).detach().clone()
        else:
            out.bias[role] = None
    return out


@torch.no_grad()
def set_projections(module: AttentionModule, proj: Projections) -> tuple[list[str], list[str]]:
    """Write ``proj`` into ``module``'s slots -> ``(roles written, notes on what could not be)``.

    A role whose weight shape differs is left as it was (noted). A bias the target lacks is dropped: exact
    for the key (it adds the same logit to all keys of a query, which the softmax ignores), noted otherwise
    when it is non-zero; a bias the source lacks is written as zero.
    """
    done: list[str] = []
    notes: list[str] = []
    heads = int(getattr(module, "num_heads", 1))
    own_scale = getattr(module, "scale", None)
    ratio = 1.0  # queries rescaled so that the logits are the source's under this module's own scale
    if proj.scale is not None and isinstance(own_scale, (int, float)) and abs(proj.scale / own_scale - 1) > 1e-9:
        ratio = proj.scale / float(own_scale)
        notes.append(f"q: scaled by {ratio:.4g} (logit scale {own_scale:.4g} here, {proj.scale:.4g} in the source)")
    for role, paths in _slots(module).items():
        if role not in proj.weight:
            continue
        src_w, src_b = proj.weight[role], proj.bias.get(role)
        if role == "q" and ratio != 1.0:
            src_w, src_b = src_w * ratio, (src_b * ratio if src_b is not None else None)
        for path in paths:
            attr, i, n, per_head = _parse(path)
            layer = module.get_submodule(attr)
            w = _rows(layer.weight.view(layer.weight.shape[0], -1), i, n, per_head, heads)
            if w.numel() != src_w.numel() or w.shape[-1] != src_w.shape[-1]:
                notes.append(f"{role}: {list(src_w.shape)} does not fit {path} ({w.numel() // w.shape[-1]} rows of "
                             f"{w.shape[-1]}), left as initialised")
                break
            w.copy_(src_w.reshape(w.shape))
            bias = getattr(layer, "bias", None)
            own = _rows(bias, i, n, per_head, heads) if bias is not None else getattr(module, _BIAS_ATTR.get(role, ""),
                                                                                      None)
            if isinstance(own, Tensor):
                own.copy_(src_b.reshape(own.shape) if src_b is not None else torch.zeros_like(own))
            elif src_b is not None and role != "k" and bool(src_b.abs().max() > 0):
                notes.append(f"{role}: bias dropped ({path} has none)")
        else:
            done.append(role)
    lost = [r for r in ROLES if r in proj.weight and r not in _slots(module)]
    if lost:
        notes.append(f"{', '.join(lost)}: no counterpart here, not carried")
    return done, notes


def fit_offset_grid(grid: Tensor, size: tuple[int, int]) -> Tensor:
    """An offset-bias grid ``[nh, 2a-1, 2b-1]`` centred into ``size`` ``(2a'-1, 2b'-1)``: offsets beyond the
    source's reach are zero, those beyond the target's are dropped -> ``[nh, *size]``."""
    out = grid.new_zeros(grid.shape[0], *size)
    (sh, sw), (th, tw) = grid.shape[1:], size
    h, w = min(sh, th), min(sw, tw)
    out[:, (th - h) // 2:(th - h) // 2 + h, (tw - w) // 2:(tw - w) // 2 + w] = \
        grid[:, (sh - h) // 2:(sh - h) // 2 + h, (sw - w) // 2:(sw - w) // 2 + w]
    return out


@torch.no_grad()
def carry_attention(source: AttentionModule, target: AttentionModule) -> tuple[list[str], list[str]]:
    """Move what ``source`` learned into ``target`` (another mechanism, or the same with other options)
    -> ``(what was carried, notes)``, both lists of short phrases.

    Order: ``target.transfer_init()`` (neutral values for what has no counterpart), then the projections
    (:func:`set_projections`), the offset bias when both have one, then every other parameter and buffer of
    the same name and shape (qk-norms, tables of the same size). What is left keeps its initialisation.
    """
    carried: list[str] = []
    notes: list[str] = []
    notes += target.transfer_init()
    roles, more = set_projections(target, get_projections(source))
    notes += more
    if roles:
        carried.append("/".join(r for r in ROLES if r in roles) + " projections")
    written = {p.split(":")[0] for role in roles for p in _slots(target)[role]}
    grid = source.get_offset_bias()
    if grid is not None and target.set_offset_bias(grid):
        carried.append("offset bias")
        table = set(target.offset_bias_params)
        written |= table
        notes = [n for n in notes if n.split(":")[0] not in table]  # its neutral value was overwritten
    own, theirs = target.state_dict(), source.state_dict()
    same = [k for k, v in theirs.items()
            if k in own and k.rsplit(".", 1)[0] not in written and k not in written and own[k].shape == v.shape]
    if same:
        target.load_state_dict({k: theirs[k] for k in same}, strict=False)
        carried.append(", ".join(sorted({k.split(".")[0] for k in same if k.split(".")[0] not in written})))
    read = {p.split(":")[0] for paths in _slots(source).values() for p in paths} | set(_BIAS_ATTR.values())
    if "offset bias" in carried:
        read |= set(source.offset_bias_params)
    behind = sorted({k.split(".")[0] for k in theirs
                     if k not in same and k.split(".")[0] not in read and k.rsplit(".", 1)[0] not in read})
    if behind:
        notes.append(f"not carried from the source: {', '.join(behind)}")
    return [c for c in carried if c], notes


# where most mechanisms keep their projections: one packed Linear(C, 3C) [q | k | v] and ``proj``
PACKED_QKV_SLOTS: dict[str, str] = {"q": "qkv:0/3", "k": "qkv:1/3", "v": "qkv:2/3", "o": "proj"}


def _slot_text(path: str) -> str:
    attr, i, n, per_head = _parse(path)
    if n == 1:
        return f"`{attr}`"
    return f"`{attr}` (rows {i + 1} of {n}{', per head' if per_head else ''})"


def describe_transfer(module: AttentionModule) -> list[str]:
    """What :func:`carry_attention` does with ``module`` as the target, as Markdown lines (the docs' pages):
    where each role is written, what is set neutral (``transfer_init`` run on a copy), the offset bias."""
    import copy

    slots = _slots(module)
    roles = ", ".join(f"{role} -> {' and '.join(_slot_text(p) for p in slots[role])}"
                      for role in ROLES if role in slots)
    lines = [f"* projections carried in: {roles}" if roles else "* no projection is carried in"]
    missing = [r for r in ROLES if r not in slots]
    if missing:
        lines.append(f"* no counterpart for: {', '.join(missing)} (another mechanism's are left behind)")
    lines += [f"* set to add nothing: {n}" for n in copy.deepcopy(module).transfer_init()]
    if module.provides("set_offset_bias"):
        lines.append("* offset bias exchanged with the other mechanisms that have one (Swin's table, NAT's `rpb`): "
                     "exact on the offsets both cover, zero beyond the source's")
    return lines
