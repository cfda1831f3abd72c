"""The one adapter between a caller's layout and a mechanism's: blocks and ``plug`` both go through it.

A caller holds tokens ``[B, P + H·W, C]`` (``P`` prefix tokens, grid ``feat_size = (H, W)``) or a
channels-last map ``[B, H, W, C]``; a mechanism takes tokens (``layout = "tokens"``) or a map
(``"spatial"``). :func:`apply_attention` converts to what the mechanism takes and back:

* a token mechanism gets every token, with ``feat_size`` and ``num_prefix_tokens`` (a map is
  flattened to ``[B, H·W, C]`` with ``feat_size = (H, W)``);
* a spatial mechanism gets the grid as ``[B, H, W, C]`` (grid tokens keep its pattern and do not see
  the prefix tokens); prefix tokens attend globally to every token, prefix and grid, through the
  mechanism's own q / k / v and output projections (its ``attend_prefix``), with no position term. So
  a class token reads the image in every block, as with global attention, and pretrained projections
  carry over (the class token of ViTDet-style / EVA windowed backbones is kept apart the same way).

What travels beside ``x`` is one :class:`~vit_attention.attention.base.AttentionCall` (grid, prefix count,
context, mask, rotary coordinates, token merging, residual). Its optional fields are checked once, here,
against what the mechanism reads (its class's ``accepts``): one it does not read raises naming it.
``residual`` (the blocks' speed path) returns ``residual + attn(x)``, fused into the mechanism's output
projection when it reads ``residual`` and no forward hook could see the difference, added here otherwise.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from ..attention.base import AttentionCall, AttentionModule, refuse_unaccepted
from ..attention.registry import get_attention_spec
from ..functional.linear import hookless

__all__ = ["apply_attention"]


def _call(attn: nn.Module, x: Tensor, call: AttentionCall) -> Tensor:
    """``attn(x, call)`` (a plain module: ``attn(x)``), ``x`` in the mechanism's own layout; ``call.residual`` is
    added, fused into the mechanism when it reads it and no hook could tell."""
    residual = call.residual
    if not isinstance(attn, AttentionModule):  # a plain module (plug of a user's module): x only
        out = attn(x)
    elif residual is not None and "residual" in attn.accepts and hookless(attn):
        return attn(x, call)
    else:
        out = attn(x, call if residual is None else dataclasses.replace(call, residual=None))
    return out if residual is None else residual + out


def apply_attention(attn: nn.Module, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
    """Run any mechanism on tokens ``[B, P + H·W, C]`` or a map ``[B, H, W, C]``; same shape out.

    Args:
        attn: a registered mechanism (its ``layout`` says tokens or spatial) or any module
            taking tokens (called with ``x`` alone: it takes no optional field).
        x: tokens ``[B, N, C]`` (``N = P + H·W``) or a channels-last map ``[B, H, W, C]``.
        call: what the call carries besides ``x`` (:class:`~vit_attention.attention.base.AttentionCall`):
            ``feat_size``, the grid ``(H, W)`` of token input (a spatial mechanism, or a token mechanism
            whose spec ``needs_feat_size``, raises without it); ``num_prefix_tokens``, ``P`` class /
            distillation tokens in front of the grid; the optional fields, each refused when the mechanism
            does not read it (:attr:`~vit_attention.attention.base.AttentionModule.accepts`), except
            ``residual`` (``x``'s shape), which is added here when the mechanism does not fuse it.

    Returns:
        ``x``'s shape and layout.
    """
    refuse_unaccepted(attn, call, residual_added=True)  # a residual the mechanism does not fuse is added here
    spatial = isinstance(attn, AttentionModule) and attn.layout == "spatial"
    residual = call.residual
    if x.dim() == 4:  # a channels-last map [B, H, W, C]
        if call.tome is not None:
            raise ValueError("token merging needs tokens [B, N, C], not a map")
        if spatial:
            return _call(attn, x, AttentionCall(residual=residual))
        B, H, W, C = x.shape
        res = None if residual is None else residual.reshape(B, H * W, C)
        flat = dataclasses.replace(call, feat_size=(H, W), num_prefix_tokens=0, residual=res)
        return _call(attn, x.reshape(B, H * W, C), flat).view(B, H, W, C)  # [B, H·W, C] -> [B, H, W, C]
    feat_size = call.feat_size
    if not spatial:
        if feat_size is None and isinstance(attn, AttentionModule) and attn.attention_name \
                and get_attention_spec(attn.attention_name).needs_feat_size:
            raise ValueError(f"{type(attn).__name__} ({attn.attention_name!r}) uses the token grid: pass "
                             "feat_size=(H, W) in its AttentionCall")
        return _call(attn, x, call)
    if feat_size is None:
        raise ValueError(f"{type(attn).__name__} is a spatial mechanism and needs the token grid feat_size")
    B, N, C = x.shape
    H, W = feat_size
    P = call.num_prefix_tokens
    if N - P != H * W:
        raise ValueError(f"{N - P} grid tokens do not fill feat_size {tuple(feat_size)}")
    res = None if residual is None else residual[:, P:].reshape(B, H, W, C)
    grid = _call(attn, x[:, P:].reshape(B, H, W, C), AttentionCall(residual=res)).reshape(B, H * W, C)  # [B, H·W, C]
    if P == 0:
        return grid
    prefix = attn.attend_prefix(x[:, :P], x)  # [B, P, C]: global attention over all P + H·W tokens
    if residual is not None:
        prefix = residual[:, :P] + prefix
    return torch.cat([prefix, grid], dim=1)  # [B, P + H·W, C]
