"""Registry of attention mechanisms: ``list_attention()``, ``create_attention(name, dim, num_heads)``.

Every mechanism registers its class with the layout it takes (``"tokens"`` = ``[B, N, C]`` or
``"spatial"`` = channels-last ``[B, H, W, C]``) and example keyword arguments that make it
valid on a small input, so tests, the CNN adapter and the study command can treat them alike.
"""

from __future__ import annotations

import difflib
import fnmatch
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from ..functional.runtime import BACKENDS, check_backend, set_switches
from .base import CALL_OPTIONS, AttentionModule, missing_members

__all__ = ["AttentionSpec", "register_attention", "list_attention", "create_attention", "get_attention_spec",
           "small_window_kwargs", "global_as_built", "covering_window_kwargs", "set_attention_backend"]

Layout = Literal["tokens", "spatial"]


PrefixTokens = Literal["attend", "global"]


def small_window_kwargs(grid: tuple[int, int]) -> dict[str, Any]:
    """``window_size`` half the smaller side of the grid (at least 1): several windows on any small grid."""
    return {"window_size": max(1, min(grid) // 2)}


def global_as_built(grid: tuple[int, int]) -> dict[str, Any]:
    """No keywords: a mechanism that attends globally as it is (``global_kwargs`` of mhsa, mha ...)."""
    return {}


def covering_window_kwargs(grid: tuple[int, int]) -> dict[str, Any]:
    """``window_size`` the larger side of the grid: one window covers the whole map (``global_kwargs``)."""
    return {"window_size": max(grid)}


@dataclass(frozen=True)
class AttentionSpec:
    """What the registry knows of one mechanism (everything else reads it here, not from tables by name).

    Fields:
        name, cls, layout: the registered name, the class, ``"tokens"`` (``[B, N, C]``) or
            ``"spatial"`` (channels-last ``[B, H, W, C]``).
        description, paper: one line, and a link.
        needs_feat_size: called on tokens it needs the grid ``feat_size=(H, W)`` (token mechanisms
            that use the map, and every spatial mechanism: the adapter builds the map from it).
        prefix_tokens: what class / distillation tokens do: ``"attend"`` (ordinary tokens of the
            sequence) or ``"global"`` (spatial mechanisms: the grid keeps the mechanism's pattern and
            the prefix tokens attend globally to every token, the mechanism's ``attend_prefix``).
        fused: the fused attention kernel applies (no weights needed inside the mechanism).
        dense_bias: it hands the core a dense ``[*, nh, N, M]`` logit bias that it builds itself (BEiT's
            relative-position table read at every (query, key) pair; MViTv2's decomposed positions, read from the
            queries, per sample), so its memory grows with ``N·M`` whatever the kernel: one bias per call.
        normalized_weights: the weights the core records are probability rows (non-negative, each
            query's row sums to 1); False where a ``weights_fn`` transforms them after the softmax
            (CaiT's talking heads mixes the heads: rows may be negative and need not sum to 1), or where
            rows keep weight on zero-padded keys past the border (outlook attention: a border query's map
            on the image sums to less than 1).
        formula, cost: Markdown formula and its cost in words (docs).
        example_kwargs, example_shape, example_heads: a small valid example,
            ``create_attention(name, example_shape[-1], example_heads, **example_kwargs)`` on an input
            of ``example_shape`` (tests, ``plug``, docs); :meth:`example` builds it.
        doc_example: ``(kwargs, input_shape)`` of a representative configuration for the docs
            (default: the example's keywords on ViT-B/16's ``[1, 197, 96]`` tokens or a
            ``[1, 14, 14, 96]`` map).
        grid_kwargs: keywords that fit the mechanism to a token grid ``(H, W)`` (``compare``), or None.
        global_kwargs: keywords under which it computes global attention over a token grid ``(H, W)`` once
            its own extra parameters are neutral (a window covering the map, no key reduction), so weights
            carried from global attention give the same outputs (tested); None: it cannot (a different
            softmax, blocks, channels, a causal mask).
        qkv_bias_split: the q / v biases are separate parameters ``q_bias`` / ``v_bias`` with no k
            bias (SwinV2), instead of one ``qkv.bias`` (checkpoint converters).
        init_kwargs: every keyword the constructor lists (read from its signature), e.g. whether
            ``qk_norm`` / ``proj_bias`` may be passed; init_accepts_any: it also takes ``**kwargs``.
        backends: the attention backends it runs on (:data:`~vit_attention.functional.flex.BACKENDS`);
            ``backend_note``: why one is missing (the error :func:`set_attention_backend` raises).
        weights_note: non-empty for a mechanism that forms no attention weights and never calls the attention
            core (ReLU linear attention): why. Recording attention maps refuses it with this reason, and the
            core's contract sweeps leave it out.
    """

    name: str
    cls: type[AttentionModule]
    layout: Layout
    description: str = ""
    example_kwargs: dict[str, Any] = field(default_factory=dict)
    paper: str = ""
    needs_feat_size: bool = False
    prefix_tokens: PrefixTokens = "attend"
    fused: bool = True
    dense_bias: bool = False
    normalized_weights: bool = True
    formula: str = ""
    cost: str = ""
    example_shape: tuple[int, ...] = ()
    example_heads: int = 4
    doc_example: tuple[dict[str, Any], tuple[int, ...]] | None = None
    grid_kwargs: Callable[[tuple[int, int]], dict[str, Any]] | None = None
    global_kwargs: Callable[[tuple[int, int]], dict[str, Any]] | None = None
    qkv_bias_split: bool = False
    init_kwargs: frozenset[str] = frozenset()
    init_accepts_any: bool = False
    backends: tuple[str, ...] = BACKENDS
    backend_note: str = ""
    weights_note: str = ""

    @property
    def supports_context(self) -> bool:
        """``forward(x, AttentionCall(context=...))`` takes keys / values from ``context`` (the class's ``accepts``)."""
        return "context" in self.cls.accepts

    def example(self) -> tuple[AttentionModule, tuple[int, ...]]:
        """The small valid example: ``(module, input_shape)``."""
        return self.cls(self.example_shape[-1], self.example_heads, **self.example_kwargs), self.example_shape


_ATTENTION: dict[str, AttentionSpec] = {}


def _init_kwargs(cls: type[AttentionModule]) -> tuple[frozenset[str], bool]:
    """Keyword names the constructor lists, and whether it also takes ``**kwargs`` (any name)."""
    params = inspect.signature(cls.__init__).parameters.values()
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    named = frozenset(p.name for p in params if p.kind in kinds and p.name != "self")
    return named, any(p.kind is p.VAR_KEYWORD for p in params)


def register_attention(
    name: str, *, layout: Layout, description: str = "", example_kwargs: dict[str, Any] | None = None,
    paper: str = "", needs_feat_size: bool | None = None, prefix_tokens: PrefixTokens | None = None,
    fused: bool = True, dense_bias: bool = False, normalized_weights: bool = True, formula: str = "", cost: str = "",
    example_shape: tuple[int, ...] | None = None, example_heads: int = 4,
    doc_example: tuple[dict[str, Any], tuple[int, ...]] | None = None,
    grid_kwargs: Callable[[tuple[int, int]], dict[str, Any]] | None = None, qkv_bias_split: bool = False,
    global_kwargs: Callable[[tuple[int, int]], dict[str, Any]] | None = None,
    backends: tuple[str, ...] = BACKENDS, backend_note: str = "", weights_note: str = "",
) -> Callable[[type[AttentionModule]], type[AttentionModule]]:
    """Class decorator adding a mechanism to the registry under ``name``; see :class:`AttentionSpec`.

    ``cls`` must subclass :class:`~vit_attention.attention.base.AttentionModule` and define ``forward`` (a
    spatial mechanism whose prefix tokens attend globally: ``attend_prefix`` too), or ``TypeError`` names
    what it lacks; its ``accepts`` must name :class:`~vit_attention.attention.base.AttentionCall` fields
    (:data:`~vit_attention.attention.base.CALL_OPTIONS`), or ``ValueError`` names the others.

    Defaults by layout: a spatial mechanism needs ``feat_size`` and its prefix tokens attend globally; a
    token mechanism does not and they attend. The small example defaults to ``[2, 11, 32]`` tokens or
    a ``[2, 7, 9, 32]`` map (non-square, not a window multiple).
    """
    if layout not in ("tokens", "spatial"):
        raise ValueError(f"layout must be 'tokens' or 'spatial', got {layout!r}")
    spatial = layout == "spatial"
    if prefix_tokens not in (None, "attend", "global"):
        raise ValueError(f"prefix_tokens must be 'attend' or 'global', got {prefix_tokens!r}")

    def deco(cls: type[AttentionModule]) -> type[AttentionModule]:
        missing = missing_members(cls, layout, prefix_tokens or ("global" if spatial else "attend"))
        if missing:
            raise TypeError(f"attention {name!r}: {getattr(cls, '__name__', cls)!r} lacks {', '.join(missing)} "
                            "(a mechanism subclasses vit_attention.attention.base.AttentionModule, which declares "
                            "every member with its default)")
        unknown = sorted(set(cls.accepts) - set(CALL_OPTIONS))
        if unknown:
            raise ValueError(f"attention {name!r}: {cls.__name__}.accepts names {', '.join(map(repr, unknown))}, "
                             f"no optional AttentionCall field (those are {', '.join(CALL_OPTIONS)})")
        if name in _ATTENTION and _ATTENTION[name].cls is not cls:
            raise ValueError(f"attention {name!r} is already registered to {_ATTENTION[name].cls.__name__}")
        named, accepts_any = _init_kwargs(cls)
        _ATTENTION[name] = AttentionSpec(
            name, cls, layout, description or (cls.__doc__ or "").split("\n")[0], dict(example_kwargs or {}), paper,
            needs_feat_size=spatial if needs_feat_size is None else needs_feat_size,
            prefix_tokens=prefix_tokens or ("global" if spatial else "attend"), fused=fused, dense_bias=dense_bias,
            normalized_weights=normalized_weights, formula=formula, cost=cost,
            example_shape=example_shape or ((2, 7, 9, 32) if spatial else (2, 11, 32)), example_heads=example_heads,
            doc_example=doc_example or (dict(example_kwargs or {}), (1, 14, 14, 96) if spatial else (1, 197, 96)),
            grid_kwargs=grid_kwargs, global_kwargs=global_kwargs, qkv_bias_split=qkv_bias_split,
            init_kwargs=named, init_accepts_any=accepts_any,
            backends=tuple(check_backend(b, f"{name}'s backends entry") for b in backends), backend_note=backend_note,
            weights_note=weights_note)
        cls.attention_name = name
        cls.layout = layout
        return cls

    return deco


def list_attention(pattern: str = "*") -> list[str]:
    """Registered mechanism names matching a glob ``pattern``, sorted."""
    return sorted(n for n in _ATTENTION if fnmatch.fnmatch(n, pattern))


def get_attention_spec(name: str) -> AttentionSpec:
    """The :class:`AttentionSpec` of ``name``; unknown names raise with close matches."""
    try:
        return _ATTENTION[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_ATTENTION), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"unknown attention mechanism {name!r}{hint} (`vit-attention attention` lists them)") from None


def set_attention_backend(module: nn.Module, backend: str) -> nn.Module:
    """Run every attention mechanism inside ``module`` (itself included) on ``backend``; returns ``module``.

    ``backend``: ``"auto"``, ``"sdpa"``, ``"explicit"`` or ``"flex"`` (:mod:`vit_attention.functional.flex`).
    Every mechanism is checked before anything changes: one that cannot run on ``backend`` (CaiT's
    talking heads on ``"flex"``) raises a ``ValueError`` naming it and why. Other modules that call the
    attention core (attention-pooling heads) follow too. Same as
    ``runtime.set_switches(module, attention_backend=backend)`` after that check.
    """
    check_backend(backend)
    for sub in module.modules():
        spec = _ATTENTION.get(sub.attention_name) if isinstance(sub, AttentionModule) else None
        if spec is not None and spec.cls is type(sub) and backend not in spec.backends:
            raise ValueError(f"attention backend {backend!r}: {spec.name} runs on {list(spec.backends)} only"
                             + (f" ({spec.backend_note})" if spec.backend_note else ""))
    return set_switches(module, attention_backend=backend)


def create_attention(name: str, dim: int, num_heads: int, *, backend: str | None = None,
                     **kwargs: Any) -> AttentionModule:
    """Build mechanism ``name`` for width ``dim`` with ``num_heads`` heads.

    Token mechanisms map ``[B, N, C] -> [B, N, C]``, spatial ones ``[B, H, W, C] -> [B, H, W, C]``.
    ``backend``: the attention backend it runs on (default: the process default, ``"auto"`` unless
    ``VIT_ATTENTION_BACKEND`` says otherwise; see :func:`set_attention_backend`).
    """
    spec = get_attention_spec(name)
    if backend is not None and backend not in spec.backends:  # before building: a clear error, nothing half made
        check_backend(backend, "backend")
        raise ValueError(f"backend={backend!r}: {name} runs on {list(spec.backends)} only"
                         + (f" ({spec.backend_note})" if spec.backend_note else ""))
    module = spec.cls(dim, num_heads, **kwargs)
    return module if backend is None else set_attention_backend(module, backend)
