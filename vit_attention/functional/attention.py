"""The single attention function every mechanism in the library calls.

``scaled_dot_product_attention`` is the one choke point: it picks torch's fused kernel when
nothing needs the attention weights and the explicit ``softmax(q kᵀ·scale + bias) v`` path when
something does (the caller, an observer, a ``logits_fn`` / ``weights_fn``, or the fused switch
turned off). It calls the observers registered in :mod:`.observers` (attention maps, shape
traces, FLOPs), and this is the one place in the package where a softmax over attention logits
is taken.

**The fused switch** (:data:`.runtime.FUSED_ATTENTION`, see :mod:`.runtime`): a mechanism
captures it when built (``self.fused_attention``) and passes it as ``fused=``; a direct call
without ``fused=`` uses the process default. An open ``FUSED_ATTENTION.override(False)`` block of
this thread overrides both.

Shapes: q ``[*b, nh, N, hd]``, k ``[*b, nh, M, hd]``, v ``[*b, nh, M, hdv]`` -> ``[*b, nh, N, hdv]``;
``bias`` / ``mask`` broadcast to the logits ``[*b, nh, N, M]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .observers import SHAPE_HOOKS, WEIGHT_HOOKS, hook_info
from .runtime import ATTENTION_BACKEND, BACKENDS, FUSED_ATTENTION, capturing, check_backend

__all__ = ["scaled_dot_product_attention", "fused_attention_enabled", "set_fused_attention"]


def fused_attention_enabled() -> bool:
    """Whether a call that passes no ``fused=`` uses the fused kernel here (:data:`.runtime.FUSED_ATTENTION`):
    this thread's open override, else the process default."""
    return FUSED_ATTENTION.get()


# (enabled) the process default: modules built afterwards capture it; modules built before keep theirs
# (runtime.set_switches(model, fused_attention=...) changes a built model)
set_fused_attention = FUSED_ATTENTION.set


# ----------------------------------------------------------------------------- argument checks
def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            "scaled_dot_product_attention expects q [*b, nh, N, hd], k [*b, nh, M, hd], v [*b, nh, M, hdv] "
            f"with the same number of dims (>= 3); got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head dims differ: q {tuple(q.shape)} vs k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v key counts differ: k {tuple(k.shape)} vs v {tuple(v.shape)}")
    if q.dim() > 4 and not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"q, k and v must share their leading dims [*b, nh]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")


def _check_broadcast(t: Tensor, name: str, q: Tensor, k: Tensor) -> None:
    """``t`` (``name`` = mask / bias, 2 to q.dim() dims) must broadcast to the logits without enlarging them.

    Only sizes are compared (no tensor values), so this traces, compiles and exports; a size of 1
    is tested first so a batch-free mask puts no guard on a dynamic batch size.
    """
    logits = (*q.shape[:-1], k.shape[-2])
    shape = t.shape
    ok = 2 <= len(shape) <= len(logits)
    if ok:
        for i in range(1, len(shape) + 1):
            if shape[-i] != 1 and shape[-i] != logits[-i]:
                ok = False
                break
    if not ok:
        dims = "[B, nh, N, M]" if len(logits) == 4 else "[*b, nh, N, M]"
        raise ValueError(
            f"{name} of shape {tuple(shape)} does not broadcast to the attention logits {dims} = "
            f"{list(logits)} (q {tuple(q.shape)}, k {tuple(k.shape)}); expected 2 to {len(logits)} dims, each 1 or "
            f"equal to the logits' dim, aligned from the right (e.g. [N, M], [B, 1, 1, M], [1, nh, N, M])"
        )


def _check_args(q: Tensor, k: Tensor, bias: Tensor | None, mask: Tensor | None, scale: Any) -> None:
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be bool (True = may attend), got {mask.dtype}; pass an additive float "
                        "mask as bias=")
    if bias is not None and not bias.is_floating_point():
        raise TypeError(f"bias must be a floating tensor (added to the logits), got {bias.dtype}")
    if isinstance(scale, Tensor):
        raise TypeError("scale must be a float; fold a per-head temperature into q (q * temperature, scale=1.0)")
    # jit.trace: sizes are tensors and the comparisons would only warn (dynamo must not reach is_tracing)
    if (mask is not None or bias is not None) and (torch.compiler.is_compiling() or not torch.jit.is_tracing()):
        if mask is not None:
            _check_broadcast(mask, "mask", q, k)
        if bias is not None:
            _check_broadcast(bias, "bias", q, k)


