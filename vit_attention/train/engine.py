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
says how to resume (temporary files of a write in progress are removed); a full disk ends it with
:class:`RunWriteError`, which says the same. A default run folder ``runs/<model>-<time>`` is created
exclusively (``-1``, ``-2``, ... on collision), and every run folder is locked for the run's life
(:class:`~.run_folder.RunLock`), so two runs never write one folder; a resume rewrites the metrics
files from the checkpoint, so they always agree with it.

One run is a few named steps sharing a ``_Run`` (options, data, model, optimizer, step, history):
``_load_data``; ``_claim_run_folder`` (rank 0 creates and locks the folder); ``_setup`` (model,
teacher, EMA, optimizer; the checkpoint and its position with ``resume``); ``_open_run_folder``;
``_train_epochs``, which runs ``_train_epoch`` (its ``_train_step`` calls and the ``--ckpt-every`` /
``--stop-after`` checkpoints) and ``_end_epoch`` (evaluation, metrics row, epoch checkpoint) per
epoch; and ``_finish`` (final score, weights, curves).
``train`` around them checks the options, sets up the processes and turns signals into
:class:`TrainingInterrupted`.

This module is the loop; its pieces live beside it and are imported from there: the options in
``config.py``, the schedule / AdamW groups / EMA / seeding in ``optim.py``, evaluation and the
metrics files in ``metrics.py``, the failure types and their messages in ``errors.py``, run folders
in ``run_folder.py`` and the curves in ``plots.py``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..factory import config_kwargs, create_model
from ..weights.hub import pretrained_cfg_for, split_model_tag
from ..weights.io import atomic_write_text, save_weights
from .checkpoint import (
    CHECKPOINT_NAME,
    TrainingState,
    check_resume_compatible,
    check_training_state,
    load_training_state,
    optimizer_state_from_safe,
    restore_rng_state,
    save_training_state,
)
from .config import TrainConfig, check_model_kwargs, model_entry
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
    to_device,
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
    load_optimizer_state,
    no_sync,
    unwrap_model,
    wrap_model,
)
from .errors import (
    RunWriteError,
    TrainingDiverged,
    TrainingInterrupted,
    TrainingOutOfMemory,
    _check_finite_state,
    _out_of_memory_error,
    _Progress,
    _sigterm_as_interrupt,
    _Terminated,
    _writing,
    out_of_memory,
)
from .generative import NextPixelObjective, is_generative, probe_datasets
from .metrics import _write_metrics, evaluate
from .optim import ModelEma, _autocast, lr_at, param_groups, seed_step
from .plots import plot_curves
from .run_folder import RunLock, check_output_folder, claim_run_folder, create_run_folder

__all__ = ["train"]


def _model_overrides(cfg: TrainConfig, data: DataBundle) -> dict[str, Any]:
    kw: dict[str, Any] = dict(cfg.model_kwargs)
    for name in ("drop_rate", "drop_path_rate", "attn_drop_rate"):
        if getattr(cfg, name) is not None:
            kw[name] = getattr(cfg, name)
    kw.setdefault("in_chans", data.in_chans)
    return kw


def build_model_for_data(cfg: TrainConfig, data: DataBundle, *, pretrained: bool = True) -> nn.Module:
    """The model ``cfg.model`` sized for ``data`` (classes, channels, image size), with ``cfg.pretrained``'s
    weights unless ``pretrained=False`` (a resumed run: its checkpoint holds them); an unknown name raises
    ``create_model``'s ``KeyError`` (with suggestions)."""
    return create_model(cfg.model, num_classes=data.num_classes, img_size=data.img_size,
                        pretrained=cfg.pretrained if pretrained and cfg.pretrained else None,
                        **_model_overrides(cfg, data))


def _pretrained_normalisation(cfg: TrainConfig, data: DataBundle, model: nn.Module) -> DataBundle:
    """``data`` normalised as the pretrained weights were trained (their data config's mean / std), for an RGB
    image folder fine-tuned from weights; ``data`` unchanged otherwise (the digits keep their own statistics)."""
    pcfg = getattr(model, "pretrained_cfg", None) or {}
    if not cfg.pretrained or data.name == "digits" or data.in_chans != 3 or "mean" not in pcfg:
        return data
    return data.normalised_with(pcfg["mean"], pcfg["std"])


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


