"""What the CPU fast paths must know about the run they are in.

Two questions decide whether a fast path may run instead of plain PyTorch:

* :func:`capturing`: is a graph being recorded (``torch.compile`` / dynamo, ``torch.export``,
  ``torch.jit.trace``, ``torch.jit.script``, the TorchScript ONNX exporter)? A capture must see
  plain, portable ops: no oneDNN-private operators (the tracer cannot even record their
  ``Scalar?[]`` arguments), no caches baked in as constants, no data-dependent branches, no
  batch chunking that depends on the traced batch size.
* :func:`cpu_kernel_supports`: can this CPU's oneDNN build a kernel for this dtype? bf16 inner
  products need AVX-512 BF16 / AMX (or AVX-512 with emulation in some builds); on an AVX2-only
  CPU oneDNN refuses to create the primitive, while ``F.linear`` runs bf16 through its reference
  path. The answer comes from oneDNN itself (it honours ``ONEDNN_MAX_CPU_ISA``), is cached per
  dtype, and can be forced with :func:`override_cpu_kernel_support` (tests prove the fallback on
  any machine with it).

It also holds the runtime switches of the fast paths (:class:`Switch`): one object per switch with
its environment default, a setter and a context manager. :data:`FUSED_ATTENTION` (the fused
attention kernel, ``VIT_ATTENTION_FUSED``), :data:`FAST_LINEAR` (oneDNN fused projections,
``VIT_ATTENTION_FAST_LINEAR``) and :data:`CHUNK_ELEMENTS` (batch chunking at CPU inference,
``VIT_ATTENTION_CHUNK_ELEMENTS``). The public names of each (``fused_attention``,
``set_fast_linear``, ``chunk_elements``, ...) are thin aliases of these objects.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import torch

__all__ = ["capturing", "cpu_kernel_supports", "override_cpu_kernel_support", "Switch", "switches",
           "FUSED_ATTENTION", "FAST_LINEAR", "CHUNK_ELEMENTS"]

_T = TypeVar("_T")


class Switch(Generic[_T]):
    """A process-wide runtime setting: default from an environment variable, a setter, a context manager.

    ``switch.value`` is read on hot paths (a plain attribute); :meth:`set` validates and assigns;
    :meth:`override` sets it inside a ``with`` block and restores the previous value.
    """

    def __init__(self, name: str, env: str, default: str, parse: Callable[[str], _T],
                 check: Callable[[object], _T]) -> None:
        self.name, self.env, self._check = name, env, check
        self.value: _T = parse(os.environ.get(env, default))

    def set(self, value: object) -> None:
        """Set the switch (validated; the message names the switch)."""
        self.value = self._check(value)

    @contextlib.contextmanager
    def override(self, value: object) -> Iterator[None]:
        """Context manager form of :meth:`set`; restores the previous value on exit."""
        prev = self.value
        self.set(value)
        try:
            yield
        finally:
            self.value = prev

    def __repr__(self) -> str:
        return f"Switch({self.name!r}, value={self.value!r}, env={self.env!r})"


def _parse_flag(text: str) -> bool:
    return text not in ("0", "false", "False")


def _check_count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"chunk elements must be an int >= 0 (0 = off), got {value!r}")
    return value


FUSED_ATTENTION: Switch[bool] = Switch("fused_attention", "VIT_ATTENTION_FUSED", "1", _parse_flag, bool)
FAST_LINEAR: Switch[bool] = Switch("fast_linear", "VIT_ATTENTION_FAST_LINEAR", "1", _parse_flag, bool)
# Elements of one chunk's input map. 2**20 fp32 = 4 MB: the MLP hidden of such a chunk is 16 MB, below glibc's
# largest mmap threshold and near the last-level cache (measured on Swin-T / SwinV2-T, see docs/benchmarks.md).
CHUNK_ELEMENTS: Switch[int] = Switch("chunk_elements", "VIT_ATTENTION_CHUNK_ELEMENTS", str(1 << 20), int,
                                     _check_count)


def switches() -> dict[str, Switch]:  # type: ignore[type-arg]
    """Every runtime switch by name (``fused_attention``, ``fast_linear``, ``chunk_elements``)."""
    return {s.name: s for s in (FUSED_ATTENTION, FAST_LINEAR, CHUNK_ELEMENTS)}

_DTYPE_SUPPORT: dict[torch.dtype, bool] = {}
_OVERRIDE: dict[torch.dtype, bool] = {}


def capturing() -> bool:
    """True while torch records a graph (compile, export, jit trace / script, ONNX export).

    Both ONNX exporters are covered: the TorchScript one traces (``jit.is_tracing``), the dynamo one
    runs ``torch.export``. (``torch.onnx.is_in_onnx_export`` costs an import per call on the hot path.)
    """
    # dynamo folds is_compiling / is_exporting to constants; asked first, they keep it from tracing
    # into torch._C._is_tracing (a graph break)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_scripting():
        return True
    return bool(torch._C._is_tracing())


def _probe(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


def cpu_kernel_supports(dtype: torch.dtype) -> bool:
    """Whether oneDNN on this CPU builds native kernels for ``dtype`` (fp32 always; bf16 / fp16 by ISA)."""
    if dtype in _OVERRIDE:
        return _OVERRIDE[dtype]
    ok = _DTYPE_SUPPORT.get(dtype)
    if ok is None:
        ok = _DTYPE_SUPPORT[dtype] = _probe(dtype)
    return ok


@contextlib.contextmanager
def override_cpu_kernel_support(dtype: torch.dtype, supported: bool) -> Iterator[None]:
    """Pretend this CPU does (not) support ``dtype`` kernels inside the block (for tests of the fallbacks)."""
    prev = _OVERRIDE.get(dtype)
    _OVERRIDE[dtype] = bool(supported)
    try:
        yield
    finally:
        if prev is None:
            _OVERRIDE.pop(dtype, None)
        else:
            _OVERRIDE[dtype] = prev
