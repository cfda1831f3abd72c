"""The CPU fast paths' private torch APIs, in one place, each with a public fallback, behind one switch.

Part of this library's CPU speed comes from torch internals that carry no compatibility promise.
Every call of one in the package goes through this module (``tests/functional/test_fast_paths.py``
checks that no other module touches ``torch.ops.mkldnn`` or ``torch._C``):

* ``torch.ops.mkldnn._linear_pointwise``: projection + bias + activation as one kernel
  (fallback ``F.linear`` then the activation); its ``.binary`` overload: projection + residual add
  (fallback ``residual + F.linear``);
* ``torch.ops.mkldnn._convolution_pointwise``: convolution + activation as one kernel (fallback
  ``F.conv2d`` then the activation);
* ``torch.ops.mkldnn._is_mkldnn_bf16_supported`` / ``_fp16_``: may oneDNN run the dtype here
  (fallback "no": ``F.linear`` runs it);
* ``torch._C._get_tracing_state`` / ``_set_tracing_state``: build a cached constant outside a
  ``torch.jit.trace`` (fallback: the trace records the build, and nothing built is cached);
* ``TorchDispatchMode`` (``_FastMeta``): empty outputs for the meta kernels torch runs in Python
  (fallback: torch's own meta kernels).

Each is looked up once, at import (``HAS_*`` below; a torch build without it sets the flag False),
and each wrapper here falls back to the public op when its flag is False, so a torch without the
private op computes the same numbers through public ops.

**The switch** :data:`.runtime.FAST_PATHS` (``VIT_ATTENTION_FAST_PATHS=0``, :func:`set_fast_paths`,
``with use_fast_paths(False):`` for this thread, ``runtime.switched(model, fast_paths=False)``): off,
every private path above is skipped, and so are the other CPU-inference shortcuts: batch chunking
(:mod:`.chunking`) and the parameter-derived caches (``attention.base.uncacheable``). What is left
is plain public PyTorch, the reference to compare with when a result looks wrong, or the path to
take on a torch build where a private op misbehaves. The switch is process-wide and read per call
(:mod:`.runtime` says why).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .runtime import FAST_PATHS

__all__ = ["ACTIVATIONS", "activation", "fast_paths_enabled", "set_fast_paths", "use_fast_paths",
           "HAS_LINEAR_POINTWISE", "HAS_LINEAR_ADD", "HAS_CONV_POINTWISE", "HAS_UNTRACED", "HAS_FAST_META",
           "linear_pointwise", "linear_add", "conv2d_pointwise", "linear_pointwise_op", "cpu_kernel_supports",
           "override_cpu_kernel_support", "untraced", "untraced_available", "fast_meta"]


def _op(namespace: str, name: str, overload: str | None = None) -> Any | None:
    """``torch.ops.<namespace>.<name>[.<overload>]``, or None where this torch build lacks it."""
    try:
        op = getattr(getattr(torch.ops, namespace), name)
        return op if overload is None else getattr(op, overload)
    except (AttributeError, RuntimeError):
        return None


_ONEDNN = bool(torch.backends.mkldnn.is_available())
_LINEAR_POINTWISE = _op("mkldnn", "_linear_pointwise") if _ONEDNN else None
_LINEAR_ADD = _op("mkldnn", "_linear_pointwise", "binary") if _ONEDNN else None
_CONV_POINTWISE = _op("mkldnn", "_convolution_pointwise") if _ONEDNN else None
_BF16_SUPPORTED = _op("mkldnn", "_is_mkldnn_bf16_supported") if _ONEDNN else None
_FP16_SUPPORTED = _op("mkldnn", "_is_mkldnn_fp16_supported") if _ONEDNN else None
_GET_TRACING_STATE = getattr(torch._C, "_get_tracing_state", None)
_SET_TRACING_STATE = getattr(torch._C, "_set_tracing_state", None)
try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # pragma: no cover - every torch this package supports has it
    TorchDispatchMode = None  # type: ignore[assignment,misc]

HAS_LINEAR_POINTWISE: bool = _LINEAR_POINTWISE is not None  # oneDNN linear with a fused activation
HAS_LINEAR_ADD: bool = _LINEAR_ADD is not None  # oneDNN linear with a fused residual add
HAS_CONV_POINTWISE: bool = _CONV_POINTWISE is not None  # oneDNN convolution with a fused activation
HAS_UNTRACED: bool = _GET_TRACING_STATE is not None and _SET_TRACING_STATE is not None  # suspend a jit trace
HAS_FAST_META: bool = TorchDispatchMode is not None  # the meta-kernel shortcut of :func:`fast_meta`

# activation name -> (oneDNN post-op, algorithm); :func:`activation` is the eager op each one replaces
ACTIVATIONS: dict[str, tuple[str, str]] = {
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
    "hardswish": ("hardswish", ""),  # oneDNN: x·clamp(x/6 + 1/2, 0, 1), torch: x·relu6(x + 3)/6 (an ulp apart)
}


def activation(x: Tensor, act: str | None) -> Tensor:
    """The eager activation named ``act`` (a key of :data:`ACTIVATIONS`; None: ``x`` unchanged), any shape."""
    if act is None:
        return x
    if act == "gelu":
        return F.gelu(x)
    if act == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if act == "relu":
        return F.relu(x)
    if act == "silu":
        return F.silu(x)
    if act == "hardswish":
        return F.hardswish(x)
    raise ValueError(f"act must be None or one of {sorted(ACTIVATIONS)}, got {act!r}")


def fast_paths_enabled() -> bool:
    """Whether the CPU fast paths may run here (:data:`.runtime.FAST_PATHS`: this thread's open override, else the
    process default)."""
    return FAST_PATHS.get()


set_fast_paths: Callable[[object], None] = FAST_PATHS.set  # (enabled) the process default, every thread
use_fast_paths = FAST_PATHS.override  # with use_fast_paths(False): this thread's calls inside; restored on exit


def linear_pointwise(x: Tensor, weight: Tensor, bias: Tensor | None, act: str | None = None) -> Tensor:
    """``act(x @ weightᵀ + bias)`` as one oneDNN kernel; ``[..., Cin] -> [..., Cout]``.

    The caller decides that oneDNN may run it (:func:`.linear.can_fuse`); without the op in this torch
    build (:data:`HAS_LINEAR_POINTWISE` False) it is ``F.linear`` then :func:`activation`.
    """
    if not HAS_LINEAR_POINTWISE:
        return activation(F.linear(x, weight, bias), act)
    attr, algo = ACTIVATIONS[act] if act is not None else ("none", "")
    return _LINEAR_POINTWISE(x, weight, bias, attr, [], algo)


def linear_add(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``residual + x @ weightᵀ + bias`` as one oneDNN kernel (the add a GEMM post-op); ``[..., Cin] -> [..., Cout]``.

    Without the op (:data:`HAS_LINEAR_ADD` False): ``residual + F.linear(x, weight, bias)``.
    """
    if not HAS_LINEAR_ADD:
        return residual + F.linear(x, weight, bias)
    return _LINEAR_ADD(x, residual, weight, bias, "add")