# ---------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train ``cfg.model`` on ``cfg.data``; returns ``{"test_acc", "test_top5", "history", "output", ...}``.

    Writes into ``cfg.output`` (rank 0): ``checkpoint.safetensors`` (+ ``.json``), ``metrics.csv``,
    ``metrics.json``, ``model.safetensors`` (+ ``model_ema.safetensors``), ``curves.png``,
    ``config.json``. Prints ``test accuracy: X`` as its last line (``test next-pixel accuracy: X`` for a
    generative model: its accuracy is of the next pixel, not of the labels).

    Raises :class:`TrainingDiverged` on a non-finite loss (before the optimizer step; nothing
    non-finite is written), :class:`TrainingInterrupted` on Ctrl-C or SIGTERM, :class:`RunWriteError`
    when a file cannot be written (a full disk) and :class:`TrainingOutOfMemory` when an allocation
    fails; their messages say where the last good checkpoint is and how to resume. The run folder is
    locked for the run's life: a second run on it is refused (``RunFolderBusy``, a ``ValueError``).
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
    progress.resuming = Path(cfg.output) if cfg.resume and cfg.output else None
    try:
        with _sigterm_as_interrupt():
            try:
                result = _train(cfg, info, tqdm, progress)
            except KeyboardInterrupt as e:
                term = isinstance(e, _Terminated)
                raise TrainingInterrupted(f"interrupted by {'SIGTERM' if term else 'Ctrl-C (SIGINT)'} at step "
                                          f"{progress.step}; {progress.where()}", 143 if term else 130) from None
            except (MemoryError, RuntimeError) as e:
                if isinstance(e, TrainingOutOfMemory) or not out_of_memory(e):
                    raise
                raise _out_of_memory_error(e, progress, cfg) from None
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
    started: float = field(default_factory=time.perf_counter)  # this invocation's start (the wall time summary)

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
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    data = _load_data(cfg, info)
    out, lock = _claim_run_folder(cfg, info)
    try:
        run, start = _setup(cfg, info, data, tqdm, progress, out)
        run.started = started
        _open_run_folder(run)
        stopped = _train_epochs(run, start)
        return stopped if stopped is not None else _finish(run)
    finally:
        if lock is not None:
            lock.release()


def _claim_run_folder(cfg: TrainConfig, info: DistInfo) -> tuple[Path, RunLock | None]:
    """Rank 0 creates and locks the run folder (``--output``, or a new ``runs/<model>-<time>``); every rank gets it.

    Returns the folder and rank 0's held lock (``None`` on other ranks). The lock makes this process
    the folder's only writer until the run ends; a new run is refused, under the lock, when the folder
    holds files a run writes. A refusal raises ``ValueError`` on every rank (rank 0 decides, then one
    broadcast: no rank waits for another that already failed).
    """
    lock, problem, out = None, None, Path(cfg.output or ".")
    if info.is_main:
        try:
            out = Path(cfg.output) if cfg.output else create_run_folder(cfg.model)
            lock = claim_run_folder(out, resume=cfg.resume, new=not cfg.output)
        except ValueError as e:
            problem = str(e)
    shared, problem = broadcast_object((str(out), problem))
    if problem:
        raise ValueError(problem)
    return Path(shared), lock