# ----------------------------------------------------------------------------- the two paths
def _in_place(logits: Tensor, other: Tensor) -> bool:
    """Whether ``logits`` may be updated in place with ``other``: no autograd, broadcast keeps its shape."""
    if torch.is_grad_enabled() and (logits.requires_grad or other.requires_grad):
        return False
    # each of other's dims, aligned from the right, is 1 or logits' (torch.broadcast_shapes: ~20 µs a call)
    shape, dims = logits.shape, other.shape
    return len(dims) <= len(shape) and all(d == 1 or d == s for s, d in zip(shape[len(shape) - len(dims):], dims))


def _bias_grad_on_cpu(q: Tensor, bias: Tensor | None) -> bool:
    """A learned bias (e.g. Swin's relative-position bias) in training on CPU.

    torch's fused CPU kernel has no gradient for the mask and falls back to its math path, which adds
    a fully-masked-row scan and a select over the logits; our explicit path computes the same thing
    without them (measured: 2 % of a Swin-T training step).
    """
    return (bias is not None and q.device.type == "cpu" and bias.requires_grad and torch.is_grad_enabled()
            and not capturing())


def _math_fallback_on_cpu(q: Tensor, v: Tensor) -> bool:
    """Eager CPU attention whose value width differs from the query / key width (LeViT, EfficientViT-M: 16-wide
    keys, 32- or 64-wide values).

    torch's fused CPU kernel needs one head width for q, k and v; otherwise it takes its math path, which scales
    q and k apart and scans every logit row for a fully masked one (``_safe_softmax``: ``isneginf``, ``all``,
    ``where``). Our explicit path computes the same products and softmax without those passes (measured: LeViT's
    attention shapes 1.3-1.8x faster on one thread). Graph capture keeps torch's kernel (the traced graph is
    unchanged)."""
    return q.device.type == "cpu" and q.shape[-1] != v.shape[-1] and not capturing()


def _explicit(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None, dead: Tensor | None,
              scale: float, dropout_p: float, logits_fn: Callable[[Tensor], Tensor] | None,
              weights_fn: Callable[[Tensor], Tensor] | None, info: dict[str, Any] | None) -> tuple[Tensor, Tensor]:
    """``softmax(logits_fn(q kᵀ·scale + bias) | mask)``, ``weights_fn``, dropout, ``@ v``: out and weights."""
    logits = (q if scale == 1.0 else q * scale) @ k.transpose(-2, -1)  # [*b, nh, N, M]
    if bias is not None:
        logits = logits.add_(bias) if _in_place(logits, bias) else logits + bias
    if logits_fn is not None:
        logits = logits_fn(logits)  # [*b, nh, N, M]
    if mask is not None:  # after logits_fn: a masked key stays masked whatever the transform does
        fill = logits.masked_fill_ if _in_place(logits, mask) else logits.masked_fill
        logits = fill(~mask, float("-inf"))
    # where the logits are this call's own product and nothing records through them, they are normalised where
    # they lie: one [*b, nh, N, M] buffer fewer to allocate and fault in (measured: LeViT-128S 7-9 % faster on two
    # threads), the same numbers
    own = logits_fn is None and not capturing() and not (torch.is_grad_enabled() and logits.requires_grad)
    weights = torch.softmax(logits, dim=-1, out=logits if own else None)  # the package's one softmax over logits
    if weights_fn is not None:
        weights = weights_fn(weights)  # [*b, nh, N, M]
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)  # rows that may attend to nothing: zeros
    if info is not None:
        detached = weights.detach()
        for hook in list(WEIGHT_HOOKS.values()):
            hook(detached, info)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return dropped @ v, weights  # [*b, nh, N, hdv], [*b, nh, N, M]


def _with_pattern(pattern: Any, q: Tensor, bias: Tensor | None, mask: Tensor | None) -> tuple[Tensor | None,
                                                                                            Tensor | None]:
    """``bias`` / ``mask`` with the pattern's dense bias ``[B, nh, N, M]`` and mask ``[Bm, Hm, N, M]`` folded in."""
    pbias = pattern.dense_bias(q.shape[0], q.shape[1], device=q.device, dtype=q.dtype)
    pmask = pattern.dense_mask(q.device)
    if pbias is not None:
        bias = pbias if bias is None else bias + pbias
    if pmask is not None:
        mask = pmask if mask is None else mask & pmask
    return bias, mask


