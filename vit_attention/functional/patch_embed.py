"""Patch-embedding kernel resampling (FlexiViT, Beyer et al. 2023, "FlexiViT: one model for all patch sizes").

A patch kernel ``w`` of size ``P x P'`` is resized to ``Q x Q'`` so that the token it makes from
a patch ``x`` stays the same when the patch is resized with the data pipeline's resize:
``<x, w> = <resize(x), w'>``. With ``B`` the ``[Q·Q', P·P']`` matrix of that (linear) resize,
column ``j`` = ``resize(e_j)``, this asks ``Bᵀ w' = w``; the least-squares answer is
``w' = pinv(Bᵀ) w``. Upsampling (``Q >= P``) makes ``Bᵀ`` full row rank, so the identity is exact
(to fp32 rounding); downsampling loses information and ``w'`` is the least-squares fit.

This is timm's ``timm.layers.patch_embed.resample_patch_embed`` (the resize is
``F.interpolate(..., align_corners=False)``, bicubic with anti-aliasing by default); the
FlexiViT reference (big_vision) resizes with ``tf.image.resize(method="bilinear")`` instead.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["resample_patch_embed", "patch_resize_matrix"]

_MODES = ("bicubic", "bilinear", "nearest", "nearest-exact", "area")
_SMOOTH = ("bilinear", "bicubic")  # the modes that take align_corners and antialias


def _size_pair(size: int | Sequence[int], name: str) -> tuple[int, int]:
    items = (size,) if isinstance(size, numbers.Integral) else size
    if (isinstance(size, (str, bytes)) or not isinstance(items, Sequence)
            or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in items)
            or len(items) not in (1, 2) or min(int(v) for v in items) <= 0):
        raise ValueError(f"{name} must be a positive int or a pair of positive ints (height, width), got {size!r}")
    h = int(items[0])
    return (h, int(items[-1]))


def _check_mode(interpolation: str) -> None:
    if interpolation not in _MODES:
        raise ValueError(f"interpolation must be one of {', '.join(map(repr, _MODES))}; got {interpolation!r}")


def _resize(x: Tensor, size: tuple[int, int], interpolation: str, antialias: bool) -> Tensor:
    """``F.interpolate`` of ``x [N, 1, h, w]`` to ``size`` (align_corners=False; antialias for the smooth modes)."""
    if interpolation in _SMOOTH:
        return F.interpolate(x, size=size, mode=interpolation, align_corners=False, antialias=antialias)
    return F.interpolate(x, size=size, mode=interpolation)


@functools.lru_cache(maxsize=32)
def _resize_matrix_f64(old: tuple[int, int], new: tuple[int, int], interpolation: str, antialias: bool) -> Tensor:
    basis = torch.eye(old[0] * old[1], dtype=torch.float64).reshape(-1, 1, *old)  # [P·P', 1, P, P']
    out = _resize(basis, new, interpolation, antialias)  # [P·P', 1, Q, Q']: column j of B, as an image
    return out.reshape(old[0] * old[1], new[0] * new[1]).T.contiguous()  # B: [Q·Q', P·P']


@functools.lru_cache(maxsize=32)
def _pinv_f64(old: tuple[int, int], new: tuple[int, int], interpolation: str, antialias: bool) -> Tensor:
    return torch.linalg.pinv(_resize_matrix_f64(old, new, interpolation, antialias))  # pinv(B): [P·P', Q·Q']


def patch_resize_matrix(old_size: int | Sequence[int], new_size: int | Sequence[int], *,
                        interpolation: str = "bicubic", antialias: bool = True) -> Tensor:
    """The matrix ``B [Q·Q', P·P']`` (float64) of resizing a ``P x P'`` patch to ``Q x Q'``:
    ``resize(x).flatten() == B @ x.flatten()`` for a single-channel patch ``x``, rows and columns
    in raster order. Cached per ``(old, new, interpolation, antialias)``; a copy is returned."""
    _check_mode(interpolation)
    old, new = _size_pair(old_size, "old_size"), _size_pair(new_size, "new_size")
    return _resize_matrix_f64(old, new, interpolation, bool(antialias)).clone()


def resample_patch_embed(weight: Tensor, new_size: int | Sequence[int], *, interpolation: str = "bicubic",
                         antialias: bool = True) -> Tensor:
    """Resize a patch-embedding kernel ``[O, C, P, P']`` to ``[O, C, *new_size]`` by the pseudo-inverse
    of the patch resize (FlexiViT; timm's ``resample_patch_embed``).

    ``w' = pinv(Bᵀ) w`` per (out, in) channel pair, with ``B`` the matrix of
    ``F.interpolate(patch, new_size, mode=interpolation, antialias=antialias, align_corners=False)``
    (:func:`patch_resize_matrix`), so ``<x, w> == <resize(x), w'>`` for every patch ``x`` when
    upsampling, and in the least-squares sense when downsampling. The pseudo-inverse is computed
    once per ``(old, new, interpolation, antialias)`` in float64 on the CPU and cached; the product
    runs in float32 on ``weight``'s device and the result has ``weight``'s dtype. The same size
    returns ``weight`` itself.
    """
    if not isinstance(weight, Tensor) or weight.dim() != 4:
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a patch kernel [out, in, h, w], got {got}")
    _check_mode(interpolation)
    new = _size_pair(new_size, "new_size")
    old = (int(weight.shape[-2]), int(weight.shape[-1]))
    if old == new:
        return weight
    pinv = _pinv_f64(old, new, interpolation, bool(antialias)).to(device=weight.device, dtype=torch.float32)
    O, C = weight.shape[:2]
    out = weight.reshape(O, C, old[0] * old[1]).float() @ pinv  # [O, C, P·P'] @ [P·P', Q·Q'] = w · pinv(B)
    return out.reshape(O, C, *new).to(weight.dtype)  # [O, C, Q, Q']
