"""The mechanism contract (:class:`AttentionModule` called with ``x`` and one :class:`AttentionCall`), the argument
checks shared by the mechanisms, and their parameter-keyed cache (:class:`ParamCache`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.attention import scaled_dot_product_attention
from ..functional.batch_norm import fold_batch_norm
from ..functional.flex import PatternDoc
from ..functional.layout import AttentionLayout, token_layout
from ..functional.linear import apply_linear
from ..functional.observers import attention_context, attention_observed
from ..functional.runtime import ATTENTION_BACKEND, FAST_PATHS, FUSED_ATTENTION, capturing
from ..functional.tome import TokenMergeState

CALL_OPTIONS: tuple[str, ...] = ("context", "mask", "rope_coords", "rope_valid", "tome", "residual")
"""The optional fields of :class:`AttentionCall`: a mechanism reads those its class lists in ``accepts``."""


@dataclass(frozen=True, eq=False)
class AttentionCall:
    """What a call of a mechanism carries besides ``x``, as one immutable value: ``attn(x, call)``.

    Every field has a neutral default, so ``AttentionCall()`` (a mechanism's default) is a plain call on
    ``x`` alone. ``feat_size`` and ``num_prefix_tokens`` describe ``x`` and every mechanism takes them; the
    optional fields (:data:`CALL_OPTIONS`) ask for something, and a mechanism reads only those its class
    declares in :attr:`AttentionModule.accepts`: the layout adapter
    (:func:`~vit_attention.layers.layout_adapter.apply_attention`) refuses any other one that is given,
    naming it. The blocks build one per call; the adapter derives the mechanism's own with
    ``dataclasses.replace`` where it converts the layout. One value rather than keywords: a new kind of
    information is one new field here, not a new keyword in every mechanism, the blocks and the adapter.
    """

    feat_size: tuple[int, int] | None = None
    """The grid ``(H, W)`` of the ``H·W`` tokens after the prefix tokens (token input), or a spatial mechanism's
    own map size; None: not known (a mechanism that needs the grid assumes a square map)."""
    num_prefix_tokens: int = 0
    """``P`` class / distillation / register tokens in front of the grid of ``x [B, P + H·W, C]``; a spatial
    mechanism always gets 0 (the adapter hands it the grid alone)."""
    context: Tensor | None = None
    """Keys and values ``[B, M, C]`` from another sequence (cross-attention; CaiT's class attention:
    ``x = u[:, :1]``, ``context = u``); None: from ``x``."""
    mask: Tensor | None = None
    """bool, broadcastable to ``[B, nh, N, M]``, True = may attend (NaFlex padding: a key mask
    ``[B, 1, 1, N]``); None: unmasked."""
    rope_coords: Tensor | None = None
    """int ``[B, L, 2]``: the ``(y, x)`` grid index of each of the ``L = N - P`` grid tokens, each sample of a
    packed NaFlex batch on its own grid (for a mechanism with a rotary embedding); None: the grid is
    ``feat_size``."""
    rope_valid: Tensor | None = None
    """bool ``[B, L]`` beside ``rope_coords``: True = a real patch (padding rows stay unrotated)."""
    tome: TokenMergeState | None = None
    """Token merging's state: ``log(size)`` joins the logits (proportional attention) and the mechanism leaves
    its merge metric (the keys averaged over heads) in it."""
    residual: Tensor | None = None
    """A tensor of ``x``'s shape: the result is ``residual + attn(x)``, the add fused into the mechanism's output
    projection (the blocks' speed path at inference)."""

    def given(self) -> tuple[str, ...]:
        """The optional fields (:data:`CALL_OPTIONS`) that are set, in that order."""
        return tuple(name for name in CALL_OPTIONS if getattr(self, name) is not None)


def check_heads(dim: int, num_heads: int, what: str = "dim") -> int:
    """Validate ``dim % num_heads == 0`` and return the head dim ``hd``."""
    if not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    if not isinstance(dim, int) or dim <= 0:
        raise ValueError(f"{what} must be a positive int, got {dim!r}")
    if dim % num_heads:
        raise ValueError(f"{what}={dim} must be divisible by num_heads={num_heads} (got remainder {dim % num_heads})")
    return dim // num_heads


def check_prob(p: float, name: str) -> float:
    """Validate a dropout probability in [0, 1)."""
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p!r}")
    return float(p)


def _mechanism_name(module: nn.Module) -> str:
    """``Class ('registered name')`` of a mechanism, the class name of any other module (error messages)."""
    name = getattr(module, "attention_name", "")
    return f"{type(module).__name__} ({name!r})" if name else type(module).__name__


def refuse_unaccepted(module: nn.Module, call: AttentionCall, *, residual_added: bool = False) -> None:
    """The one check of a call's optional fields: each one given must be in ``module``'s ``accepts``.

    A module that is no :class:`AttentionModule` accepts none (it is called with ``x`` alone). A field it
    does not read raises ``ValueError`` naming the field and the mechanism, so nothing asked for is
    dropped silently. ``residual_added``: the caller adds ``call.residual`` itself where the module does not
    (the layout adapter), so the residual is not checked.
    """
    accepts = module.accepts if isinstance(module, AttentionModule) else frozenset()
    for field in CALL_OPTIONS:
        if field in accepts or getattr(call, field) is None or (residual_added and field == "residual"):
            continue
        if not isinstance(module, AttentionModule):
            raise ValueError(f"{type(module).__name__} is not a registered mechanism: it is called with x alone and "
                             f"takes no {field}")
        reads = ", ".join(sorted(accepts)) or "none"
        raise ValueError(f"{_mechanism_name(module)} takes no {field} (the optional AttentionCall fields it reads: "
                         f"{reads})")


def check_tokens_call(module: AttentionModule, x: Any, call: AttentionCall) -> tuple[int, int, int]:
    """The contract checks of a token mechanism's call on ``x [B, N, C]``: returns ``(B, N, C)``.

    ``x`` must be tokens of the module's width, every optional field given must be one the mechanism
    accepts (:func:`refuse_unaccepted`) and a ``context`` must be ``[B, M, C]`` with ``x``'s ``B`` and ``C``.
    """
    if x.dim() != 3 or x.shape[-1] != module.dim:
        raise ValueError(f"expected tokens [B, N, {module.dim}], got {tuple(x.shape)}")
    refuse_unaccepted(module, call)
    context = call.context
    if context is not None and (context.dim() != 3 or context.shape[-1] != module.dim
                                or context.shape[0] != x.shape[0]):
        raise ValueError(f"context must be [B, M, {module.dim}] with x's B = {x.shape[0]}, got {tuple(context.shape)}")
    B, N, C = x.shape
    return B, N, C


def check_spatial_call(module: AttentionModule, x: Any, call: AttentionCall) -> tuple[int, int, int, int]:
    """The contract checks of a spatial mechanism's call; returns ``(B, H, W, C)`` of ``x [B, H, W, C]``.

    ``call.feat_size`` must be the map's own ``(H, W)`` when given; a spatial mechanism never sees prefix
    tokens (``num_prefix_tokens`` must be 0), takes only the optional fields it accepts
    (:func:`refuse_unaccepted`), and a ``residual`` must have ``x``'s shape.
    """
    name = type(module).__name__
    if x.dim() != 4 or x.shape[-1] != module.dim:
        hint = ""
        if x.dim() == 4 and x.shape[1] == module.dim:  # a CNN's [B, C, H, W] feature map
            hint = ("; this looks like a [B, C, H, W] feature map: pass x.permute(0, 2, 3, 1), or wrap the "
                    "mechanism with vit_attention.plug(...), which takes and returns [B, C, H, W]")
        elif x.dim() == 3:
            hint = (f"; for tokens [B, N, C] of a known grid pass x.reshape(B, H, W, {module.dim})")
        raise ValueError(f"{name} expects a channels-last map [B, H, W, {module.dim}], got shape "
                         f"{tuple(x.shape)}{hint}")
    B, H, W, C = x.shape
    feat_size = call.feat_size
    if feat_size is not None and tuple(feat_size) != (H, W):
        raise ValueError(f"feat_size={tuple(feat_size)} does not match the map's {H}x{W}")
    if call.num_prefix_tokens:
        raise ValueError(f"num_prefix_tokens={call.num_prefix_tokens}: a spatial mechanism never sees prefix tokens "
                         "(apply it through vit_attention.layers.apply_attention)")
    refuse_unaccepted(module, call)
    residual = call.residual
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have the input's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    return B, H, W, C


def prefix_attention(q: Tensor, k: Tensor, v: Tensor, num_heads: int, *, scale: float | Tensor,
                     dropout_p: float = 0.0, fused: bool | None = None, backend: str | None = None) -> Tensor:
    """Global attention of the prefix tokens of a spatial mechanism: ``[B, P, nh·hd]`` queries over every token.

    ``q [B, P, nh·hd]`` (the class / distillation / register tokens), ``k [B, N, nh·hd]`` and
    ``v [B, N, nh·hdv]`` of all ``N = P + H·W`` tokens -> ``[B, P, nh·hdv]`` (heads merged, before the output
    projection). ``scale``: a float, or a per-head temperature ``[nh, 1, 1]`` (cosine attention: ``q`` and
    ``k`` come normalized). Plain softmax attention through the library's core (no position term: prefix
    tokens have no grid position); ``fused`` / ``backend``: the mechanism's captured switches (``"flex"``
    runs torch's kernel: ``P`` dense query rows have no block sparsity to use).
    """
    B, P, _ = q.shape
    N = k.shape[1]
    q = q.reshape(B, P, num_heads, -1).transpose(1, 2)  # [B, nh, P, hd]
    k = k.reshape(B, N, num_heads, -1).transpose(1, 2)  # [B, nh, N, hd]
    v = v.reshape(B, N, num_heads, -1).transpose(1, 2)  # [B, nh, N, hdv]
    if isinstance(scale, Tensor):
        q, scale = q * scale.to(q.dtype), 1.0
    out = scaled_dot_product_attention(q, k, v, scale=scale, dropout_p=dropout_p, fused=fused,
                                       backend="sdpa" if backend == "flex" else backend)  # [B, nh, P, hdv]
    return out.transpose(1, 2).reshape(B, P, -1)


def packed_prefix_attention(module: Any, prefix: Tensor, tokens: Tensor, qkv: Tensor, *,
                            scale: float | Tensor) -> Tensor:
    """:func:`prefix_attention` of a mechanism with a packed ``[q | k | v]`` projection and ``proj``.

    ``qkv [B, N, 3C]``: the projection of ``tokens [B, N, C]`` whose first ``P = prefix.shape[1]`` rows
    are the prefix tokens; returns the prefix tokens' update ``[B, P, C]`` after ``proj`` (and its dropout).
    """
    P, C = prefix.shape[1], prefix.shape[-1]
    q, k, v = qkv[:, :P, :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    if isinstance(scale, Tensor):  # cosine attention: normalized queries and keys
        q, k = F.normalize(q.reshape(*q.shape[:2], module.num_heads, -1), dim=-1).flatten(2), \
            F.normalize(k.reshape(*k.shape[:2], module.num_heads, -1), dim=-1).flatten(2)
    out = prefix_attention(q, k, v, module.num_heads, scale=scale, **module.core_options())  # [B, P, C]
    return module.proj_drop(module.proj(out))


def grid_of(num_grid_tokens: int, feat_size: Any = None) -> tuple[int, int]:
    """``feat_size`` as ``(H, W)``, or without it the square ``s x s`` map the grid tokens fill; a mismatch or a
    count that is not a square raises naming ``feat_size``."""
    if feat_size is not None:
        H, W = int(feat_size[0]), int(feat_size[1])
        if H < 1 or W < 1 or H * W != num_grid_tokens:
            raise ValueError(f"feat_size {tuple(feat_size)} holds {H * W} tokens, but x has {num_grid_tokens} grid "
                             "tokens (after the prefix tokens)")
        return H, W
    s = math.isqrt(max(num_grid_tokens, 0))
    if num_grid_tokens <= 0 or s * s != num_grid_tokens:
        raise ValueError(f"{num_grid_tokens} grid tokens are not a square map: pass feat_size=(H, W)")
    return s, s


def check_map_tokens_call(module: AttentionModule, x: Any, call: AttentionCall) -> tuple[int, int, int, int]:
    """The contract checks of a token mechanism that works on the map of ``x [B, P + H·W, C]``: ``(B, N, C, P)``.

    ``x`` must be tokens of the module's width, every optional field given must be one it accepts
    (:func:`refuse_unaccepted`; keys come from ``x``'s own map, so never a ``context``) and
    ``0 <= num_prefix_tokens < N``; each refusal names its argument. The grid itself is
    :func:`grid_of` ``(N - P, call.feat_size)`` where the mechanism needs it.
    """
    if x.dim() != 3 or x.shape[-1] != module.dim:
        raise ValueError(f"expected tokens [B, N, {module.dim}], got {tuple(x.shape)}")
    refuse_unaccepted(module, call)
    B, N, C = x.shape
    P = int(call.num_prefix_tokens)
    if not 0 <= P < N:
        raise ValueError(f"num_prefix_tokens={call.num_prefix_tokens!r} must be in 0..{N - 1} for {N} tokens")
    return B, N, C, P


def observed_layout(x: Tensor, call: AttentionCall, *, num_context: int | None = None) -> AttentionLayout | None:
    """Where the rows of a global token mechanism's attention on ``x [B, N, C]`` sit on the grid, for observers.

    :func:`~vit_attention.functional.layout.token_layout` of ``N`` tokens with the call's ``feat_size`` and
    ``num_prefix_tokens`` (``num_context``: keys from a context of that many tokens, not from ``x``); None
    while nothing observes attention (no cost on the plain path) and once token merging has merged rows
    (they no longer sit one per grid cell: :func:`merged_frame` tells the observers where they came from).
    """
    tome = call.tome
    if not attention_observed() or (tome is not None and tome.token_map is not None):
        return None
    return token_layout(x.shape[1], call.feat_size, call.num_prefix_tokens, num_context=num_context)


def merged_frame(call: AttentionCall) -> AbstractContextManager[Any]:
    """The context a token mechanism computes its attention in: with merged tokens (``call.tome``) and an observer,
    :func:`~vit_attention.functional.observers.attention_context` with the merge's token map and sizes (observers
    place merged tokens' weights on the original ones, :func:`~vit_attention.functional.tome.expand_weights`);
    otherwise a context that does nothing."""
    tome = call.tome
    if tome is not None and tome.token_map is not None and attention_observed():
        return attention_context(**tome.observer_info())
    return nullcontext()


class ParamCache:
    """One tensor derived from parameters (a position bias), reused while the parameters hold the same values.

    :meth:`lookup` hits when the ``key`` (sizes, inference mode, ...) is the one stored and every
    parameter has the stored dtype, device, shape and values (``torch.equal`` with a snapshot
    copied when the value was stored). So whatever changes a parameter is seen, through public
    API only: an optimizer step, ``load_state_dict``, an in-place edit under ``torch.no_grad()``
    (an EMA update, ``p.copy_(...)``), ``.to(dtype)`` / ``.to(device)``, other tensors swapped in
    (``torch.func.functional_call``). Nothing is invalidated by hand. The price is one
    ``torch.equal`` per parameter per lookup: microseconds for a relative-position table on the
    CPU (the cached value saves far more); on an accelerator nothing is cached (:func:`uncacheable`).

    The caller decides when not to cache at all (autograd recording through the parameters, graph
    capture, the meta device, where no values exist). The snapshot holds a copy of the parameters
    (a few KB for a position-bias table or SwinV2's CPB MLP).
    """

    __slots__ = ("_snapshot", "_key", "value")

    def __init__(self) -> None:
        self._snapshot: tuple[Any, ...] | None = None
        self._key: Any = None
        self.value: Any = None

    def clear(self) -> None:
        """Forget the stored value (and the snapshot)."""
        self._snapshot, self._key, self.value = None, None, None

    def lookup(self, params: Sequence[Any], key: Any) -> bool:
        """True when :attr:`value` was computed from parameters equal to ``params`` under ``key``."""
        snapshot = self._snapshot
        if snapshot is None or key != self._key or len(snapshot) != len(params):
            return False
        for p, s in zip(params, snapshot):
            if p.dtype != s.dtype or p.device != s.device or p.shape != s.shape or not torch.equal(p, s):
                return False
        return True

    def store(self, params: Sequence[Any], key: Any, value: Any) -> Any:
        """Keep ``value``, computed from ``params`` under ``key``; returns it."""
        self._snapshot = tuple(p.detach().clone() for p in params)
        self._key, self.value = key, value
        return value


def uncacheable(params: Sequence[torch.Tensor]) -> bool:
    """No cache for a value derived from ``params``: autograd records through them, torch captures a
    graph (a cached tensor would become a constant), they live on the meta device (no values), or on
    an accelerator: comparing values there would stop the host until the device catches up (a
    synchronisation per block per forward), while recomputing a position bias is a few small
    kernels queued asynchronously. The cache is a CPU-inference saving (off with the fast paths' switch)."""
    if capturing() or not FAST_PATHS.get():
        return True
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        return True
    return any(p.device.type != "cpu" for p in params)


class VersionCache:
    """One value derived from some tensors (a layer's BatchNorm-folded weights), kept while each tensor is the same
    object with the same storage and version counter.

    Every in-place change through the tensor bumps its version counter: an optimizer step, ``load_state_dict``'s
    copies, ``p.copy_(...)`` / ``p.mul_(...)`` under ``torch.no_grad()``; ``.to(...)`` swaps the storage and
    ``torch.func.functional_call`` the objects. The check is a few attribute reads per tensor, where
    :class:`ParamCache`'s value comparison would cost as much as recomputing a folded weight matrix. Not seen: an
    in-place edit of ``p.data`` (torch gives ``.data`` its own version counter): edit parameters under
    ``torch.no_grad()`` instead. Nothing is cached where :func:`uncacheable` says so, nor across entering or
    leaving ``torch.inference_mode`` (an inference tensor must not reach autograd later); a copied or pickled
    module starts empty.
    """

    __slots__ = ("_key", "value")

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self.value: Any = None

    def get(self, tensors: Sequence[Tensor], compute: Any) -> Any:
        """``compute()`` (no arguments), or the value it gave for ``tensors`` as they are now."""
        if uncacheable(tensors):
            self._key = self.value = None
            return compute()
        inference = torch.is_inference_mode_enabled()
        old = self._key
        try:
            if old is not None and len(old) == len(tensors) + 1 and old[0] == inference:
                for t, (s, version, ptr) in zip(tensors, old[1:]):  # a plain loop: this runs for every layer
                    if t is not s or t._version != version or t.data_ptr() != ptr:
                        break
                else:
                    return self.value
            key = (inference, *((t, t._version, t.data_ptr()) for t in tensors))
        except RuntimeError:  # inference-mode tensors have no version counter
            return compute()
        self._key, self.value = None, None
        self.value = compute()
        self._key = key
        return self.value

    def fold(self, layer: nn.Module, bn: nn.Module) -> tuple[Tensor, Tensor]:
        """``(weight, bias)`` of ``layer`` (a convolution or linear layer) with the eval-mode BatchNorm ``bn`` folded
        in (:func:`~vit_attention.functional.batch_norm.fold_batch_norm`), kept while the tensors of both are
        unchanged."""
        tensors = [t for t in (layer.weight, layer.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var)
                   if t is not None]
        return self.get(tensors, lambda: fold_batch_norm(layer, bn))  # type: ignore[arg-type]

    def clear(self) -> None:
        """Forget the stored value."""
        self._key = self.value = None

    def __getstate__(self) -> tuple[None, None]:  # copied / pickled modules start empty
        return None, None

    def __setstate__(self, state: tuple[Any, Any]) -> None:
        self._key, self.value = None, None


class AttentionModule(nn.Module):
    """The base of every registered attention mechanism: each member a mechanism has or may have, with its default.

    A mechanism maps tokens ``[B, N, C] -> [B, N, C]`` (``layout = "tokens"``) or a channels-last map
    ``[B, H, W, C] -> [B, H, W, C]`` (``"spatial"``) in ``forward(x, call: AttentionCall = AttentionCall())``,
    reading from the :class:`AttentionCall` the grid, the prefix count and the optional fields its
    :attr:`accepts` lists. The tools that treat every mechanism alike (the layout adapter, FLOP counting, weight
    transfer, token merging, window resizing) read the members below; a mechanism overrides those it
    offers, and :meth:`provides` tells an override from the default. :func:`register_attention` refuses a
    class that does not subclass this one, naming what it lacks.
    """

    attention_name: ClassVar[str] = ""
    """The registered name (set by :func:`register_attention`); ``""`` on an unregistered subclass."""
    layout: ClassVar[str] = "tokens"
    """``"tokens"`` (``[B, N, C]``) or ``"spatial"`` (``[B, H, W, C]``); set by :func:`register_attention`."""
    dim: int
    """The width ``C`` of the input and output."""
    num_heads: int
    """The number of attention heads."""
    fused_attention: bool
    """Captured when built: the fused kernel may run (``runtime.switched`` flips it)."""
    attention_backend: str
    """Captured when built: ``"auto"`` | ``"sdpa"`` | ``"explicit"`` | ``"flex"``."""
    head_dim: int
    """The width ``hd`` of one head (``dim // num_heads`` for most mechanisms)."""
    attn_drop: float
    """Dropout probability on the attention weights (handed to the core)."""
    proj_drop: nn.Module
    """Dropout after the output projection (:meth:`project_out`)."""
    transfer_slots: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    """Where the q / k / v / o projections sit (:mod:`~vit_attention.attention.transfer`); empty = none."""
    offset_bias_params: ClassVar[tuple[str, ...]] = ()
    """The parameters :meth:`set_offset_bias` writes (weight transfer leaves them out of its name match)."""
    flex_pattern: ClassVar[PatternDoc | None] = None
    """How its flex pattern reads, in words: its row of docs/flex.md's table of patterns
    (:class:`~vit_attention.functional.flex.PatternDoc`); None = no pattern of its own."""
    accepts: ClassVar[frozenset[str]] = frozenset()
    """The optional :class:`AttentionCall` fields (:data:`CALL_OPTIONS`) the forward reads: ``"context"`` (keys /
    values from another sequence), ``"mask"``, ``"rope_coords"`` / ``"rope_valid"`` (per-sample rotary grids),
    ``"tome"`` (token merging), ``"residual"`` (returns ``residual + attn(x)``, the add fused into the output
    projection). The adapter refuses any other one that is given; ``feat_size`` and ``num_prefix_tokens``
    every mechanism takes."""
    merging_note: ClassVar[str] = ""
    """Why token merging has no meaning for the mechanism (one without ``"tome"`` in :attr:`accepts`): a model's
    ``set_token_merging`` names it when it refuses; ``""``: the refusal names the mechanism only."""

    def init_attention(self, dim: int, num_heads: int, *, attn_drop: float = 0.0, proj_drop: float = 0.0) -> int:
        """The shared constructor preamble -> ``head_dim``: checks ``dim`` / ``num_heads`` (divisible) and the
        dropouts, captures the fused / backend switches, sets ``dim``, ``num_heads``, ``head_dim``, ``attn_drop``
        (a probability for the core) and ``proj_drop`` (an ``nn.Dropout``). Creates no parameter and draws no
        random number, so parameter creation order and initial values are those of the code that follows."""
        self.fused_attention = FUSED_ATTENTION.default  # captured when built (runtime.switched flips it)
        self.attention_backend = ATTENTION_BACKEND.default  # "auto" | "sdpa" | "explicit" | "flex" (captured)
        self.head_dim = check_heads(dim, num_heads)
        self.dim, self.num_heads = dim, num_heads
        self.attn_drop = check_prob(attn_drop, "attn_drop")
        self.proj_drop = nn.Dropout(check_prob(proj_drop, "proj_drop"))
        return self.head_dim

    def project_out(self, out: Tensor, residual: Tensor | None = None, *, proj: nn.Module | None = None) -> Tensor:
        """The shared output tail: ``residual + proj_drop(proj(out))``, ``[..., C] -> [..., C]`` (``proj``: default
        ``self.proj``; ``residual``: None = no add). Where the dropout does nothing (inference, or ``p = 0``) the
        residual add is fused into the projection (one kernel, :func:`~vit_attention.functional.linear.linear`)."""
        proj = self.proj if proj is None else proj
        if not (self.training and self.proj_drop.p > 0):  # proj_drop is the identity
            return apply_linear(proj, out, residual=residual)
        out = self.proj_drop(apply_linear(proj, out))
        return out if residual is None else residual + out

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **options: Any) -> Any:
        """The one attention function as this module runs it: ``q [*b, nh, N, hd]``, ``k [*b, nh, M, hd]``,
        ``v [*b, nh, M, hdv]`` -> ``[*b, nh, N, hdv]`` (with ``return_weights=True``: that and the weights
        ``[*b, nh, N, M]``).

        :func:`~vit_attention.functional.attention.scaled_dot_product_attention` with the module's attention
        dropout while training (none in eval) and its captured ``fused`` / ``backend`` switches; ``options``: the
        core's other keywords (``scale``, ``bias``, ``mask``, ``is_causal``, ``layout``, ``logits_fn``,
        ``weights_fn``, ``return_weights``, ``pattern``, ``observed``)."""
        return scaled_dot_product_attention(q, k, v, **self.core_options(), **options)

    def core_options(self) -> dict[str, Any]:
        """The keywords this module gives the attention core and the functional helpers built on it (neighborhood,
        halo, prefix attention): ``dropout_p`` (its attention dropout while training, 0 in eval) and the captured
        ``fused`` / ``backend`` switches."""
        return {"dropout_p": self.attn_drop if self.training else 0.0, "fused": self.fused_attention,
                "backend": self.attention_backend}

    @classmethod
    def provides(cls, member: str) -> bool:
        """Whether this class overrides the base's default of ``member`` (e.g. ``"set_window_size"``)."""
        if not hasattr(AttentionModule, member):
            raise AttributeError(f"member must be one of AttentionModule's, got {member!r}")
        return getattr(cls, member) is not getattr(AttentionModule, member)

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int | None:
        """Multiply-adds of one forward on ``input_shape``; None = no closed form (count the operations inside)."""
        return None

    def transfer_init(self) -> list[str]:
        """Set what has no counterpart in another mechanism to add nothing -> notes; default: nothing to set."""
        return []

    def get_offset_bias(self) -> Tensor | None:
        """The learned offset bias as a grid ``[nh, 2a-1, 2b-1]`` (key minus query); None = the mechanism has none."""
        return None

    def set_offset_bias(self, grid: Tensor) -> bool:
        """Write an offset-bias grid ``[nh, 2a-1, 2b-1]`` -> whether it was written; default: no table, False."""
        return False

    def set_window_size(self, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0) -> None:
        """Change the attention window in place (a model's ``set_input_size``); default: no window, TypeError."""
        raise TypeError(f"{type(self).__name__} ({self.attention_name or 'unregistered'!r}) has no window to resize "
                        "(set_window_size)")

    def attend_prefix(self, prefix: Tensor, tokens: Tensor) -> Tensor:
        """Prefix tokens ``[B, P, C]`` attend globally to all ``tokens [B, P + H·W, C]`` -> ``[B, P, C]`` (spatial
        mechanisms); default: ValueError, the prefix tokens could not see the grid."""
        raise ValueError(f"{type(self).__name__} is a spatial mechanism without attend_prefix: prefix (class / "
                         "register) tokens could not see the image; build the model without prefix tokens "
                         "(class_token=False, global_pool='avg')")



class PackedQKVAttention(AttentionModule):
    """A mechanism with one packed projection ``qkv = Linear(C, 3C)`` (``[q | k | v]``), an output ``proj`` and a
    float logit ``scale``: what its prefix tokens do follows from those alone (:meth:`attend_prefix`)."""

    qkv: nn.Linear
    """The packed ``[q | k | v]`` projection ``Linear(C, 3C)``."""
    scale: float
    """The logit scale (``hd^-1/2`` unless given)."""

    def attend_prefix(self, prefix: Tensor, tokens: Tensor) -> Tensor:
        """Prefix tokens ``[B, P, C]`` attend globally to ``tokens [B, P + H·W, C]`` (all of them): ``[B, P, C]``.

        The adapter's rule for class / register tokens in front of the grid (the grid keeps the mechanism's
        pattern): the same q / k / v and output projections, no position term (:func:`packed_prefix_attention`).
        """
        return packed_prefix_attention(self, prefix, tokens, apply_linear(self.qkv, tokens), scale=self.scale)

def missing_members(cls: type, layout: str, prefix_tokens: str) -> list[str]:
    """What ``cls`` lacks to be registered as a mechanism of ``layout``: ``[]`` when nothing.

    It must subclass :class:`AttentionModule` and define ``forward``; a spatial mechanism whose prefix tokens
    attend globally (``prefix_tokens="global"``) must define ``attend_prefix``.
    """
    if not (isinstance(cls, type) and issubclass(cls, AttentionModule)):
        return ["the base class AttentionModule (vit_attention.attention.base)"]
    missing = [] if cls.forward is not nn.Module.forward else ["forward"]
    if layout == "spatial" and prefix_tokens == "global" and not cls.provides("attend_prefix"):
        missing.append("attend_prefix")
    return missing
