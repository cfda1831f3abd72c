"""Peak memory of one step: allocator statistics on CUDA, live tensor bytes on any device.

On CPU there is no allocator counter to read, so :class:`TensorMemoryTracker` watches every
aten op through a ``TorchDispatchMode``: each tensor an op creates (not a view of, or in-place on,
its inputs) adds its storage's bytes, and the storage's finaliser subtracts them when it dies.
The peak of that running total is the memory the step needed above what existed before it.
Kernel-internal scratch (oneDNN, the fused attention kernel's tiles) is invisible to it, and so
is anything a kernel computes without returning; an ``N x M`` attention matrix built from aten
ops (the explicit path, the math fallback) is seen.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["TensorMemoryTracker", "measure_peak_memory"]


class TensorMemoryTracker(TorchDispatchMode):
    """Track bytes of tensors created while active: ``peak_bytes``, ``largest_bytes`` (one tensor).

    Usage::

        with TensorMemoryTracker() as mem:
            model(x)
        mem.peak_bytes, mem.largest_bytes, mem.largest_shape
    """

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.largest_bytes = 0
        self.largest_shape: tuple[int, ...] = ()
        self.largest_op = ""
        self._live: dict[int, int] = {}

    def _release(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.layout == torch.strided}
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            st = t.untyped_storage()
            key = id(st)
            if key in inputs or key in self._live:
                continue  # a view of / in-place update on an input, or already counted
            nbytes = st.nbytes()
            if nbytes == 0:
                continue
            self._live[key] = nbytes
            self.live_bytes += nbytes
            weakref.finalize(st, self._release, key)
            if nbytes > self.largest_bytes:
                self.largest_bytes, self.largest_shape, self.largest_op = nbytes, tuple(t.shape), str(func)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out


def measure_peak_memory(step: Callable[[], Any], device: torch.device | str) -> dict[str, Any]:
    """Run ``step()`` once and return its peak memory above the memory live before it.

    Returns ``{"peak_bytes", "method", "largest_bytes", "largest_shape"}``; CUDA reads the caching
    allocator's peak (``largest_*`` are None), other devices use :class:`TensorMemoryTracker`.
    """
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return {"peak_bytes": torch.cuda.max_memory_allocated(device) - base, "method": "cuda.max_memory_allocated",
                "largest_bytes": None, "largest_shape": None}
    with TensorMemoryTracker() as mem:
        step()
    return {"peak_bytes": mem.peak_bytes, "method": "live tensor bytes (dispatch tracker)",
            "largest_bytes": mem.largest_bytes, "largest_shape": list(mem.largest_shape)}
