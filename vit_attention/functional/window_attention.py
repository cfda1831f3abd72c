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

On the ``"flex"`` backend (:func:`.flex.use_flex`) neither runs: one gather puts the map's tokens
in a window-major sequence per head, ``[B, nh, nW·S, hd]`` (windows one after the other, ``S >= N``
positions each), and ONE FlexAttention call runs :func:`window_pattern` on it (same-window mask,
position bias / shift term / query bias in the score_mod), block-sparse; docs/swin.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import scaled_dot_product_attention
from .flex import AttentionPattern, flex_buffer, use_flex
from .heads import split_qkv
from .layout import window_layout
from .observers import attention_context, attention_observed
from .window import (
    MASK_VALUE,
    shift_window_mask,
    to_pair,
    window_gather_index,
    window_head_gather_index,
    window_partition,
    window_sequence_gather_index,
    window_sequence_stride,
    window_sequence_tables,
)

__all__ = ["window_geometry", "window_tokens", "window_bias", "window_pattern", "window_attention"]


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


def window_pattern(feat_size: tuple[int, int], window_size: int | Sequence[int], shift: tuple[int, int], *,
                   pad_first: bool = True, mask_padding: bool = False, stride: int | None = None,
                   position_bias: Tensor | None = None, query_bias: Tensor | None = None,
                   device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> AttentionPattern:
    """(Shifted) window attention over the whole window-major sequence of a map, as one :class:`AttentionPattern`.

    The sequence is :func:`.window.window_sequence_gather_index`'s: the ``nW`` windows of the
    shifted, padded ``Hp x Wp`` map one after the other, ``stride`` positions each (default
    ``N = Wh·Ww``; the slots past ``N`` are never attended to), tokens row-major inside a window,
    ``L = nW·stride`` positions. A window is a contiguous run, so the block mask is
    block-diagonal and skips every block no window spans (docs/swin.md measures it against
    row-major order).

    * ``mask_mod``: query and key in the same window (``q // stride == kv // stride``) and the key a
      window slot (``kv % stride < N``) holding, with ``mask_padding`` on a padded map, a map token;
    * ``score_mod``: ``position_bias[h, q % stride, kv % stride]`` (``[nh, N, N]``, the relative-position
      table gathered by (Δrow, Δcol), read at run time: its parameters get their gradient) plus
      Swin's ``-100`` where query and key come from different shift regions (an additive term,
      as in the reference, not a mask) plus ``query_bias[b, h, q, kv % stride]`` (``[B, nh, L, N]``:
      each query's bias over the slots of its window, ViTDet's decomposed positions).

    ``shift`` is the shift actually applied (:func:`window_geometry`). ``dtype``: the score's dtype
    the bias terms are cast to (default: theirs). The ``cache_key`` holds what the mask depends on:
    ``N`` and ``stride`` alone, or the map geometry too when padded keys are masked.
    """
    H, W = feat_size
    wh, ww = to_pair(window_size)
    N = wh * ww
    S = N if stride is None else stride
    device = torch.device(device)
    masked = mask_padding and (H % wh != 0 or W % ww != 0)  # padded keys exist only on a padded map
    region, valid = window_sequence_tables(H, W, (wh, ww), shift, pad_first=pad_first, stride=S,
                                           mask_padding=masked, device=device)  # [L], [L]
    region, valid = flex_buffer(region), flex_buffer(valid)  # captured by the mods
    L = region.numel()
    if masked or S != N:
        key: tuple[Any, ...] = ("window", N, S) + (("valid", H, W, wh, ww, shift, pad_first) if masked else ())

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return (q_idx // S == kv_idx // S) & valid[kv_idx]
    else:
        key = ("window", N, S)

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return q_idx // S == kv_idx // S

    # the mods are evaluated on masked positions too: the terms are padded to the stride (in range, unused)
    pos = None if position_bias is None else position_bias.to(dtype or position_bias.dtype)  # [nh, N, N]
    qb = None if query_bias is None else query_bias.to(dtype or query_bias.dtype)  # [B, nh, L, N]
    if S != N:
        pos = None if pos is None else F.pad(pos, (0, S - N, 0, S - N))  # [nh, S, S]
        qb = None if qb is None else F.pad(qb, (0, S - N))  # [B, nh, L, S]
    shifted = shift != (0, 0)
    pos, qb = flex_buffer(pos), flex_buffer(qb)  # captured by score_mod
    score_mod = None
    if pos is not None or shifted or qb is not None:
        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            # the terms summed first, then added to q·k (the explicit path's order: one bias tensor)
            term = None if pos is None else pos[h, q_idx % S, kv_idx % S]
            if shifted:
                cross = torch.where(region[q_idx] != region[kv_idx], MASK_VALUE, 0.0)
                term = cross if term is None else term + cross
            if qb is not None:
                extra = qb[b, h, q_idx, kv_idx % S]
                term = extra if term is None else term + extra
            return score + term.to(score.dtype)

    return AttentionPattern(L, L, mask_mod=mask_mod, score_mod=score_mod, cache_key=key)


def _flex_window_attention(qkv: Tensor, position_bias: Tensor | None, *, feat_size: tuple[int, int], nh: int,
                           window: tuple[int, int], padded: tuple[int, int], shift: tuple[int, int], pad_first: bool,
                           scale: float | None, logit_scale: Tensor | None, dropout_p: float, mask_padding: bool,
                           query_bias: Callable[[Tensor], Tensor] | None, fused: bool | None,
                           backend: str | None) -> Tensor:
    """:func:`window_attention` as one FlexAttention call over the window-major sequence ``[B, nh, nW·S, hd]``."""
    H, W = feat_size
    (wh, ww), (Hp, Wp) = window, padded
    nW, N = (Hp // wh) * (Wp // ww), wh * ww
    S = window_sequence_stride(nW, N)  # N, or N padded so that windows fit the block mask's blocks
    L = nW * S
    hd = qkv.shape[-1] // (3 * nh)
    partitioned = shift == (0, 0) and (Hp, Wp) == (H, W)  # qkv holds windows [B·nW, N, 3C] (window_tokens)
    B = qkv.shape[0] // nW if partitioned else qkv.shape[0]
    if B == 0:  # nothing to attend (flex cannot index the score terms of an empty batch); still on the graph
        return qkv.narrow(-1, 0, nh * hd).reshape(0, H * W, nh * hd)
    if partitioned and S == N:  # already in window-major order: a view per head
        q, k, v = qkv.view(B, L, 3, nh, hd).permute(2, 0, 3, 1, 4).unbind(0)  # each [B, nh, L, hd]
        _, out_rows = window_sequence_gather_index(H, W, window, shift, nh, pad_first=pad_first, stride=S,
                                                   device=qkv.device)
    else:  # one gather: shift + pad + window-major order (windows spaced S apart), per head
        qkv_rows, out_rows = window_sequence_gather_index(H, W, window, shift, nh, pad_first=pad_first, stride=S,
                                                          partitioned=partitioned, device=qkv.device)
        rows = (nW * N if partitioned else qkv.shape[1]) * 3 * nh  # not reshape(B, -1, hd): an empty batch
        q, k, v = qkv.reshape(B, rows, hd).index_select(1, qkv_rows).view(B, 3, nh, L, hd).unbind(1)
    q_bias = None
    if query_bias is not None:  # from each window's unscaled queries: [B, nh, nW, N, N] -> [B, nh, L, N]
        q_bias = query_bias(q.unflatten(2, (nW, S))[..., :N, :])  # [B, nh, nW, N, N]
        q_bias = F.pad(q_bias, (0, 0, 0, S - N)).flatten(2, 3)  # [B, nh, L, N]
    if logit_scale is not None:  # cosine attention: unit q, k; the per-head temperature folded into q
        q = F.normalize(q, dim=-1) * logit_scale.to(q.dtype)  # [B, nh, L, hd] * [nh, 1, 1]
        k, scale = F.normalize(k, dim=-1), 1.0
    pattern = window_pattern((H, W), window, shift, pad_first=pad_first, mask_padding=mask_padding, stride=S,
                             position_bias=position_bias, query_bias=q_bias, device=qkv.device, dtype=q.dtype)
    out = scaled_dot_product_attention(q, k, v, scale=scale, dropout_p=dropout_p, fused=fused, backend=backend,
                                       pattern=pattern)  # [B, nh, L, hd]
    return out.reshape(B, nh * L, hd).index_select(1, out_rows).view(B, H * W, nh * hd)


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
        backend: the caller's captured attention backend (None: the process default; :mod:`.flex`);
            ``"flex"`` runs one FlexAttention call over the whole map (:func:`window_pattern`).

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
    if use_flex(backend, fused, qkv.device, mechanism=mechanism):  # one call over the whole sequence
        return _flex_window_attention(qkv, position_bias, feat_size=(H, W), nh=nh, window=(wh, ww), padded=(Hp, Wp),
                                      shift=shift, pad_first=pad_first, scale=scale, logit_scale=logit_scale,
                                      dropout_p=attn_drop if training else 0.0, mask_padding=mask_padding,
                                      query_bias=query_bias, fused=fused, backend=backend)
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
