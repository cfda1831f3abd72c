"""NaFlex data side: resize each image keeping its aspect to fit a token budget, patchify, pad, batch.

:func:`size_for_seq_len` is timm's ``get_image_size_for_seq`` rule (``ResizeKeepRatioToSequence``): a
binary search for the largest scale ``r`` with ``ceil(h·r/p)·ceil(w·r/p) <= max_seq_len``, each side
rounded **up** to a multiple of the patch and at least one patch. :class:`NaFlexCollate` turns a list of
``(image [C, H, W], label)`` into the packed batch :class:`~vit_attention.models.naflexvit.NaFlexVit` takes
(``patches [B, L, p·p·C]``, ``patch_coord [B, L, 2]``, ``patch_valid [B, L]``, zero-padded to
``max_seq_len``) and the labels; :func:`bucket_by_seq_len` groups indices of similar token counts so a
batch wastes little padding.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.naflexvit import patchify_images

__all__ = ["size_for_seq_len", "resize_to_seq_len", "NaFlexCollate", "bucket_by_seq_len"]


def _pair(p: int | Sequence[int]) -> tuple[int, int]:
    return (int(p), int(p)) if isinstance(p, int) else (int(p[0]), int(p[1]))


def size_for_seq_len(hw: tuple[int, int], patch_size: int | Sequence[int], max_seq_len: int, *,
                     max_ratio: float | None = None, eps: float = 1e-5) -> tuple[int, int]:
    """The largest aspect-keeping size ``(H', W')`` (multiples of the patch, at least one patch each) of an
    ``hw`` image whose patch count ``H'/p · W'/p`` is at most ``max_seq_len`` (timm's binary search on the
    scale; ``max_ratio`` caps the upscaling)."""
    ph, pw = _pair(patch_size)
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")

    def target(r: float) -> tuple[int, int]:
        return max(ph * math.ceil(hw[0] * r / ph), ph), max(pw * math.ceil(hw[1] * r / pw), pw)

    def fits(r: float) -> bool:
        h, w = target(r)
        return (h // ph) * (w // pw) <= max_seq_len

    lo, hi = eps / 10.0, 100.0
    while hi - lo >= eps:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    ratio = lo if max_ratio is None else min(lo, max_ratio)
    if ratio <= eps or ratio >= 100.0:
        raise ValueError(f"no scale of a {hw[0]}x{hw[1]} image fits {max_seq_len} patches of {ph}x{pw}")
    return target(ratio)


def resize_to_seq_len(img: Tensor, patch_size: int | Sequence[int], max_seq_len: int, *,
                      interpolation: str = "bicubic", antialias: bool = True) -> Tensor:
    """``[C, H, W]`` -> ``[C, H', W']`` at :func:`size_for_seq_len`'s size (``H'``, ``W'`` multiples of the patch)."""
    size = size_for_seq_len(tuple(img.shape[-2:]), patch_size, max_seq_len)  # type: ignore[arg-type]
    if size == tuple(img.shape[-2:]):
        return img
    align = False if interpolation in ("bilinear", "bicubic") else None
    return F.interpolate(img[None].float(), size=size, mode=interpolation, antialias=antialias,
                         align_corners=align)[0].to(img.dtype)


class NaFlexCollate:
    """``[(image [C, H_i, W_i], label), ...]`` -> ``({"patches": [B, L, p·p·C], "patch_coord": [B, L, 2],
    "patch_valid": [B, L]}, labels [B])`` with ``L = max_seq_len``.

    Each image is resized to fit the budget keeping its aspect (:func:`resize_to_seq_len`; ``resize=False``
    only checks it fits), patchified ``(ph, pw, C)`` and zero-padded (timm's ``NaFlexCollator``, default
    576 tokens). ``max_seq_len`` may be changed between batches (sequence-length schedules).
    """

    def __init__(self, patch_size: int | Sequence[int] = 16, max_seq_len: int = 576, *, resize: bool = True,
                 interpolation: str = "bicubic") -> None:
        self.patch_size = _pair(patch_size)
        self.max_seq_len = int(max_seq_len)
        self.resize, self.interpolation = resize, interpolation

    def __call__(self, batch: Sequence[tuple[Tensor, Any]]) -> tuple[dict[str, Tensor], Tensor]:
        images = [img for img, _ in batch]
        if self.resize:
            images = [resize_to_seq_len(img, self.patch_size, self.max_seq_len, interpolation=self.interpolation)
                      for img in images]
        packed = patchify_images(images, self.patch_size, max_seq_len=self.max_seq_len)
        labels = torch.as_tensor([int(label) for _, label in batch], dtype=torch.long)
        return packed, labels


def bucket_by_seq_len(seq_lens: Sequence[int], batch_size: int, *, shuffle: bool = True,
                      generator: torch.Generator | None = None) -> Iterator[list[int]]:
    """Batches of indices with similar token counts: sort by ``seq_lens`` (ties in a seeded random order when
    ``shuffle``), cut into ``batch_size`` runs, yield the runs (in a random order when ``shuffle``)."""
    n = len(seq_lens)
    tie = torch.randperm(n, generator=generator).tolist() if shuffle else list(range(n))
    order = sorted(range(n), key=lambda i: (seq_lens[i], tie[i]))
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    if shuffle:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    yield from batches
