"""What every model family shares: config JSON round-trips, argument checks, intermediate-index resolution.

The ``check_*`` helpers validate one config field each and raise an error that names the field
and what was expected. Configs call them from ``__post_init__``, so a bad value fails where it is
given (``create_model``, ``model_config``, ``from_dict``), never deep inside a constructor or a
forward pass; nothing here runs on the forward path.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Sequence
from typing import Any, TypeVar

from ..attention import get_attention_spec, list_attention
from ..layers.stage import resolve_indices

T = TypeVar("T", bound="ConfigMixin")

__all__ = ["ConfigMixin", "resolve_indices", "check_int", "check_float", "check_size", "check_int_seq",
           "check_choice", "check_attn_layer", "check_common", "check_width_heads"]


class ConfigMixin:
    """Checks on construction, ``to_dict`` / ``to_json`` / ``from_dict`` for a config dataclass.

    A family's config implements :meth:`validate`. It runs on construction (so ``create_model``
    and ``model_config`` fail at once) and again in the model's constructor (fields may be
    assigned after construction). JSON lists become tuples again in :meth:`from_dict`.
    """

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field and what it expects."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the fields."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        """The config as JSON text."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:
        """Inverse of :meth:`to_dict`: JSON lists (sizes, depths, widths) become tuples again."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value: Any, name: str, *, min_value: int = 1) -> int:
    """``value`` as an int ``>= min_value``; anything else raises naming ``name``.

    Not an int (a str, a float such as ``768.0``, a bool): ``TypeError``; out of range: ``ValueError``.
    """
    if not _is_int(value):
        raise TypeError(f"{name} must be an int >= {min_value}, got {value!r} ({type(value).__name__})")
    if value < min_value:
        raise ValueError(f"{name} must be an int >= {min_value}, got {value!r}")
    return int(value)


def check_float(value: Any, name: str, *, low: float = 0.0, high: float = math.inf, low_open: bool = False,
                high_open: bool = True) -> float:
    """``value`` as a finite real number in the interval from ``low`` to ``high``; else raises naming ``name``.

    ``low_open`` / ``high_open`` exclude the bound (default ``[low, high)``). Not a number: ``TypeError``.
    """
    if high == math.inf and low == -math.inf:
        interval = "finite"
    elif high == math.inf:
        interval = f"{'>' if low_open else '>='} {low:g}"
    else:
        interval = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number ({interval}), got {value!r} ({type(value).__name__})")
    v = float(value)
    below = v <= low if low_open else v < low
    above = v >= high if high_open else v > high
    if math.isnan(v) or below or above:
        raise ValueError(f"{name} must be {interval}, got {value!r}")
    return v


def check_size(value: Any, name: str, *, min_value: int = 1) -> tuple[int, int]:
    """An int or a pair of ints, each ``>= min_value`` (image, patch, window sizes) -> ``(h, w)``."""
    what = f"an int >= {min_value} or a pair of them"
    if _is_int(value):
        pair: tuple[Any, ...] = (value, value)
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        pair = tuple(value)
    else:
        raise TypeError(f"{name} must be {what}, got {value!r}")
    if not all(_is_int(v) for v in pair):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    if min(pair) < min_value:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(pair[0]), int(pair[1])


def check_int_seq(value: Any, name: str, *, min_value: int = 1, length: int | None = None) -> tuple[int, ...]:
    """A non-empty sequence of ints ``>= min_value`` (per-stage depths, heads); ``length`` if given."""
    what = f"a non-empty sequence of ints >= {min_value}"
    if length is not None:
        what = f"a sequence of {length} ints >= {min_value} (one per stage)"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    if not value or (length is not None and len(value) != length):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if not all(_is_int(v) for v in value):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    if min(value) < min_value:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return tuple(int(v) for v in value)


def check_width_heads(cfg: Any) -> tuple[int, int]:
    """``(embed_dim, num_heads)`` of a single-width config, each a positive int and the width divisible by the
    heads; else raises naming them."""
    dim = check_int(cfg.embed_dim, "embed_dim")
    heads = check_int(cfg.num_heads, "num_heads")
    if dim % heads:
        raise ValueError(f"embed_dim={dim} must be divisible by num_heads={heads} (head dim = embed_dim / num_heads)")
    return dim, heads


def check_common(cfg: Any, pools: Sequence[str] | None = ("avg", "")) -> tuple[int, int]:
    """The fields every family config has: ``img_size`` (an int or a pair), ``in_chans`` (>= 1), ``num_classes``
    (>= 0; 0: no head), every ``*_rate`` (a probability in ``[0, 1)``) and, unless ``pools`` is ``None``,
    ``global_pool`` (one of ``pools``); else raises naming the field -> ``img_size`` as ``(h, w)``."""
    img = check_size(cfg.img_size, "img_size")
    check_int(cfg.in_chans, "in_chans")
    check_int(cfg.num_classes, "num_classes", min_value=0)
    if pools is not None:
        check_choice(cfg.global_pool, "global_pool", pools)
    for f in dataclasses.fields(cfg):
        if f.name.endswith("_rate"):  # dropout and drop-path probabilities
            check_float(getattr(cfg, f.name), f.name, low=0.0, high=1.0)
    return img


def check_choice(value: Any, name: str, choices: Sequence[Any]) -> Any:
    """``value`` if it is one of ``choices``; else raises naming ``name`` and listing them."""
    if isinstance(value, (list, dict, set)) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def check_attn_layer(value: Any, kwargs: Any, *, layout: str | None = None) -> str:
    """A registered mechanism name (of ``layout``, when given) and a dict of its keywords; else raises naming them.

    Not a str: ``TypeError``; unknown: ``KeyError`` with close matches; another layout: ``ValueError``
    listing the mechanisms of the right one.
    """
    if not isinstance(value, str):
        raise TypeError(f"attn_layer must be a registered mechanism name (str), got {value!r}")
    try:
        spec = get_attention_spec(value)  # unknown mechanisms raise with suggestions
    except KeyError as e:
        raise KeyError(f"attn_layer: {e.args[0]}") from None
    if layout is not None and spec.layout != layout:
        fits = [n for n in list_attention() if get_attention_spec(n).layout == layout]
        raise ValueError(f"attn_layer must be a {layout} mechanism (one of {', '.join(map(repr, fits))}); "
                         f"got {value!r}, which takes {spec.layout}")
    if not isinstance(kwargs, dict):
        raise TypeError(f"attn_kwargs must be a dict of keyword arguments, got {kwargs!r}")
    return value
