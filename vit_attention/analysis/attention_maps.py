"""Attention maps: record every attention call, place the weights back in the image.

    >>> with record_attention(model) as rec:
    ...     model(images)
    >>> heat = rec.rollout()               # ViT / DeiT: class token -> patches, [B, H', W']
    >>> heat = rec.image_map(layer=-1)     # any mechanism, [B, H', W'] on that layer's token grid
    >>> where = rec.records[0].query_map((5, 7))   # where token (5, 7) looks, [B, H', W']

Recording goes through the single attention function of the core
(:func:`vit_attention.functional.register_attention_hook`), so it sees every mechanism the same
way. Each record keeps the weights and the :class:`~vit_attention.functional.layout.AttentionLayout`
the mechanism handed the core (where each query and key row sits on the grid: windows, shifts,
padding, prefix tokens, a coarser key grid); placing them in the image reads only that layout,
with no branch per mechanism. A call without a layout (or whose mechanism does not know the grid)
is taken as token rows, prefix tokens first, on ``grid`` (the model's patch grid by default).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.layout import AttentionLayout
from ..functional.observers import attention_context, register_attention_hook
from ..functional.tome import expand_weights

__all__ = ["AttentionRecord", "AttentionRecorder", "record_attention", "attention_rollout"]


@dataclass
class AttentionRecord:
    """One attention call.

    ``weights``: ``[B·G, nh, n, m]`` post-softmax, on CPU (``G`` groups of the layout: windows,
    neighbourhoods; 1 for global attention, then ``[B, nh, N, M]``). ``layout``: where each row
    sits on the grid (:class:`~vit_attention.functional.layout.AttentionLayout`). ``batch``: ``B``.
    """

    index: int
    module: str
    weights: Tensor
    layout: AttentionLayout
    batch: int
    info: dict[str, Any] = field(default_factory=dict)
    num_registers: int = 0  # register tokens among the prefix tokens (the last ones; Darcet et al. 2024)

    @property
    def grid(self) -> tuple[int, int] | None:
        """The query grid ``(H, W)`` (None when it could not be known)."""
        return self.layout.grid

    @property
    def num_prefix_tokens(self) -> int:
        """Class / distillation / global tokens among the queries."""
        return self.layout.num_prefix_tokens

    @property
    def is_global(self) -> bool:
        """Every token may attend to every token (one group, keys = queries)."""
        return self.layout.is_global

    @property
    def has_class_token(self) -> bool:
        """Global attention with a class (or distillation) token, the first prefix token: its row is the
        layer's map. Register tokens alone are not one: a model with registers but no class token has none."""
        return self.is_global and self.num_prefix_tokens > self.num_registers

    @property
    def is_self_attention(self) -> bool:
        """Tokens attending to tokens of the image grid (not cross-attention, not channel attention)."""
        return self.layout.key_pos is not None and self.layout.axis == "tokens" and self.layout.grid is not None

    def head_weights(self, head: int | None = None) -> Tensor:
        """Weights of one head (or the mean over heads): ``[B·G, n, m]``."""
        nh = self.weights.shape[1]
        if head is None:
            return self.weights.mean(dim=1)
        if not -nh <= head < nh:
            raise ValueError(f"head={head} out of range for {nh} heads in {self.module or 'the model'}")
        return self.weights[:, head]

    def received(self, head: int | None = None) -> Tensor:
        """Attention each grid cell receives as a key, averaged over the queries that may attend to
        it (all of them for global attention, its window's for windows): ``[B, H, W]``."""
        self.head_weights(head)  # range check naming the module
        return self.layout.received(self.weights, head)

    def prefix_share(self, head: int | None = None) -> Tensor:
        """Share of the grid queries' attention on each prefix token (class, distillation, registers, in
        token order): ``[B, P]``, mean over heads unless ``head`` is named."""
        self.head_weights(head)  # range check naming the module
        try:
            return self.layout.prefix_share(self.weights, head)
        except ValueError as e:
            raise ValueError(f"{self.module or 'the model'}: {e}") from None

    def query_map(self, query: tuple[int, int] | str = "cls", head: int | None = None) -> Tensor:
        """Where the query at grid position ``(row, col)`` looks: ``[B, H, W]``.

        Mean over heads unless ``head`` is named; zero where it may not attend (outside its window,
        padding); a key on a coarser grid has its weight spread evenly over the cells it covers, so
        the map sums to the row's weight on grid keys (1 for softmax attention without prefix or
        padding keys). ``query="cls"``: the first prefix token. Channel attention raises.
        """
        self.head_weights(head)  # range check naming the module
        try:
            return self.layout.query_map(self.weights, query, head)
        except ValueError as e:
            raise ValueError(f"{self.module or 'the model'}: {e}") from None