def _flex(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None, is_causal: bool,
          scale: float, dropout_p: float, pattern: Any) -> Tensor:
    """The ``"flex"`` backend: the pattern's mods plus any dense ``bias`` / ``mask`` / causal flag, block-sparse."""
    from .flex import AttentionPattern, block_mask_for, dense_mods, flex_attention

    if dropout_p > 0.0:
        raise ValueError(f"dropout on the attention weights (dropout_p={dropout_p}, a mechanism's attn_drop) is not "
                         "supported by the 'flex' attention backend; use backend 'auto', 'sdpa' or 'explicit' to "
                         "train with it")
    lead = q.shape[:-3]
    if q.dim() != 4:
        if pattern is not None:
            raise ValueError(f"an attention pattern needs 4-D q [B, nh, N, hd], got {tuple(q.shape)}")
        q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
        bias = None if bias is None else _fold(bias, lead)
        mask = None if mask is None else _fold(mask, lead)
    B, H, N, M = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    dense_score, dense_mask = dense_mods(bias, mask, is_causal, (B, H, N, M))
    if pattern is None:
        pattern = AttentionPattern(N, M)
    score_mod = pattern.score_mod
    if dense_score is not None:
        own = score_mod
        score_mod = dense_score if own is None else (
            lambda s, b, h, qi, ki: dense_score(own(s, b, h, qi, ki), b, h, qi, ki))
    mask_mod, key = pattern.mask_mod, pattern.cache_key
    mask_batch, mask_heads = pattern.mask_batch, pattern.mask_heads
    if dense_mask is not None:
        if mask is not None:  # data: no cache, per sample / head where the mask has those dims
            key = None
            m4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
            mask_batch = B if m4.shape[0] != 1 else mask_batch
            mask_heads = H if m4.shape[1] != 1 else mask_heads
        else:  # the causal flag only: geometry, cacheable unless the pattern's own mask is uncached data
            key = None if key is None and pattern.mask_mod is not None else (key, "causal")
        own_mask = mask_mod
        mask_mod = dense_mask if own_mask is None else (
            lambda b, h, qi, ki: own_mask(b, h, qi, ki) & dense_mask(b, h, qi, ki))
    full = AttentionPattern(N, M, mask_mod=mask_mod, score_mod=score_mod, cache_key=key, mask_batch=mask_batch,
                            mask_heads=mask_heads)
    out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask_for(full, q.device), scale=scale)
    return out if len(lead) == 1 else out.view(*lead, *out.shape[-3:])  # [*b, nh, N, hdv]


def _fold(t: Tensor, lead: torch.Size) -> Tensor:
    """``[*b, x, y, z]`` (or fewer dims, broadcastable) -> ``[prod(b), x, y, z]`` for the 4-D fused kernel."""
    if t.dim() <= 3:
        return t
    t = t.reshape((1,) * (len(lead) + 3 - t.dim()) + tuple(t.shape))
    if all(s == 1 for s in t.shape[:-3]):
        return t.reshape(1, *t.shape[-3:])
    return t.expand(*lead, *t.shape[-3:]).reshape(-1, *t.shape[-3:])


