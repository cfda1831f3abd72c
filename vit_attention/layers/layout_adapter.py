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

``residual`` (a private speed path of the blocks) returns ``residual + attn(x)``, fused into the
mechanism's output projection when it offers that (``accepts_residual``) and no forward hook
could see the difference.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import AttentionModule
from ..functional.linear import hookless

__all__ = ["apply_attention"]


def _call(attn: nn.Module, x: Tensor, residual: Tensor | None, **contract: Any) -> Tensor:
    """``attn(x, **contract)`` (+ residual, fused when the mechanism can); ``x`` in the mechanism's own layout."""
    if not isinstance(attn, AttentionModule):  # a plain module (plug of a user's module): x only
        given = [k for k in ("context", "mask", "rope_coords", "rope_valid", "tome") if contract.get(k) is not None]
        if given:
            raise ValueError(f"{type(attn).__name__} is not a registered mechanism; it takes no "
                             f"{' / '.join(given)}")
        out = attn(x)
        return out if residual is None else residual + out
    for key in ("mask", "rope_coords", "rope_valid", "tome"):
        if key in contract and contract[key] is None:
            del contract[key]  # not given: the mechanism is called exactly as without these keywords
    if ("rope_coords" in contract or "rope_valid" in contract) and getattr(attn, "rope", None) is None:
        raise ValueError(f"{type(attn).__name__} ({attn.attention_name!r}) has no rotary embedding: it takes no "
                         f"rope_coords / rope_valid (build it with rope='axial' or 'mixed')")
    if "tome" in contract and not attn.supports_token_merging:
        raise ValueError(f"{type(attn).__name__} ({attn.attention_name!r}) does not support token merging")
    if residual is not None and attn.accepts_residual and hookless(attn):
        return attn(x, residual=residual, **contract)
    out = attn(x, **contract)
    return out if residual is None else residual + out


def _no_spatial(attn: nn.Module, mask: Tensor | None, rope_coords: Tensor | None, rope_valid: Tensor | None
                ) -> None:
    """A spatial mechanism takes no attention mask and no per-sample RoPE coordinates: raise naming them."""
    if mask is not None:
        raise ValueError(f"{type(attn).__name__} is a spatial mechanism: it takes no attention mask")
    if rope_coords is not None or rope_valid is not None:
        raise ValueError(f"{type(attn).__name__} is a spatial mechanism: it takes no rope_coords / rope_valid")


def apply_attention(attn: nn.Module, x: Tensor, *, feat_size: tuple[int, int] | None = None,
                    num_prefix_tokens: int = 0, context: Tensor | None = None,
                    residual: Tensor | None = None, mask: Tensor | None = None,
                    rope_coords: Tensor | None = None, rope_valid: Tensor | None = None,
                    tome: Any = None) -> Tensor:
    """Run any mechanism on tokens ``[B, P + H·W, C]`` or a map ``[B, H, W, C]``; same shape out.

    Args:
        attn: a registered mechanism (its ``layout`` says tokens or spatial) or any module
            taking tokens (called with ``x`` alone).
        x: tokens ``[B, N, C]`` (``N = P + H·W``) or a channels-last map ``[B, H, W, C]``.
        feat_size: the grid ``(H, W)`` of token input (a spatial mechanism raises without it).
        num_prefix_tokens: ``P`` class / distillation tokens in front of the grid.
        context: keys / values ``[B, M, C]`` for a token mechanism that takes them.
        residual: when given (``x``'s shape), the result is ``residual + attn(x)``.
        mask: bool, broadcastable to ``[B, nh, N, M]``, True = may attend (NaFlex padding: a key mask
            ``[B, 1, 1, N]``), handed to a token mechanism's ``forward(..., mask=)``; None = not passed
            at all (the call is the same as before masks existed). A spatial mechanism takes none.
        rope_coords: int ``[B, L, 2]``, the ``(y, x)`` grid index of each of the ``L = N - P`` grid tokens
            of a packed NaFlex batch (each sample on its own grid), and ``rope_valid [B, L]`` bool (True =
            real patch): handed to a token mechanism with a rotary embedding as
            ``forward(..., rope_coords=, rope_valid=)``; None = not passed. A mechanism without ``rope``
            (or a spatial one) raises naming them.
        tome: a :class:`~vit_attention.functional.tome.TokenMergeState` (token merging), handed to a token
            mechanism that supports it (``supports_token_merging``); None = not passed.

    Returns:
        ``x``'s shape and layout.
    """
    spatial = isinstance(attn, AttentionModule) and attn.layout == "spatial"
    if x.dim() == 4:  # a channels-last map [B, H, W, C]
        if tome is not None:
            raise ValueError("token merging needs tokens [B, N, C], not a map")
        if spatial:
            _no_spatial(attn, mask, rope_coords, rope_valid)
            return _call(attn, x, residual, context=context)
        B, H, W, C = x.shape
        res = None if residual is None else residual.reshape(B, H * W, C)
        out = _call(attn, x.reshape(B, H * W, C), res, feat_size=(H, W), context=context,
                    mask=mask, rope_coords=rope_coords, rope_valid=rope_valid)  # [B, H·W, C]
        return out.view(B, H, W, C)
    if not spatial:
        if feat_size is None and isinstance(attn, AttentionModule) and attn.spec.needs_feat_size:
            raise ValueError(f"{type(attn).__name__} ({attn.attention_name!r}) uses the token grid: pass "
                             "feat_size=(H, W)")
        return _call(attn, x, residual, feat_size=feat_size, num_prefix_tokens=num_prefix_tokens, context=context,
                     mask=mask, rope_coords=rope_coords, rope_valid=rope_valid, tome=tome)
    if tome is not None:
        raise ValueError(f"{type(attn).__name__} is a spatial mechanism: tokens cannot be merged")
    _no_spatial(attn, mask, rope_coords, rope_valid)
    if feat_size is None:
        raise ValueError(f"{type(attn).__name__} is a spatial mechanism and needs the token grid feat_size")
    B, N, C = x.shape
    H, W = feat_size
    P = num_prefix_tokens
    if N - P != H * W:
        raise ValueError(f"{N - P} grid tokens do not fill feat_size {tuple(feat_size)}")
    res = None if residual is None else residual[:, P:].reshape(B, H, W, C)
    grid = _call(attn, x[:, P:].reshape(B, H, W, C), res, context=context).reshape(B, H * W, C)  # [B, H·W, C]
    if P == 0:
        return grid
    prefix = attn.attend_prefix(x[:, :P], x)  # [B, P, C]: global attention over all P + H·W tokens
    if residual is not None:
        prefix = residual[:, :P] + prefix
    return torch.cat([prefix, grid], dim=1)  # [B, P + H·W, C]

