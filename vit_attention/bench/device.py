"""What every timed step of the benchmarks needs from the device: wait for it, and the precision to run in."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["synchronize", "autocast"]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA runs asynchronously; a no-op on CPU) before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, amp: str | None) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` in bf16 on ``device`` for ``amp="bf16"``; fp32 (a null context) for None."""
    if amp == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
