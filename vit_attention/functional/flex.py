"""Attention patterns described once, run by FlexAttention (fused, block-sparse) or densely.

An :class:`AttentionPattern` says, over a sequence of ``N`` queries and ``M`` keys, which keys a
query may see (``mask_mod(b, h, q_idx, kv_idx) -> bool``) and the additive term on its logit
(``score_mod(score, b, h, q_idx, kv_idx) -> score``), in the vocabulary of PyTorch's
``torch.nn.attention.flex_attention``. A patterned mechanism (Swin's shifted windows with their
bias table, neighbourhood and halo attention, 2-D Longformer, ViTDet's decomposed positions,
causal) writes that description once; from it

* the ``"flex"`` backend runs :func:`flex_attention` with a block mask cached per pattern
  geometry and device (:func:`block_mask_for`): one fused kernel on CUDA that skips every block
  of the ``N x M`` logits the pattern never touches;
* :meth:`AttentionPattern.dense_mask` / :meth:`AttentionPattern.dense_bias` evaluate the same
  functions on broadcast index grids: the ``[.., N, M]`` mask and bias of the dense paths (and of
  the tests proving the two agree).

A mod must be written with tensor operations only (arithmetic, comparisons, ``torch.where``,
indexing captured tensors with the index arguments), as FlexAttention requires: evaluated on
broadcast index tensors it then gives exactly what flex computes element by element.

**Backends** (:data:`BACKENDS`, chosen per module: ``create_attention(..., backend=)``,
``create_model(..., attn_backend=)``, the captured switch :data:`.runtime.ATTENTION_BACKEND`):

* ``"auto"`` (default): the fastest measured path of each mechanism: torch's fused SDPA kernel
  when nothing needs the weights, the explicit path where it measured faster (a learned bias in
  CPU training), and a mechanism's own tiled paths on CPU.
* ``"sdpa"``: torch's fused kernel whenever nothing needs the weights.
* ``"explicit"``: ``softmax(q kᵀ·scale + bias) v`` written out (the reference).
* ``"flex"``: FlexAttention. Compiled on CUDA (lazily, once per process); eager (unfused, the
  reference math) on CPU unless the caller compiles the model. FlexAttention has no backward on
  CPU in torch 2.13 and no dropout on the weights: both are refused with a clear error. Observers
  that need the weights (attention maps) still get the explicit path.
"""

from __future__ import annotations

import collections
import contextlib
import math
import warnings
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, overload

import torch
from torch import Tensor

from .observers import attention_observed
from .runtime import ATTENTION_BACKEND, BACKENDS, FUSED_ATTENTION, capturing, check_backend

__all__ = ["BACKENDS", "check_backend", "AttentionPattern", "MaskMod", "ScoreMod", "flex_attention",
           "block_mask_for", "clear_block_mask_cache", "dense_mods", "flex_buffer", "use_flex", "AUTO_FLEX",
           "PatternDoc", "recording_patterns", "skipped_blocks"]

# mechanisms for which "auto" picks flex on CUDA: those measured faster there than their SDPA path
# (docs/benchmarks.md). Empty until a GPU measurement says so; "flex" asks for it explicitly.
AUTO_FLEX: frozenset[str] = frozenset()


def use_flex(backend: str | None, fused: bool | None, device: torch.device, mechanism: str = "") -> bool:
    """Whether a patterned mechanism should run its :class:`AttentionPattern` on FlexAttention for this call.

    ``backend`` / ``fused``: the mechanism's captured switches (None: the process defaults). True for
    ``"flex"`` (and for ``"auto"`` on CUDA when ``mechanism`` is in :data:`AUTO_FLEX`), unless the
    explicit path is asked for (``fused`` False) or an observer is registered: observers (maps, traces,
    FLOPs) see the mechanism's own layout, whose rows they know how to place.
    """
    backend = ATTENTION_BACKEND.get(backend)
    if backend != "flex" and not (backend == "auto" and AUTO_FLEX and device.type == "cuda"
                                  and mechanism in AUTO_FLEX):
        return False  # the common case, decided without another lookup
    return FUSED_ATTENTION.get(fused) and not attention_observed()

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (b, h, q_idx, kv_idx) -> bool
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]  # (score, b, h, q_idx, kv_idx) -> score


