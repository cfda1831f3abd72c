"""How a run fails without losing work: :class:`TrainingDiverged` (a non-finite loss or weights),
:class:`TrainingInterrupted` (Ctrl-C / SIGTERM), the progress record their messages quote (where the
last good checkpoint is and how to resume), SIGTERM turned into an exception, and the check that
keeps non-finite weights off disk."""

from __future__ import annotations

import errno
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import Tensor

from .config import TrainConfig

__all__ = ["TrainingDiverged", "TrainingInterrupted", "RunWriteError", "TrainingOutOfMemory", "disk_full",
           "out_of_memory"]


class TrainingDiverged(RuntimeError):
    """The loss (or the weights) became non-finite; nothing non-finite was written."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; ``str(e)`` says how to resume, ``e.exit_code`` is 130 or 143."""

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class RunWriteError(OSError):
    """A file of the run could not be written (a full disk, a folder made read-only); ``str(e)`` says how to resume."""


class TrainingOutOfMemory(MemoryError):
    """An allocation failed during the run; ``str(e)`` says which options use less memory and how to resume."""


class _Progress:
    """What the interrupt and divergence messages need to know about the run so far."""

    def __init__(self) -> None:
        self.out: Path | None = None
        self.step = 0
        self.ckpt: tuple[int, int] | None = None  # (full epochs done, global step) of the last checkpoint
        self.config_written = False  # config.json of this invocation written (with its first checkpoint)
        self.resuming: Path | None = None  # the run folder of a --resume, known before the run starts

    def where(self) -> str:
        """Where the run can continue from, as a sentence."""
        if self.out is None and self.resuming is not None:
            return (f"the run in {self.resuming} was not changed and can be resumed again with: "
                    f"vit-attention train --resume --output {self.resuming}")
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



def disk_full(e: BaseException) -> bool:
    """Whether ``e`` (an ``OSError`` or a safetensors writer error) reports a full disk or quota."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return bool(re.search(r"StorageFull|No space left|code: 28\b|QuotaExceeded", str(e)))


@contextmanager
def _writing(path: Path, progress: _Progress) -> Iterator[None]:
    """Turn a failed write of ``path`` (``OSError``, ``SafetensorError``) into :class:`RunWriteError`.

    Its message names the file, what to do (free disk space) and where the run can continue from.
    """
    try:
        yield
    except RunWriteError:
        raise
    except (OSError, SafetensorError) as e:
        if disk_full(e):
            reason = "the disk is full; free some space"
        else:
            reason = ((e.strerror if isinstance(e, OSError) else None) or str(e)) + "; make the folder writable"
        raise RunWriteError(f"cannot write {path}: {reason}; {progress.where()}") from None


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation failure (``MemoryError``, torch's CPU / CUDA out-of-memory errors)."""
    if isinstance(e, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(e, RuntimeError) and bool(re.search(r"can't allocate memory|out of memory", str(e)))


def _out_of_memory_error(e: BaseException, progress: _Progress, cfg: TrainConfig) -> TrainingOutOfMemory:
    """The one-line error of an allocation failure: the options that use less memory and how to resume."""
    detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    detail = re.sub(r"^\[enforce fail at [^]]*\] ?", "", detail)
    return TrainingOutOfMemory(
        f"out of memory at step {progress.step} ({detail}): use less memory per step with a smaller --batch-size "
        f"(now {cfg.batch_size}), or keep it and raise --accum-steps (now {cfg.accum_steps}; the same result in "
        f"smaller pieces), or --grad-checkpointing; {progress.where()}")
