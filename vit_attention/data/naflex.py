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

import argparse
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.naflexvit import patchify_images

__all__ = ["size_for_seq_len", "resize_to_seq_len", "NaFlexCollate", "bucket_by_seq_len", "load_naflex_image",
           "inference_meta", "naflex_budget"]


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


# ---------------------------------------------------------------- reading images and runs (train, eval, predict, attn)
def load_naflex_image(path: str | Path, patch_size: int | tuple[int, int], max_seq_len: int, *,
                      in_chans: int = 3) -> Tensor:
    """An image file as NaFlex training, ``eval`` and ``predict`` read it: ``[C, H', W']`` in [0, 1], its
    aspect kept, resized (Pillow, bicubic) to the largest size of at most ``max_seq_len`` patches
    (:func:`~vit_attention.data.naflex.size_for_seq_len`), sides multiples of the patch."""
    from PIL import Image

    from . import read_image

    patch = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    img = read_image(path, channels=in_chans)
    w, h = img.size
    H, W = size_for_seq_len((h, w), patch, max_seq_len)
    if (W, H) != (w, h):
        img = img.resize((W, H), Image.Resampling.BICUBIC)
    a = np.asarray(img, dtype=np.float32) / 255.0  # [H', W'] or [H', W', C]
    a = a[:, :, None] if a.ndim == 2 else a
    return torch.from_numpy(a).permute(2, 0, 1).contiguous()  # [C, H', W']


def inference_meta(saved: Any) -> dict[str, Any]:
    """What training recorded for inference (classes, mean / std, data, crop, split) from a :class:`SavedModel`."""
    md = saved.metadata
    if saved.kind != "train_state":
        keys = ("classes", "mean", "std", "data", "crop_pct", "val_fraction", "split_seed", "naflex", "max_seq_len")
        return {k: md[k] for k in keys if k in md}
    meta = {k: md[k] for k in ("classes", "mean", "std") if k in md}
    config = md.get("config") or {}
    data = config.get("data") or "digits"
    meta["data"] = data
    meta["crop_pct"] = 1.0 if data == "digits" else config.get("crop_pct", 0.875)
    meta["val_fraction"] = config.get("val_fraction", 0.1)
    meta["split_seed"] = config.get("seed", 0)
    if config.get("naflex"):
        meta["naflex"], meta["max_seq_len"] = True, int(config.get("max_seq_len", 576))
    return meta


def naflex_budget(args: argparse.Namespace, model: Any, meta: dict[str, Any]) -> int | None:
    """The patch budget to read images with at their own aspect (NaFlex), or ``None`` for the fixed-size path.

    A run trained with ``--naflex`` says so (and its ``--max-seq-len``); ``--naflex`` asks for it with a
    NaFlex model given otherwise; ``--max-seq-len`` overrides the budget. Errors name the option.
    """
    from ..models.registry import get_model_entry

    given = getattr(args, "max_seq_len", None)
    naflex = bool(getattr(args, "naflex", False) or meta.get("naflex"))
    if not naflex:
        if given is not None:
            raise ValueError(f"--max-seq-len {given} applies with --naflex only (a run trained with --naflex, or "
                             "--naflex with a NaFlex model)")
        return None
    name = getattr(model, "registry_name", None) or type(model).__name__
    try:
        family = get_model_entry(name).family
    except (KeyError, ValueError):
        family = "naflexvit" if type(model).__name__ == "NaFlexVit" else type(model).__name__
    if family != "naflexvit":
        raise ValueError(f"--naflex needs a NaFlex model (family naflexvit, e.g. naflexvit_base_patch16_gap); "
                         f"{name} is a {family} model, which takes fixed-size image tensors")
    budget = int(given if given is not None else meta.get("max_seq_len", 576))
    if budget < 1:
        raise ValueError(f"--max-seq-len must be >= 1, got {budget}")
    return budget
