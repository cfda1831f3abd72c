"""PNG rendering of attention maps with matplotlib's Agg canvas (no pyplot, no global backend change)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..weights.io import atomic_write

__all__ = ["upsample_map", "save_heatmap", "save_grid", "save_merge_groups"]


def upsample_map(heat: Tensor, size: Sequence[int]) -> Tensor:
    """A token-grid map ``[h, w]`` resized to image ``size = (H, W)`` (bilinear), ``[H, W]``."""
    if heat.dim() != 2:
        raise ValueError(f"heat must be a 2-D map [h, w], got shape {tuple(heat.shape)}")
    return F.interpolate(heat[None, None].float(), size=tuple(size), mode="bilinear", align_corners=False)[0, 0]


def _as_image(image: Tensor | np.ndarray) -> np.ndarray:
    """``[C, H, W]`` / ``[H, W]`` tensor or ``[H, W(, C)]`` array -> float ``[H, W, 3]`` in [0, 1]."""
    arr = image.detach().cpu().float().numpy() if isinstance(image, Tensor) else np.asarray(image, dtype=np.float32)
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
        arr = arr.transpose(1, 2, 0)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    lo, hi = float(arr.min()), float(arr.max())
    return (arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr)


def _save(fig: Any, path: str | Path, suptitle: str = "") -> Path:
    """Lay out ``fig`` (with ``suptitle``) and write it as a PNG at ``path`` (folders made; no timestamp)."""
    if suptitle:
        fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout()
    # atomically, through a temporary file: a symlink planted at ``path`` is replaced, its target untouched
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", metadata={"Software": None}))


def save_heatmap(image: Tensor | np.ndarray, heat: Tensor, path: str | Path, *, title: str = "",
                 alpha: float = 0.55, cmap: str = "inferno") -> Path:
    """Write ``image`` next to ``heat`` (resized to the image) overlaid on it, as a PNG at ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    img = _as_image(image)
    H, W = img.shape[:2]
    up = upsample_map(heat, (H, W)).numpy()
    fig = Figure(figsize=(6, 3.2), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.imshow(img, interpolation="nearest")
    ax1.set_title("input", fontsize=9)
    ax2.imshow(img, interpolation="nearest")
    ax2.imshow(up, cmap=cmap, alpha=alpha, interpolation="bilinear")
    ax2.set_title(title or "attention", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_xticks([])
        ax.set_yticks([])
    return _save(fig, path)


def save_grid(maps: Sequence[Tensor], titles: Sequence[str], path: str | Path, *, suptitle: str = "",
              marks: Sequence[tuple[int, int] | None] | None = None, cmap: str = "viridis") -> Path:
    """Write a row of 2-D maps ``[h, w]`` (token grids) as one PNG; ``marks`` puts a cross on a cell."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(maps)
    fig = Figure(figsize=(2.6 * n, 2.9), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, n, squeeze=False)[0]
    for i, (ax, m, t) in enumerate(zip(axes, maps, titles)):
        ax.imshow(torch.as_tensor(m).float().numpy(), cmap=cmap, interpolation="nearest")
        if marks is not None and marks[i] is not None:
            r, c = marks[i]  # type: ignore[misc]
            ax.plot([c], [r], marker="x", color="red", markersize=8, mew=2)
        ax.set_title(t, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    return _save(fig, path, suptitle)


def _merge_overlay(img: np.ndarray, groups: Tensor, palette: np.ndarray, alpha: float) -> np.ndarray:
    """``img [H, W, 3]`` with every group of two or more patches of ``groups [h, w]`` (ids) in its own colour."""
    H, W = img.shape[:2]
    ids = torch.as_tensor(groups).long().cpu().numpy()
    counts = np.bincount(ids.ravel(), minlength=int(ids.max()) + 1)
    rows, cols = np.arange(H) * ids.shape[0] // H, np.arange(W) * ids.shape[1] // W  # nearest: a colour per patch
    ids = ids[rows][:, cols]
    merged = (counts[ids] > 1)[..., None]
    return np.where(merged, (1 - alpha) * img + alpha * palette[ids % len(palette)], img)


def save_merge_groups(images: Sequence[Tensor | np.ndarray], groups: Sequence[Sequence[Tensor]],
                      titles: Sequence[str], path: str | Path, *, suptitle: str = "", alpha: float = 0.65) -> Path:
    """Write one row per image: the image, then per entry of its ``groups`` (``[h, w]`` int: the merged token
    covering each patch, e.g. after each block) the image with every group of two or more patches in its own
    colour (single patches left as they are). ``titles`` name the group columns. One PNG at ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if len(images) != len(groups) or not images:
        raise ValueError(f"give one list of group maps per image: {len(images)} images, {len(groups)} lists")
    n = len(groups[0]) + 1
    fig = Figure(figsize=(2.0 * n, 2.1 * len(images) + 0.3), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(images), n, squeeze=False)
    palette = np.random.default_rng(0).uniform(0.15, 1.0, size=(4096, 3))
    for row, (image, maps) in enumerate(zip(images, groups)):
        img = _as_image(image)
        axes[row][0].imshow(img, interpolation="nearest")
        for ax, g in zip(axes[row][1:], maps):
            ax.imshow(_merge_overlay(img, g, palette, alpha), interpolation="nearest")
        for col, ax in enumerate(axes[row]):
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title("input" if col == 0 else titles[col - 1], fontsize=8)
    return _save(fig, path, suptitle)
