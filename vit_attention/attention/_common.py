"""Argument checks shared by the attention modules."""

from __future__ import annotations

from typing import Any


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


def check_spatial_call(module: Any, x: Any, feat_size: Any, num_prefix_tokens: int, context: Any,
                       residual: Any = None) -> tuple[int, int, int, int]:
    """The contract checks of a spatial mechanism's call; returns ``(B, H, W, C)`` of ``x [B, H, W, C]``.

    ``feat_size`` must be the map's own ``(H, W)`` when given; a spatial mechanism never sees prefix
    tokens (``num_prefix_tokens`` must be 0) nor a ``context``; ``residual`` (the blocks' private
    speed keyword) must have ``x``'s shape.
    """
    name = type(module).__name__
    if x.dim() != 4 or x.shape[-1] != module.dim:
        raise ValueError(f"{name} expects a channels-last map [B, H, W, {module.dim}], got shape {tuple(x.shape)}")
    B, H, W, C = x.shape
    if feat_size is not None and tuple(feat_size) != (H, W):
        raise ValueError(f"feat_size={tuple(feat_size)} does not match the map's {H}x{W}")
    if num_prefix_tokens:
        raise ValueError(f"num_prefix_tokens={num_prefix_tokens}: a spatial mechanism never sees prefix tokens "
                         "(apply it through vit_attention.layers.adapter.apply_attention)")
    if context is not None:
        raise ValueError(f"{name} attends within the map; it takes no context")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have the input's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    return B, H, W, C
