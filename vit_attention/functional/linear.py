"""Linear projections with fused epilogues: ``act(x Wᵀ + b) (+ residual)`` in one kernel.

Eager PyTorch runs ``Linear -> GELU -> (+ residual)`` as separate kernels: a bias broadcast copy,
the GEMM, an activation pass and an add pass, each a full sweep over the activations and, on a
multi-threaded CPU, its own parallel region. For inference on CPU (no autograd, fp32 or bf16,
no autocast, a dtype this CPU's oneDNN has kernels for, no graph capture: compile, export,
``jit.trace`` / ``jit.script``, ONNX export; see :mod:`.runtime`) :func:`linear` hands the whole thing to oneDNN's
``linear_pointwise`` (bias, activation and residual add fused as GEMM post-ops). Everywhere else
it is exactly ``F.linear`` followed by the activation and the add, so results, autograd and
devices are unchanged. The oneDNN operators are private torch APIs, called through :mod:`.fast_paths`
(which falls back to ``F.linear`` where this torch lacks them); the switch :data:`.runtime.FAST_PATHS`
(``VIT_ATTENTION_FAST_PATHS=0``, :func:`.fast_paths.use_fast_paths`\\ ``(False)``) turns them off.

Shapes: ``x [..., Cin]``, ``weight [Cout, Cin]``, ``bias [Cout]``, ``residual [..., Cout]`` ->
``[..., Cout]``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules import module as _module

from . import fast_paths as _fp
from .fast_paths import ACTIVATIONS, activation, cpu_kernel_supports
from .runtime import FAST_PATHS, capturing

__all__ = ["linear", "apply_linear", "can_fuse", "hookless", "fusable_activation", "act_fresh", "INPLACE_ACTIVATIONS"]


def fusable_activation(module: torch.nn.Module) -> str | None:
    """Name in :data:`.fast_paths.ACTIVATIONS` of an activation module (``nn.GELU``, ``nn.ReLU``, ``nn.SiLU``),
    else None."""
    if type(module) is torch.nn.GELU:
        return "gelu" if module.approximate == "none" else "gelu_tanh"
    if type(module) is torch.nn.ReLU:
        return "relu"
    if type(module) is torch.nn.SiLU:
        return "silu"
    return None


def _autocast_on(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4: no device argument
        return bool(torch.is_autocast_cpu_enabled()) if device_type == "cpu" else bool(torch.is_autocast_enabled())


def _onednn_ok(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """oneDNN can run this projection: CPU, fp32 (or bf16) without autocast, eager, plain tensors."""
    if not (FAST_PATHS.get() and _fp.HAS_LINEAR_POINTWISE) or x.device.type != "cpu" or weight.device.type != "cpu":
        return False
    if x.dtype != torch.float32 or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return False
    if capturing() or _autocast_on("cpu"):
        return False
    return x.is_contiguous() and weight.is_contiguous() and type(x) in (Tensor, torch.nn.Parameter) and type(
        weight) in (Tensor, torch.nn.Parameter)


class _OneDNNLinear(torch.autograd.Function):
    """``x Wᵀ + b`` with oneDNN's GEMM (bias fused) forward and for the input gradient; autograd-aware."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _fp.linear_pointwise(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])  # [M, Cout]
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:  # [M, Cin] = g W
            if torch.is_grad_enabled():  # create_graph=True: differentiable ops for higher-order gradients
                gx = g2 @ weight
            else:  # oneDNN: linear with weight Wᵀ [Cin, Cout]
                gx = _fp.linear_pointwise(g2.contiguous(), weight.t().contiguous(), None)
            gx = gx.view(x.shape)
        if ctx.needs_input_grad[1]:
            gw = g2.t() @ x.reshape(-1, x.shape[-1])  # [Cout, Cin]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def can_fuse(x: Tensor, weight: Tensor, bias: Tensor | None = None, residual: Tensor | None = None) -> bool:
    """True when the fused oneDNN kernel computes exactly what the eager ops would (inference on CPU)."""
    if not (FAST_PATHS.get() and _fp.HAS_LINEAR_POINTWISE) or x.device.type != "cpu" or weight.device.type != "cpu" \
            or capturing():
        return False
    if x.dtype not in (torch.float32, torch.bfloat16) or weight.dtype != x.dtype or not cpu_kernel_supports(x.dtype):
        return False
    if bias is not None and bias.dtype != x.dtype:
        return False
    if residual is not None and (residual.dtype != x.dtype or not residual.is_contiguous()):
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, residual)):
        return False
    if capturing() or _autocast_on("cpu"):
        return False
    return x.is_contiguous() and weight.is_contiguous() and type(x) is Tensor and type(weight) in (
        Tensor, torch.nn.Parameter)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, act: str | None = None,
           residual: Tensor | None = None) -> Tensor:
    """``act(x @ weightᵀ + bias) + residual``; ``[..., Cin] -> [..., Cout]``.

    Args:
        x: input ``[..., Cin]``.
        weight: ``[Cout, Cin]``; bias: ``[Cout]`` or None.
        act: None or a name in :data:`.fast_paths.ACTIVATIONS` (applied before the residual add).
        residual: None or ``[..., Cout]``, added last.
    """
    if act is not None and act not in ACTIVATIONS:
        raise ValueError(f"act must be None or one of {sorted(ACTIVATIONS)}, got {act!r}")
    if x.device.type != "cpu" or not FAST_PATHS.get():
        # the oneDNN paths are CPU-only (switched off: the same F.linear path as a GPU's, which
        # scripts/host_overhead.py then measures): straight to F.linear, launch-bound GPUs pay nothing more
        out = activation(F.linear(x, weight, bias), act)
        return out if residual is None else residual + out
    if residual is not None and act is not None:  # oneDNN fuses one post-op at a time
        return residual + linear(x, weight, bias, act=act)
    if can_fuse(x, weight, bias, residual):
        if residual is not None:
            if _fp.HAS_LINEAR_ADD and residual.shape[:-1] == x.shape[:-1] and residual.shape[-1] == weight.shape[0]:
                return _fp.linear_add(x, residual, weight, bias)
        else:
            return _fp.linear_pointwise(x, weight, bias, act)
    if _onednn_ok(x, weight, bias) and x.dim() >= 2 and x.shape[-1] == weight.shape[-1]:
        out = _OneDNNLinear.apply(x, weight, bias)  # training on CPU: same math, faster GEMM, no bias copy
    else:
        out = F.linear(x, weight, bias)
    out = activation(out, act)
    return out if residual is None else residual + out


