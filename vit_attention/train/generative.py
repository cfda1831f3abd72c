"""The next-pixel objective for generative models (Image GPT) in the training loop, and a linear probe.

A model that declares ``generative = True`` and offers ``forward(x, objective="generative") -> logits
[B, N, K]`` and ``quantize(x) -> tokens [B, N]`` is trained on its own pixels: the loss of an image is
the mean cross-entropy of its ``N`` next-pixel predictions (nats; ``/ ln 2`` = bits per dimension,
one dimension per pixel token), "accuracy" is the fraction of pixels whose most likely colour is
right, labels are not used. Its inputs are normalised to ``[-1, 1]`` (mean = std = 0.5), the range of
its palette. :func:`linear_probe` then scores the learned features on the labels: a logistic
regression on the average-pooled output of one block (iGPT's linear probe; the paper's best
features come from the middle of the network).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["NextPixelObjective", "is_generative", "evaluate_generative", "evaluate_dataset", "linear_probe",
           "block_features", "probe_datasets"]

LN2 = math.log(2.0)


def is_generative(model: nn.Module) -> bool:
    """The (possibly wrapped) model trains with the next-pixel objective."""
    return bool(getattr(getattr(model, "module", model), "generative", False))


class NextPixelObjective:
    """Per-image next-pixel loss and hits for the engine: ``criterion(x, logits, target) -> [b]``."""

    forward_kwargs = {"objective": "generative"}
    normalization = 0.5  # mean = std: images in [-1, 1]

    def __init__(self, model: nn.Module) -> None:
        self.model = getattr(model, "module", model)

    def targets(self, x: Tensor) -> Tensor:
        """Normalised images ``[b, Cin, H, W]`` -> target tokens ``[b, N]``."""
        return self.model.quantize(x)  # type: ignore[operator]

    def __call__(self, x: Tensor, logits: Tensor, target: Any = None) -> Tensor:
        """Mean next-pixel cross-entropy per image ``[b]`` (nats) of ``logits [b, N, K]``."""
        return F.cross_entropy(logits.float().transpose(1, 2), self.targets(x), reduction="none").mean(dim=1)

    def correct(self, x: Tensor, logits: Tensor) -> Tensor:
        """Sum over the batch of the fraction of pixels predicted right (a float scalar)."""
        return (logits.argmax(-1) == self.targets(x)).float().mean(dim=1).sum()


@torch.no_grad()
def evaluate_generative(model: nn.Module, batches: Any) -> dict[str, Any]:
    """Next-pixel loss (nats), bits per dimension and pixel accuracy over ``batches`` of normalised images.

    Returns ``{"loss", "bpd", "top1", "top5", "n"}`` (``top1`` / ``top5``: fraction of pixels whose
    colour is the most likely / among the 5 most likely).
    """
    objective = NextPixelObjective(model)
    sums = torch.zeros(4, dtype=torch.float64)
    for x in batches:
        logits = model(x, **objective.forward_kwargs).float()  # [b, N, K]
        target = objective.targets(x)  # [b, N]
        k = min(5, logits.shape[-1])
        top = logits.topk(k, dim=-1).indices  # [b, N, k]
        sums += torch.stack([
            objective(x, logits).sum().double().cpu(),
            (top[..., 0] == target).float().mean(1).sum().double().cpu(),
            (top == target[..., None]).any(-1).float().mean(1).sum().double().cpu(),
            torch.tensor(float(x.shape[0]), dtype=torch.float64)])
    n = max(sums[3].item(), 1.0)
    loss = sums[0].item() / n
    return {"loss": loss, "bpd": loss / LN2, "top1": sums[1].item() / n, "top5": sums[2].item() / n,
            "n": int(sums[3].item())}


@torch.no_grad()
def block_features(model: nn.Module, x: Tensor, layer: int, *, batch_size: int = 256) -> Tensor:
    """Average-pooled output of block ``layer`` (final norm applied) for images ``x``: ``[n, C]``."""
    model.eval()
    feats = []
    for i in range(0, x.shape[0], batch_size):
        (h,) = model.forward_intermediates(x[i:i + batch_size], [layer], norm=True, output_fmt="NLC",  # type: ignore[operator]
                                           intermediates_only=True)
        feats.append(h.mean(dim=1))  # [b, C]
    return torch.cat(feats)


def linear_probe(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, *, num_classes: int,
                 steps: int = 300, weight_decay: float = 1e-3) -> float:
    """Test accuracy of a logistic regression fit on features ``train_x [n, C]`` (standardised, L-BFGS)."""
    mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    a, b = (train_x - mean) / std, (test_x - mean) / std
    torch.manual_seed(0)
    clf = nn.Linear(a.shape[1], num_classes)
    opt = torch.optim.LBFGS(clf.parameters(), lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(clf(a), train_y) + weight_decay * clf.weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        return (clf(b).argmax(-1) == test_y).float().mean().item()


def _normalised(dataset: Any, transform: nn.Module, device: Any, batch_size: int = 256) -> tuple[Tensor, Tensor]:
    """Every image of ``dataset`` through the eval ``transform`` and its labels: ``[n, C, H, W]``, ``[n]``."""
    from .data import iterate_batches

    transform.eval()
    idx = list(range(len(dataset)))
    xs, ys = [], []
    with torch.no_grad():
        for x, y in iterate_batches(dataset, [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)]):
            xs.append(transform(x.to(device)))
            ys.append(y.to(device))
    return torch.cat(xs), torch.cat(ys)


def evaluate_dataset(model: nn.Module, dataset: Any, transform: nn.Module, device: Any,
                     batch_size: int = 256) -> dict[str, Any]:
    """:func:`evaluate_generative` on a whole dataset (the eval transform applied), model left in its mode."""
    net = getattr(model, "module", model)
    was_training = net.training
    net.eval()
    x, _ = _normalised(dataset, transform, device, batch_size)
    out = evaluate_generative(net, (x[i:i + batch_size] for i in range(0, x.shape[0], batch_size)))
    net.train(was_training)
    return out


def probe_datasets(model: nn.Module, train: Any, test: Any, transform: nn.Module, device: Any, *,
                   num_classes: int, layer: int | None = None) -> tuple[float, int]:
    """Linear-probe test accuracy of block ``layer`` (default the middle one) on labelled sets: ``(acc, layer)``."""
    net = getattr(model, "module", model)
    was_training = net.training
    depth = len(net.blocks)  # type: ignore[arg-type]
    layer = depth // 2 if layer is None else layer
    tr_x, tr_y = _normalised(train, transform, device)
    te_x, te_y = _normalised(test, transform, device)
    acc = linear_probe(block_features(net, tr_x, layer).cpu(), tr_y.cpu(), block_features(net, te_x, layer).cpu(),
                       te_y.cpu(), num_classes=num_classes)
    net.train(was_training)
    return acc, layer