def conv2d_pointwise(x: Tensor, weight: Tensor, bias: Tensor | None, *, stride: int, padding: int, groups: int,
                     act: str | None) -> Tensor:
    """``act(conv2d(x, weight, bias))`` as one oneDNN kernel; ``[B, Cin, H, W] -> [B, Cout, H', W']``.

    Without the op (:data:`HAS_CONV_POINTWISE` False): ``F.conv2d`` then :func:`activation`.
    """
    if not HAS_CONV_POINTWISE:
        return activation(F.conv2d(x, weight, bias, stride=stride, padding=padding, groups=groups), act)
    attr, algo = ACTIVATIONS[act] if act is not None else ("none", "")
    return _CONV_POINTWISE(x, weight, bias, [padding, padding], [stride, stride], [1, 1], groups, attr, [], algo)


def linear_pointwise_op() -> Any | None:
    """The oneDNN linear operator (to count its FLOPs in ``FlopCounterMode``), or None without it."""
    return _op("mkldnn", "_linear_pointwise") if HAS_LINEAR_POINTWISE else None


_DTYPE_SUPPORT: dict[torch.dtype, bool] = {}
_OVERRIDE: dict[torch.dtype, bool] = {}


def _probe(dtype: torch.dtype) -> bool:
    if not _ONEDNN:
        return False
    if dtype == torch.float32:
        return True
    probe = _BF16_SUPPORTED if dtype == torch.bfloat16 else _FP16_SUPPORTED if dtype == torch.float16 else None
    return bool(probe()) if probe is not None else False  # no probe: assume no kernels, F.linear runs it