def apply_linear(module: torch.nn.Module, x: Tensor, *, residual: Tensor | None = None) -> Tensor:
    """``module(x) (+ residual)`` for a projection module, fused when it is a plain ``nn.Linear``.

    A subclass, a wrapper or a module with forward hooks runs through its own ``forward``.
    ``[..., Cin] -> [..., Cout]``.
    """
    if type(module) is torch.nn.Linear and hookless(module):
        return linear(x, module.weight, module.bias, residual=residual)
    out = module(x)
    return out if residual is None else residual + out


def hookless(*modules: torch.nn.Module) -> bool:
    """True when neither these modules nor the global registry carry forward hooks.

    Fused paths skip submodule calls (or change what a module returns), so they run only where
    no hook could observe the difference.
    """
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return False
    for m in modules:  # a plain loop: this runs several times per block, on every forward
        if m._forward_hooks or m._forward_pre_hooks:
            return False
    return True


INPLACE_ACTIVATIONS: dict[type, Any] = {
    torch.nn.Hardswish: lambda x: F.hardswish(x, inplace=True), torch.nn.ReLU: torch.relu_,
    torch.nn.SiLU: lambda x: F.silu(x, inplace=True)}
"""Activation module classes with an in-place form: ``{class: x -> act(x), overwriting x}``."""


def act_fresh(act: torch.nn.Module, x: Tensor) -> Tensor:
    """``act(x)`` for an ``x`` nobody else holds (the caller's own fresh output), any shape: in place when ``act`` is
    one of :data:`INPLACE_ACTIVATIONS`, hookless, no autograd records through ``x`` and no graph is captured (one
    buffer fewer, the same numbers); otherwise the module itself runs."""
    fn = INPLACE_ACTIVATIONS.get(type(act))
    if fn is None or capturing() or not hookless(act) or (torch.is_grad_enabled() and x.requires_grad):
        return act(x)
    return fn(x)
