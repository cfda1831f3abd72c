"""Attention maps: record every attention call, place the weights back in the image.

    >>> with record_attention(model) as rec:
    ...     model(images)
    >>> heat = rec.rollout()               # ViT / DeiT: class token -> patches, [B, H', W']
    >>> heat = rec.image_map(layer=-1)     # any layout, [B, H', W'] on that layer's token grid

Recording goes through the single attention function of the core
(:func:`vit_attention.functional.register_attention_hook`), so it sees every mechanism the same
way. Each record carries the module name and the layout needed to map its weights back to image
positions: ``"global"`` (``[B, nh, N, M]`` over the token grid plus prefix tokens) or ``"window"``
(``[B·nW, nh, n, n]`` per window, with the window size, the cyclic shift, the padded size and the
order of padding and shift that the window module reports through :func:`attention_context`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.attention import attention_context, register_attention_hook
from ..functional.window import window_gather_index

__all__ = ["AttentionRecord", "AttentionRecorder", "record_attention", "attention_rollout", "window_token_index"]


@dataclass
class AttentionRecord:
    """One attention call.

    ``weights``: ``[B, nh, N, M]`` (global) or ``[B·nW, nh, n, n]`` (window), post-softmax, on CPU.
    ``grid``: the token grid ``(H, W)`` the call attends over (window: the module's input map;
    global: the patch grid, prefix tokens excluded). ``num_prefix_tokens``: class / distillation
    tokens in front of the grid (global). Window fields: ``window_size``, ``shift_size`` (the
    shift actually applied), ``padded_size`` and ``pad_first`` (torchvision order).
    """

    index: int
    module: str
    weights: Tensor
    layout: str
    batch: int
    grid: tuple[int, int] | None = None
    num_prefix_tokens: int = 0
    window_size: tuple[int, int] | None = None
    shift_size: tuple[int, int] = (0, 0)
    padded_size: tuple[int, int] | None = None
    pad_first: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def is_self_attention(self) -> bool:
        """Queries and keys are the same tokens (not cross-attention / attention pooling)."""
        return self.weights.shape[-1] == self.weights.shape[-2]

    def head_weights(self, head: int | None = None) -> Tensor:
        """Weights of one head (or the mean over heads): ``[B', N, M]``."""
        nh = self.weights.shape[1]
        if head is None:
            return self.weights.mean(dim=1)
        if not -nh <= head < nh:
            raise ValueError(f"head={head} out of range for {nh} heads in {self.module or 'the model'}")
        return self.weights[:, head]

    def received(self, head: int | None = None) -> Tensor:
        """Attention each grid token receives, averaged over queries: ``[B, H, W]``.

        Window layout: computed per window and reassembled into image positions (shift and
        padding undone). Global layout: over the patch grid (prefix tokens excluded as keys).
        """
        w = self.head_weights(head)  # [B', N, M]
        if self.layout == "window":
            return self._to_image(w.mean(dim=1))  # per key, [B·nW, n] -> [B, H, W]
        P = self.num_prefix_tokens
        gh, gw = self._global_grid()
        return w[:, :, P:].mean(dim=1).reshape(self.batch, gh, gw)  # [B, H, W]

    def query_map(self, query: tuple[int, int] | str = "cls", head: int | None = None) -> Tensor:
        """Where one query token looks: ``[B, H, W]`` (zero outside its window for window layouts).

        ``query``: grid position ``(row, col)``, or ``"cls"`` for the first prefix token (global).
        """
        w = self.head_weights(head)  # [B', N, M]
        if self.layout == "window":
            if not isinstance(query, tuple):
                raise ValueError("window attention has no class token; pass query=(row, col)")
            H, W = self._check_grid()
            index = window_token_index(H, W, self.window_size, self.shift_size, self.padded_size,  # type: ignore
                                       self.pad_first)  # [nW, n]
            pos = query[0] * W + query[1]
            where = (index == pos).nonzero()
            if len(where) != 1:
                raise ValueError(f"query {query} is outside the {H}x{W} grid of {self.module}")
            win, tok = int(where[0, 0]), int(where[0, 1])
            nW = index.shape[0]
            rows = w.reshape(self.batch, nW, *w.shape[1:])[:, win, tok]  # [B, n]
            out = torch.zeros(self.batch, H * W, dtype=rows.dtype)
            keep = index[win] >= 0
            out[:, index[win][keep]] = rows[:, keep]
            return out.reshape(self.batch, H, W)
        P = self.num_prefix_tokens
        gh, gw = self._global_grid()
        if query == "cls":
            if P == 0:
                raise ValueError(f"{self.module or 'the model'} has no prefix (class) token; pass query=(row, col)")
            row = w[:, 0]
        else:
            row = w[:, P + query[0] * gw + query[1]]  # type: ignore[index]
        return row[:, P:].reshape(self.batch, gh, gw)

    # ------------------------------------------------------------------ helpers
    def _check_grid(self) -> tuple[int, int]:
        if self.grid is None:
            raise ValueError(f"record of {self.module!r} has no token grid")
        return self.grid

    def _global_grid(self) -> tuple[int, int]:
        if not self.is_self_attention:
            raise ValueError(f"{self.module} is cross-attention ({tuple(self.weights.shape)}); no image map")
        n = self.weights.shape[-1] - self.num_prefix_tokens
        if self.grid is not None and self.grid[0] * self.grid[1] == n:
            return self.grid
        side = int(round(math.sqrt(n)))
        if side * side != n:
            raise ValueError(f"cannot place {n} tokens of {self.module} on a grid; pass grid=(H, W) to "
                             "record_attention")
        return side, side

    def _to_image(self, per_token: Tensor) -> Tensor:
        """Window tokens ``[B·nW, n]`` -> image positions ``[B, H, W]`` (padding dropped, shift undone)."""
        H, W = self._check_grid()
        index = window_token_index(H, W, self.window_size, self.shift_size, self.padded_size,  # type: ignore
                                   self.pad_first)  # [nW, n]
        vals = per_token.reshape(self.batch, -1)  # [B, nW·n]
        flat = index.reshape(-1)
        keep = flat >= 0
        out = torch.zeros(self.batch, H * W, dtype=vals.dtype)
        out[:, flat[keep]] = vals[:, keep]
        return out.reshape(self.batch, H, W)


def window_token_index(H: int, W: int, window_size: Sequence[int], shift_size: Sequence[int] = (0, 0),
                       padded_size: Sequence[int] | None = None, pad_first: bool = False) -> Tensor:
    """For each window token, its position ``row·W + col`` in the unshifted, unpadded map (-1 = padding).

    Returns ``[nW, Wh·Ww]`` (long) in the window order of
    :func:`vit_attention.functional.window.window_partition`: the gather index the attention itself
    uses (:func:`vit_attention.functional.window.window_gather_index`), with its zero-token slot as -1.
    ``pad_first=False``: the map is rolled by ``-shift`` and then padded (timm); ``True``: padded,
    then rolled (torchvision). ``padded_size``, when given, must be the window multiple it implies.
    """
    wh, ww = int(window_size[0]), int(window_size[1])
    if padded_size is not None and tuple(padded_size) != (H + (-H) % wh, W + (-W) % ww):
        raise ValueError(f"padded_size {tuple(padded_size)} is not the {wh}x{ww}-window multiple of {H}x{W}")
    fwd, _ = window_gather_index(H, W, (wh, ww), (int(shift_size[0]), int(shift_size[1])), pad_first=pad_first)
    return torch.where(fwd == H * W, -1, fwd).view(-1, wh * ww)  # [nW, Wh·Ww]


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
        if rec.layout == "global" and rec.num_prefix_tokens > 0:
            return rec.query_map("cls", head)
        return rec.received(head)

    def rollout(self, head: int | None = None, *, residual: float = 0.5) -> Tensor:
        """Attention rollout (Abnar & Zuidema 2020) over the global self-attention layers: ``[B, H, W]``.

        Per layer ``Â = (1 - residual)·A + residual·I`` (rows renormalised), ``R = Â_L ⋯ Â_1``;
        the map is the class token's row of ``R`` over the patches (mean row without a class token).
        """
        recs = [r for r in self.self_attention() if r.layout == "global"]
        if not recs:
            raise ValueError("rollout needs global self-attention layers (ViT / DeiT); use image_map() for "
                             "windowed models")
        n = recs[0].weights.shape[-1]
        recs = [r for r in recs if r.weights.shape[-1] == n]
        result: Tensor | None = None
        for rec in recs:
            a = rec.head_weights(head).float()  # [B, N, N]
            a = (1.0 - residual) * a + residual * torch.eye(n)
            a = a / a.sum(dim=-1, keepdim=True)
            result = a if result is None else a @ result
        assert result is not None
        last = recs[-1]
        P = last.num_prefix_tokens
        gh, gw = last._global_grid()
        row = result[:, 0, P:] if P > 0 else result.mean(dim=1)
        return row.reshape(last.batch, gh, gw)

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


@contextlib.contextmanager
def record_attention(model: nn.Module, *, grid: tuple[int, int] | None = None) -> Iterator[AttentionRecorder]:
    """Collect the attention weights of every attention call inside ``model`` while active.

    Each mechanism module (anything registered with ``register_attention``) is wrapped in an
    :func:`attention_context` frame naming it and giving its input map size; window modules add
    their window layout themselves. The explicit attention path is used while recording.

    Args:
        model: any module (model, mechanism, CNN with plugged attention).
        grid: the patch grid ``(H', W')`` of global attention, when it is not the model's
            ``grid_size`` (e.g. a different input size with ``dynamic_img_size``).

    Yields:
        an :class:`AttentionRecorder`; its ``records`` fill up as the model runs.
    """
    rec = AttentionRecorder(model, grid or _model_grid(model))
    names = {id(m): n for n, m in model.named_modules()}
    frames: list[contextlib.AbstractContextManager[None]] = []
    prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)

    def pre(mod: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0] if args and isinstance(args[0], Tensor) else None
        info: dict[str, Any] = {"module": names.get(id(mod), "")}
        if x is not None:
            info["input_shape"] = tuple(x.shape)
        info["pad_first"] = bool(getattr(mod, "pad_first", False))
        cm = attention_context(**info)
        cm.__enter__()
        frames.append(cm)

    def post(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if frames:
            frames.pop().__exit__(None, None, None)

    def on_weights(weights: Tensor, info: dict[str, Any]) -> None:
        w = weights.detach().float().cpu()
        shape = info.get("input_shape")
        window = info.get("window_size")
        if window is not None and shape is not None and len(shape) == 4:
            B, H, W, _ = shape
            if info.get("heads_layout") == "windows*heads":  # [B, nW·nh, n, n] -> [B·nW, nh, n, n]
                nW = int(info["num_windows"])
                w = w.view(B, nW, w.shape[1] // nW, *w.shape[2:]).reshape(B * nW, -1, *w.shape[2:])
            rec.records.append(AttentionRecord(
                len(rec.records), info.get("module", ""), w, "window", B, (H, W), 0,
                tuple(window), tuple(info.get("shift_size", (0, 0))), tuple(info.get("padded_size") or (H, W)),
                bool(info.get("pad_first", False)), dict(info)))
            return
        if shape is not None and len(shape) == 4:  # a spatial mechanism with global attention over [B, H, W, C]
            B, H, W, _ = shape
            rec.records.append(AttentionRecord(len(rec.records), info.get("module", ""), w, "global", B, (H, W), 0,
                                               info=dict(info)))
            return
        B = shape[0] if shape else w.shape[0]
        n = w.shape[-1]
        P = 0 if rec.grid is not None and rec.grid[0] * rec.grid[1] == n else prefix
        rec.records.append(AttentionRecord(len(rec.records), info.get("module", ""), w, "global", B, rec.grid, P,
                                           info=dict(info)))

    handles = []
    for m in model.modules():
        if getattr(type(m), "attention_name", None) is not None:
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post))
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
