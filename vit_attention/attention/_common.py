"""Argument checks shared by the attention modules."""

from __future__ import annotations


def check_heads(dim: int, num_heads: int, what: str = "dim") -> int:
    """Validate ``dim % num_heads == 0`` and return the head dim ``hd``."""
    if not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    if not isinstance(dim, int) or dim <= 0:
        raise ValueError(f"{what} must be a positive int, got {dim!r}")
    if dim % num_heads:
        raise ValueError(f"{what}={dim} must be divisible by num_heads={num_heads} (got remainder {dim % num_heads})")
    return dim // num_heads


def check_prob(p: float, name: str) -> float:
    """Validate a dropout probability in [0, 1)."""
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p!r}")
    return float(p)