class AttentionRecorder:
    """What :func:`record_attention` collected: ``records`` in call order, and ways to map them."""

    def __init__(self, model: nn.Module, grid: tuple[int, int] | None = None) -> None:
        self.model = model
        self.grid = grid
        self.records: list[AttentionRecord] = []

    def __len__(self) -> int:
        return len(self.records)

    def clear(self) -> None:
        """Forget what was recorded (e.g. between two forwards)."""
        self.records.clear()

    def self_attention(self) -> list[AttentionRecord]:
        """Records of self-attention over image tokens (cross-attention pooling left out)."""
        return [r for r in self.records if r.is_self_attention]

    def layer(self, layer: int) -> AttentionRecord:
        """The ``layer``-th self-attention record (negative from the end)."""
        recs = self.self_attention()
        if not recs:
            raise ValueError("no self-attention was recorded: run the model inside record_attention(model)")
        if not -len(recs) <= layer < len(recs):
            raise ValueError(f"layer={layer} out of range: {len(recs)} attention layers were recorded")
        return recs[layer]

    def image_map(self, layer: int = -1, head: int | None = None) -> Tensor:
        """One layer's map ``[B, H, W]`` on its token grid: the class token's attention when the layer
        has one, else the attention each token receives (window layouts reassembled)."""
        rec = self.layer(layer)
        if rec.has_class_token:
            return rec.query_map("cls", head)
        return rec.received(head)

    def rollout(self, head: int | None = None, *, residual: float = 0.5) -> Tensor:
        """Attention rollout (Abnar & Zuidema 2020) over the global self-attention layers: ``[B, H, W]``.

        Per layer ``Â = (1 - residual)·A + residual·I`` (rows renormalised), ``R = Â_L ⋯ Â_1``;
        the map is the class token's row of ``R`` over the patches; without a class token (none, or
        registers only), the attention each patch receives in ``R``, mean over all tokens.
        """
        recs = [r for r in self.self_attention() if r.is_global]
        if not recs:
            raise ValueError("rollout needs global self-attention layers (ViT / DeiT); use image_map() for "
                             "windowed models")
        last = recs[-1]
        recs = [r for r in recs if torch.equal(r.layout.query_pos, last.layout.query_pos)]
        n = last.weights.shape[-1]
        result: Tensor | None = None
        for rec in recs:
            a = rec.head_weights(head).float()  # [B, N, N]
            a = (1.0 - residual) * a + residual * torch.eye(n)
            a = a / a.sum(dim=-1, keepdim=True)
            result = a if result is None else a @ result
        assert result is not None
        joint = result[:, None]  # [B, 1, N, N]: one "head", placed with the last layer's layout
        if last.has_class_token:
            return last.layout.query_map(joint, "cls")
        return last.layout.received(joint)

    def mean_map(self, head: int | None = None, size: tuple[int, int] | None = None) -> Tensor:
        """Every self-attention layer's :meth:`image_map`, each rescaled to mean 1 and resized to
        ``size`` (default: the finest grid), averaged: ``[B, H, W]``. Works for any layout."""
        recs = self.self_attention()
        if not recs:
            raise ValueError("no self-attention was recorded")
        maps = [self.image_map(i, head) for i in range(len(recs))]
        if size is None:
            size = max((m.shape[-2:] for m in maps), key=lambda s: s[0] * s[1])  # type: ignore[assignment]
        acc = None
        for m in maps:
            m = m / m.mean(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
            m = F.interpolate(m[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0]
            acc = m if acc is None else acc + m
        assert acc is not None
        return acc / len(maps)


def _model_grid(model: nn.Module) -> tuple[int, int] | None:
    grid = getattr(model, "grid_size", None)
    if grid is None:
        grid = getattr(getattr(model, "patch_embed", None), "grid_size", None)
    return tuple(grid) if grid is not None else None  # type: ignore[return-value]


def _place(layout: AttentionLayout, grid: tuple[int, int] | None, prefix: int) -> AttentionLayout:
    """A layout without a grid (token rows): on ``grid`` when its tokens fill it after some prefix
    tokens, else on the square that ``prefix`` prefix tokens leave (unchanged when neither fits)."""
    if layout.grid is not None or layout.groups != 1:
        return layout
    n = layout.query_pos.shape[1]
    if grid is not None and grid[0] * grid[1] <= n:
        return layout.on_grid(grid)
    for P in dict.fromkeys((prefix, 0)):
        side = math.isqrt(max(n - P, 0))
        if side > 0 and side * side == n - P:
            return layout.on_grid((side, side))
    return layout


def _refuse_weightless(model: nn.Module) -> None:
    """``ValueError`` naming the first module of ``model`` whose mechanism forms no attention weights, and why."""
    from ..attention.registry import get_attention_spec

    for name, mod in model.named_modules():
        mechanism = getattr(type(mod), "attention_name", "")
        if mechanism:
            note = get_attention_spec(mechanism).weights_note
            if note:
                raise ValueError(f"no attention maps to record: {name or 'the model'} is {mechanism!r}: {note}")


@contextlib.contextmanager
def record_attention(model: nn.Module, *, grid: tuple[int, int] | None = None) -> Iterator[AttentionRecorder]:
    """Collect the attention weights of every attention call inside ``model`` while active.

    Each mechanism module (anything registered with ``register_attention``) is wrapped in an
    :func:`attention_context` frame naming it; where its rows sit comes from the layout it hands
    the core. The explicit attention path is used while recording.

    Args:
        model: any module (model, mechanism, CNN with plugged attention).
        grid: the token grid ``(H', W')`` of calls whose mechanism does not know it (token rows
            without ``feat_size``), when it is not the model's ``grid_size``.

    Yields:
        an :class:`AttentionRecorder`; its ``records`` fill up as the model runs.

    Raises:
        ValueError: ``model`` holds a mechanism that forms no attention weights (its spec's ``weights_note``,
            e.g. ReLU linear attention), naming the module and why: there would be no map to record.
    """
    _refuse_weightless(model)
    rec = AttentionRecorder(model, grid or _model_grid(model))
    names = {id(m): n for n, m in model.named_modules()}
    frames: list[contextlib.AbstractContextManager[None]] = []
    prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)
    registers = int(getattr(model, "num_reg_tokens", 0) or 0)

    def pre(mod: nn.Module, args: tuple[Any, ...]) -> None:
        cm = attention_context(module=names.get(id(mod), ""))
        cm.__enter__()
        frames.append(cm)

    def post(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if frames:
            frames.pop().__exit__(None, None, None)

    def on_weights(weights: Tensor, info: dict[str, Any]) -> None:
        if info.get("token_map") is not None:  # token merging: the weights among merged tokens, on the original ones
            weights = expand_weights(weights, info["token_map"], info["token_size"])  # [B, nh, T0, T0]
            info = {k: v for k, v in info.items() if k not in ("token_map", "token_size")}
        n, m = weights.shape[-2:]
        layout = info.get("layout")
        if not isinstance(layout, AttentionLayout):  # a call that did not say: token rows
            rows = torch.arange(n)
            layout = AttentionLayout(None, rows, rows if n == m else None)
        layout = _place(layout, rec.grid, prefix)
        w = layout.canonical(weights.detach().float().cpu())  # [B, G, nh, n, m]
        if layout.fold != "batch":  # the record keeps [B·G, nh, n, m]
            layout = dataclasses.replace(layout, fold="batch")
        rec.records.append(AttentionRecord(len(rec.records), info.get("module", ""), w.flatten(0, 1), layout,
                                           w.shape[0], dict(info), min(registers, layout.num_prefix_tokens)))

    handles = []
    for mod in model.modules():
        if getattr(type(mod), "attention_name", None) is not None:
            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.register_forward_hook(post))
    handles.append(register_attention_hook(on_weights))
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()
        while frames:  # a forward that raised leaves its frames open
            frames.pop().__exit__(None, None, None)


def attention_rollout(model: nn.Module, images: Tensor, head: int | None = None) -> Tensor:
    """Run ``model`` on ``images [B, Cin, H, W]`` and return its rollout map ``[B, H', W']``."""
    with record_attention(model) as rec, torch.no_grad():
        model(images)
    return rec.rollout(head)
