"""The training engine: ``train(TrainConfig(...))`` trains any registered model and returns its metrics.

AdamW (no weight decay on biases, norms, position embeddings and prefix tokens), linear warm-up
then cosine decay per optimizer step, gradient clipping, gradient accumulation, gradient
checkpointing, bf16 autocast on CUDA (fp32 on CPU), an optional EMA of the weights, DeiT
distillation, checkpoints that resume exactly, ``torchrun`` data parallelism.

``batch_size`` is the global batch of one optimizer step: it is cut into ``world_size x
accum_steps`` micro-batches and the loss is normalised by the global batch, so the result does
not depend on how many processes or accumulation steps share the work. Every optimizer step
re-seeds the random generators from ``(seed, step, rank)``, so augmentation and dropout draws
are the same after a resume as in an uninterrupted run.

Runs never lose work: a non-finite loss stops the run before the optimizer step
(:class:`TrainingDiverged`) and non-finite weights are never written, so the last good checkpoint
stays resumable; Ctrl-C and SIGTERM end the run with :class:`TrainingInterrupted`, whose message
says how to resume (temporary files of a write in progress are removed); a default run folder
``runs/<model>-<time>`` is created exclusively (``-1``, ``-2``, ... on collision), so two runs
started in the same second never share one.

One run is a few named steps sharing a ``_Run`` (options, data, model, optimizer, step, history):
``_load_data``; ``_setup`` (model, teacher, EMA, optimizer; the checkpoint and its position with
``resume``); ``_open_run_folder``; ``_train_epochs``, which runs ``_train_epoch`` (its
``_train_step`` calls and the ``--ckpt-every`` / ``--stop-after`` checkpoints) and ``_end_epoch``
(evaluation, metrics row, epoch checkpoint) per epoch; and ``_finish`` (final score, weights, curves).
``train`` around them checks the options, sets up the processes and turns signals into
:class:`TrainingInterrupted`.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import signal
import sys
import threading
import time
import types
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.registry import create_model, get_model_entry
from ..weights.io import atomic_write, probe_writable, save_weights
from . import presets  # noqa: F401  (registers the digits presets)
from .checkpoint import (
    CHECKPOINT_NAME,
    TrainingState,
    check_resume_compatible,
    load_training_state,
    optimizer_state_from_safe,
    restore_rng_state,
    save_training_state,
)
from .data import (
    BatchTransform,
    DataBundle,
    batch_indices,
    build_data,
    check_classifiable,
    describe_input_size,
    iterate_batches,
    mix_batch,
    shard_indices,
)
from .distill import DistillationLoss, build_teacher, soft_target_cross_entropy
from .distributed import (
    DistInfo,
    all_reduce_sum,
    broadcast_object,
    cleanup_distributed,
    full_optimizer_state,
    full_state_dict,
    init_distributed,
    is_fsdp,
    load_optimizer_state,
    no_sync,
    unwrap_model,
    wrap_model,
)
from .generative import NextPixelObjective, evaluate_dataset, is_generative, probe_datasets

__all__ = ["TrainConfig", "ModelEma", "lr_at", "param_groups", "evaluate", "train", "plot_curves", "seed_step",
           "TrainingDiverged", "TrainingInterrupted", "create_run_folder", "check_model_kwargs",
           "check_output_folder"]


class TrainingDiverged(RuntimeError):
    """The loss (or the weights) became non-finite; nothing non-finite was written."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; ``str(e)`` says how to resume, ``e.exit_code`` is 130 or 143."""

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class TrainConfig:
    """Every choice of a training run (JSON-serialisable; stored in checkpoints)."""

    model: str = presets.DEFAULT_MODEL
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # config overrides, e.g. {"attn_layer": "window"}
    data: str | None = None  # None / "digits": the embedded set; else an image folder
    img_size: int | None = None  # None: 8 for digits, the model's for folders
    in_chans: int = 3  # image folders: 1 (grayscale) or 3 (RGB)
    val_fraction: float = 0.1
    crop_pct: float = 0.875
    output: str | None = None  # run folder; None: runs/<model>-<time>
    epochs: int = 60
    batch_size: int = 64  # global batch per optimizer step
    lr: float = 2e-3
    min_lr: float = 1e-5
    warmup_epochs: float = 3.0
    weight_decay: float = 0.05
    clip_grad: float | None = 1.0
    accum_steps: int = 1
    label_smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    randaugment: tuple[int, int] | None = None  # (num ops, magnitude), e.g. (2, 9)
    hflip: float | None = None  # None: 0.5 for image folders, 0 for digits
    crop_scale: tuple[float, float] | None = None  # random resized crop; None: (0.35, 1) folders, off for digits
    affine: float | None = None  # probability of a small random affine; None: 0.5 for digits, off for folders
    drop_rate: float | None = None  # model overrides when set
    drop_path_rate: float | None = None
    attn_drop_rate: float | None = None
    grad_checkpointing: bool = False
    amp: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU), bf16, none
    ema_decay: float | None = None
    seed: int = 0
    device: str | None = None
    threads: int | None = None  # CPU intra-op threads; None: 1 for models under 2M parameters, else torch's
    fsdp: bool = False
    workers: int = 0
    ckpt_every: int = 0  # also checkpoint every N optimizer steps (0: at epoch ends only)
    resume: bool = False
    stop_after: int | None = None  # save a checkpoint and stop at this global step (continue with resume)
    teacher: str | None = None  # a registered model name or a .safetensors checkpoint
    teacher_checkpoint: str | None = None
    distill_type: str = "hard"
    distill_alpha: float = 0.5
    distill_tau: float = 1.0
    progress: bool | None = None  # progress bars; None: only when stderr is a terminal (else one line per epoch)
    plot: bool = True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the fields."""
        return json.loads(json.dumps(asdict(self)))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad option."""
        checks = [
            (self.epochs > 0, f"epochs must be positive, got {self.epochs}"),
            (self.batch_size > 0, f"batch_size must be positive, got {self.batch_size}"),
            (self.accum_steps > 0, f"accum_steps must be positive, got {self.accum_steps}"),
            (self.lr > 0, f"lr must be positive, got {self.lr}"),
            (self.warmup_epochs >= 0, f"warmup_epochs must be >= 0, got {self.warmup_epochs}"),
            (0 <= self.label_smoothing < 1, f"label_smoothing must be in [0, 1), got {self.label_smoothing}"),
            (self.mixup >= 0 and self.cutmix >= 0, "mixup and cutmix must be >= 0 (0 = off)"),
            (self.amp in ("auto", "bf16", "none"), f"amp must be 'auto', 'bf16' or 'none', got {self.amp!r}"),
            (self.ema_decay is None or 0 < self.ema_decay < 1, f"ema_decay must be in (0, 1), got {self.ema_decay}"),
            (self.distill_type in ("soft", "hard"), f"distill_type must be soft or hard, got {self.distill_type!r}"),
            (self.ckpt_every >= 0, f"ckpt_every must be >= 0, got {self.ckpt_every}"),
            (not (self.fsdp and self.ema_decay), "ema_decay is not supported together with fsdp"),
            (not (self.resume and not self.output),
             "resume needs output (--output): the folder of the run to continue"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


# ---------------------------------------------------------------------------- pieces
def lr_at(step: int, *, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warm-up, then cosine decay to ``min_lr``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay for weight matrices, none for biases, norms, position embeddings and tokens."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        bare = name.removeprefix("module.").removeprefix("_fsdp_wrapped_module.")
        (no_decay if p.ndim <= 1 or bare in skip or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class ModelEma(nn.Module):
    """Exponential moving average of a model's weights: ``ema = decay · ema + (1 - decay) · w`` per step."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        super().__init__()
        self.module = copy.deepcopy(unwrap_model(model)).eval()
        self.decay = decay
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average one step towards ``model``'s current weights."""
        own = self.module.state_dict()
        for k, v in unwrap_model(model).state_dict().items():
            if own[k].is_floating_point():
                own[k].lerp_(v.to(own[k].dtype), 1.0 - self.decay)
            else:
                own[k].copy_(v)


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed torch's generators for optimizer step ``step`` on ``rank`` (a resumed run draws the same numbers)."""
    torch.manual_seed((seed * 1_000_003 + step) * 4096 + rank)


def _autocast(device: torch.device, amp: str) -> Any:
    if amp == "none" or (amp == "auto" and device.type != "cuda"):
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


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
        x, y = transform(x.to(info.device, non_blocking=True)), y.to(info.device)
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


# metrics.csv's columns, in this order whatever order a (resumed, JSON-sorted) history row has; others follow.
METRIC_COLUMNS = ("epoch", "step", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "test_top5",
                  "train_img_s", "test_bpd", "test_acc_ema")


def _write_metrics(out: Path, history: list[dict[str, Any]]) -> None:
    """``metrics.csv`` / ``metrics.json``: one row per epoch, columns in :data:`METRIC_COLUMNS` order."""
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
    atomic_write(out / "metrics.json", lambda tmp: Path(tmp).write_text(json.dumps(history, indent=1)))


def create_run_folder(model: str, root: str | Path = "runs") -> Path:
    """Create and return a new run folder ``root/<model>-<time>`` (``-1``, ``-2``, ... when taken).

    The folder is created exclusively (``mkdir`` without ``exist_ok``), so concurrent runs started
    in the same second each get their own. Raises ``ValueError`` naming ``--output`` when ``root``
    cannot be created or written.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the run folder {root}/ ({e.strerror or e}); choose a writable "
                         "folder with --output") from None
    for i in range(10_000):
        out = root / (f"{model}-{stamp}" + (f"-{i}" if i else ""))
        try:
            out.mkdir()
            return out
        except FileExistsError:
            continue
        except OSError as e:
            raise ValueError(f"cannot create the run folder {out} ({e.strerror or e}); choose a writable "
                             "folder with --output") from None
    raise ValueError(f"no free run folder name for {root}/{model}-{stamp}; choose one with --output")


def check_output_folder(output: str | Path) -> None:
    """Raise ``ValueError`` naming ``--output`` when ``output`` cannot become a writable run folder.

    Creates nothing: the nearest existing ancestor must be a folder the process may write in.
    """
    path = Path(output)
    try:
        if path.exists() and not path.is_dir():
            raise ValueError(f"--output {output} is a file; expected a folder for the run")
        probe = path
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise ValueError(f"--output {output}: {probe} is a file, so the run folder cannot be created there")
        if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
            raise ValueError(f"--output {output}: {probe} is not writable; choose a folder you may write in")
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, ...
        if isinstance(e, ValueError) and str(e).startswith("--output"):
            raise
        raise ValueError(f"--output {output!r} is not a usable folder name ({e}); expected a writable "
                         "folder path") from None


def _make_output(path: Path) -> Path:
    """Create ``path`` (and parents) and check a file can be written in it; ``ValueError`` naming --output."""
    try:
        probe_writable(path)
    except OSError as e:
        raise ValueError(f"--output {path}: cannot create or write the run folder ({e.strerror or e}); "
                         "expected a writable folder") from None
    return path


def _type_name(tp: Any) -> str:
    """A short readable name of a config annotation: ``int``, ``float``, ``list of int``, ``one of 'a', 'b'``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (tuple, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_type_name(args[0])}"
        return f"a list of {len(args)} ({', '.join(_type_name(a) for a in args)})" if args else "a list"
    if origin is dict or tp is dict:
        return "a JSON object"
    if tp is float:
        return "a number (float)"
    if tp is bool:
        return "true or false (bool)"
    if tp is int:
        return "an integer (int)"
    if tp is str:
        return "a string (str)"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    """Whether the JSON ``value`` fits the annotation ``tp`` (unknown annotations accept anything)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True
    if tp is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return not args or (len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args)))
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return not isinstance(tp, type) or isinstance(value, tp)


def check_model_kwargs(model: str, kwargs: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the option and its expected type when a ``--model-arg`` value has the wrong type.

    Unknown model names raise ``KeyError`` (with suggestions), unknown options ``TypeError`` (with the
    valid ones), both from the registry.
    """
    entry = get_model_entry(model)
    try:
        hints = typing.get_type_hints(entry.config_cls)
    except Exception:  # noqa: BLE001 - an annotation we cannot resolve: the config checks its own values
        hints = {}
    for key, value in kwargs.items():
        if key in hints and not _matches(value, hints[key]):
            example = json.dumps(getattr(entry.config(), key, None), default=list)
            raise ValueError(f"--model-arg {key}={json.dumps(value)}: {key} expects {_type_name(hints[key])} "
                             f"(the preset has {key}={example})")
    entry.config(**kwargs)  # unknown option names (and values the config refuses) raise, naming the option


def _model_overrides(cfg: TrainConfig, data: DataBundle) -> dict[str, Any]:
    kw: dict[str, Any] = dict(cfg.model_kwargs)
    for name in ("drop_rate", "drop_path_rate", "attn_drop_rate"):
        if getattr(cfg, name) is not None:
            kw[name] = getattr(cfg, name)
    kw.setdefault("in_chans", data.in_chans)
    return kw


def build_model_for_data(cfg: TrainConfig, data: DataBundle) -> nn.Module:
    """The model ``cfg.model`` sized for ``data`` (classes, channels, image size); clear error if unknown."""
    get_model_entry(cfg.model)  # unknown names raise KeyError with suggestions
    return create_model(cfg.model, num_classes=data.num_classes, img_size=data.img_size,
                        **_model_overrides(cfg, data))


def _make_transform(cfg: TrainConfig, data: DataBundle) -> BatchTransform:
    folder = data.name != "digits"
    hflip = cfg.hflip if cfg.hflip is not None else (0.5 if folder else 0.0)
    crop = cfg.crop_scale if cfg.crop_scale is not None else ((0.35, 1.0) if folder else None)
    affine = cfg.affine if cfg.affine is not None else (0.0 if folder else 0.5)
    return BatchTransform(data.mean, data.std, img_size=data.img_size, crop_scale=crop, hflip=hflip,
                          randaugment=cfg.randaugment, affine=affine)


def _set_threads(cfg: TrainConfig, info: DistInfo, model: nn.Module) -> None:
    """CPU threads: tiny models run fastest on one (each op is too small to split, and spare threads
    spin against other processes); larger ones keep torch's default unless ``cfg.threads`` says."""
    if info.device.type != "cpu":
        return
    if cfg.threads is not None:
        if cfg.threads < 1:
            raise ValueError(f"threads must be >= 1, got {cfg.threads}")
        torch.set_num_threads(cfg.threads)
    elif sum(p.numel() for p in model.parameters()) < 2_000_000:
        torch.set_num_threads(1)


# Options a resumed run may change without breaking the exact continuation.
_FREE_ON_RESUME = {"output", "resume", "epochs", "progress", "plot", "ckpt_every", "stop_after", "workers", "threads",
                   "device"}


def _warn_changed_options(info: DistInfo, cfg: TrainConfig, saved: dict[str, Any]) -> None:
    now = cfg.to_dict()
    changed = sorted(k for k in now if k not in _FREE_ON_RESUME and k in saved and saved[k] != now[k])
    if changed:
        _say(info, "warning: resuming with changed option(s) " + ", ".join(
            f"{k}: {saved[k]!r} -> {now[k]!r}" for k in changed) + "; the run will not match an uninterrupted one")
    if "epochs" in saved and saved["epochs"] != cfg.epochs:
        _say(info, f"warning: resuming with epochs {saved['epochs']} -> {cfg.epochs}: the learning-rate schedule "
                   f"(warm-up, then cosine decay to --min-lr over all epochs) changes from the checkpoint on; the "
                   f"run will not match an uninterrupted {saved['epochs']}- or {cfg.epochs}-epoch run")


def _say(info: DistInfo, *args: Any) -> None:
    if info.is_main:
        print(*args, flush=True)


class _Progress:
    """What the interrupt and divergence messages need to know about the run so far."""

    def __init__(self) -> None:
        self.out: Path | None = None
        self.step = 0
        self.ckpt: tuple[int, int] | None = None  # (full epochs done, global step) of the last checkpoint
        self.config_written = False  # config.json of this invocation written (with its first checkpoint)

    def where(self) -> str:
        """Where the run can continue from, as a sentence."""
        if self.out is None:
            return "the run had not started; nothing was written"
        if self.ckpt is None:
            return (f"no checkpoint was written yet, so there is nothing to resume in {self.out} (start again; "
                    "--ckpt-every N checkpoints every N steps)")
        epochs, step = self.ckpt
        return (f"the last good checkpoint (step {step}, {epochs} full epoch(s) done) is in {self.out}; continue "
                f"with: vit-attention train --resume --output {self.out}")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that ``finally`` blocks (temporary files) run."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated()


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into an exception for the duration (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_finite_state(state: dict[str, Tensor], progress: _Progress, cfg: TrainConfig) -> None:
    """Raise :class:`TrainingDiverged` when a floating tensor of ``state`` holds NaN or infinity."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise TrainingDiverged(f"training diverged: the weights ({bad[0]}"
                               + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
                               + f") are not finite after step {progress.step}; nothing was saved. Try a lower "
                               f"--lr (now {cfg.lr:g}); {progress.where()}")


# ---------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train ``cfg.model`` on ``cfg.data``; returns ``{"test_acc", "test_top5", "history", "output", ...}``.

    Writes into ``cfg.output`` (rank 0): ``checkpoint.safetensors`` (+ ``.json``), ``metrics.csv``,
    ``metrics.json``, ``model.safetensors`` (+ ``model_ema.safetensors``), ``curves.png``,
    ``config.json``. Prints ``test accuracy: X`` as its last line.

    Raises :class:`TrainingDiverged` on a non-finite loss (before the optimizer step; nothing
    non-finite is written) and :class:`TrainingInterrupted` on Ctrl-C or SIGTERM; both messages say
    where the last good checkpoint is and how to resume.
    """
    from tqdm.auto import tqdm

    cfg.validate()
    if cfg.model_kwargs:
        check_model_kwargs(cfg.model, cfg.model_kwargs)
    if cfg.output:
        check_output_folder(cfg.output)
    info = init_distributed(cfg.device)
    threads = torch.get_num_threads()
    progress = _Progress()
    try:
        with _sigterm_as_interrupt():
            try:
                result = _train(cfg, info, tqdm, progress)
            except KeyboardInterrupt as e:
                term = isinstance(e, _Terminated)
                raise TrainingInterrupted(f"interrupted by {'SIGTERM' if term else 'Ctrl-C (SIGINT)'} at step "
                                          f"{progress.step}; {progress.where()}", 143 if term else 130) from None
        cleanup_distributed(sync=True)  # every rank done (rank 0 may still be writing) before leaving
        return result
    finally:
        torch.set_num_threads(threads)  # the thread choice is this run's, not the caller's
        cleanup_distributed()


@dataclass
class _Run:
    """What the steps of one run share: its options, data, model, optimizer and where it stands.

    Built by :func:`_setup`; ``step`` (optimizer steps done) and ``history`` (one row per finished
    epoch) advance as the run trains. ``out`` is rank 0's run folder once :func:`_open_run_folder`
    has created it.
    """

    cfg: TrainConfig
    info: DistInfo
    progress: _Progress
    tqdm: Any  # the progress-bar class (tqdm.auto.tqdm)
    data: DataBundle
    model: nn.Module  # the bare model
    model_cfg: dict[str, Any]
    net: nn.Module  # the model as trained: wrapped for DDP / FSDP, or the model itself
    optimizer: torch.optim.Optimizer
    ema: ModelEma | None
    transform: BatchTransform
    criterion: DistillationLoss | NextPixelObjective
    out: Path
    total_steps: int
    warmup_steps: int
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    n_params: int = 0
    show: bool = False  # progress bars (else one line per epoch)
    config_text: str = ""  # config.json, written with the first checkpoint
    forward_kwargs: dict[str, Any] = field(default_factory=dict)  # generative models: {"objective": "generative"}

    def lr(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` in this run's schedule."""
        return lr_at(step, total_steps=self.total_steps, warmup_steps=self.warmup_steps, lr=self.cfg.lr,
                     min_lr=self.cfg.min_lr)


@dataclass
class _Start:
    """Where training (re)starts: the epoch, the step within it, and that epoch's running sums and time so far."""

    epoch: int = 0
    in_epoch: int = 0
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # loss sum, correct, count
    train_time: float = 0.0


def _train(cfg: TrainConfig, info: DistInfo, tqdm: Any, progress: _Progress) -> dict[str, Any]:
    """One run on this rank: data, model and state (resumed or new), the epochs, then the final weights."""
    torch.manual_seed(cfg.seed)
    data = _load_data(cfg, info)
    run, start = _setup(cfg, info, data, tqdm, progress)
    _open_run_folder(run)
    stopped = _train_epochs(run, start)
    return stopped if stopped is not None else _finish(run)


def _load_data(cfg: TrainConfig, info: DistInfo) -> DataBundle:
    """The data of ``cfg`` (image folders at the model's input size); prints the input size and where it comes from.

    Warns about images much larger than the input, skipped images and thin splits.

    Raises ``ValueError`` when the batch does not fit the training set or the processes x accumulation steps.
    """
    img_size, source = cfg.img_size, "--img-size"
    if img_size is None and cfg.data not in (None, "digits"):  # image folders: the model's input size
        size = get_model_entry(cfg.model).config(**cfg.model_kwargs).img_size
        img_size = size if isinstance(size, int) else int(size[0])
        source = f"the model's default, {cfg.model}; --img-size to change"
    elif img_size is None:
        source = "the digits' default; --img-size to change"
    data = build_data(cfg.data, img_size=img_size, in_chans=cfg.in_chans, val_fraction=cfg.val_fraction,
                      crop_pct=cfg.crop_pct, seed=cfg.seed)
    for line in describe_input_size(data, source):
        _say(info, line)
    if data.skipped:
        _say(info, f"warning: skipped {len(data.skipped)} corrupt image(s), e.g. {data.skipped[0]}")
    for warning in check_classifiable(data, val_fraction=cfg.val_fraction):
        _say(info, f"warning: {warning}")
    n_train = len(data.train)
    if n_train < cfg.batch_size:
        raise ValueError(f"batch_size={cfg.batch_size} is larger than the {n_train} training images")
    if cfg.batch_size < info.world_size * cfg.accum_steps:
        raise ValueError(f"batch_size={cfg.batch_size} must be at least world_size x accum_steps "
                         f"= {info.world_size * cfg.accum_steps}")
    return data


def _load_checkpoint(cfg: TrainConfig, info: DistInfo, model: nn.Module, model_cfg: dict[str, Any],
                     out: Path) -> TrainingState | None:
    """With ``cfg.resume``: the checkpoint in ``out``, checked against ``model`` and loaded into it.

    Without: ``None``, after refusing an ``out`` that already holds a run (``ValueError``).
    """
    ckpt_path = out / CHECKPOINT_NAME
    if cfg.resume:
        ckpt = load_training_state(ckpt_path)
        check_resume_compatible(ckpt, model.registry_name, model_cfg, ckpt_path)
        _warn_changed_options(info, cfg, ckpt.state.get("config", {}))
        model.load_state_dict(ckpt.model)
        return ckpt
    if ckpt_path.exists() or (out / "metrics.json").exists():
        raise ValueError(f"output folder {out} already holds a run; pass --resume to continue it, or choose "
                         "another --output (nothing was overwritten)")
    return None


def _setup(cfg: TrainConfig, info: DistInfo, data: DataBundle, tqdm: Any,
           progress: _Progress) -> tuple[_Run, _Start]:
    """Model, teacher, EMA, optimizer, transform and loss for ``data``, resumed from the checkpoint with ``cfg.resume``.

    Returns the run and where its training starts (epoch 0, or the checkpoint's position, RNG restored).
    """
    model = build_model_for_data(cfg, data)
    generative = is_generative(model)
    if generative:  # trained on its own pixels (train/generative.py): images in [-1, 1], no labels, no teacher
        for name, bad in (("teacher", cfg.teacher), ("mixup", cfg.mixup), ("cutmix", cfg.cutmix)):
            if bad:
                raise ValueError(f"{cfg.model} trains generatively (next-pixel loss): --{name} does not apply")
        m = NextPixelObjective.normalization
        data = DataBundle(**{**data.__dict__, "mean": (m,) * data.in_chans, "std": (m,) * data.in_chans})
    _set_threads(cfg, info, model)
    model_cfg = model.cfg.to_dict() if hasattr(model.cfg, "to_dict") else {}
    out = Path(cfg.output) if cfg.output else Path("runs") / f"{cfg.model}-<time>"  # created by _open_run_folder
    ckpt = _load_checkpoint(cfg, info, model, model_cfg, out)
    teacher = None
    if cfg.teacher:
        teacher = build_teacher(cfg.teacher, num_classes=data.num_classes, img_size=data.img_size,
                                in_chans=data.in_chans, checkpoint=cfg.teacher_checkpoint).to(info.device)

    model.to(info.device)
    if cfg.grad_checkpointing:
        if not hasattr(model, "set_grad_checkpointing"):
            raise ValueError(f"{cfg.model} does not support gradient checkpointing")
        model.set_grad_checkpointing(True)
    ema = ModelEma(model, cfg.ema_decay) if cfg.ema_decay else None
    if ema is not None and ckpt is not None and ckpt.ema:
        ema.module.load_state_dict(ckpt.ema)
    net = wrap_model(model, info, fsdp=cfg.fsdp)
    optimizer = torch.optim.AdamW(param_groups(net, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.999))
    if ckpt is not None:
        load_optimizer_state(net, optimizer, optimizer_state_from_safe(ckpt.optim, ckpt.state["optimizer"]))
    transform = _make_transform(cfg, data).to(info.device)
    criterion = DistillationLoss(soft_target_cross_entropy, teacher,
                                 distill_type=cfg.distill_type if teacher else "none",
                                 alpha=cfg.distill_alpha, tau=cfg.distill_tau) if not generative \
        else NextPixelObjective(model)

    steps_per_epoch = len(data.train) // cfg.batch_size
    total_steps = steps_per_epoch * cfg.epochs
    run = _Run(cfg=cfg, info=info, progress=progress, tqdm=tqdm, data=data, model=model, model_cfg=model_cfg,
               net=net, optimizer=optimizer, ema=ema, transform=transform, criterion=criterion, out=out,
               total_steps=total_steps,
               warmup_steps=min(int(round(cfg.warmup_epochs * steps_per_epoch)), total_steps),
               forward_kwargs=dict(NextPixelObjective.forward_kwargs) if generative else {})
    start = _Start()
    if ckpt is not None:
        st = ckpt.state
        start = _Start(epoch=st["epoch"], in_epoch=st["step_in_epoch"],
                       sums=list(st["epoch_sums"]) if info.is_main else [0.0, 0.0, 0.0],
                       train_time=st.get("epoch_train_time", 0.0))
        run.step, run.history = st["global_step"], list(st["history"])
        restore_rng_state(ckpt.rng, st["rng"])
        progress.ckpt = (start.epoch, run.step)
        _say(info, f"resuming {out} at epoch {start.epoch + 1}, step {run.step}")
    if cfg.stop_after is not None and run.step >= cfg.stop_after:
        raise ValueError(f"stop_after={cfg.stop_after} is not after the checkpoint's step {run.step}")
    return run, start


def _open_run_folder(run: _Run) -> None:
    """Create the run folder on rank 0 (``--output``, or a new ``runs/<model>-<time>``) and share it with every rank.

    Sets ``run.out``, the progress bars' switch and ``config.json``'s text; prints the run's summary line.
    A folder rank 0 cannot create raises ``ValueError`` on every rank.
    """
    cfg, info, data = run.cfg, run.info, run.data
    run.n_params = sum(p.numel() for p in run.model.parameters())
    problem = None
    out = run.out
    if info.is_main:
        try:
            out = _make_output(out) if cfg.output else create_run_folder(cfg.model)
        except ValueError as e:
            problem = str(e)
    shared, problem = broadcast_object((str(out), problem))  # every rank writes to (or fails on) rank 0's folder
    if problem:
        raise ValueError(problem)
    run.out = Path(shared)
    run.progress.out, run.progress.step = run.out, run.step
    _say(info, f"model {cfg.model}: {run.n_params:,} parameters; data {data.name}: {len(data.train)} train / "
               f"{len(data.test)} test images, {data.num_classes} classes; {info.world_size} process(es) on "
               f"{info.device.type}; output {run.out}")
    run.config_text = json.dumps({"train": cfg.to_dict(), "model_name": run.model.registry_name,
                                  "model_config": run.model_cfg, "classes": data.classes, "mean": data.mean,
                                  "std": data.std}, indent=1)
    run.show = (sys.stderr.isatty() if cfg.progress is None else cfg.progress) and info.is_main


def _save_checkpoint(run: _Run, epoch: int, in_epoch: int, sums: Tensor, train_time: float) -> None:
    """Checkpoint the run at step ``in_epoch`` of ``epoch`` (every rank gathers; rank 0 writes).

    ``sums`` / ``train_time``: the epoch's running sums and training time so far. Non-finite weights
    raise :class:`TrainingDiverged` instead of being written. The first checkpoint of this
    invocation also writes ``config.json`` (a resumed run that fails before it saves keeps the old one).
    """
    info, progress = run.info, run.progress
    g_sums = all_reduce_sum(sums.clone())
    msd, osd = full_state_dict(run.net), full_optimizer_state(run.net, run.optimizer)
    if info.is_main:
        _check_finite_state(msd, progress, run.cfg)
        if run.ema is not None:
            _check_finite_state(run.ema.module.state_dict(), progress, run.cfg)
        data = run.data
        save_training_state(run.out / CHECKPOINT_NAME, model_state=msd, optimizer_state=osd,
                            ema_state=run.ema.module.state_dict() if run.ema else None,
                            state={"epoch": epoch, "step_in_epoch": in_epoch, "global_step": run.step,
                                   "epoch_sums": g_sums.tolist(), "epoch_train_time": train_time,
                                   "history": run.history, "config": run.cfg.to_dict(),
                                   "model_name": run.model.registry_name, "model_config": run.model_cfg,
                                   "world_size": info.world_size, "classes": data.classes,
                                   "mean": list(data.mean), "std": list(data.std)})
        if not progress.config_written:
            atomic_write(run.out / "config.json", lambda tmp: Path(tmp).write_text(run.config_text))
            progress.config_written = True
    progress.ckpt = (epoch, run.step)


def _train_epochs(run: _Run, start: _Start) -> dict[str, Any] | None:
    """Train from ``start`` to the last epoch, evaluating and checkpointing after each.

    Returns the ``--stop-after`` result when the run stops early, else ``None``.
    """
    cfg, info = run.cfg, run.info
    epoch_bar = run.tqdm(total=cfg.epochs, initial=start.epoch, desc="epochs", unit="ep", disable=not run.show,
                         file=sys.stderr, dynamic_ncols=True)
    for epoch in range(start.epoch, cfg.epochs):
        resumed = epoch == start.epoch
        sums = torch.tensor(start.sums if resumed else [0.0, 0.0, 0.0], dtype=torch.float64,
                            device=info.device)  # loss sum, correct, count
        train_time, stopped = _train_epoch(run, epoch, start.in_epoch if resumed else 0, sums,
                                           start.train_time if resumed else 0.0)
        if not stopped:
            row = _end_epoch(run, epoch, sums, train_time)
            epoch_bar.set_postfix(loss=f"{row['train_loss']:.3f}", test_acc=f"{row['test_acc']:.4f}")
            epoch_bar.update(1)
            if not run.show:
                _say(info, f"epoch {epoch + 1}/{cfg.epochs}: train loss {row['train_loss']:.4f} acc "
                           f"{row['train_acc']:.4f} | test loss {row['test_loss']:.4f} acc {row['test_acc']:.4f} | "
                           f"{row['train_img_s']:.0f} img/s"
                           + (f" | test {row['test_bpd']:.3f} bits/dim" if "test_bpd" in row else ""))
            stopped = cfg.stop_after is not None and run.step >= cfg.stop_after and epoch + 1 < cfg.epochs
        if stopped:
            epoch_bar.close()
            _say(info, f"stopped at step {run.step} (--stop-after); continue with --resume --output {run.out}")
            return {"stopped": True, "step": run.step, "history": run.history, "output": str(run.out)}
    epoch_bar.close()
    return None


def _train_epoch(run: _Run, epoch: int, first: int, sums: Tensor, train_time: float) -> tuple[float, bool]:
    """The optimizer steps of ``epoch`` from its step ``first`` on, adding to the running ``sums`` in place.

    Checkpoints every ``--ckpt-every`` steps and where ``--stop-after`` stops the run. Returns the
    epoch's training time and whether ``--stop-after`` stopped it before the epoch's end.
    """
    cfg, show = run.cfg, run.show
    batches = batch_indices(len(run.data.train), cfg.batch_size, epoch=epoch, seed=cfg.seed, drop_last=True)
    run.net.train()
    run.transform.train()
    stopped = False
    bar = run.tqdm(total=len(batches), initial=first, desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="step",
                   leave=False, disable=not show, file=sys.stderr, dynamic_ncols=True)
    for bi in range(first, len(batches)):
        t0 = time.perf_counter()
        lr = _train_step(run, batches[bi], epoch, sums)
        train_time += time.perf_counter() - t0
        if show:
            cnt = max(sums[2].item(), 1.0)
            bar.set_postfix(loss=f"{sums[0].item() / cnt:.3f}", acc=f"{sums[1].item() / cnt:.3f}",
                            img_s=f"{cnt * run.info.world_size / max(train_time, 1e-9):.0f}", lr=f"{lr:.2e}")
            bar.update(1)
        stopped = cfg.stop_after is not None and run.step >= cfg.stop_after and bi + 1 < len(batches)
        if stopped or (cfg.ckpt_every and run.step % cfg.ckpt_every == 0 and bi + 1 < len(batches)):
            _save_checkpoint(run, epoch, bi + 1, sums, train_time)
        if stopped:
            break
    bar.close()
    return train_time, stopped


def _train_step(run: _Run, batch: list[int], epoch: int, sums: Tensor) -> float:
    """One optimizer step on the global ``batch`` (image indices); returns its learning rate.

    Re-seeds from ``(seed, step, rank)``, runs this rank's micro-batches (adding loss, correct and
    count to ``sums``), then clips, steps and updates the EMA. A loss that is not finite on any rank
    raises :class:`TrainingDiverged` before the optimizer step, on every rank.
    """
    cfg, info = run.cfg, run.info
    seed_step(cfg.seed, run.step, info.rank)
    lr = run.lr(run.step)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    local = shard_indices(batch, info.rank, info.world_size)
    micro = [shard_indices(local, i, cfg.accum_steps) for i in range(cfg.accum_steps)]
    run.optimizer.zero_grad(set_to_none=True)
    step_loss = torch.zeros((), dtype=torch.float64, device=info.device)
    for mi, (x, y) in enumerate(iterate_batches(run.data.train, micro, workers=cfg.workers)):
        x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
        x = run.transform(x)
        x, target = mix_batch(x, y, run.data.num_classes, mixup=cfg.mixup, cutmix=cfg.cutmix,
                              label_smoothing=cfg.label_smoothing)
        with no_sync(run.net, skip=mi < cfg.accum_steps - 1), _autocast(info.device, cfg.amp):
            outputs = run.net(x, **run.forward_kwargs)
            per_sample = run.criterion(x, outputs, target)  # [b]
            loss = per_sample.sum() * (info.world_size / len(batch))
            loss.backward()
        step_loss += per_sample.detach().sum().double()
        with torch.no_grad():
            logits = outputs[0] if isinstance(outputs, tuple) else outputs
            hits = run.criterion.correct(x, logits) if isinstance(run.criterion, NextPixelObjective) \
                else (logits.argmax(-1) == y).sum()  # generative: the fraction of pixels right, per image
            sums += torch.stack([per_sample.detach().sum().double(), hits.double(),
                                 torch.tensor(float(len(y)), dtype=torch.float64, device=info.device)])
    # a non-finite loss stops the run before the step: the weights on disk stay the last good ones
    # (one scalar summed over ranks, so every rank stops at the same step)
    step_loss = all_reduce_sum(step_loss)
    if not math.isfinite(step_loss.item()):
        raise TrainingDiverged(
            f"training diverged: the loss is {step_loss.item()} at step {run.step + 1} (epoch {epoch + 1}, "
            f"learning rate {lr:.3g}); nothing non-finite was saved. Try a lower --lr (now {cfg.lr:g})"
            + ("" if cfg.clip_grad else " and keep gradient clipping on (--clip-grad 1)")
            + f"; {run.progress.where()}")
    if cfg.clip_grad:  # (FSDP: DTensor gradients, the norm is global)
        torch.nn.utils.clip_grad_norm_(run.net.parameters(), cfg.clip_grad)
    run.optimizer.step()
    if run.ema is not None:
        run.ema.update(run.net)
    run.step += 1
    run.progress.step = run.step
    return lr


def _end_epoch(run: _Run, epoch: int, sums: Tensor, train_time: float) -> dict[str, Any]:
    """After ``epoch``: evaluate (and the EMA), add the metrics row, checkpoint, write the metrics; returns the row."""
    cfg, info, data = run.cfg, run.info, run.data
    g = all_reduce_sum(sums.clone())
    count = max(g[2].item(), 1.0)
    ev = evaluate(run.net, data.test, run.transform, info=info, amp=cfg.amp, workers=cfg.workers)
    row: dict[str, Any] = {"epoch": epoch + 1, "step": run.step, "lr": run.lr(run.step - 1),  # the last step's
                           "train_loss": g[0].item() / count, "train_acc": g[1].item() / count,
                           "test_loss": ev["loss"], "test_acc": ev["top1"], "test_top5": ev["top5"],
                           "train_img_s": count / max(train_time, 1e-9)}
    if "bpd" in ev:  # generative models: the test next-pixel loss in bits per dimension
        row["test_bpd"] = ev["bpd"]
    if run.ema is not None:
        row["test_acc_ema"] = evaluate(run.ema.module, data.test, run.transform, info=info, amp=cfg.amp,
                                       workers=cfg.workers)["top1"]
    run.history.append(row)
    _save_checkpoint(run, epoch + 1, 0, torch.zeros(3, dtype=torch.float64, device=info.device), 0.0)
    if info.is_main:
        _write_metrics(run.out, run.history)
    return row


def _finish(run: _Run) -> dict[str, Any]:
    """Score the final weights, write them (and the EMA's) with their metadata, the curves, and print the results.

    Returns :func:`train`'s result. Non-finite weights raise :class:`TrainingDiverged` instead of being written.
    """
    cfg, info, data, ema = run.cfg, run.info, run.data, run.ema
    final = evaluate(run.net, data.test, run.transform, info=info, amp=cfg.amp, workers=cfg.workers)
    bare = unwrap_model(run.net)
    result: dict[str, Any] = {"test_acc": final["top1"], "test_top5": final["top5"], "test_loss": final["loss"],
                              "history": run.history, "output": str(run.out), "params": run.n_params,
                              "model": bare, "input_size": data.img_size, "device": info.device}
    msd = full_state_dict(run.net)
    result["threads"] = torch.get_num_threads()  # the thread count this run trained with (compare times with it)
    if ema is not None:
        result["test_acc_ema"] = evaluate(ema.module, data.test, run.transform, info=info, amp=cfg.amp,
                                          workers=cfg.workers)["top1"]
    if "bpd" in final:  # generative: bits/dim, and a linear probe of the middle block's features on the labels
        result["test_bpd"] = final["bpd"]
        result["probe_acc"], result["probe_layer"] = probe_datasets(
            bare, data.train, data.test, run.transform, info.device, num_classes=data.num_classes)
    if not info.is_main:
        return result
    _check_finite_state(msd, run.progress, cfg)
    meta = {"classes": data.classes, "mean": list(data.mean), "std": list(data.std),
            "data": str(Path(cfg.data).resolve()) if cfg.data and cfg.data != "digits" else "digits",
            "crop_pct": cfg.crop_pct if data.name != "digits" else 1.0, "val_fraction": cfg.val_fraction,
            "split_seed": cfg.seed, "test_acc": final["top1"], "model": bare.registry_name,
            "config": bare.cfg.to_json()}
    save_weights(msd, run.out / "model.safetensors", metadata=meta)
    if ema is not None:
        _check_finite_state(ema.module.state_dict(), run.progress, cfg)
        save_weights(ema.module.state_dict(), run.out / "model_ema.safetensors",
                     metadata={**meta, "test_acc": result["test_acc_ema"]})
    if cfg.plot and run.history:
        plot_curves(run.history, run.out / "curves.png", title=f"{cfg.model} on {data.name}")
    print(f"wrote {run.out}/ (model.safetensors, checkpoint.safetensors, metrics.csv, metrics.json"
          + (", curves.png" if cfg.plot else "") + ")", flush=True)
    print(f"test top-5 accuracy: {final['top5']:.4f}", flush=True)
    if ema is not None:
        print(f"test accuracy (EMA weights): {result['test_acc_ema']:.4f}", flush=True)
    if "bpd" in final:
        print(f"test next-pixel loss: {final['bpd']:.4f} bits/dim (pixel accuracy {final['top1']:.4f}); linear probe "
              f"of block {result['probe_layer']} on the labels: test accuracy {result['probe_acc']:.4f}", flush=True)
    print(f"test accuracy: {final['top1']:.4f}", flush=True)
    return result