def cpu_kernel_supports(dtype: torch.dtype) -> bool:
    """Whether oneDNN on this CPU builds native kernels for ``dtype`` (fp32 always; bf16 / fp16 by ISA).

    bf16 inner products need AVX-512 BF16 / AMX (or AVX-512 with emulation in some builds); on an AVX2-only
    CPU oneDNN refuses to create the primitive, while ``F.linear`` runs bf16 through its reference path. The
    answer comes from oneDNN itself (it honours ``ONEDNN_MAX_CPU_ISA``), is cached per dtype, and can be
    forced with :func:`override_cpu_kernel_support`.
    """
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


def untraced_available() -> bool:
    """Whether :func:`untraced` suspends a ``torch.jit.trace`` (the switch is on and this torch has the API).

    Where it does not, a cache must not store what it builds during a trace (the trace records the build
    instead, and a value built in one trace and found in the next would leave the second graph without it).
    """
    return HAS_UNTRACED and FAST_PATHS.get()


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Inside the block a running ``torch.jit.trace`` records nothing: what is computed enters the graph as a
    constant (a cached index tensor, NaFlexViT's position table at ONNX export). Without the API, or with the
    fast paths off, the trace goes on recording (:func:`untraced_available`)."""
    state = _GET_TRACING_STATE() if untraced_available() else None  # type: ignore[misc]
    if state is None:
        yield
        return
    _SET_TRACING_STATE(None)  # type: ignore[misc]
    try:
        yield
    finally:
        _SET_TRACING_STATE(state)  # type: ignore[misc]


def _layer_norm_out(x: Tensor, normalized_shape: Any, *rest: Any) -> tuple[Tensor, Tensor, Tensor]:
    stats = (*x.shape[:x.dim() - len(normalized_shape)], *([1] * len(normalized_shape)))
    opmath = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(stats, dtype=opmath, device=x.device), torch.empty(stats, dtype=opmath, device=x.device))


def _addmm_out(bias: Tensor, a: Tensor, b: Tensor, **kwargs: Any) -> Tensor:
    return torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)


def _like(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    return torch.empty_like(x)


def _meta_shortcuts() -> dict[Any, Callable[..., Any]]:
    table = {("native_layer_norm", _layer_norm_out), ("addmm", _addmm_out), ("_safe_softmax", _like),
             ("_softmax", _like), ("gelu", _like)}
    found = {_op("aten", name, "default"): fn for name, fn in table}
    found.pop(None, None)  # an op this torch lacks is simply not shortcut
    return found


if TorchDispatchMode is not None:
    class _FastMeta(TorchDispatchMode):
        """Meta tensors only: the ops whose meta kernels torch runs in Python (its reference decompositions,
        about a millisecond a call: layer norm, ``addmm``, softmax, GELU) answered with an empty output of the
        shape, dtype and strides they produce. Meta tensors hold no values, so nothing else changes."""

        _OUT = _meta_shortcuts()

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = self._OUT.get(func)
            if out is not None and all(not isinstance(a, Tensor) or a.device.type == "meta" for a in args):
                return out(*args, **kwargs)
            return func(*args, **kwargs)


def fast_meta() -> contextlib.AbstractContextManager[Any]:
    """A context in which a forward on meta tensors skips torch's Python meta kernels of layer norm, ``addmm``,
    softmax and GELU (empty outputs of the right shape, dtype and strides; a recorded forward of a large model
    takes a third of the time). With the fast paths off or without ``TorchDispatchMode``: no change, torch's
    own meta kernels run."""
    if HAS_FAST_META and FAST_PATHS.get():
        return _FastMeta()
    return contextlib.nullcontext()
