"""What the CPU fast paths must know about the run they are in, and the runtime switches.

Whether a fast path may run instead of plain PyTorch depends on the switch :data:`FAST_PATHS` (below)
and on :func:`capturing`: is a graph being recorded (``torch.compile`` / dynamo, ``torch.export``,
``torch.jit.trace``, ``torch.jit.script``, the TorchScript ONNX exporter)? A capture must see
plain, portable ops: no oneDNN-private operators (the tracer cannot even record their
``Scalar?[]`` arguments), no caches baked in as constants, no data-dependent branches, no
batch chunking that depends on the traced batch size. The private torch APIs themselves, and
whether this CPU's oneDNN has kernels for a dtype, are in :mod:`.fast_paths`.

**The runtime switches** (:class:`Switch`, all listed by :func:`switches`):

=========================  ================================  ============================================
switch                     environment default               scope
=========================  ================================  ============================================
:data:`FUSED_ATTENTION`    ``VIT_ATTENTION_FUSED=1``         captured by each attention module when built
:data:`ATTENTION_BACKEND`  ``VIT_ATTENTION_BACKEND=auto``    captured by each attention module when built
:data:`FAST_PATHS`         ``VIT_ATTENTION_FAST_PATHS=1``    process-wide (read per call)
:data:`CHUNK_ELEMENTS`     ``VIT_ATTENTION_CHUNK_ELEMENTS``  process-wide (read per call)
=========================  ================================  ============================================

A switch has three levels; the most specific one wins at a call:

1. an *override*, ``with switch.override(value):`` (``use_fast_paths(False)`` is
   ``FAST_PATHS.override(False)``): every call made inside the block **by this thread** (this
   ``contextvars`` context, so also this asyncio task) sees ``value``, whatever the modules
   captured. Other threads do not see it. It is not consulted while ``torch.compile`` traces
   (dynamo cannot read a context variable); use level 2 there.
2. the value a module *captured when it was built* (``FUSED_ATTENTION`` and ``ATTENTION_BACKEND``;
   the backend is ``"auto"``, ``"sdpa"``, ``"explicit"`` or ``"flex"``, see :mod:`.flex`): every attention
   mechanism sets ``self.fused_attention = FUSED_ATTENTION.default`` in ``__init__`` (timm's
   ``self.fused_attn = use_fused_attn()``) and hands it to the attention core on each call, a
   plain attribute that dynamo guards on. :func:`switched` flips it on every module of a built
   model inside a ``with`` block (tests: "this model, explicit path"), :func:`set_switches` for
   good.
3. the process default ``switch.default``: the environment variable, changed with
   :meth:`Switch.set` (``set_fused_attention``, ``set_fast_paths``, ``set_chunk_elements``).
   For ``FUSED_ATTENTION`` it is what modules built *afterwards* capture (and what a direct call
   of the core without ``fused=`` uses); modules built before keep their value.

Why two switches stay process-wide rather than captured:

* ``CHUNK_ELEMENTS`` (elements per chunk of batch chunking at CPU inference) is a property of the
  machine (its last-level cache and glibc's mmap threshold), not of a model; it is read by the
  stage scaffolds of several families and the right value is the same for all of them.
* ``FAST_PATHS`` chooses between the CPU fast paths (:mod:`.fast_paths`: oneDNN's fused kernels,
  batch chunking, the parameter-derived caches, ...) and plain public PyTorch, the same function
  either way, as ``torch.backends.mkldnn`` does for torch; the paths it covers run in many layers
  and in plain functions that own no module (``conv_act``, the window caches), so a per-module
  flag would leave some of a model on the other path.

Both are read with :meth:`Switch.get` on each call: a plain attribute, plus a context-variable
lookup only while an override is open somewhere in the process. Reading them is thread-safe;
:meth:`Switch.set` changes the process default for every thread (a deliberate, global act).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import torch

__all__ = ["capturing", "Switch", "switches", "switched",
           "set_switches", "FUSED_ATTENTION", "ATTENTION_BACKEND", "BACKENDS", "check_backend", "FAST_PATHS",
           "CHUNK_ELEMENTS", "COMPILE_MODES"]

_T = TypeVar("_T")

# torch.compile(mode=...) values the library accepts (bench --compile-mode, ImageGPT.generate(compile_mode=)).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class Switch(Generic[_T]):
    """A runtime setting: a process default (environment variable, :meth:`set`) and a thread-local override.

    * :attr:`default`: the process default; modules that capture the switch copy it when built.
    * :meth:`get`: the value for a call: an open :meth:`override` of this thread, else the
      value the caller captured (``captured``), else :attr:`default`.
    * :attr:`value`: :meth:`get` with nothing captured (assigning it calls :meth:`set`).
    * :attr:`captured`: whether modules capture it (an attribute named :attr:`name`, which
      :func:`switched` / :func:`set_switches` change on a built model).
    """

    def __init__(self, name: str, env: str, default: str, parse: Callable[[str], _T],
                 check: Callable[[object], _T], *, captured: bool = False) -> None:
        self.name, self.env, self._check, self.captured = name, env, check, captured
        self.default: _T = parse(os.environ.get(env, default))
        # created once per switch (module level): a context variable must not be made per call
        self._forced: contextvars.ContextVar[_T | None] = contextvars.ContextVar(f"vit_attention_{name}",
                                                                                 default=None)
        self._forcing = 0  # overrides open in any thread; get() looks at the context variable only then
        self._lock = threading.Lock()

    def get(self, captured: _T | None = None) -> _T:
        """The value for one call: this thread's open override, else ``captured``, else the default."""
        if self._forcing and not torch.compiler.is_compiling():  # dynamo cannot read a context variable
            forced = self._forced.get()
            if forced is not None:
                return forced
        return self.default if captured is None else captured

    @property
    def value(self) -> _T:
        """The value a call that captured nothing sees (:meth:`get`)."""
        return self.get()

    @value.setter
    def value(self, value: object) -> None:
        self.set(value)

    def set(self, value: object) -> None:
        """Set the process default (validated; the message names the switch).

        Calls that captured nothing see it at once (in every thread); for a captured switch,
        modules built from now on capture it, modules already built keep theirs (:func:`set_switches`).
        """
        self.default = self._check(value)

    @contextlib.contextmanager
    def override(self, value: object) -> Iterator[None]:
        """Inside the block, every call made by this thread sees ``value`` (over captured values and the default).

        Thread-local (a ``contextvars`` variable: this thread, or this asyncio task); restores the
        previous value on exit, also after an error. Not consulted while ``torch.compile`` traces;
        for one model, prefer :func:`switched`.
        """
        checked = self._check(value)
        with self._lock:
            self._forcing += 1
        token = self._forced.set(checked)
        try:
            yield
        finally:
            self._forced.reset(token)
            with self._lock:
                self._forcing -= 1

    def __repr__(self) -> str:
        return f"Switch({self.name!r}, default={self.default!r}, env={self.env!r}, captured={self.captured})"


