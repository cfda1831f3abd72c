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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["capturing", "cpu_kernel_supports", "override_cpu_kernel_support"]

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
