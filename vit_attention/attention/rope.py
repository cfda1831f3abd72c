"""Rotary position embedding for the token mechanisms: :class:`RotaryEmbedding` (axial or mixed 2-D RoPE).

Not a mechanism itself: a mechanism that knows its grid builds one from its ``rope`` / ``rope_kwargs``
keywords (:func:`make_rope`) and calls it on q and k after any qk-norm, before the product (the rule
of EVA-02, DINOv3 and RoPE-ViT; timm 1.0.31 ``layers/pos_embed_sincos.py``). The math lives in
:mod:`vit_attention.functional.rope`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..functional.rope import (
    ROPE_COORDS,
    ROPE_LAYOUTS,
    TWO_PI,
    apply_rope,
    axial_rope_angles,
    axial_rope_tables,
    grid_positions_to_coords,
    mixed_rope_angles,
    rope_coords,
    rope_cos_sin,
)
from .base import grid_of

__all__ = ["RotaryEmbedding", "ROPE_KINDS", "ROPE_CONVENTIONS", "make_rope"]

ROPE_KINDS: tuple[str, ...] = ("axial", "mixed")
# the axial conventions of the published models (timm 1.0.31 ``eva.py`` / ``rope_vit`` presets, DINOv3's
# ``rope_position_encoding.py``): frequencies, coordinates, channel layout
ROPE_CONVENTIONS: dict[str, dict[str, Any]] = {
    # DINOv3: periods 100^(4j/hd), patch centres in (-1, 1), angle 2π·c/period, (y, x), half-split channels
    "dinov3": dict(theta=100.0, scale=TWO_PI, coords="centered", layout="half", axes="yx"),
    # EVA-02: 10000^(-i/nb), index rescaled to the pretraining grid (ref_feat_shape), (y, x), interleaved
    "eva": dict(theta=10000.0, scale=1.0, coords="ref", layout="interleaved", axes="yx"),
    # RoPE-ViT axial (Heo et al. 2024): 100^(-4i/hd), integer index, (x, y), interleaved
    "naver": dict(theta=100.0, scale=1.0, coords="index", layout="interleaved", axes="xy"),
}


class RotaryEmbedding(nn.Module):
    """2-D RoPE for ``q, k [B, nh, P + H·W, hd]`` -> the same, the ``P`` prefix tokens left unrotated.

    ``kind="axial"``: fixed frequencies, half of each head's channel pairs turn with ``y`` and half
    with ``x``; ``convention`` picks the published rule (``"dinov3"`` default, ``"eva"``, ``"naver"``;
    :data:`ROPE_CONVENTIONS`), and ``theta`` / ``scale`` / ``coords`` / ``ref_feat_shape`` /
    ``layout`` / ``axes`` override its parts. No parameters, no state.

    ``kind="mixed"`` (RoPE-Mixed, Heo et al. 2024): learned frequencies ``freqs [2, nh, hd/2]``
    (key ``freqs``; rows x then y), every pair turning with ``fx·x + fy·y``; integer coordinates,
    interleaved channels; initialised as the paper does (magnitudes ``theta^(-4i/hd)``, theta 10,
    a random direction per head).

    Coordinates come from ``feat_size`` on every call, so any grid size and aspect works.
    """

    def __init__(self, head_dim: int, num_heads: int, kind: str = "axial", *, convention: str | None = None,
                 theta: float | None = None, scale: float | None = None, coords: str | None = None,
                 ref_feat_shape: tuple[int, int] | None = None, layout: str | None = None,
                 axes: str | None = None) -> None:
        super().__init__()
        if kind not in ROPE_KINDS:
            raise ValueError(f"rope must be one of {', '.join(map(repr, ROPE_KINDS))}; got {kind!r}")
        if head_dim % 4:
            raise ValueError(f"rope={kind!r} needs a head dim divisible by 4 (two axes of channel pairs), "
                             f"got {head_dim}")
        self.kind, self.head_dim, self.num_heads = kind, int(head_dim), int(num_heads)
        if kind == "axial":
            convention = convention or "dinov3"
            if convention not in ROPE_CONVENTIONS:
                raise ValueError(f"convention must be one of {', '.join(map(repr, ROPE_CONVENTIONS))}; "
                                 f"got {convention!r}")
            base = dict(ROPE_CONVENTIONS[convention])
        else:
            if convention is not None:
                raise ValueError("convention applies to rope='axial' only (rope='mixed' learns its frequencies)")
            base = dict(theta=10.0, scale=1.0, coords="index", layout="interleaved", axes="xy")
        given = dict(theta=theta, scale=scale, coords=coords, layout=layout, axes=axes)
        opts = {**base, **{k: v for k, v in given.items() if v is not None}}
        if opts["coords"] not in ROPE_COORDS:
            raise ValueError(f"coords must be one of {', '.join(map(repr, ROPE_COORDS))}; got {opts['coords']!r}")
        if opts["layout"] not in ROPE_LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(map(repr, ROPE_LAYOUTS))}; got {opts['layout']!r}")
        if opts["axes"] not in ("yx", "xy"):
            raise ValueError(f"axes must be 'yx' or 'xy', got {opts['axes']!r}")
        if not (isinstance(opts["theta"], (int, float)) and opts["theta"] > 0):
            raise ValueError(f"theta must be a positive number, got {opts['theta']!r}")
        if ref_feat_shape is not None:
            ref_feat_shape = (int(ref_feat_shape[0]), int(ref_feat_shape[1]))
        if opts["coords"] == "ref" and ref_feat_shape is None:
            raise ValueError("coords='ref' (convention 'eva') needs ref_feat_shape, the pretraining grid "
                             "(EVA-02 at 224 with patch 14: (16, 16))")
        self.convention = convention
        self.theta, self.scale = float(opts["theta"]), float(opts["scale"])
        self.coords, self.layout, self.axes = opts["coords"], opts["layout"], opts["axes"]
        self.ref_feat_shape = ref_feat_shape
        if kind == "mixed":
            self.freqs = nn.Parameter(torch.empty(2, num_heads, head_dim // 2))
            self.reset_parameters()
        else:
            self.freqs = None  # type: ignore[assignment]

    def reset_parameters(self) -> None:
        """RoPE-Mixed init: per head a random direction φ; pair ``i`` of each half turns at ``theta^(-4i/hd)``
        along φ (first half) and φ + π/2 (second half)."""
        if self.freqs is None:
            return
        nb = self.head_dim // 4
        mag = self.theta ** (-torch.arange(nb, dtype=torch.float32) * 4 / self.head_dim)  # [hd/4]
        with torch.no_grad():
            phi = torch.rand(self.num_heads, 1) * 2 * math.pi  # [nh, 1]
            fx = torch.cat([mag * torch.cos(phi), mag * torch.cos(phi + math.pi / 2)], dim=-1)  # [nh, hd/2]
            fy = torch.cat([mag * torch.sin(phi), mag * torch.sin(phi + math.pi / 2)], dim=-1)
            self.freqs.copy_(torch.stack([fx, fy]).to(self.freqs.device))

    def tables(self, feat_size: tuple[int, int], device: torch.device | None = None) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` for the ``feat_size`` grid: ``[H·W, hd]`` (axial) or ``[nh, H·W, hd]`` (mixed), float32."""
        if self.freqs is None:
            return axial_rope_tables(feat_size, self.head_dim, theta=self.theta, scale=self.scale,
                                     axes=self.axes, coords=self.coords,  # type: ignore[arg-type]
                                     ref_feat_shape=self.ref_feat_shape, layout=self.layout,  # type: ignore[arg-type]
                                     device=device)
        c = rope_coords(feat_size, self.coords, device=self.freqs.device)  # type: ignore[arg-type]
        return rope_cos_sin(mixed_rope_angles(c, self.freqs.float()), self.layout)  # type: ignore[arg-type]

    def batch_tables(self, coords: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Per-sample tables for a packed NaFlex batch: ``coords [B, L, 2]`` (int ``(y, x)`` grid index of each
        token), ``valid [B, L]`` bool (None = all valid) -> ``(cos, sin)`` ``[B, 1, L, hd]`` (axial) or
        ``[B, nh, L, hd]`` (mixed), float32.

        Each sample's grid is ``(max y + 1, max x + 1)`` over its valid rows; a valid token gets the entry of
        its coordinate in that grid's table (so ``coords`` of a full grid give :meth:`tables`), a padding
        row the identity rotation (cos 1, sin 0). Computed per token with the grids kept on the device: no
        host read and no loop over samples, so a packed batch stays one graph under ``torch.compile``."""
        B, L, _ = coords.shape
        valid_b = torch.ones(B, L, dtype=torch.bool, device=coords.device) if valid is None else valid.bool()
        c = coords.long() * valid_b[..., None]  # [B, L, 2]: padding rows -> (0, 0)
        grids = c.amax(dim=1, keepdim=True) + 1  # [B, 1, 2]: each sample's (h, w), kept on the device (no sync)
        cos, sin = self._tables_on(c.float(), grids)  # [B, 1 or nh, L, hd]
        keep = valid_b[:, None, :, None]  # padding rows: the identity rotation
        return torch.where(keep, cos, 1.0), torch.where(keep, sin, 0.0)

    def tables_at(self, positions: Tensor, feat_size: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` at grid ``positions [B, L, 2]`` (float ``(y, x)`` indices on the ``feat_size`` grid,
        fractional for merged tokens: :class:`~vit_attention.functional.tome.TokenMergeState`) ->
        ``[B, 1, L, hd]`` (axial) or ``[B, nh, L, hd]`` (mixed), float32. Integer positions of the whole
        grid give :meth:`tables`."""
        return self._tables_on(positions, feat_size)

    def _tables_on(self, positions: Tensor, feat_size: tuple[int, int] | Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`tables_at` where ``feat_size`` may also be a tensor ``[B, 1, 2]`` (one grid per sample)."""
        B, L, _ = positions.shape
        c = grid_positions_to_coords(positions, feat_size, self.coords,  # type: ignore[arg-type]
                                     ref_feat_shape=self.ref_feat_shape).reshape(B * L, 2)  # [B·L, 2]
        if self.freqs is None:
            angles = axial_rope_angles(c, self.head_dim, theta=self.theta, scale=self.scale,
                                       axes=self.axes)  # type: ignore[arg-type]
            angles = angles.view(B, 1, L, -1)  # [B, 1, L, hd/2]
        else:
            angles = mixed_rope_angles(c, self.freqs.float()).view(self.num_heads, B, L, -1).transpose(0, 1)
        return rope_cos_sin(angles, self.layout)  # type: ignore[arg-type]

    def forward(self, q: Tensor, k: Tensor, feat_size: tuple[int, int] | None = None,
                num_prefix_tokens: int = 0, *, coords: Tensor | None = None,
                valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Rotate ``q, k [B, nh, P + H·W, hd]`` (``P = num_prefix_tokens``; ``feat_size`` ``(H, W)``, or a
        square grid when None) -> the same shapes.

        ``coords [B, L, 2]`` (with ``valid [B, L]``): a packed NaFlex batch of ``L`` grid tokens per sample,
        each sample on its own grid (:meth:`batch_tables`; padding rows unrotated); ``feat_size`` unused."""
        P = int(num_prefix_tokens)
        if coords is not None:
            if coords.shape[:2] != (q.shape[0], q.shape[-2] - P):
                raise ValueError(f"coords {tuple(coords.shape)} do not fit {q.shape[-2] - P} grid tokens of "
                                 f"batch {q.shape[0]}")
            cos, sin = self.batch_tables(coords, valid)
            return (apply_rope(q, cos, sin, num_prefix_tokens=P, layout=self.layout),  # type: ignore[arg-type]
                    apply_rope(k, cos, sin, num_prefix_tokens=P, layout=self.layout))  # type: ignore[arg-type]
        grid = grid_of(q.shape[-2] - P, feat_size)
        cos, sin = self.tables(grid, q.device)
        return (apply_rope(q, cos, sin, num_prefix_tokens=P, layout=self.layout),  # type: ignore[arg-type]
                apply_rope(k, cos, sin, num_prefix_tokens=P, layout=self.layout))  # type: ignore[arg-type]

    def flops(self, num_tokens: int) -> int:
        """Multiply-adds of one call on ``num_tokens`` grid tokens: q and k, two products per channel."""
        return 2 * 2 * num_tokens * self.num_heads * self.head_dim

    def extra_repr(self) -> str:
        conv = f", convention={self.convention!r}" if self.convention else ""
        return (f"kind={self.kind!r}{conv}, theta={self.theta:g}, coords={self.coords!r}, layout={self.layout!r}, "
                f"axes={self.axes!r}")


def make_rope(rope: str | None, rope_kwargs: Mapping[str, Any] | None, head_dim: int, num_heads: int
              ) -> RotaryEmbedding | None:
    """A mechanism's ``rope`` / ``rope_kwargs`` keywords -> its :class:`RotaryEmbedding` (None without ``rope``)."""
    if rope is None:
        if rope_kwargs:
            raise ValueError(f"rope_kwargs={dict(rope_kwargs)!r} given without rope; pass rope='axial' or 'mixed'")
        return None
    if not isinstance(rope, str):
        raise ValueError(f"rope must be one of {', '.join(map(repr, ROPE_KINDS))} or None; got {rope!r}")
    return RotaryEmbedding(head_dim, num_heads, rope, **dict(rope_kwargs or {}))
