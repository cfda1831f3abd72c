"""What every model config dataclass shares: JSON round-trips."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TypeVar

T = TypeVar("T", bound="ConfigMixin")

__all__ = ["ConfigMixin"]


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
