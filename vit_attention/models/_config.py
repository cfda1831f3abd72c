"""What every model family shares: config JSON round-trips, intermediate-index resolution."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T", bound="ConfigMixin")

__all__ = ["ConfigMixin", "resolve_indices"]


class ConfigMixin:
    """``to_dict`` / ``to_json`` / ``from_dict`` for a config dataclass (JSON lists become tuples)."""

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


def resolve_indices(indices: int | Sequence[int] | None, n: int, what: str = "block") -> list[int]:
    """``forward_intermediates`` indices -> sorted list in ``0..n-1``.

    ``None`` = all; an int ``k`` = the last ``k``; a sequence may use negative indices.
    """
    if indices is None:
        return list(range(n))
    if isinstance(indices, int):
        if not 0 < indices <= n:
            raise ValueError(f"indices={indices} must be in 1..{n}")
        return list(range(n - indices, n))
    take = [i + n if i < 0 else i for i in indices]
    if any(not 0 <= i < n for i in take):
        raise ValueError(f"{what} indices {list(indices)} out of range for {n} {what}s")
    return take
