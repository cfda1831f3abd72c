"""Size arithmetic shared by every layer: channel rounding (no tensors, no modules)."""

from __future__ import annotations

__all__ = ["make_divisible"]


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None, round_limit: float = 0.9) -> int:
    """``v`` rounded to the nearest multiple of ``divisor`` (at least ``min_value``, default ``divisor``),
    one step up when rounding lost more than ``1 - round_limit`` of it (MobileNet / timm / ml-cvnets rule)."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v