def _parse_flag(text: str) -> bool:
    return text not in ("0", "false", "False")


def _check_count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"chunk elements must be an int >= 0 (0 = off), got {value!r}")
    return value


FUSED_ATTENTION: Switch[bool] = Switch("fused_attention", "VIT_ATTENTION_FUSED", "1", _parse_flag, bool,
                                       captured=True)

# the attention backends (functional.flex explains each); a module's choice is the captured ATTENTION_BACKEND
BACKENDS: tuple[str, ...] = ("auto", "sdpa", "explicit", "flex")


def check_backend(value: object, name: str = "attention backend") -> str:
    """``value`` if it is one of :data:`BACKENDS`, else a ``ValueError`` naming ``name`` and the choices."""
    if not isinstance(value, str) or value not in BACKENDS:
        raise ValueError(f"{name} must be one of {list(BACKENDS)}, got {value!r}")
    return value


ATTENTION_BACKEND: Switch[str] = Switch("attention_backend", "VIT_ATTENTION_BACKEND", "auto", check_backend,
                                        check_backend, captured=True)
# the CPU fast paths (functional.fast_paths): oneDNN's fused kernels, batch chunking, the CPU caches; off = public ops
FAST_PATHS: Switch[bool] = Switch("fast_paths", "VIT_ATTENTION_FAST_PATHS", "1", _parse_flag, bool)
# Elements of one chunk's input map. 2**20 fp32 = 4 MB: the MLP hidden of such a chunk is 16 MB, below glibc's
# largest mmap threshold and near the last-level cache (measured on Swin-T / SwinV2-T, see docs/benchmarks.md).
CHUNK_ELEMENTS: Switch[int] = Switch("chunk_elements", "VIT_ATTENTION_CHUNK_ELEMENTS", str(1 << 20), int,
                                     _check_count)


