"""One instrumented forward pass shared by ``flops``, ``trace`` and ``info``.

It runs a model (or a single mechanism) once with forward hooks on every module and the
attention shape hook of :mod:`vit_attention.functional.observers`, and records, in call order,
every module call (name, class, input and output shapes) and every attention call (q, k, v
shapes plus the :func:`attention_context` info). By default the pass runs on the meta device:
parameters and buffers are swapped for meta tensors with ``torch.func.functional_call``, so
nothing is computed or copied and even ViT-22B takes milliseconds.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionCall
from ..functional import fast_paths
from ..functional.observers import register_attention_hook

__all__ = ["ModuleCall", "CoreCall", "Recording", "record_forward", "as_input", "meta_state", "module_device"]

Shape = tuple[int, ...]


@dataclass
class ModuleCall:
    """One call of one module: ``name`` ('' for the root), class, input / output shapes, nesting depth."""

    index: int
    name: str
    module: nn.Module
    depth: int
    in_shapes: list[Shape]
    out_shapes: list[Shape] = field(default_factory=list)
    n_tensor_args: int = 0
    end: int = -1  # event counter when the call returned (calls nested inside have index in (index, end))
    arg_shape: Shape | None = None  # the first positional tensor's shape
    n_positional_tensors: int = 0
    tensor_kwargs: tuple[str, ...] = ()  # keyword arguments / AttentionCall fields that were tensors (residual, ...)
    feat_size: tuple[int, int] | None = None  # the grid passed as feat_size= or in an AttentionCall, if any


@dataclass
class CoreCall:
    """One call of the attention core: q ``[B, nh, N, hd]``, k ``[B, nh, M, hd]``, v ``[B, nh, M, hdv]``."""

    index: int
    module: str  # innermost module that made the call
    q: Shape
    k: Shape
    v: Shape
    info: dict[str, Any]

    @property
    def macs(self) -> int:
        """Multiply-adds of ``q kᵀ`` and ``weights v``: ``prod(*b)·nh·N·M·(hd + hdv)``."""
        N, hd = self.q[-2], self.q[-1]
        M, hdv = self.v[-2], self.v[-1]
        return math.prod(self.q[:-2]) * N * M * (hd + hdv)


@dataclass
class Recording:
    """What one instrumented forward saw, in call order."""

    input_shape: Shape
    output_shapes: list[Shape]
    calls: list[ModuleCall]
    attention: list[CoreCall]
    device: str


def _shapes(obj: Any) -> list[Shape]:
    if isinstance(obj, Tensor):
        return [tuple(obj.shape)]
    if isinstance(obj, (list, tuple)):
        return [s for o in obj for s in _shapes(o)]
    if isinstance(obj, dict):
        return [s for o in obj.values() for s in _shapes(o)]
    return []


def module_device(module: nn.Module) -> torch.device:
    """Device of the first parameter or buffer (cpu for a module without tensors)."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


def meta_state(module: nn.Module) -> dict[str, Tensor]:
    """Meta stand-ins for every parameter and buffer (same shape, dtype and ``requires_grad``)."""
    state = {k: torch.empty_like(v, device="meta").requires_grad_(v.requires_grad)
             for k, v in module.named_parameters()}
    state.update({k: torch.empty_like(v, device="meta") for k, v in module.named_buffers()})
    return state


def as_input(input_shape: Sequence[int] | Tensor, device: torch.device | str, dtype: torch.dtype = torch.float32
             ) -> Tensor:
    """A random input of ``input_shape`` on ``device`` (a tensor passes through, moved)."""
    if isinstance(input_shape, Tensor):
        return input_shape.to(device)
    shape = tuple(input_shape)
    if not shape or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ValueError(f"input_shape must be a tuple of positive ints, e.g. (1, 3, 224, 224); got {input_shape!r}")
    return torch.randn(shape, device=device, dtype=dtype)


def record_forward(model: nn.Module, input_shape: Sequence[int] | Tensor, *, device: str | torch.device | None = "meta",
                   fast_meta: bool = True) -> Recording:
    """Run ``model`` once on a random input of ``input_shape`` and record every module and attention call.

    ``device="meta"`` (default) runs with meta stand-ins for parameters and buffers (no compute,
    no copy); ``None`` runs where the model lives. The model is left unchanged (hooks removed).
    ``fast_meta``: on the meta device, answer the ops torch's meta kernels run in Python with their empty
    output (:func:`.functional.fast_paths.fast_meta`: the same shapes, three times faster; also off with the
    fast paths' switch); False runs torch's own kernels.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    dev = module_device(model) if device is None else torch.device(device)
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    calls: list[ModuleCall] = []
    attention: list[CoreCall] = []
    stack: list[ModuleCall] = []
    counter = [0]

    def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        counter[0] += 1
        positional = [a for a in args if isinstance(a, Tensor)]
        tensor_kwargs = tuple(k for k, v in kwargs.items() if isinstance(v, Tensor))
        feat_size = kwargs.get("feat_size")
        in_shapes = _shapes(args) + _shapes(kwargs)
        given = next((a for a in (*args, *kwargs.values()) if isinstance(a, AttentionCall)), None)
        if given is not None:  # a mechanism's AttentionCall: its tensor fields count as tensor keywords
            fields = tuple(f for f in given.given() if isinstance(getattr(given, f), Tensor))
            tensor_kwargs += fields
            in_shapes += [tuple(getattr(given, f).shape) for f in fields]
            feat_size = given.feat_size
        call = ModuleCall(counter[0], names.get(id(mod), "?"), mod, len(stack), in_shapes,
                          n_tensor_args=len(positional) + len(tensor_kwargs),
                          arg_shape=tuple(positional[0].shape) if positional else None,
                          n_positional_tensors=len(positional), tensor_kwargs=tensor_kwargs,
                          feat_size=tuple(feat_size) if feat_size is not None else None)
        calls.append(call)
        stack.append(call)

    def post(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        counter[0] += 1
        call = stack.pop()
        call.out_shapes = _shapes(out)
        call.end = counter[0]

    def on_attention(q: Tensor, k: Tensor, v: Tensor, info: dict[str, Any]) -> None:
        counter[0] += 1
        attention.append(CoreCall(counter[0], stack[-1].name if stack else "", tuple(q.shape), tuple(k.shape),
                                       tuple(v.shape), dict(info)))

    handles = []
    for mod in model.modules():
        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post, with_kwargs=True))
    handles.append(register_attention_hook(on_attention, weights=False))
    x = as_input(input_shape, dev)
    try:
        shortcut = fast_paths.fast_meta() if dev.type == "meta" and fast_meta else contextlib.nullcontext()
        with torch.no_grad(), shortcut:
            if dev.type == "meta" and module_device(model).type != "meta":
                out = torch.func.functional_call(model, meta_state(model), (x,), strict=False)
            else:
                out = model(x)
    finally:
        for h in handles:
            h.remove()
        stack.clear()
    return Recording(tuple(x.shape), _shapes(out), calls, attention, str(dev))