def _load_data(cfg: TrainConfig, info: DistInfo) -> DataBundle:
    """The data of ``cfg`` (image folders at the model's input size); prints the input size and where it comes from.

    Warns about images much larger than the input, skipped images and thin splits.

    Raises ``ValueError`` when the batch does not fit the training set or the processes x accumulation steps.
    """
    img_size, source = cfg.img_size, "--img-size"
    base, tag = split_model_tag(cfg.model)
    if img_size is None and cfg.data not in (None, "digits") and tag and "img_size" not in cfg.model_kwargs:
        # NAME.TAG: the size its weights were trained at (MobileViT v2's _384 tags: 384 for a 256 preset)
        img_size = int(pretrained_cfg_for(base, tag)["input_size"][-1])
        source = f"the input size of {cfg.model}'s weights; --img-size to change"
    elif img_size is None and cfg.data not in (None, "digits"):  # image folders: the model's input size
        size = model_entry(cfg.model).config(**config_kwargs(cfg.model_kwargs)).img_size
        img_size = size if isinstance(size, int) else int(size[0])
        source = f"the model's default, {cfg.model}; --img-size to change"
    elif img_size is None:
        source = "the digits' default; --img-size to change"
    naflex_patch = (model_entry(cfg.model).config(**config_kwargs(cfg.model_kwargs)).patch_size if cfg.naflex
                    else None)
    data = build_data(cfg.data, img_size=img_size, in_chans=cfg.in_chans, val_fraction=cfg.val_fraction,
                      crop_pct=cfg.crop_pct, seed=cfg.seed, naflex_patch=naflex_patch, max_seq_len=cfg.max_seq_len)
    if cfg.naflex:
        _say(info, f"NaFlex: each image at its own aspect, at most {cfg.max_seq_len} patches of {naflex_patch} px, "
                   f"packed to {cfg.max_seq_len} (--max-seq-len)")
    for line in ([] if cfg.naflex else describe_input_size(data, source)):  # NaFlex: its own line above
        _say(info, line)
    for warning in check_classifiable(data, val_fraction=cfg.val_fraction):
        _say(info, f"warning: {warning}")
    n_train = len(data.train)
    if n_train < cfg.batch_size:  # a small folder: each epoch is one batch of every image (batch_indices)
        _say(info, f"note: the {n_train} training images are fewer than --batch-size {cfg.batch_size}: each epoch "
                   f"is one batch of all {n_train}")
    if min(cfg.batch_size, n_train) < info.world_size * cfg.accum_steps:
        raise ValueError(f"batch_size={min(cfg.batch_size, n_train)} must be at least world_size x accum_steps "
                         f"= {info.world_size * cfg.accum_steps}")
    if cfg.warmup_epochs >= cfg.epochs:
        _say(info, f"warning: --warmup-epochs {cfg.warmup_epochs:g} >= --epochs {cfg.epochs}: the learning rate "
                   "warms up for the whole run and never decays; give fewer warm-up epochs or more epochs")
    return data


def _load_checkpoint(cfg: TrainConfig, info: DistInfo, model: nn.Module, model_cfg: dict[str, Any],
                     out: Path) -> TrainingState | None:
    """With ``cfg.resume``: the checkpoint in ``out``, checked against ``model`` and loaded into it.

    Without: ``None`` (a new run; :func:`_claim_run_folder` refused a folder that holds one).
    """
    if not cfg.resume:
        return None
    ckpt_path = out / CHECKPOINT_NAME
    ckpt = load_training_state(ckpt_path)
    check_training_state(ckpt.state, ckpt.rng, ckpt_path)  # every field the resume reads, before it reads one
    check_resume_compatible(ckpt, model.registry_name, model_cfg, ckpt_path)
    _warn_changed_options(info, cfg, ckpt.state.get("config", {}))
    model.load_state_dict(ckpt.model)
    return ckpt


