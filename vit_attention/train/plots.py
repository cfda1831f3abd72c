"""PNG figures of the training commands: confusion matrix and accuracy vs FLOPs (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from ..weights.io import atomic_write

__all__ = ["plot_confusion", "plot_accuracy_vs_flops"]


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


def plot_accuracy_vs_flops(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Test accuracy against MACs per image, one labelled point per row (``name``, ``macs``, ``test_acc``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in rows:
        ax.scatter(r["macs"] / 1e6, r["test_acc"], s=40)
        ax.annotate(r["name"], (r["macs"] / 1e6, r["test_acc"]), textcoords="offset points", xytext=(5, 5),
                    fontsize=8)
    ax.set_xlabel("MMACs per image (FLOPs as in the papers)")
    ax.set_ylabel("test top-1 accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return Path(path)