def _fused(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float, is_causal: bool,
           scale: float) -> Tensor:
    """torch's fused kernel; more than one leading batch dim is folded into one (its fast kernels are 4-D)."""
    if q.dim() <= 4:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                              scale=scale)
    lead = q.shape[:-3]
    out = F.scaled_dot_product_attention(
        q.reshape(-1, *q.shape[-3:]), k.reshape(-1, *k.shape[-3:]), v.reshape(-1, *v.shape[-3:]),
        attn_mask=None if attn_mask is None else _fold(attn_mask, lead), dropout_p=dropout_p, is_causal=is_causal,
        scale=scale)  # [prod(b), nh, N, hdv]
    return out.view(*lead, *out.shape[-3:])  # [*b, nh, N, hdv]


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    bias: Tensor | None = None,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    logits_fn: Callable[[Tensor], Tensor] | None = None,
    weights_fn: Callable[[Tensor], Tensor] | None = None,
    layout: Any = None,
    return_weights: bool = False,
    fused: bool | None = None,
    backend: str | None = None,
    pattern: Any = None,
    observed: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention ``softmax(q kᵀ · scale + bias) v``, masked.

    Args:
        q: queries ``[*b, nh, N, hd]`` (any number of leading batch dims, the same for q, k, v).
        k: keys ``[*b, nh, M, hd]``.
        v: values ``[*b, nh, M, hdv]``.
        bias: additive float, broadcastable to the logits ``[*b, nh, N, M]``; finite, may carry
            gradients (relative-position biases, Swin's -100 shift mask). Never scanned.
        mask: bool, broadcastable to ``[*b, nh, N, M]``, True = may attend. A query row that may
            attend to nothing gives zeros (and finite gradients), never NaN.
        is_causal: query ``i`` attends to keys ``j <= i`` (torch's fused flag; the same as a
            lower-triangular ``mask``).
        scale: logit scale, default ``hd ** -0.5``.
        dropout_p: dropout on the attention weights (pass 0 in eval).
        logits_fn: ``[*b, nh, N, M] -> [*b, nh, N, M]`` on ``q kᵀ·scale + bias`` before the softmax
            (the masks are applied after it). Forces the explicit path.
        weights_fn: ``[*b, nh, N, M] -> [*b, nh, N, M]`` on the weights after the softmax, before
            dropout and ``@ v`` (CaiT's talking heads). Forces the explicit path.
        layout: where the rows sit on the grid (an :class:`~.layout.AttentionLayout`, or a
            zero-argument callable returning one, called only when an observer is registered);
            handed to observers as ``info["layout"]``.
        return_weights: also return the weights ``[*b, nh, N, M]`` (forces the explicit path).
        fused: whether the fused kernel may run when nothing needs the weights: the caller's
            captured :data:`.runtime.FUSED_ATTENTION` (a mechanism's ``self.fused_attention``);
            None = the process default. An open ``FUSED_ATTENTION.override(...)`` of this
            thread wins over both. False takes the explicit path whatever the backend.
        backend: ``"auto"``, ``"sdpa"``, ``"explicit"`` or ``"flex"`` (:mod:`.flex`): the caller's
            captured :data:`.runtime.ATTENTION_BACKEND` (a mechanism's ``self.attention_backend``);
            None = the process default. Whatever it says, the explicit path runs when something
            needs the weights (``return_weights``, an observer, ``logits_fn`` / ``weights_fn``).
        pattern: an :class:`~.flex.AttentionPattern` over this call's ``N`` queries and ``M`` keys
            (4-D q): the flex backend runs its mods block-sparse; the other paths add its dense
            bias / mask to ``bias`` / ``mask``.
        observed: False hides this call from the observers (maps, shape traces, FLOP records) and does not force
            the explicit path for them: a mechanism whose one attention is several dependent core calls (a
            cascade of heads) computes the parts so and reports them as one observed call.

    A bad ``mask`` / ``bias`` shape raises a ``ValueError`` naming the argument.

    Returns:
        ``[*b, nh, N, hdv]``, or ``(out, weights)`` when ``return_weights``.
    """
    _check_shapes(q, k, v)
    _check_args(q, k, bias, mask, scale)
    info = hook_info(mask, bias, is_causal, layout) if observed and (WEIGHT_HOOKS or SHAPE_HOOKS) else None
    if info is not None:
        for shape_hook in list(SHAPE_HOOKS.values()):
            shape_hook(q, k, v, info)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if bias is not None:
        bias = bias.to(q.dtype)
    backend = ATTENTION_BACKEND.get(backend)
    if backend not in BACKENDS:
        check_backend(backend, "backend")
    explicit = (return_weights or (observed and bool(WEIGHT_HOOKS)) or logits_fn is not None or weights_fn is not None
                or not FUSED_ATTENTION.get(fused) or backend == "explicit"
                or (backend == "auto" and (_bias_grad_on_cpu(q, bias) or _math_fallback_on_cpu(q, v))))
    if backend == "flex" and not explicit:
        return _flex(q, k, v, bias, mask, is_causal, scale, dropout_p, pattern)
    if pattern is not None:
        if q.dim() != 4:
            raise ValueError(f"an attention pattern needs 4-D q [B, nh, N, hd], got {tuple(q.shape)}")
        bias, mask = _with_pattern(pattern, q, bias, mask)
    if is_causal and (explicit or mask is not None or bias is not None):  # the flag alone takes no other mask
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()  # [N, M]
        mask, is_causal = (causal if mask is None else mask & causal), False
    dead = None
    if mask is not None:
        dead = ~mask.any(dim=-1, keepdim=True)  # [..., N, 1]: rows that may attend to nothing
        mask = mask | dead  # all-permissive there (no NaN on either path); zeroed below
    if explicit:
        out, weights = _explicit(q, k, v, bias, mask, dead, scale, dropout_p, logits_fn, weights_fn,
                                 info if observed and WEIGHT_HOOKS else None)
        return (out, weights) if return_weights else out
    attn_mask = mask if bias is None else bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    out = _fused(q, k, v, attn_mask, dropout_p, is_causal, scale)
    return out if dead is None else out.masked_fill(dead, 0.0)