def _setup(cfg: TrainConfig, info: DistInfo, data: DataBundle, tqdm: Any,
           progress: _Progress, out: Path) -> tuple[_Run, _Start]:
    """Model, teacher, EMA, optimizer, transform and loss for ``data``, resumed from the checkpoint with ``cfg.resume``.

    ``out``: the run folder (claimed by :func:`_claim_run_folder`).

    Returns the run and where its training starts (epoch 0, or the checkpoint's position, RNG restored).
    """
    model = build_model_for_data(cfg, data, pretrained=not cfg.resume)
    data = _pretrained_normalisation(cfg, data, model)
    generative = is_generative(model)
    if generative:  # trained on its own pixels (train/generative.py): images in [-1, 1], no labels, no teacher
        for name, bad in (("teacher", cfg.teacher), ("mixup", cfg.mixup), ("cutmix", cfg.cutmix)):
            if bad:
                raise ValueError(f"{cfg.model} trains generatively (next-pixel loss): --{name} does not apply")
        m = NextPixelObjective.normalization
        data = data.normalised_with((m,) * data.in_chans, (m,) * data.in_chans)
    _set_threads(cfg, info, model)
    model_cfg = model.cfg.to_dict() if hasattr(model.cfg, "to_dict") else {}
    ckpt = _load_checkpoint(cfg, info, model, model_cfg, out)
    if ckpt is not None and not generative and "mean" in ckpt.state:  # a resumed run normalises as it began
        data = data.normalised_with(ckpt.state["mean"], ckpt.state["std"])
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
    optimizer = torch.optim.AdamW(param_groups(net, cfg.weight_decay, cfg.layer_decay), lr=cfg.lr,
                                  betas=(0.9, 0.999))
    if ckpt is not None:
        load_optimizer_state(net, optimizer, optimizer_state_from_safe(ckpt.optim, ckpt.state["optimizer"]))
    transform = _make_transform(cfg, data).to(info.device)
    criterion = DistillationLoss(soft_target_cross_entropy, teacher,
                                 distill_type=cfg.distill_type if teacher else "none",
                                 alpha=cfg.distill_alpha, tau=cfg.distill_tau) if not generative \
        else NextPixelObjective(model)

    steps_per_epoch = max(1, len(data.train) // cfg.batch_size)  # fewer images than a batch: one
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
        if start.epoch >= cfg.epochs:  # nothing left: say so (the final scores and weights are written again)
            _say(info, f"the run in {out} has finished its {cfg.epochs} epoch(s) (step {run.step}): nothing to "
                       f"train; give a larger --epochs with --resume to train it further")
        else:
            _say(info, f"resuming {out} at epoch {start.epoch + 1}, step {run.step}")
    if cfg.stop_after is not None and run.step >= cfg.stop_after:
        raise ValueError(f"stop_after={cfg.stop_after} is not after the checkpoint's step {run.step}")
    return run, start


def _open_run_folder(run: _Run) -> None:
    """Start writing in the run folder: a resumed run's metrics files rewritten from its checkpoint (rank 0).

    Sets the progress record, the progress bars' switch and ``config.json``'s text; prints the run's
    summary line. The metrics files follow the checkpoint: a run killed between an epoch's checkpoint
    and its metrics (or after) gets them back whole, whatever epoch it resumes at.
    """
    cfg, info, data = run.cfg, run.info, run.data
    run.n_params = sum(p.numel() for p in run.model.parameters())
    run.progress.out, run.progress.step = run.out, run.step
    if cfg.resume:
        def write() -> None:
            with _writing(run.out / "metrics.json", run.progress):
                _write_metrics(run.out, run.history)

        _on_rank0(info, write)
    weights = "" if not cfg.pretrained else (
        f" from {cfg.pretrained}" if isinstance(cfg.pretrained, str) else " from the preset's published weights")
    _say(info, f"model {cfg.model}{weights}: {run.n_params:,} parameters; data {data.name}: {len(data.train)} train / "
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

    def write() -> None:
        _check_finite_state(msd, progress, run.cfg)
        if run.ema is not None:
            _check_finite_state(run.ema.module.state_dict(), progress, run.cfg)
        data = run.data
        with _writing(run.out / CHECKPOINT_NAME, progress):
            save_training_state(run.out / CHECKPOINT_NAME, model_state=msd, optimizer_state=osd,
                                ema_state=run.ema.module.state_dict() if run.ema else None,
                                state={"epoch": epoch, "step_in_epoch": in_epoch, "global_step": run.step,
                                       "epoch_sums": g_sums.tolist(), "epoch_train_time": train_time,
                                       "history": run.history, "config": run.cfg.to_dict(),
                                       "model_name": run.model.registry_name, "model_config": run.model_cfg,
                                       "world_size": info.world_size, "classes": data.classes,
                                       "mean": list(data.mean), "std": list(data.std)})
        progress.ckpt = (epoch, run.step)  # the checkpoint is whole on disk from here on
        if not progress.config_written:
            with _writing(run.out / "config.json", progress):
                atomic_write_text(run.out / "config.json", run.config_text)
            progress.config_written = True

    _on_rank0(info, write)
    progress.ckpt = (epoch, run.step)


def _on_rank0(info: DistInfo, write: Callable[[], None]) -> None:
    """Run ``write`` on rank 0 and share how it ended: when it raises :class:`TrainingDiverged` or
    :class:`RunWriteError` (a full disk), every rank raises the same error (one broadcast) instead of
    the others waiting for rank 0 in the next collective."""
    if not info.enabled:
        write()
        return
    failure: tuple[bool, str] | None = None
    if info.is_main:
        try:
            write()
        except (TrainingDiverged, RunWriteError) as e:
            failure = (isinstance(e, TrainingDiverged), str(e))
    failure = broadcast_object(failure)
    if failure is not None:
        raise (TrainingDiverged if failure[0] else RunWriteError)(failure[1])


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
            acc = "next-pixel acc" if "test_bpd" in row else "acc"  # generative: the accuracy of the pixels
            line = (f"epoch {epoch + 1}/{cfg.epochs}: train loss {row['train_loss']:.4f} {acc} "
                    f"{row['train_acc']:.4f} | test loss {row['test_loss']:.4f} {acc} {row['test_acc']:.4f} | "
                    f"{row['train_img_s']:.0f} img/s" + (f" | test {row['test_bpd']:.3f} bits/dim" if "test_bpd" in row
                                                         else ""))
            if run.show:  # above the bars, which stay at the bottom: every epoch keeps its line in the terminal
                run.tqdm.write(line, file=sys.stdout)
            else:
                _say(info, line)
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
        group["lr"] = lr * group.get("lr_scale", 1.0)  # layer-wise decay (--layer-decay) scales each group
    local = shard_indices(batch, info.rank, info.world_size)
    micro = [shard_indices(local, i, cfg.accum_steps) for i in range(cfg.accum_steps)]
    run.optimizer.zero_grad(set_to_none=True)
    step_loss = torch.zeros((), dtype=torch.float64, device=info.device)
    for mi, (x, y) in enumerate(iterate_batches(run.data.train, micro, workers=cfg.workers)):
        x, y = to_device(x, info.device), y.to(info.device, non_blocking=True)  # x: images or a packed NaFlex dict
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

    def write() -> None:
        with _writing(run.out / "metrics.json", run.progress):
            _write_metrics(run.out, run.history)

    _on_rank0(info, write)
    return row


def _run_summary(run: _Run) -> str:
    """One line after the run: its best epoch and accuracy, the wall time, and which weights ``model.safetensors``
    holds (the last epoch's; no separate best-epoch file is written)."""
    acc = "next-pixel accuracy" if "test_bpd" in run.history[-1] else "accuracy"
    best = max(run.history, key=lambda r: r["test_acc"])
    last = run.history[-1]
    secs = time.perf_counter() - run.started
    wall = f"{int(secs // 60)} min {int(secs % 60)} s" if secs >= 60 else f"{secs:.1f} s"
    where = ("the last epoch's, the best" if best is last else
             f"the last epoch's ({last['epoch']}, test {acc} {last['test_acc']:.4f})")
    return (f"best epoch {best['epoch']}/{run.cfg.epochs}: test {acc} {best['test_acc']:.4f}; wall time {wall}; "
            f"weights: {run.out}/model.safetensors ({where})")


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
    if cfg.naflex:  # eval / predict read the images as training did: aspect kept, this patch budget
        meta.update(naflex=True, max_seq_len=cfg.max_seq_len)
    with _writing(run.out / "model.safetensors", run.progress):
        save_weights(msd, run.out / "model.safetensors", metadata=meta)
    if ema is not None:
        _check_finite_state(ema.module.state_dict(), run.progress, cfg)
        with _writing(run.out / "model_ema.safetensors", run.progress):
            save_weights(ema.module.state_dict(), run.out / "model_ema.safetensors",
                         metadata={**meta, "test_acc": result["test_acc_ema"]})
    if cfg.plot and run.history:
        with _writing(run.out / "curves.png", run.progress):
            plot_curves(run.history, run.out / "curves.png", title=f"{cfg.model} on {data.name}")
    print(f"wrote {run.out}/ (model.safetensors, checkpoint.safetensors, metrics.csv, metrics.json"
          + (", curves.png" if cfg.plot else "") + ")", flush=True)
    if run.history:
        print(_run_summary(run), flush=True)
    print(f"test top-5 accuracy: {final['top5']:.4f}", flush=True)
    if ema is not None:
        print(f"test accuracy (EMA weights): {result['test_acc_ema']:.4f}", flush=True)
    if "bpd" in final:  # generative: its accuracy is of the next pixel, and its last line says so
        print(f"test next-pixel loss: {final['bpd']:.4f} bits/dim; linear probe of block {result['probe_layer']} on "
              f"the labels: test accuracy {result['probe_acc']:.4f}", flush=True)
        print(f"test next-pixel accuracy: {final['top1']:.4f}", flush=True)
    else:
        print(f"test accuracy: {final['top1']:.4f}", flush=True)
    return result
