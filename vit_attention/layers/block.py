"""Transformer encoder blocks: pre-norm (ViT), post-norm (original Transformer / BERT), parallel (ViT-22B).

Any registered mechanism can be the block's attention (``attn_layer="mhsa"`` by default). A
spatial mechanism (``[B, H, W, C]``) gets the token grid ``feat_size`` and sees only the grid
tokens; prefix tokens (class / distillation) pass its attention unchanged and still go through
the MLP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import create_attention, get_attention_spec
from ..functional.linear import hookless
from .drop_path import DropPath
from .layer_scale import LayerScale
from .mlp import Mlp

__all__ = ["Block", "PostNormBlock", "ParallelBlock", "apply_token_attention"]


def apply_token_attention(attn: nn.Module, x: Tensor, feat_size: tuple[int, int] | None = None,
                          num_prefix_tokens: int = 0) -> Tensor:
    """Run any mechanism on tokens ``[B, P + H·W, C] -> [B, P + H·W, C]``.

    Token mechanisms see all tokens; spatial ones see the ``H x W`` grid as ``[B, H, W, C]``.
    """
    if getattr(attn, "layout", "tokens") == "tokens":
        return attn(x)
    if feat_size is None:
        raise ValueError(f"{type(attn).__name__} is a spatial mechanism and needs the token grid feat_size")
    B, N, C = x.shape
    H, W = feat_size
    if N - num_prefix_tokens != H * W:
        raise ValueError(f"{N - num_prefix_tokens} grid tokens do not fill feat_size {feat_size}")
    prefix, grid = x[:, :num_prefix_tokens], x[:, num_prefix_tokens:]
    grid = attn(grid.reshape(B, H, W, C)).reshape(B, H * W, C)  # [B, H·W, C]
    if num_prefix_tokens == 0:
        return grid
    return torch.cat([prefix.new_zeros(prefix.shape), grid], dim=1)  # prefix tokens get no update


class _BlockBase(nn.Module):
    def __init__(self, dim: int, num_heads: int, *, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 qk_norm: bool = False, proj_bias: bool = True, mlp_bias: bool = True,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 init_values: float | None = None, norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 act_layer: Callable[[], nn.Module] = nn.GELU, attn_layer: str = "mhsa",
                 attn_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        kw: dict[str, Any] = dict(attn_kwargs or {})
        spec = get_attention_spec(attn_layer)
        if attn_layer == "mhsa":
            kw.setdefault("qk_norm", qk_norm)
            kw.setdefault("proj_bias", proj_bias)
        kw.setdefault("qkv_bias", qkv_bias)
        kw.setdefault("attn_drop", attn_drop)
        kw.setdefault("proj_drop", drop)
        self.layout = spec.layout
        self.norm1 = norm_layer(dim)
        self.attn = create_attention(attn_layer, dim, num_heads, **kw)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, bias=mlp_bias, drop=drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def _attn(self, x: Tensor, feat_size: tuple[int, int] | None, num_prefix_tokens: int) -> Tensor:
        return apply_token_attention(self.attn, x, feat_size, num_prefix_tokens)


class Block(_BlockBase):
    """Pre-norm block: ``x + attn(LN(x))``, then ``x + mlp(LN(x))``; ``[B, N, C] -> [B, N, C]``."""

    def forward(self, x: Tensor, feat_size: tuple[int, int] | None = None, num_prefix_tokens: int = 0) -> Tensor:
        """``[B, N, C] -> [B, N, C]``."""
        if not self.training and isinstance(self.ls1, nn.Identity) and isinstance(self.ls2, nn.Identity):
            # inference: the residual adds are fused into the output projections (same math)
            if (getattr(self.attn, "accepts_residual", False) and getattr(self.attn, "layout", "tokens") == "tokens"
                    and hookless(self.attn)):
                x = self.attn(self.norm1(x), residual=x)
            else:
                x = x + self._attn(self.norm1(x), feat_size, num_prefix_tokens)
            return self.mlp(self.norm2(x), residual=x) if hookless(self.mlp) else x + self.mlp(self.norm2(x))
        x = x + self.drop_path1(self.ls1(self._attn(self.norm1(x), feat_size, num_prefix_tokens)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class PostNormBlock(_BlockBase):
    """Post-norm block: ``LN(x + attn(x))``, then ``LN(x + mlp(x))``; ``[B, N, C] -> [B, N, C]``."""

    def forward(self, x: Tensor, feat_size: tuple[int, int] | None = None, num_prefix_tokens: int = 0) -> Tensor:
        """``[B, N, C] -> [B, N, C]``."""
        x = self.norm1(x + self.drop_path1(self.ls1(self._attn(x, feat_size, num_prefix_tokens))))
        return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))


class ParallelBlock(_BlockBase):
    """ViT-22B parallel block: ``x + attn(LN(x)) + mlp(LN(x))`` with one shared norm; ``[B, N, C] -> [B, N, C]``."""

    def __init__(self, dim: int, num_heads: int, **kwargs: Any) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.norm2 = nn.Identity()  # the single pre-norm norm1 feeds both branches

    def forward(self, x: Tensor, feat_size: tuple[int, int] | None = None, num_prefix_tokens: int = 0) -> Tensor:
        """``[B, N, C] -> [B, N, C]``."""
        y = self.norm1(x)
        return (x + self.drop_path1(self.ls1(self._attn(y, feat_size, num_prefix_tokens)))
                + self.drop_path2(self.ls2(self.mlp(y))))
