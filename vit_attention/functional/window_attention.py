"""Shifted-window attention (Swin W-MSA / SW-MSA, SwinV2 cosine) as one plain function of tensors.

:func:`window_attention` takes the packed q|k|v projection of a map's tokens and the per-head
position bias, and returns the attention output per token (heads merged), before the output
projection. The modules in :mod:`vit_attention.attention.window` own the parameters, the caches
and the two projections; the projections stay module calls so that forward hooks, subclasses
and wrappers of ``qkv`` / ``proj`` (LoRA, quantisation) keep working.

Two layouts, chosen by :func:`window_tokens` from the sizes alone:

* a map that is neither shifted nor padded is partitioned before the projection: windows are
  batch rows, q, k, v ``[B·nW, nh, N, hd]``, and the ``[nh, N, N]`` bias broadcasts over them;
* otherwise the map's tokens are projected as they are and one row gather (cached indices,
  :func:`.window.window_head_gather_index`) does shift, padding and partition at once, folding
  the windows into the heads, ``[B, nW·nh, N, hd]``, so that one ``[1, nW·nh, N, N]`` bias
  (position bias + shift mask, cached by the caller) broadcasts over the batch.

Both end in the same memory order, so one row gather merges the heads and puts every token back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import attention_context, attention_observed, scaled_dot_product_attention
from .heads import split_qkv
from .layout import window_layout
from .window import shift_window_mask, to_pair, window_gather_index, window_head_gather_index, window_partition

__all__ = ["window_geometry", "window_tokens", "window_bias", "window_attention"]


def window_geometry(H: int, W: int, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0, *,
                    pad_first: bool = True) -> tuple[tuple[int, int], tuple[int, int]]:
    """Padded size and the shift actually applied for an ``H x W`` map: ``((Hp, Wp), (sh, sw))``.

    ``pad_first`` (torchvision's order): an axis whose padded length fits in one window is not shifted.
    """
    wh, ww = to_pair(window_size)
    sh, sw = to_pair(shift_size, "shift_size")
    Hp, Wp = H + (-H) % wh, W + (-W) % ww
    if pad_first:
        sh = 0 if wh >= Hp else sh
        sw = 0 if ww >= Wp else sw
    return (Hp, Wp), (sh, sw)


def window_tokens(x: Tensor, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0, *,
                  pad_first: bool = True) -> Tensor:
    """What the qkv projection runs on: ``[B, H, W, C]`` -> windows ``[B·nW, N, C]`` (map neither shifted
    nor padded) or tokens ``[B, T, C]`` (``T = H·W``, plus one zero token when the map is padded)."""
    B, H, W, C = x.shape
    (Hp, Wp), shift = window_geometry(H, W, window_size, shift_size, pad_first=pad_first)
    if shift == (0, 0) and (Hp, Wp) == (H, W):
        return window_partition(x, window_size)  # [B·nW, N, C]
    tokens = x.reshape(B, H * W, C)  # [B, H·W, C]
    if (Hp, Wp) != (H, W):
        tokens = torch.cat([tokens, tokens.new_zeros(B, 1, C)], dim=1)  # last token: zero (padding)
    return tokens


def window_bias(position_bias: Tensor, padded_size: tuple[int, int], window_size: int | Sequence[int],
                shift: tuple[int, int]) -> Tensor:
    """Position bias ``[nh, N, N]`` plus the shift region mask: ``[1, nW·nh, N, N]`` (windows folded into heads)."""
    Hp, Wp = padded_size
    region = shift_window_mask(Hp, Wp, window_size, shift, device=position_bias.device)  # [nW, N, N]
    bias = position_bias.unsqueeze(0) + region.unsqueeze(1).to(position_bias.dtype)  # [nW, nh, N, N]
    return bias.view(1, -1, *bias.shape[-2:])  # [1, nW·nh, N, N]


def window_attention(qkv: Tensor, position_bias: Tensor | None, *, feat_size: tuple[int, int], num_heads: int,
                     window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0, pad_first: bool = True,
                     scale: float | None = None, logit_scale: Tensor | None = None, attn_drop: float = 0.0,
                     training: bool = False, bias_cache: dict[Any, Tensor] | None = None,
                     mechanism: str = "window", mask_padding: bool = False,
                     query_bias: Callable[[Tensor], Tensor] | None = None, fused: bool | None = None,
                     backend: str | None = None) -> Tensor:
    """Attention inside (shifted) windows of an ``H x W`` map: packed q|k|v -> ``[B, H·W, C]``.

    Args:
        qkv: the packed projection of :func:`window_tokens`: windows ``[B·nW, N, 3C]``, or the
            map's tokens ``[B, T, 3C]`` (``T = H·W``, plus one last token, the projection of a zero
            input, when the map is padded: every padded slot shares it).
        position_bias: per-head additive bias inside a window, ``[nh, N, N]``, ``N = Wh·Ww``; None =
            no position bias (Twins LSA).
        feat_size: the map ``(H, W)``.
        num_heads, window_size, shift_size: ``nh``, the window ``(Wh, Ww)``, the cyclic shift.
        pad_first: pad then roll (torchvision); else roll then pad (timm, the original repository).
        scale: logit scale for dot-product attention (default ``hd ** -0.5``).
        logit_scale: SwinV2 cosine attention: the per-head temperature ``[nh, 1, 1]`` (already
            clamped and exponentiated); q and k are normalised and q is multiplied by it.
        attn_drop, training: dropout on the weights, only when ``training``.
        bias_cache: a dict the caller owns, for the ``[1, nW·nh, N, N]`` bias + shift mask per
            size, kept while ``position_bias`` is the same (the caller clears it when it changes).
        mechanism: the name given to attention observers (with the window geometry, in an
            :func:`.attention.attention_context` frame opened only while one is registered).
        mask_padding: padded keys are masked out (no query attends to them); default False, the
            padded slots take part in the softmax as zero-input tokens (timm, the original repositories).
        query_bias: an additive bias computed from each window's unscaled queries, ``q [*b, nh', N, hd]
            -> [*b, nh', N, N]`` (rows in row-major order inside a window; windows folded into the
            batch or the heads), added to the position bias (ViTDet's decomposed relative positions).
        fused: the caller's captured fused-attention switch (None: the process default; see
            :func:`.attention.scaled_dot_product_attention`).
        backend: the caller's captured attention backend (None: the process default; :mod:`.flex`).

    Returns:
        ``[B, H·W, C]``: heads merged, windows reversed, shift undone, padding cropped.
    """
    H, W = feat_size
    nh = num_heads
    hd = qkv.shape[-1] // (3 * nh)
    wh, ww = to_pair(window_size)
    (Hp, Wp), shift = window_geometry(H, W, (wh, ww), shift_size, pad_first=pad_first)
    nW, N = (Hp // wh) * (Wp // ww), wh * ww
    folded = shift != (0, 0) or (Hp, Wp) != (H, W)
    B = qkv.shape[0] if folded else qkv.shape[0] // nW
    qkv_rows, out_rows = window_head_gather_index(H, W, (wh, ww), shift, nh, pad_first=pad_first, device=qkv.device)
    if folded:  # one gather: shift + pad + partition, windows folded into the heads
        rows = qkv.shape[1] * 3 * nh  # spelled out: reshape(B, -1, hd) is ambiguous for an empty batch
        qkv = qkv.reshape(B, rows, hd).index_select(1, qkv_rows).view(B, 3, nW * nh, N, hd)
        q, k, v = qkv.unbind(1)  # each [B, nW·nh, N, hd]
    else:
        q, k, v = split_qkv(qkv, nh)  # each [B·nW, nh, N, hd]
    q_bias = None if query_bias is None else query_bias(q)  # [B, nW·nh | nh, N, N] (from the unscaled q)
    if logit_scale is not None:  # cosine attention: unit q, k; the per-head temperature folded into q
        temp = logit_scale.to(q.dtype)  # [nh, 1, 1]
        q = F.normalize(q.unflatten(-3, (-1, nh)), dim=-1) * temp  # [B, nW, nh, N, hd] | [B·nW, 1, nh, N, hd]
        q, k, scale = q.flatten(-4, -3), F.normalize(k, dim=-1), 1.0
    if position_bias is None and shift == (0, 0):  # no bias at all (Twins LSA)
        bias = None
    elif folded:
        key = (Hp, Wp, shift, qkv.device)
        bias = None if bias_cache is None else bias_cache.get(key)
        if bias is None:
            if position_bias is None:
                position_bias = qkv.new_zeros(nh, N, N)
            bias = window_bias(position_bias, (Hp, Wp), (wh, ww), shift)  # [1, nW·nh, N, N]
            if bias_cache is not None:
                if len(bias_cache) > 8:
                    bias_cache.clear()
                bias_cache[key] = bias
    else:
        bias = position_bias.unsqueeze(0)  # [1, nh, N, N]
    if q_bias is not None:
        bias = q_bias if bias is None else bias + q_bias
    mask = None
    if mask_padding and (Hp, Wp) != (H, W):  # padded keys may not be attended to
        key = ("pad", Hp, Wp, shift, nh, qkv.device)
        mask = None if bias_cache is None else bias_cache.get(key)
        if mask is None:
            fwd, _ = window_gather_index(H, W, (wh, ww), shift, pad_first=pad_first, device=qkv.device)
            valid = (fwd != H * W).view(nW, 1, 1, N)  # [nW, 1, 1, N]: slot holds a map token
            mask = valid.expand(nW, nh, 1, N).reshape(1, nW * nh, 1, N)  # [1, nW·nh, 1, N]
            if bias_cache is not None:
                bias_cache[key] = mask
    # for observers only (none registered: no layout, no context frame): where each row sits on the map
    # (cached per size) and the window geometry
    layout, frame = None, contextlib.nullcontext()
    if attention_observed():
        layout = window_layout(H, W, (wh, ww), shift, pad_first=pad_first, fold="heads" if folded else "batch")
        frame = attention_context(mechanism=mechanism, window_size=(wh, ww), shift_size=shift, num_windows=nW,
                                  heads_layout="windows*heads" if folded else "heads")
    with frame:
        out = scaled_dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                           dropout_p=attn_drop if training else 0.0,
                                           layout=layout, fused=fused, backend=backend)  # [B, nW·nh | nh, N, hd]
    # [B, nW·nh, N, hd] and [B·nW, nh, N, hd] are the same memory: one row gather merges the heads,
    # reverses the windows, undoes the shift and crops the padding
    # (reshape, not contiguous().view(): an exported graph drops a contiguous() that was a no-op when traced)
    return out.reshape(B, nW * nh * N, hd).index_select(1, out_rows).view(B, H * W, nh * hd)
