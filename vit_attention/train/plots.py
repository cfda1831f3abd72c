"""PNG figures of training: the loss / accuracy curves of a run, the confusion matrix and accuracy vs FLOPs
(matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from ..weights.io import atomic_write

__all__ = ["plot_curves", "plot_confusion", "plot_accuracy_vs_flops", "place_labels"]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion(conf: Tensor, classes: Sequence[str], path: str | Path, title: str = "") -> Path:
    """Confusion matrix ``[K, K]`` (rows: true class, columns: predicted) as a PNG with counts in the cells."""
    plt = _plt()
    k = conf.shape[0]
    size = min(4 + 0.45 * k, 20)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(conf.numpy(), cmap="Blues")
    if k <= 30:
        ax.set_xticks(range(k), [str(c) for c in classes], rotation=90 if k > 10 else 0)
        ax.set_yticks(range(k), [str(c) for c in classes])
        peak = max(int(conf.max()), 1)
        for i in range(k):
            for j in range(k):
                v = int(conf[i, j])
                if v:
                    ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                            color="white" if v > peak / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return Path(path)


def _label_candidates(max_rings: int = 12) -> list[tuple[float, float, str]]:
    """Label offsets in points from a marker, nearest first: beside it, then further above and below."""
    out: list[tuple[float, float, str]] = []
    for k in range(max_rings):
        for dy in (4 + 11 * k, -14 - 11 * k):
            out += [(7.0, float(dy), "left"), (-7.0, float(dy), "right")]
    return out


def place_labels(ax: Any, points: Sequence[tuple[float, float]], labels: Sequence[str], *,
                 fontsize: float = 8, marker_size: float = 40) -> list[Any]:
    """Annotate each data point with its label so that no two labels (and no label and marker) overlap.

    Tries offsets nearest first (right, left, then further up and down, with a thin leader line)
    and keeps the first whose box is free and inside the axes; call it after the layout is final.
    Returns the annotations.
    """
    from matplotlib.transforms import Bbox

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    px = fig.dpi / 72.0
    half = (marker_size ** 0.5) / 2 * px + 1
    taken = [Bbox.from_bounds(x - half, y - half, 2 * half, 2 * half)
             for x, y in (ax.transData.transform(pt) for pt in points)]
    area = ax.get_window_extent(renderer)
    order = sorted(range(len(points)), key=lambda i: (points[i][1], points[i][0]), reverse=True)
    annotations: list[Any] = [None] * len(points)
    for i in order:
        chosen, fallback = None, None
        for dx, dy, ha in _label_candidates():
            far = abs(dy) > 20
            ann = ax.annotate(labels[i], points[i], xytext=(dx, dy), textcoords="offset points", ha=ha,
                              va="bottom", fontsize=fontsize,
                              arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5"} if far else None)
            box = ann.get_window_extent(renderer).padded(1.5)
            inside = area.x0 <= box.x0 and box.x1 <= area.x1 and area.y0 <= box.y0 and box.y1 <= area.y1
            free = not any(box.overlaps(t) for t in taken)
            if free and inside:
                chosen = (ann, box)
                break
            if free and fallback is None:  # free but leaving the axes: only if no free place inside
                fallback = (ann, box)
                continue
            ann.remove()
        if chosen is None:
            if fallback is None:  # crowded beyond every candidate: the nearest place
                dx, dy, ha = _label_candidates()[0]
                ann = ax.annotate(labels[i], points[i], xytext=(dx, dy), textcoords="offset points", ha=ha,
                                  va="bottom", fontsize=fontsize)
                fallback = (ann, ann.get_window_extent(renderer))
            chosen = fallback
        elif fallback is not None:
            fallback[0].remove()
        annotations[i] = chosen[0]
        taken.append(chosen[1])
    return annotations


def plot_accuracy_vs_flops(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Test accuracy against MACs per image, one labelled point per row (``name``, ``macs``, ``test_acc``).

    Labels never overlap each other or the markers (:func:`place_labels`).
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    points = [(r["macs"] / 1e6, r["test_acc"]) for r in rows]
    for x, y in points:
        ax.scatter(x, y, s=40)
    ax.margins(x=0.35, y=0.25)  # room for the labels inside the axes
    ax.set_xlabel("MMACs per image (FLOPs as in the papers)")
    ax.set_ylabel("test top-1 accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    place_labels(ax, points, [str(r["name"]) for r in rows])
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return Path(path)


def plot_curves(history: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """PNG of loss and accuracy per epoch (train and test) from the metrics ``history``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ep = [h["epoch"] for h in history]
    mark = {"marker": "o", "markersize": 4 if len(ep) > 1 else 6}  # a single epoch is a point, not a line
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(ep, [h["train_loss"] for h in history], label="train", **mark)
    a.plot(ep, [h["test_loss"] for h in history], label="test", **mark)
    a.set_xlabel("epoch")
    a.set_ylabel("loss")
    a.legend()
    b.plot(ep, [h["train_acc"] for h in history], label="train", **mark)
    b.plot(ep, [h["test_acc"] for h in history], label="test top-1", **mark)
    if any("test_acc_ema" in h for h in history):
        b.plot(ep, [h.get("test_acc_ema", float("nan")) for h in history], label="test top-1 (EMA)", **mark)
    b.set_xlabel("epoch")
    b.set_ylabel("accuracy")
    b.legend()
    for axis in (a, b):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
        if len(set(ep)) == 1:
            axis.set_xlim(ep[0] - 0.5, ep[0] + 0.5)
            axis.set_xticks(ep)
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return Path(path)