@dataclass(frozen=True, eq=False)
class AttentionPattern:
    """Which keys each of ``num_queries`` queries may see among ``num_keys``, and the additive logit term.

    Fields:
        num_queries, num_keys: ``N`` and ``M`` of the sequence the pattern is written for.
        mask_mod: ``(b, h, q_idx, kv_idx) -> bool`` (True = may attend); None = every key.
        score_mod: ``(score, b, h, q_idx, kv_idx) -> score``, applied to ``q·k·scale``; None = none.
            FlexAttention differentiates through the tensors it captures (a learned bias table
            receives its gradient).
        cache_key: what fixes ``mask_mod`` (the geometry: sizes, window, shift, dilation ...), so
            that its block mask is built once per key and device; None = rebuilt on each call
            (a mask that depends on data).
        mask_batch, mask_heads: the batch / head counts ``mask_mod`` depends on (None: the same
            for every sample / head, the block mask broadcasts).
    """

    num_queries: int
    num_keys: int
    mask_mod: MaskMod | None = None
    score_mod: ScoreMod | None = None
    cache_key: Hashable | None = None
    mask_batch: int | None = None
    mask_heads: int | None = None
    _dense: dict[Any, Tensor] = field(default_factory=dict, repr=False)

    def _grids(self, batch: int, heads: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
        h = torch.arange(heads, device=device).view(1, heads, 1, 1)
        q = torch.arange(self.num_queries, device=device).view(1, 1, -1, 1)
        kv = torch.arange(self.num_keys, device=device).view(1, 1, 1, -1)
        return b, h, q, kv

    def dense_mask(self, device: torch.device | str = "cpu") -> Tensor | None:
        """``mask_mod`` on every (query, key): bool ``[Bm, Hm, N, M]`` (``Bm`` / ``Hm`` = ``mask_batch`` /
        ``mask_heads`` or 1), True = may attend; None without a ``mask_mod``. Cached on the pattern per device."""
        if self.mask_mod is None:
            return None
        device = torch.device(device)
        key = ("mask", device)
        if key not in self._dense or capturing():
            b, h, q, kv = self._grids(self.mask_batch or 1, self.mask_heads or 1, device)
            mask = self.mask_mod(b, h, q, kv)
            full = (self.mask_batch or 1, self.mask_heads or 1, self.num_queries, self.num_keys)
            mask = torch.broadcast_to(mask, full)
            if capturing():
                return mask
            self._dense[key] = mask
        return self._dense[key]

    def dense_bias(self, batch: int, heads: int, *, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> Tensor | None:
        """``score_mod`` on a zero score for every (sample, head, query, key): ``[batch, heads, N, M]``; None without
        a ``score_mod``. Not cached: a score_mod may read parameters (a learned table) that change."""
        if self.score_mod is None:
            return None
        b, h, q, kv = self._grids(batch, heads, torch.device(device))
        zero = torch.zeros(batch, heads, self.num_queries, self.num_keys, device=device, dtype=dtype)
        return torch.broadcast_to(self.score_mod(zero, b, h, q, kv), zero.shape)


@dataclass(frozen=True)
class PatternDoc:
    """How a patterned mechanism's :class:`AttentionPattern` reads, in words: one row of docs/flex.md's table of
    patterns, declared where the mechanism is defined (its class attribute ``flex_pattern``).

    Fields:
        families: the model families that run it ("Swin, SwinV2, ...").
        keys: which keys a query sees (the ``mask_mod``).
        term: the additive term on a logit (the ``score_mod``); "-" for none.
        order: the token order the pattern is written in.
        example: ``(kwargs, input_shape)``: the mechanism's small geometry on which the docs count the share of
            skipped blocks (``create_attention(name, input_shape[-1], 3, **kwargs)`` on that input).
    """

    families: str
    keys: str
    term: str
    order: str
    example: tuple[dict[str, Any], tuple[int, ...]]


# ----------------------------------------------------------------------------- block masks
_RECORDERS: list[list[AttentionPattern]] = []


@contextlib.contextmanager
def recording_patterns() -> Iterator[list[AttentionPattern]]:
    """Inside the block, every :class:`AttentionPattern` the flex path runs (the full pattern of each call, its
    block mask asked for with :func:`block_mask_for`) is appended to the yielded list, in call order."""
    seen: list[AttentionPattern] = []
    _RECORDERS.append(seen)
    try:
        yield seen
    finally:
        _RECORDERS.remove(seen)


def skipped_blocks(pattern: AttentionPattern, device: torch.device | str = "cpu") -> tuple[int, int]:
    """``(skipped, total)``: the ``128 x 128`` blocks of the ``[N, M]`` logits (per masked sample and head) that
    ``pattern``'s block mask leaves out, and all of them. Counted from the block mask's own block counts, so it is
    exact where torch's ``BlockMask.sparsity()`` is not (it goes negative when a length is not a multiple of 128).
    A pattern without a ``mask_mod`` skips nothing."""
    rows, cols = (math.ceil(n / 128) for n in (pattern.num_queries, pattern.num_keys))
    block_mask = block_mask_for(pattern, torch.device(device))
    if block_mask is None:
        return 0, rows * cols
    full = block_mask.full_kv_num_blocks
    computed = int(block_mask.kv_num_blocks.sum()) + (0 if full is None else int(full.sum()))
    total = block_mask.kv_num_blocks.numel() * math.ceil(pattern.num_keys / block_mask.BLOCK_SIZE[1])
    return total - computed, total


_BLOCK_MASKS: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
_BLOCK_MASK_CAPACITY = 64


def clear_block_mask_cache() -> None:
    """Forget every cached block mask (they are rebuilt on the next call)."""
    _BLOCK_MASKS.clear()


def _create_block_mask(mask_mod: MaskMod, batch: int | None, heads: int | None, n: int, m: int,
                       device: torch.device) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mask_mod, batch, heads, n, m, device=device)


def block_mask_for(pattern: AttentionPattern, device: torch.device) -> Any:
    """The ``BlockMask`` of ``pattern.mask_mod`` on ``device`` (None without a mask_mod).

    Cached per ``(cache_key, sizes, device)`` (an LRU of 64) when the pattern has a ``cache_key``, built
    outside inference mode (a later call may record gradients); built afresh without one. While torch
    captures a graph a mask cached by an earlier eager call is used as it is, else the build becomes part
    of the graph (nothing is stored).
    """
    if _RECORDERS:
        _RECORDERS[-1].append(pattern)
    if pattern.mask_mod is None:
        return None
    args = (pattern.mask_batch, pattern.mask_heads, pattern.num_queries, pattern.num_keys, device)
    if pattern.cache_key is None:
        return _create_block_mask(pattern.mask_mod, *args)
    key = (pattern.cache_key, *args)
    if capturing():  # a mask an eager call cached enters the graph as it is (its geometry fixes it); no LRU edits
        cached = _BLOCK_MASKS.get(key)
        return cached if cached is not None else _create_block_mask(pattern.mask_mod, *args)
    cached = _BLOCK_MASKS.get(key)
    if cached is None:
        # built outside inference mode: a mask first made by an inference_mode call is reused by later calls
        # that record gradients, and autograd may not save inference tensors
        with torch.inference_mode(False):
            cached = _BLOCK_MASKS[key] = _create_block_mask(pattern.mask_mod, *args)
        if len(_BLOCK_MASKS) > _BLOCK_MASK_CAPACITY:
            _BLOCK_MASKS.popitem(last=False)
    else:
        _BLOCK_MASKS.move_to_end(key)
    return cached


# ----------------------------------------------------------------------------- the kernel
_COMPILED: dict[str, Callable[..., Tensor]] = {}


def _kernel(device: torch.device) -> Callable[..., Tensor]:
    """torch's flex_attention, compiled on CUDA (its fused kernel) and eager elsewhere; inside a graph
    capture the plain function (the enclosing compile fuses it)."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    if capturing() or device.type != "cuda":
        return flex
    if "cuda" not in _COMPILED:
        _raise_recompile_limit(FLEX_RECOMPILE_LIMIT)
        _COMPILED["cuda"] = torch.compile(flex, dynamic=False)
    return _COMPILED["cuda"]


# Each pattern (a mechanism's mods, their captured sizes and tensors) and each shape is one compiled variant
# of the flex kernel, all counted against ONE code object: a Swin-T alone has 8 (4 stages, shifted or not),
# DiNAT more. Past dynamo's default limit (8) the kernel would silently run unfused (its eager math: slow and
# memory-hungry on a GPU), so the first flex call on CUDA raises the limit to at least this.
FLEX_RECOMPILE_LIMIT = 64


def _raise_recompile_limit(n: int) -> None:
    """Raise torch._dynamo's per-code-object recompile limit to at least ``n`` (never lowers it); the name is
    ``recompile_limit`` on torch >= 2.6, ``cache_size_limit`` before."""
    import torch._dynamo  # noqa: F401 - imported by torch.compile anyway; here before its first call

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    if getattr(config, name) < n:
        setattr(config, name, n)


_CPU_BACKWARD = ("attention backend 'flex' has no backward on CPU (torch's FlexAttention runs forward only there): "
                 "train on CPU with backend 'auto', 'sdpa' or 'explicit'")


def _cpu_backward_refused(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """True for a CPU call that records gradients (torch's FlexAttention has no CPU backward)."""
    return q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                                   or v.requires_grad)


class _ForwardOnlyOnCPU(torch.autograd.Function):
    """A CPU flex call in grad mode: the forward runs (its inputs detached: ``forward`` runs without grad), so
    a model used for inference without ``torch.no_grad()`` works as on any other backend; the backward raises
    a ``NotImplementedError`` naming the backend, at ``loss.backward()`` rather than at the forward."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, score_mod: ScoreMod | None, block_mask: Any,
                scale: float | None) -> Tensor:
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> Any:
        raise NotImplementedError(_CPU_BACKWARD)


def flex_attention(q: Tensor, k: Tensor, v: Tensor, *, score_mod: ScoreMod | None = None,
                   block_mask: Any = None, scale: float | None = None) -> Tensor:
    """FlexAttention on ``q [B, nh, N, hd]``, ``k [B, nh, M, hd]``, ``v [B, nh, M, hdv]`` -> ``[B, nh, N, hdv]``.

    Compiled on CUDA; on CPU eager, forward only: a CPU call that records gradients runs its forward, and
    its backward raises a ``NotImplementedError`` naming the backend (torch's FlexAttention has no CPU
    backward; under torch.compile the capture raises it, since the compiled graph would need that backward).
    """
    if _cpu_backward_refused(q, k, v):
        if capturing():
            raise NotImplementedError(_CPU_BACKWARD)
        return _ForwardOnlyOnCPU.apply(q, k, v, score_mod, block_mask, scale)
    if not torch.is_grad_enabled():  # torch's front end refuses inputs that require grad on CPU even here
        q, k, v = q.detach(), k.detach(), v.detach()
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    kernel = _kernel(q.device)
    if capturing() and q.device.type == "cpu":
        # inductor's CPU FlexAttention template reads q / k / v sizes off their storage and fails on a view
        # of the 2-D projection output, and it reads a view at an offset of its buffer (v sliced off a packed
        # q|k|v gather) from the buffer's start, a wrong output (torch 2.11 - 2.13): hand it buffers of their own
        q, k, v = (flex_buffer(t).contiguous() for t in (q, k, v))  # one copy (a no-op contiguous) under compile
    if capturing() or q.device.type == "cuda":
        return kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    with warnings.catch_warnings():  # eager off CUDA is the documented choice: no "use torch.compile" advice
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        return kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


@torch.library.custom_op("vit_attention::flex_buffer", mutates_args=())
def _flex_buffer(x: Tensor) -> Tensor:
    """A contiguous copy of ``x``, opaque to inductor: its result is a realized buffer (:func:`flex_buffer`)."""
    return x.clone(memory_format=torch.contiguous_format)


@_flex_buffer.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@overload
def flex_buffer(t: Tensor) -> Tensor: ...
@overload
def flex_buffer(t: None) -> None: ...


def flex_buffer(t: Tensor | None) -> Tensor | None:
    """``t`` (any shape; None passes through) as a tensor a mod may capture or the kernel may read: ``t``
    itself, except while torch.compile captures a graph on CPU, where it is a contiguous copy (same shape,
    its own buffer).

    Inductor's CPU FlexAttention template (torch 2.11 - 2.13) reads the tensors a ``score_mod`` /
    ``mask_mod`` captures before it realizes them: a tensor the graph computes with pointwise ops (a
    gathered bias table, a padded term, an index table built in the graph) fails to lower ("No choices",
    "buffers ... should be in input_buffers"). Handed through an opaque copy (a custom op) it reaches the
    template as a realized buffer. :func:`flex_attention` passes q / k / v through it too there. Not applied
    under ``torch.export`` (an exported program keeps only torch's ops) nor on CUDA, whose Triton template
    is another lowering.
    """
    if (t is not None and t.device.type == "cpu" and torch.compiler.is_compiling()
            and not torch.compiler.is_exporting()):
        return _flex_buffer(t)
    return t


def dense_mods(bias: Tensor | None, mask: Tensor | None, is_causal: bool,
               logits_shape: tuple[int, int, int, int]) -> tuple[ScoreMod | None, MaskMod | None]:
    """A dense ``bias`` / bool ``mask`` (broadcastable to the 4-D ``logits_shape``) and the causal flag as flex
    mods: a score_mod reading the bias, a mask_mod reading the mask (and ``kv_idx <= q_idx``)."""
    B, H, N, M = logits_shape
    score_mod = mask_mod = None
    if bias is not None:
        full_bias = flex_buffer(bias).reshape((1,) * (4 - bias.dim()) + tuple(bias.shape)).expand(B, H, N, M)

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return score + full_bias[b, h, q, kv]

    if mask is not None or is_causal:
        full_mask = None if mask is None else flex_buffer(mask).reshape(
            (1,) * (4 - mask.dim()) + tuple(mask.shape)).expand(B, H, N, M)

        def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            keep = (kv <= q) if is_causal else None
            if full_mask is not None:
                seen = full_mask[b, h, q, kv]
                keep = seen if keep is None else keep & seen
            return keep

    return score_mod, mask_mod
