"""How a run fails without losing work: :class:`TrainingDiverged` (a non-finite loss or weights),
:class:`TrainingInterrupted` (Ctrl-C / SIGTERM), the progress record their messages quote (where the
last good checkpoint is and how to resume), SIGTERM turned into an exception, and the check that
keeps non-finite weights off disk."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .config import TrainConfig

__all__ = ["TrainingDiverged", "TrainingInterrupted"]


class TrainingDiverged(RuntimeError):
    """The loss (or the weights) became non-finite; nothing non-finite was written."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; ``str(e)`` says how to resume, ``e.exit_code`` is 130 or 143."""

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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

