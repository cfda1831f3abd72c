"""PNG rendering of attention maps with matplotlib's Agg canvas (no pyplot, no global backend change)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["upsample_map", "save_heatmap", "save_grid"]


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
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


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
    if suptitle:
        fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return path
