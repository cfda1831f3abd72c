"""Observers of attention calls: hooks that see every call, and the context frames that describe it.

Observers (attention maps, shape traces, FLOPs) register with :func:`register_attention_hook`;
:func:`~.attention.scaled_dot_product_attention` calls them, and a mechanism (or a block-sparse
backend, :mod:`.flex`) asks :func:`attention_observed` before it takes a path an observer cannot
see. This module imports no other part of the package, so both may import it.

Registered hooks are process-wide: an observer sees the attention calls of every thread, as a
forward hook registered on a shared model would. What a call reports with it (``info``) is per
thread: :func:`attention_context` frames live in a ``contextvars`` variable (a tuple, pushed and
popped by tokens), so a frame opened in one thread (or asyncio task) is never seen by a call in
another. Callers open frames and build layouts only while someone observes.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from torch import Tensor

__all__ = ["register_attention_hook", "attention_context", "attention_observed", "current_frames", "hook_info",
           "WEIGHT_HOOKS", "SHAPE_HOOKS"]

WeightsHook = Callable[[Tensor, dict[str, Any]], None]
ShapeHook = Callable[[Tensor, Tensor, Tensor, dict[str, Any]], None]

# the registered observers by handle id (read them; register and remove through register_attention_hook)
WEIGHT_HOOKS: dict[int, WeightsHook] = {}
SHAPE_HOOKS: dict[int, ShapeHook] = {}
_HOOK_IDS = itertools.count(1)  # next() is atomic: two threads registering at once get distinct ids
# the open attention_context frames of this thread / task, outermost first (immutable: set and reset by token)
_FRAMES: contextvars.ContextVar[tuple[dict[str, Any], ...]] = contextvars.ContextVar("vit_attention_frames",
                                                                                       default=())


class _HookHandle:
    """What :func:`register_attention_hook` returns: ``remove()`` unregisters the observer (twice is harmless)."""

    def __init__(self, hook_id: int, registry: dict[int, Any]) -> None:
        self.id = hook_id
        self._registry = registry

    def remove(self) -> None:
        """Unregister the observer."""
        self._registry.pop(self.id, None)


def register_attention_hook(fn: WeightsHook | ShapeHook, *, weights: bool = True) -> _HookHandle:
    """Observe every attention call while registered; returns a handle with ``.remove()``.

    * ``weights=True``: ``fn(weights, info)`` after the softmax (and ``weights_fn``), before
      dropout, with ``weights [*b, nh, N, M]`` detached. Forces the explicit path.
    * ``weights=False`` (shapes only): ``fn(q, k, v, info)`` before anything is computed. It does
      not change the path and works on the meta device (shape traces, FLOPs).

    ``info`` is the merged dict of the :func:`attention_context` frames open in the calling
    thread plus ``mask`` and ``bias`` (their shape tuples or None), ``is_causal`` and, when the
    caller passed one, ``layout`` (an :class:`~.layout.AttentionLayout`: where the rows sit on the
    grid). The hook itself is process-wide: it sees the calls of every thread (module docstring).
    """
    hook_id = next(_HOOK_IDS)
    registry: dict[int, Any] = WEIGHT_HOOKS if weights else SHAPE_HOOKS
    registry[hook_id] = fn
    return _HookHandle(hook_id, registry)


@contextlib.contextmanager
def attention_context(**info: Any) -> Iterator[None]:
    """Attach metadata (module name, window layout, ...) to the attention calls this thread makes inside.

    The frame is seen by observers of calls made in the same thread (or asyncio task) only; frames
    nest (inner keys win). Cheap, but callers on hot paths open one only when
    :func:`attention_observed`.
    """
    token = _FRAMES.set(_FRAMES.get() + (info,))
    try:
        yield
    finally:
        _FRAMES.reset(token)


def current_frames() -> tuple[dict[str, Any], ...]:
    """The :func:`attention_context` frames open in this thread / task, outermost first (empty when none)."""
    return _FRAMES.get()


def attention_observed() -> bool:
    """True while any observer is registered (callers must then keep their batch whole)."""
    return bool(WEIGHT_HOOKS or SHAPE_HOOKS)


def hook_info(mask: Tensor | None, bias: Tensor | None, is_causal: bool, layout: Any) -> dict[str, Any]:
    """The ``info`` an observer gets for one call: this thread's open frames merged (inner keys win), the
    ``mask`` / ``bias`` shapes (or None), ``is_causal`` and the ``layout`` (built now when given as a builder)."""
    merged: dict[str, Any] = {}
    for frame in _FRAMES.get():
        merged.update(frame)
    merged["mask"] = None if mask is None else tuple(mask.shape)
    merged["bias"] = None if bias is None else tuple(bias.shape)
    merged["is_causal"] = is_causal
    if callable(layout):  # built only now that an observer asks (a zero-argument builder)
        layout = layout()
    if layout is not None:
        merged["layout"] = layout
    return merged

