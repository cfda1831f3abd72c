"""Registry of attention mechanisms: ``list_attention()``, ``create_attention(name, dim, num_heads)``.

Every mechanism registers its class with the layout it takes (``"tokens"`` = ``[B, N, C]`` or
``"spatial"`` = channels-last ``[B, H, W, C]``) and example keyword arguments that make it
valid on a small input, so tests, the CNN adapter and the study command can treat them alike.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

__all__ = ["AttentionSpec", "register_attention", "list_attention", "create_attention", "get_attention_spec"]

Layout = Literal["tokens", "spatial"]


@dataclass(frozen=True)
class AttentionSpec:
    """What the registry knows of one mechanism."""

    name: str
    cls: type[nn.Module]
    layout: Layout
    description: str = ""
    example_kwargs: dict[str, Any] = field(default_factory=dict)
    paper: str = ""


_ATTENTION: dict[str, AttentionSpec] = {}


def register_attention(
    name: str, *, layout: Layout, description: str = "", example_kwargs: dict[str, Any] | None = None,
    paper: str = "",
) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator adding a mechanism to the registry under ``name``."""
    if layout not in ("tokens", "spatial"):
        raise ValueError(f"layout must be 'tokens' or 'spatial', got {layout!r}")

    def deco(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _ATTENTION and _ATTENTION[name].cls is not cls:
            raise ValueError(f"attention {name!r} is already registered to {_ATTENTION[name].cls.__name__}")
        _ATTENTION[name] = AttentionSpec(name, cls, layout, description or (cls.__doc__ or "").split("\n")[0],
                                         dict(example_kwargs or {}), paper)
        cls.registry_name = name  # type: ignore[attr-defined]
        cls.layout = layout  # type: ignore[attr-defined]
        return cls

    return deco


def list_attention(pattern: str = "*") -> list[str]:
    """Registered mechanism names matching a glob ``pattern``, sorted."""
    return sorted(n for n in _ATTENTION if fnmatch.fnmatch(n, pattern))


def get_attention_spec(name: str) -> AttentionSpec:
    """The :class:`AttentionSpec` of ``name``; unknown names raise with close matches."""
    try:
        return _ATTENTION[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_ATTENTION), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"unknown attention mechanism {name!r}{hint} (see list_attention())") from None


def create_attention(name: str, dim: int, num_heads: int, **kwargs: Any) -> nn.Module:
    """Build mechanism ``name`` for width ``dim`` with ``num_heads`` heads.

    Token mechanisms map ``[B, N, C] -> [B, N, C]``, spatial ones ``[B, H, W, C] -> [B, H, W, C]``.
    """
    return get_attention_spec(name).cls(dim, num_heads, **kwargs)
