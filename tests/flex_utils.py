"""Helpers for the FlexAttention tests: torch's own flex backward on CPU, and flex-vs-explicit comparisons.

torch 2.13's FlexAttention refuses gradients on CPU in its front end (``_validate_device``), and the
library refuses them too with a clear message. The autograd function behind it
(``FlexAttentionAutogradOp``, whose backward is the math the unfused path runs on any device) works
on CPU; :func:`flex_backward_on_cpu` lifts both front-end checks inside a test so that the flex path
of every pattern, its score_mod's captured tables included, is proven differentiable to the
explicit path's gradients without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from unittest import mock

import torch
from torch import Tensor, nn

from vit_attention.attention import set_attention_backend
from vit_attention.functional import flex


@contextlib.contextmanager
def flex_backward_on_cpu() -> Iterator[None]:
    """Inside: flex calls on CPU may record gradients (torch's unfused flex autograd runs the backward)."""
    import torch.nn.attention.flex_attention as fa

    with mock.patch.object(fa, "_validate_device", lambda *a: None), \
            mock.patch.object(flex, "_cpu_backward_refused", lambda *a: False):
        yield


@contextlib.contextmanager
def recorded_patterns() -> Iterator[list[flex.AttentionPattern]]:
    """Every :class:`AttentionPattern` whose block mask is asked for inside the block (the flex path ran on it)."""
    seen: list[flex.AttentionPattern] = []
    real = flex.block_mask_for

    def spy(pattern: flex.AttentionPattern, device: torch.device) -> Any:
        seen.append(pattern)
        return real(pattern, device)

    with mock.patch.object(flex, "block_mask_for", spy):
        yield seen


def rel_err(a: Tensor, b: Tensor, floor: float = 0.0) -> float:
    """``max|a - b| / max(max|b|, floor)`` (the plain difference when both are 0). ``floor`` keeps a gradient
    that is zero in exact arithmetic (a key bias: softmax ignores it) from turning rounding noise into 100 %."""
    scale = max(b.detach().abs().max().item() if b.numel() else 0.0, floor)
    diff = (a.detach() - b.detach()).abs().max().item() if a.numel() else 0.0
    return diff / scale if scale > 0 else diff


def run_backend(module: nn.Module, backend: str, make_inputs: Callable[[], Sequence[Tensor]],
                call: Callable[..., Tensor] | None = None, *, backward: bool = True,
                dtype: torch.dtype | None = None, **kwargs: Any) -> tuple[Tensor, list[Tensor | None]]:
    """``module`` on ``backend``: its output and the gradients of a fixed random projection of it with respect
    to the inputs and every parameter (None where none flows); ``backward=False`` runs under no_grad.
    ``dtype``: run in it (module and floating inputs converted; the module stays converted)."""
    set_attention_backend(module, backend)
    if dtype is not None:
        module.to(dtype)
    inputs = [t.detach().clone() for t in make_inputs()]
    inputs = [(t.to(dtype) if dtype is not None and t.is_floating_point() else t) for t in inputs]
    inputs = [t.requires_grad_(backward and t.is_floating_point()) for t in inputs]
    fn = call or module
    if not backward:
        with torch.no_grad():
            return fn(*inputs, **kwargs), []
    for p in module.parameters():
        p.grad = None
    with flex_backward_on_cpu():
        out = fn(*inputs, **kwargs)
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
        (out * weight).sum().backward()
    grads = [t.grad for t in inputs if t.requires_grad] + [p.grad for p in module.parameters()]
    return out.detach(), [None if g is None else g.clone() for g in grads]


def assert_flex_matches_explicit(module: nn.Module, make_inputs: Callable[[], Sequence[Tensor]],
                                 call: Callable[..., Tensor] | None = None, *, rel: float = 1e-5,
                                 backward: bool = True, dtype: torch.dtype | None = torch.float64,
                                 other: str = "flex", **kwargs: Any) -> None:
    """The ``other`` backend (flex) gives the explicit backend's output and gradients (inputs and parameters),
    within ``rel`` of each tensor's largest value (float64 by default: the comparison is of the math, and a
    gradient that is 0 in exact arithmetic is measured against 1e-6 of the largest gradient)."""
    out_e, grads_e = run_backend(module, "explicit", make_inputs, call, backward=backward, dtype=dtype, **kwargs)
    out_f, grads_f = run_backend(module, other, make_inputs, call, backward=backward, dtype=dtype, **kwargs)
    set_attention_backend(module, "auto")
    assert out_f.shape == out_e.shape
    assert rel_err(out_f, out_e) <= rel, f"forward differs: {rel_err(out_f, out_e):.3g}"
    names = [f"input {i}" for i in range(len(grads_e) - len(list(module.parameters())))]
    names += [n for n, _ in module.named_parameters()]
    floor = 1e-6 * max([g.abs().max().item() for g in grads_e if g is not None and g.numel()], default=0.0)
    for name, ge, gf in zip(names, grads_e, grads_f):
        assert (ge is None) == (gf is None), f"gradient of {name}: explicit {ge is not None}, {other} {gf is not None}"
        if ge is not None:
            err = rel_err(gf, ge, floor)
            assert err <= rel, f"gradient of {name} differs: {err:.3g}"


def assert_compiled_flex_matches_explicit(module: nn.Module, x: Tensor, rel: float = 1e-5) -> None:
    """``torch.compile(module, fullgraph=True)`` on flex (inductor's FlexAttention kernel) gives the explicit
    backend's output for ``x``, within ``rel`` (inference)."""
    with torch.no_grad():
        set_attention_backend(module, "explicit")
        ref = module(x)
        set_attention_backend(module, "flex")
        torch._dynamo.reset()
        try:
            out = torch.compile(module, fullgraph=True)(x)
        finally:
            torch._dynamo.reset()
    assert rel_err(out, ref) <= rel


def count_graphs(module: nn.Module, *args: Any) -> int:
    """How many graphs ``torch.compile(module, fullgraph=True)`` captures for ``module(*args)`` (inference);
    a graph break raises (fullgraph). The graphs run as captured, no code generation (cheap)."""
    graphs: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(module, backend=backend, fullgraph=True)(*args)
    finally:
        torch._dynamo.reset()
    return len(graphs)
