"""2-D rotary position embeddings (RoPE): token coordinates, rotation angles, and the rotation itself.

RoPE rotates each query and key channel pair by an angle that depends on the token's position, so
``q·k`` depends on the positions' difference only (Su et al. 2021; 2-D: Heo et al. 2024, EVA-02,
DINOv3). For a patch at grid cell ``(y, x)`` and head width ``hd``::

    angles  = [θ_0 .. θ_{hd/2-1}]                      # one angle per channel pair
    axial:    angles = [c_y·f_0 .. c_y·f_{nb-1}, c_x·f_0 .. c_x·f_{nb-1}]   (nb = hd/4; axes in ``axes`` order)
              f_i = scale · theta^(-i/nb)
    mixed:    angles_j = c_x·fx_j + c_y·fy_j           # learned per-head frequencies (RoPE-Mixed)
    rope(t) = t·cos(angles') + R(t)·sin(angles')       # angles' = the angles spread to hd channels

Two channel layouts (they must match the checkpoint; the rule of timm 1.0.31 ``EvaAttention`` /
``AttentionRope`` and of transformers' DINOv3):

* ``"interleaved"`` (EVA-02, RoPE-ViT): pairs are channels ``(2i, 2i+1)``; ``R(t) = [-t1, t0, -t3, t2, ...]``
  and ``angles' = repeat_interleave(angles, 2)``;
* ``"half"`` (DINOv3): pairs are ``(i, i + hd/2)``; ``R(t) = [-t_{hd/2:}, t_{:hd/2}]`` and
  ``angles' = cat(angles, angles)``.

Coordinates (:func:`rope_coords`), per axis of length ``L``:

* ``"index"``: ``0 .. L-1`` (RoPE-ViT);
* ``"ref"``: ``index · ref / L``, rescaled to a reference grid (EVA-02: ``ref = 16`` for 224 / 14);
* ``"centered"``: patch centres in ``(-1, 1)``, ``(index + 0.5) / L · 2 - 1`` (DINOv3).

Prefix tokens (class, registers) are not rotated: :func:`apply_rope` skips the first
``num_prefix_tokens`` rows. Values are never rotated and the softmax scale does not change.
Angles, sines and cosines are float32 whatever the activations' dtype; the rotation runs in the promoted dtype and
is cast back to the activations' once (timm and the originals; HF DINOv3 casts the tables first).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from .window import _cached

__all__ = ["ROPE_LAYOUTS", "ROPE_COORDS", "rope_coords", "grid_positions_to_coords", "axial_rope_angles",
           "mixed_rope_angles",
           "rope_cos_sin", "rotate_pairs", "apply_rope",
           "axial_rope_tables", "TWO_PI"]

RopeLayout = Literal["interleaved", "half"]
RopeCoords = Literal["index", "ref", "centered"]
ROPE_LAYOUTS: tuple[str, ...] = ("interleaved", "half")
ROPE_COORDS: tuple[str, ...] = ("index", "ref", "centered")
TWO_PI = 2.0 * math.pi  # DINOv3's angle factor (convention "dinov3": scale = 2π)


def _axis(length: int, coords: str, ref: float | None, device: torch.device | str | None) -> Tensor:
    return _map_axis(torch.arange(length, dtype=torch.float32, device=device), length, coords, ref)


def _map_axis(t: Tensor, length: int | Tensor, coords: str, ref: float | None) -> Tensor:
    """Grid indices ``t`` (float, possibly fractional) on an axis of ``length`` tokens (an int, or a tensor
    broadcastable to ``t``: one length per sample) -> ``coords`` coordinates."""
    if coords == "index":
        return t
    if coords == "ref":
        if ref is None:
            raise ValueError("coords='ref' needs ref_feat_shape (the grid the model was trained on)")
        return t / length * float(ref)  # timm's rounding order (index / size · ref)
    if coords == "centered":
        return (t + 0.5) / length * 2.0 - 1.0
    raise ValueError(f"coords must be one of {', '.join(map(repr, ROPE_COORDS))}; got {coords!r}")


def rope_coords(feat_size: tuple[int, int], coords: RopeCoords = "index", *,
                ref_feat_shape: tuple[int, int] | None = None,
                device: torch.device | str | None = None) -> Tensor:
    """Coordinates of the ``H x W`` grid's tokens in row-major order, ``-> [H·W, 2]`` float32, columns ``(y, x)``.

    ``coords``: ``"index"`` | ``"ref"`` (needs ``ref_feat_shape``) | ``"centered"`` (module docstring).
    """
    H, W = int(feat_size[0]), int(feat_size[1])
    if H < 1 or W < 1:
        raise ValueError(f"feat_size must be two positive ints, got {tuple(feat_size)}")
    ref_h, ref_w = (None, None) if ref_feat_shape is None else ref_feat_shape
    y = _axis(H, coords, ref_h, device)
    x = _axis(W, coords, ref_w, device)
    yy, xx = torch.meshgrid(y, x, indexing="ij")
    return torch.stack([yy.reshape(-1), xx.reshape(-1)], dim=-1)  # [H·W, 2]


def grid_positions_to_coords(positions: Tensor, feat_size: tuple[int, int] | Tensor, coords: RopeCoords = "index",
                             *, ref_feat_shape: tuple[int, int] | None = None) -> Tensor:
    """Grid positions ``[..., 2]`` (float ``(y, x)`` indices, fractional for merged tokens) on the ``feat_size``
    grid -> the same points in ``coords`` coordinates (:func:`rope_coords` of integer positions).

    ``feat_size``: ``(H, W)``, or a tensor ``[..., 2]`` broadcastable to ``positions`` (each sample's own
    grid, e.g. ``[B, 1, 2]`` for positions ``[B, L, 2]``: no host read, one graph under ``torch.compile``)."""
    ref_h, ref_w = (None, None) if ref_feat_shape is None else ref_feat_shape
    if isinstance(feat_size, Tensor):
        h, w = feat_size[..., 0], feat_size[..., 1]
    else:
        h, w = int(feat_size[0]), int(feat_size[1])
    y = _map_axis(positions[..., 0].float(), h, coords, ref_h)
    x = _map_axis(positions[..., 1].float(), w, coords, ref_w)
    return torch.stack([y, x], dim=-1)


def axial_rope_angles(coords: Tensor, head_dim: int, *, theta: float = 100.0, scale: float = 1.0,
                      axes: Literal["yx", "xy"] = "yx") -> Tensor:
    """Axial angles: ``coords [N, 2]`` (y, x) -> ``[N, hd/2]`` (``hd/4`` bands per axis, ``axes`` order).

    Band ``i`` of ``nb = hd/4`` has the period ``p_i = theta^(i/nb)`` and the angle ``scale · c / p_i``
    (EVA-02: theta 10000; RoPE-ViT: 100; DINOv3: 100 with ``scale = 2π``). Rounded as the references
    round: ``c · (1 / p_i)`` with ``scale = 1`` (timm ``freq_bands``), ``(scale · c) / p_i`` otherwise
    (DINOv3's ``2π · coords / periods``); the two differ by float32 rounding only.
    """
    if head_dim % 4:
        raise ValueError(f"axial RoPE needs a head dim divisible by 4 (hd/4 bands per axis), got {head_dim}")
    if axes not in ("yx", "xy"):
        raise ValueError(f"axes must be 'yx' or 'xy', got {axes!r}")
    nb = head_dim // 4
    periods = float(theta) ** (torch.arange(nb, dtype=torch.float32, device=coords.device) / nb)  # [nb]
    c = coords.float()
    c = c[:, [0, 1]] if axes == "yx" else c[:, [1, 0]]  # [N, 2] in the angle order
    if scale == 1.0:
        angles = c[:, :, None] * (1.0 / periods)  # [N, 2, nb]
    else:
        angles = (scale * c[:, :, None]) / periods
    return angles.flatten(1)  # [N, hd/2]: the first axis's nb bands, then the second's


def mixed_rope_angles(coords: Tensor, freqs: Tensor) -> Tensor:
    """RoPE-Mixed angles: ``coords [N, 2]`` (y, x), learned ``freqs [2, nh, hd/2]`` (x row first, then y)
    -> ``[nh, N, hd/2]``, ``angle = c_x·fx + c_y·fy``."""
    if freqs.dim() != 3 or freqs.shape[0] != 2:
        raise ValueError(f"freqs must be [2, num_heads, head_dim/2], got {tuple(freqs.shape)}")
    c = coords.to(freqs.dtype)
    return c[None, :, 1:2] * freqs[0][:, None, :] + c[None, :, 0:1] * freqs[1][:, None, :]  # [nh, N, hd/2]


def rope_cos_sin(angles: Tensor, layout: RopeLayout = "interleaved") -> tuple[Tensor, Tensor]:
    """Angles ``[..., hd/2]`` -> ``(cos, sin)``, each ``[..., hd]`` spread to the channels of ``layout``."""
    if layout == "interleaved":
        full = angles.repeat_interleave(2, dim=-1)
    elif layout == "half":
        full = torch.cat([angles, angles], dim=-1)
    else:
        raise ValueError(f"layout must be one of {', '.join(map(repr, ROPE_LAYOUTS))}; got {layout!r}")
    return full.cos(), full.sin()


def rotate_pairs(t: Tensor, layout: RopeLayout = "interleaved") -> Tensor:
    """``R(t)``: each channel pair ``(a, b) -> (-b, a)``, ``[..., hd] -> [..., hd]`` (pairs per ``layout``)."""
    if layout == "interleaved":
        pairs = t.unflatten(-1, (-1, 2))  # [..., hd/2, 2]
        return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    a, b = t.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(t: Tensor, cos: Tensor, sin: Tensor, *, num_prefix_tokens: int = 0,
               layout: RopeLayout = "interleaved") -> Tensor:
    """Rotate queries or keys ``t [B, nh, P + N, hd]`` (the first ``P = num_prefix_tokens`` rows untouched)
    by ``cos`` / ``sin`` ``[N, hd]`` or per head ``[nh, N, hd]`` -> ``[B, nh, P + N, hd]`` in ``t``'s dtype.

    The product runs in the promoted dtype of ``t`` and the tables (float32 tables keep a bf16 ``t``'s
    rotation in float32 until the one cast back).
    """
    P = int(num_prefix_tokens)
    if t.shape[-2] - P != cos.shape[-2] or t.shape[-1] != cos.shape[-1]:
        raise ValueError(f"rope tables {tuple(cos.shape)} do not fit {t.shape[-2] - P} grid tokens of width "
                         f"{t.shape[-1]} (t {tuple(t.shape)}, num_prefix_tokens={P})")
    grid = t[..., P:, :] if P else t
    # float32 tables: a low-precision t is promoted, rotated, and cast back once (timm, the EVA-02 / DINOv3
    # originals; HF DINOv3 casts the tables to the activations' dtype first, a bf16 rounding apart)
    rotated = (grid * cos + rotate_pairs(grid, layout) * sin).to(t.dtype)
    return torch.cat([t[..., :P, :], rotated], dim=-2) if P else rotated


@_cached(maxsize=64)
def _axial_tables(feat_size: tuple[int, int], head_dim: int, theta: float, scale: float, axes: str, coords: str,
                  ref_feat_shape: tuple[int, int] | None, layout: str, device: torch.device
                  ) -> tuple[Tensor, Tensor]:
    c = rope_coords(feat_size, coords, ref_feat_shape=ref_feat_shape, device="cpu")  # type: ignore[arg-type]
    cos, sin = rope_cos_sin(axial_rope_angles(c, head_dim, theta=theta, scale=scale, axes=axes),  # type: ignore[arg-type]
                            layout)  # type: ignore[arg-type]
    return cos.to(device), sin.to(device)


def axial_rope_tables(feat_size: tuple[int, int], head_dim: int, *, theta: float = 100.0, scale: float = 1.0,
                      axes: Literal["yx", "xy"] = "yx", coords: RopeCoords = "index",
                      ref_feat_shape: tuple[int, int] | None = None, layout: RopeLayout = "interleaved",
                      device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` ``[H·W, hd]`` float32 of axial RoPE on the ``feat_size`` grid (cached per arguments: the
    tables have no parameters, so a cache hit is always current; built outside inference mode and captures)."""
    ref = None if ref_feat_shape is None else (int(ref_feat_shape[0]), int(ref_feat_shape[1]))
    return _axial_tables((int(feat_size[0]), int(feat_size[1])), int(head_dim), float(theta), float(scale), axes,
                         coords, ref, layout, torch.device(device if device is not None else "cpu"))
