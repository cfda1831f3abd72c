"""Checkpoint layouts: detection and conversion to our (timm-compatible) key layout.

Each model family registers converters: ``(layout name, detect(state) -> bool,
convert(state, model) -> state)`` and optionally an ``adapt(state, model, report)`` step that
fits shapes to the model (position-embedding grids, relative-position tables, heads).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["Converter", "register_converter", "register_adapter", "converters_for", "adapters_for",
           "model_family", "rename", "concat_qkv"]

State = dict[str, Tensor]


@dataclass(frozen=True)
class Converter:
    """Maps one foreign layout of one family onto ours."""

    family: str
    layout: str
    detect: Callable[[Mapping[str, Tensor]], bool]
    convert: Callable[[State, nn.Module], State]


_CONVERTERS: list[Converter] = []
_ADAPTERS: dict[str, list[Callable[..., State]]] = {}


def register_converter(family: str, layout: str, detect: Callable[[Mapping[str, Tensor]], bool],
                       convert: Callable[[State, nn.Module], State]) -> None:
    """Add a converter for ``layout`` checkpoints of models of ``family``."""
    _CONVERTERS.append(Converter(family, layout, detect, convert))


def register_adapter(family: str, adapt: Callable[..., State]) -> None:
    """Add a shape-fitting step run after conversion for models of ``family``."""
    _ADAPTERS.setdefault(family, []).append(adapt)


def converters_for(family: str) -> list[Converter]:
    """Converters registered for ``family``, in registration order."""
    return [c for c in _CONVERTERS if c.family == family]


def adapters_for(family: str) -> list[Callable[..., State]]:
    """Adapters registered for ``family``."""
    return list(_ADAPTERS.get(family, []))


def model_family(model: nn.Module) -> str:
    """The family name a model class declares (``family`` attribute)."""
    family = getattr(type(model), "family", None)
    if not family:
        raise TypeError(f"{type(model).__name__} declares no checkpoint family; cannot convert foreign layouts")
    return str(family)


def rename(state: Mapping[str, Tensor], rules: Iterable[tuple[str, str]]) -> State:
    """Apply regex ``(pattern, replacement)`` rules to every key, in order."""
    compiled = [(re.compile(p), r) for p, r in rules]
    out: State = {}
    for k, v in state.items():
        for pat, rep in compiled:
            k = pat.sub(rep, k)
        out[k] = v
    return out


def concat_qkv(state: State, pattern: str, q: str, k: str, v: str, target: str) -> State:
    """Merge separate q / k / v tensors into one packed ``target`` (``[q | k | v]`` along dim 0).

    ``pattern`` is a regex with one group capturing the block prefix, matched against q keys,
    e.g. ``r"(blocks\\.\\d+\\.attn)\\.q\\.(weight|bias)"``; ``q``, ``k``, ``v`` and ``target`` are
    format strings with ``{p}`` (prefix) and ``{s}`` (suffix).
    """
    rx = re.compile(pattern)
    for key in list(state):
        m = rx.fullmatch(key)
        if not m:
            continue
        p, s = m.group(1), m.group(2)
        parts = [state.pop(fmt.format(p=p, s=s)) for fmt in (q, k, v)]
        state[target.format(p=p, s=s)] = torch.cat(parts, dim=0)
    return state
