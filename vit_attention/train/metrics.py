"""Scoring and recording: :func:`evaluate` (loss, top-1 / top-5 over a data set, summed over ranks)
and the per-epoch metrics files ``metrics.csv`` / ``metrics.json`` (columns in :data:`METRIC_COLUMNS` order)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..weights.io import atomic_write, atomic_write_text
from .data import iterate_batches, shard_indices, to_device
from .distributed import DistInfo, all_reduce_sum, is_fsdp, unwrap_model
from .generative import evaluate_dataset, is_generative
from .optim import _autocast

__all__ = ["evaluate", "METRIC_COLUMNS"]


@torch.no_grad()
def evaluate(model: nn.Module, dataset: Any, transform: nn.Module, *, batch_size: int = 256,
             info: DistInfo | None = None, amp: str = "auto", workers: int = 0,
             return_predictions: bool = False) -> dict[str, Any]:
    """Loss, top-1 and top-5 accuracy of ``model`` on ``dataset`` (each rank scores its share, then summed).

    Returns ``{"loss", "top1", "top5", "n"}`` (plus ``"pred"`` / ``"target"`` ``[n]`` tensors of this
    rank's share with ``return_predictions``).
    """
    info = info or DistInfo()
    if is_generative(model) and not return_predictions:  # next-pixel loss, bits/dim, pixel accuracy (no labels)
        return evaluate_dataset(model, dataset, transform, info.device, batch_size)
    was_training = model.training
    sharded = is_fsdp(model)
    net = model if sharded else unwrap_model(model)  # a DDP wrapper would sync buffers in every forward
    net.eval()
    transform.eval()
    n = len(dataset)
    idx = shard_indices(list(range(n)), info.rank, info.world_size)
    # FSDP gathers parameters in every forward: all ranks run the same number of batches (a spare
    # rank scores one image and throws it away)
    per_rank = math.ceil(n / info.world_size) if sharded else len(idx)
    n_batches = math.ceil(per_rank / batch_size)
    batches = [idx[i * batch_size:(i + 1) * batch_size] for i in range(n_batches)]
    real = [bool(b) for b in batches]
    batches = [b if b else [0] for b in batches]
    sums = torch.zeros(4, dtype=torch.float64, device=info.device)  # loss, top1, top5, n
    preds, targets = [], []
    for keep, (x, y) in zip(real, iterate_batches(dataset, batches, workers=workers)):
        x, y = transform(to_device(x, info.device)), y.to(info.device)  # images or a packed NaFlex dict
        with _autocast(info.device, amp):
            logits = net(x)
        if not keep:
            continue
        logits = (logits[0] if isinstance(logits, tuple) else logits).float()
        k = min(5, logits.shape[-1])
        top = logits.topk(k, dim=-1).indices  # [b, k]
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum").double(),
                             (top[:, 0] == y).sum().double(), (top == y[:, None]).any(-1).sum().double(),
                             torch.tensor(float(len(y)), dtype=torch.float64, device=info.device)])
        if return_predictions:
            preds.append(top[:, 0].cpu())
            targets.append(y.cpu())
    all_reduce_sum(sums)
    net.train(was_training)
    count = max(sums[3].item(), 1.0)
    out: dict[str, Any] = {"loss": sums[0].item() / count, "top1": sums[1].item() / count,
                           "top5": sums[2].item() / count, "n": int(sums[3].item())}
    if return_predictions:
        out["pred"] = torch.cat(preds) if preds else torch.empty(0, dtype=torch.long)
        out["target"] = torch.cat(targets) if targets else torch.empty(0, dtype=torch.long)
    return out

# metrics.csv's columns, in this order whatever order a (resumed, JSON-sorted) history row has; others follow.
METRIC_COLUMNS = ("epoch", "step", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "test_top5",
                  "train_img_s", "test_bpd", "test_acc_ema")


def _write_metrics(out: Path, history: list[dict[str, Any]]) -> None:
    """``metrics.csv`` / ``metrics.json``: one row per epoch, columns in :data:`METRIC_COLUMNS` order.

    An empty ``history`` (a run resumed before its first epoch ended) removes both files.
    """
    if not history:
        for name in ("metrics.csv", "metrics.json"):
            (out / name).unlink(missing_ok=True)
        return
    keys = [k for k in METRIC_COLUMNS if any(k in h for h in history)]
    for h in history:
        keys += [k for k in h if k not in keys]
    history = [{k: h[k] for k in keys if k in h} for h in history]

    def write_csv(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(history)

    atomic_write(out / "metrics.csv", write_csv)
    atomic_write_text(out / "metrics.json", json.dumps(history, indent=1))
