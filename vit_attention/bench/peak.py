"""This machine's matrix-multiply peak, measured in the same run as the models.

The peak is the best rate of a large square GEMM over the implementations torch offers on the
device (``torch.mm``; on CPU also oneDNN's ``linear``, which the models' fused projections use,
where this CPU has oneDNN kernels for the dtype),
so a model's fraction of peak is never flattered by a slow reference GEMM.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..functional import fast_paths
from .device import synchronize

__all__ = ["MatmulPeak"]


class MatmulPeak:
    """A square ``n x n x n`` GEMM; :meth:`time_once` returns GFLOP/s (``2·n³`` FLOPs per call).

    Args:
        device: where to run; dtype: ``torch.float32`` or ``torch.bfloat16``; n: matrix size;
        clock: seconds counter (wall clock, or ``time.process_time`` for CPU seconds).
    """

    def __init__(self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 2048,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        if n <= 0:
            raise ValueError(f"n (peak GEMM size) must be positive, got {n}")
        self.device, self.dtype, self.n = torch.device(device), dtype, n
        g = torch.Generator(device="cpu").manual_seed(0)
        self.a = torch.randn(n, n, generator=g).to(self.device, dtype)
        self.b = torch.randn(n, n, generator=g).to(self.device, dtype)
        self.flops = 2.0 * n ** 3
        self.kernels: dict[str, Callable[[], torch.Tensor]] = {"torch.mm": lambda: torch.mm(self.a, self.b)}
        # oneDNN's GEMM only where this CPU has kernels for the dtype (no bf16 inner product on AVX2-only CPUs)
        if self.device.type == "cpu" and fast_paths.cpu_kernel_supports(dtype) and fast_paths.HAS_LINEAR_POINTWISE:
            self.kernels["onednn.linear"] = lambda: fast_paths.linear_pointwise(self.a, self.b, None)
        self.kernel = "torch.mm"

    def calibrate(self, repeats: int = 2) -> dict[str, float]:
        """Time each kernel ``repeats`` times, keep the fastest for later rounds; GFLOP/s per kernel."""
        best: dict[str, float] = {}
        with torch.inference_mode():
            for name, fn in self.kernels.items():
                fn()
                best[name] = max(self._rate(fn) for _ in range(repeats))
        self.kernel = max(best, key=best.__getitem__)
        return best

    def _rate(self, fn: Callable[[], torch.Tensor]) -> float:
        synchronize(self.device)
        t0 = self.clock()
        fn()
        synchronize(self.device)
        return self.flops / max(self.clock() - t0, 1e-9) / 1e9

    def time_once(self) -> float:
        """GFLOP/s of one call of the chosen kernel."""
        with torch.inference_mode():
            return self._rate(self.kernels[self.kernel])
