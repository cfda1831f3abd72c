"""The single attention function every mechanism in the library calls.

``scaled_dot_product_attention`` is the choke point of DESIGN.md §2: it picks torch's fused
kernel when the attention weights are not needed and the explicit ``softmax(QKᵀ·scale)V`` path
when they are (requested by the caller, by an active recorder, or because the fused path is
switched off). Attention hooks (used by ``vit_attention.analysis.record_attention``) and the
fused/explicit switch live here and nowhere else.

Shapes: q ``[B, nh, N, hd]``, k ``[B, nh, M, hd]``, v ``[B, nh, M, hdv]`` -> ``[B, nh, N, hdv]``.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from .runtime import capturing

__all__ = [
    "scaled_dot_product_attention",
    "fused_attention_enabled",
    "set_fused_attention",
    "fused_attention",
    "register_attention_hook",
    "register_attention_shape_hook",
    "attention_context",
    "attention_observed",
]

_FUSED: bool = os.environ.get("VIT_ATTENTION_FUSED", "1") not in ("0", "false", "False")
_HOOKS: dict[int, Callable[[Tensor, dict[str, Any]], None]] = {}
_SHAPE_HOOKS: dict[int, Callable[[Tensor, Tensor, Tensor, dict[str, Any]], None]] = {}
_NEXT_HOOK_ID = 0
_CONTEXT: list[dict[str, Any]] = []
# mask -> ((version, dtype), normalised mask or None = the mask itself, dead rows or None)
_MASK_MEMO: WeakIdKeyDictionary = WeakIdKeyDictionary()


def fused_attention_enabled() -> bool:
    """Whether the fused kernel is used when weights are not requested."""
    return _FUSED


def set_fused_attention(enabled: bool) -> None:
    """Globally switch the fused kernel on or off (env default: ``VIT_ATTENTION_FUSED``)."""
    global _FUSED
    _FUSED = bool(enabled)


@contextlib.contextmanager
def fused_attention(enabled: bool) -> Iterator[None]:
    """Context manager form of :func:`set_fused_attention`; restores the previous value."""
    prev = _FUSED
    set_fused_attention(enabled)
    try:
        yield
    finally:
        set_fused_attention(prev)


class _HookHandle:
    def __init__(self, hook_id: int, registry: dict[int, Any] | None = None) -> None:
        self.id = hook_id
        self._registry = _HOOKS if registry is None else registry

    def remove(self) -> None:
        self._registry.pop(self.id, None)


def register_attention_hook(fn: Callable[[Tensor, dict[str, Any]], None]) -> _HookHandle:
    """Call ``fn(weights, info)`` for every attention computed while registered.

    ``weights`` is ``[B, nh, N, M]`` (post-softmax, pre-dropout, detached); ``info`` is the merged
    dict of the active :func:`attention_context` frames (e.g. module name, layout). Returns a
    handle with ``.remove()``. While any hook is registered the explicit path is used.
    """
    global _NEXT_HOOK_ID
    _NEXT_HOOK_ID += 1
    _HOOKS[_NEXT_HOOK_ID] = fn
    return _HookHandle(_NEXT_HOOK_ID)


def register_attention_shape_hook(fn: Callable[[Tensor, Tensor, Tensor, dict[str, Any]], None]) -> _HookHandle:
    """Call ``fn(q, k, v, info)`` before every attention call while registered (shape tracing, FLOPs).

    Unlike :func:`register_attention_hook` it does not force the explicit path and computes
    nothing, so it works on the meta device. ``info`` is the merged :func:`attention_context`
    plus ``mask``: the mask's shape tuple or None. Returns a handle with ``.remove()``.
    """
    global _NEXT_HOOK_ID
    _NEXT_HOOK_ID += 1
    _SHAPE_HOOKS[_NEXT_HOOK_ID] = fn
    return _HookHandle(_NEXT_HOOK_ID, _SHAPE_HOOKS)


@contextlib.contextmanager
def attention_context(**info: Any) -> Iterator[None]:
    """Attach metadata (module name, window layout, ...) to attention calls made inside."""
    _CONTEXT.append(info)
    try:
        yield
    finally:
        _CONTEXT.pop()


def attention_observed() -> bool:
    """True while any attention hook or shape hook is registered (callers must then keep their batch whole)."""
    return bool(_HOOKS or _SHAPE_HOOKS)


def _context_info() -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for frame in _CONTEXT:
        merged.update(frame)
    return merged


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "scaled_dot_product_attention expects 4-D q [B, nh, N, hd], k [B, nh, M, hd], "
            f"v [B, nh, M, hdv]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head dims differ: q {tuple(q.shape)} vs k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v key counts differ: k {tuple(k.shape)} vs v {tuple(v.shape)}")


def _check_mask(mask: Tensor, q: Tensor, k: Tensor) -> None:
    """``mask`` (2 to 4 dims) must broadcast to the logits ``[B, nh, N, M]`` without enlarging them.

    Only sizes are compared (no tensor values), so this traces, compiles and exports; a mask size of
    1 is tested first so a batch-free mask puts no guard on a dynamic batch size.
    """
    logits = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    shape = mask.shape
    ok = 2 <= len(shape) <= 4
    if ok:
        for i in range(1, len(shape) + 1):
            if shape[-i] != 1 and shape[-i] != logits[-i]:
                ok = False
                break
    if not ok:
        raise ValueError(
            f"mask of shape {tuple(shape)} does not broadcast to the attention logits [B, nh, N, M] = "
            f"{list(logits)} (q {tuple(q.shape)}, k {tuple(k.shape)}); expected 2 to 4 dims, each 1 or "
            f"equal to the logits' dim, aligned from the right (e.g. [N, M], [B, 1, 1, M], [1, nh, N, M])"
        )


def _as_is(mask: Tensor, q: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask.to(q.dtype)


def _normalise_mask(mask: Tensor | None, q: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """Return (mask usable by both paths, query rows that may attend to nothing, or None).

    Fully masked query rows get an all-permissive mask row (so neither path produces NaN) and
    are reported so the caller zeroes their output. No host sync: this runs on the hot path.
    """
    if mask is None:
        return None, None
    # A mask a module caches and passes again (Swin's bias + shift mask) is checked once per version on
    # CPU: without dead rows it is used as is, sparing a scan, a copy and an output fill per call.
    memo = (not capturing() and mask.device.type == "cpu"
            and not mask.requires_grad and not mask.is_inference())
    if memo:
        hit = _MASK_MEMO.get(mask)
        if hit is not None and hit[0] == (mask._version, q.dtype):
            return (_as_is(mask, q), None) if hit[1] is None else (hit[1], hit[2])
    if mask.dtype == torch.bool:
        dead = ~mask.any(dim=-1, keepdim=True)  # [..., N, 1]
        out = mask | dead
    elif not mask.is_floating_point():
        raise TypeError(f"mask must be bool (True = may attend) or floating (additive), got {mask.dtype}")
    else:
        out = mask.to(q.dtype)
        neginf = out == float("-inf")  # (not isneginf: the ONNX exporter has no such op)
        if not memo and out.device.type == "cpu" and not capturing() and not bool(neginf.any()):
            return out, None  # CPU, no -inf at all (e.g. Swin's -100 shift mask): nothing to check or fill
        dead = neginf.all(dim=-1, keepdim=True)  # [..., N, 1]
        out = out.masked_fill(dead, 0.0)
    if memo:
        if not bool(dead.any()):  # CPU: no device sync to pay
            _MASK_MEMO[mask] = ((mask._version, q.dtype), None, None)  # never hold the key itself
            return _as_is(mask, q), None
        _MASK_MEMO[mask] = ((mask._version, q.dtype), out, dead)
    return out, dead


def _explicit(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, scale: float | Tensor
              ) -> tuple[Tensor, Tensor]:
    if isinstance(scale, Tensor):  # per-head temperature multiplies the logits (SwinV2 op order)
        logits = q @ k.transpose(-2, -1)  # [B, nh, N, M]
        logits = logits.mul_(scale) if _in_place(logits, scale) else logits * scale
    else:
        logits = (q * scale) @ k.transpose(-2, -1)  # [B, nh, N, M]
    if mask is not None:
        if mask.dtype == torch.bool:
            fill = logits.masked_fill_ if _in_place(logits, mask) else logits.masked_fill
            logits = fill(~mask, float("-inf"))
        else:
            logits = logits.add_(mask) if _in_place(logits, mask) else logits + mask
    weights = logits.softmax(dim=-1)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return dropped @ v, weights  # [B, nh, N, hdv], [B, nh, N, M]


def _in_place(logits: Tensor, other: Tensor) -> bool:
    """Whether ``logits`` may be updated in place with ``other``: no autograd, broadcast keeps its shape."""
    if torch.is_grad_enabled() and (logits.requires_grad or other.requires_grad):
        return False
    return torch.broadcast_shapes(logits.shape, other.shape) == logits.shape


def _mask_grad_on_cpu(q: Tensor, mask: Tensor | None) -> bool:
    """A learned additive mask (e.g. Swin's position bias) in training on CPU.

    torch's fused CPU kernel has no gradient for the mask and falls back to its math path, which adds
    a fully-masked-row scan and a select over the logits; our explicit path computes the same thing
    without them (measured: 2 % of a Swin-T training step).
    """
    return (mask is not None and q.device.type == "cpu" and mask.requires_grad and torch.is_grad_enabled()
            and not capturing())


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | Tensor | None = None,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention ``softmax(q kᵀ · scale + mask) v``.

    Args:
        q: queries ``[B, nh, N, hd]``.
        k: keys ``[B, nh, M, hd]``.
        v: values ``[B, nh, M, hdv]``.
        mask: broadcastable to ``[B, nh, N, M]`` (2 to 4 dims, each 1 or the logits' size); bool
            (True = may attend) or additive float. A query row that may attend to nothing yields
            zeros, never NaN. Any other shape raises a ``ValueError`` naming ``mask``.
        dropout_p: dropout on the attention weights (pass 0 in eval).
        scale: logit scale, default ``hd ** -0.5``; a tensor broadcastable to ``[B, nh, 1, 1]`` is a
            per-head temperature (SwinV2), folded into ``q`` on the fused path.
        return_weights: also return the weights ``[B, nh, N, M]`` (forces the explicit path).

    Returns:
        ``[B, nh, N, hdv]``, or ``(out, weights)`` when ``return_weights``.
    """
    _check_shapes(q, k, v)
    # jit.trace: sizes are tensors and the comparisons would only warn (dynamo must not reach is_tracing)
    if mask is not None and (torch.compiler.is_compiling() or not torch.jit.is_tracing()):
        _check_mask(mask, q, k)
    if _SHAPE_HOOKS:
        shape_info = {**_context_info(), "mask": None if mask is None else tuple(mask.shape)}
        for shape_hook in list(_SHAPE_HOOKS.values()):
            shape_hook(q, k, v, shape_info)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    mask, dead = _normalise_mask(mask, q)
    want_weights = return_weights or bool(_HOOKS)
    if want_weights or not _FUSED or _mask_grad_on_cpu(q, mask):
        out, weights = _explicit(q, k, v, mask, dropout_p, scale)
        if dead is not None:
            out = out.masked_fill(dead, 0.0)
            weights = weights.masked_fill(dead, 0.0)
        if _HOOKS:
            info = _context_info()
            detached = weights.detach()
            for hook in list(_HOOKS.values()):
                hook(detached, info)
        return (out, weights) if return_weights else out
    if isinstance(scale, Tensor):
        q, scale = q * scale.to(q.dtype), 1.0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out