def switches() -> dict[str, Switch]:  # type: ignore[type-arg]
    """Every runtime switch by name (fused_attention, attention_backend, fast_paths, chunk_elements)."""
    return {s.name: s for s in (FUSED_ATTENTION, ATTENTION_BACKEND, FAST_PATHS, CHUNK_ELEMENTS)}


def _resolve(values: dict[str, object]) -> list[tuple[Switch, object]]:  # type: ignore[type-arg]
    known = switches()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise TypeError(f"unknown switch(es) {unknown}; the switches are {sorted(known)}")
    return [(known[name], known[name]._check(value)) for name, value in values.items()]


def _captors(module: torch.nn.Module, name: str) -> list[torch.nn.Module]:
    """The submodules of ``module`` (itself included) that captured switch ``name`` when built."""
    return [m for m in module.modules() if name in vars(m)]


def set_switches(module: torch.nn.Module, **values: object) -> torch.nn.Module:
    """Set captured switches on every submodule of a built ``module`` that captured them; returns ``module``.

    ``set_switches(model, fused_attention=False)``: every attention mechanism of ``model`` takes the
    explicit path from now on (other models and modules built later are not affected). Only
    captured switches (:attr:`Switch.captured`); a process-wide one raises ``TypeError`` naming
    :meth:`Switch.set`.
    """
    for switch, value in _resolve(values):
        if not switch.captured:
            raise TypeError(f"{switch.name} is process-wide, not captured by modules: use "
                            f"runtime.{switch.name.upper()}.set(...) or switched(model, {switch.name}=...)")
        for m in _captors(module, switch.name):
            setattr(m, switch.name, value)
    return module


@contextlib.contextmanager
def switched(module: torch.nn.Module, **values: object) -> Iterator[torch.nn.Module]:
    """Run a built ``module`` with other switch values inside the block; everything is restored on exit.

    ``with switched(model, fused_attention=False): model(x)`` (the explicit attention path of this
    model; other models are not affected). A captured switch is set on every submodule that
    captured it and put back on exit (also after an error): it changes the model itself, so
    another thread running the same model inside the block sees it too (and ``torch.compile``
    recompiles on it). A process-wide one (``fast_paths``, ``chunk_elements``) is overridden for
    this thread with :meth:`Switch.override`. Yields ``module``.
    """
    resolved = _resolve(values)
    saved: list[tuple[torch.nn.Module, str, object]] = []
    with contextlib.ExitStack() as stack:
        try:
            for switch, value in resolved:
                if switch.captured:
                    for m in _captors(module, switch.name):
                        saved.append((m, switch.name, vars(m)[switch.name]))
                        setattr(m, switch.name, value)
                else:
                    stack.enter_context(switch.override(value))
            yield module
        finally:
            for m, name, old in reversed(saved):
                setattr(m, name, old)


def capturing() -> bool:
    """True while torch records a graph (compile, export, jit trace / script, ONNX export).

    Both ONNX exporters are covered: the TorchScript one traces (``jit.is_tracing``), the dynamo one
    runs ``torch.export``. (``torch.onnx.is_in_onnx_export`` costs an import per call on the hot path.)
    """
    # dynamo folds is_compiling / is_exporting to constants; asked first, they keep it from tracing
    # into torch.jit.is_tracing (a graph break)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_scripting():
        return True
    return torch.jit.is_tracing()
