"""The CNN adapter: any registered attention mechanism inside a ``(B, C, H, W)`` network.

    >>> net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), plug("window", 32, 4, window_size=4),
    ...                     nn.Conv2d(32, 64, 3, stride=2, padding=1))

``Plug`` changes the layout (``[B, C, H, W]`` -> channels-last ``[B, H, W, C]``; the blocks'
adapter :func:`~vit_attention.layers.layout_adapter.apply_attention` hands sequence mechanisms tokens
``[B, H·W, C]`` with ``feat_size = (H, W)``), applies a pre-norm residual attention
``x + attn(norm(x))`` and optionally a pre-norm residual MLP, and changes the layout back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from ..attention import create_attention, get_attention_spec
from .layer_scale import LayerScale
from .layout_adapter import apply_attention
from .mlp import Mlp

__all__ = ["Plug", "plug"]


def _module_dim(module: nn.Module) -> int | None:
    for attr in ("dim", "embed_dim"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    return None


class Plug(nn.Module):
    """Residual attention (and optional MLP) block for CNN feature maps, ``[B, C, H, W] -> [B, C, H, W]``.

    Args:
        mechanism: a registered mechanism name (see ``list_attention()``) or an already built
            mechanism module (its ``layout`` attribute says tokens or spatial; default tokens).
        dim: channels ``C`` (inferred from a module's ``dim`` / ``embed_dim`` when omitted).
        num_heads: heads ``nh`` (needed with a name; must divide ``dim``).
        mlp_ratio: add ``x + mlp(norm(x))`` with hidden width ``mlp_ratio · C``; None = no MLP.
        norm_layer: normalisation over channels before each branch (default LayerNorm).
        init_values: LayerScale on both branches (small values keep the CNN's function at init).
        **attn_kwargs: mechanism keywords (``window_size=``, ``shift_size=``, ``qkv_bias=`` ...).
    """

    def __init__(self, mechanism: str | nn.Module, dim: int | None = None, num_heads: int | None = None, *,
                 mlp_ratio: float | None = None, norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 init_values: float | None = None, act_layer: Callable[[], nn.Module] = nn.GELU,
                 **attn_kwargs: Any) -> None:
        super().__init__()
        if isinstance(mechanism, str):
            spec = get_attention_spec(mechanism)
            if not isinstance(dim, int) or dim <= 0:
                raise ValueError(f"plug({mechanism!r}, ...) needs dim, a positive int (channels C); got {dim!r}")
            if not isinstance(num_heads, int) or num_heads <= 0:
                raise ValueError(f"plug({mechanism!r}, ...) needs num_heads, a positive int; got {num_heads!r}")
            self.attn = create_attention(mechanism, dim, num_heads, **attn_kwargs)
            self.layout = spec.layout
        elif isinstance(mechanism, nn.Module):
            if attn_kwargs or num_heads is not None:
                raise ValueError("num_heads / mechanism keywords only apply when mechanism is a registered name")
            inferred = _module_dim(mechanism)
            dim = dim if dim is not None else inferred
            if not isinstance(dim, int) or dim <= 0:
                raise ValueError(f"cannot infer the channels of {type(mechanism).__name__}; pass dim=C")
            self.attn = mechanism
            self.layout = getattr(mechanism, "layout", "tokens")
        else:
            raise TypeError(f"mechanism must be a registered name or an nn.Module, got {type(mechanism).__name__}")
        if self.layout not in ("tokens", "spatial"):
            raise ValueError(f"mechanism layout must be 'tokens' or 'spatial', got {self.layout!r}")
        self.dim = dim
        self.norm1 = norm_layer(dim)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        if mlp_ratio is not None:
            if mlp_ratio <= 0:
                raise ValueError(f"mlp_ratio must be positive or None, got {mlp_ratio!r}")
            self.norm2: nn.Module | None = norm_layer(dim)
            self.mlp: nn.Module | None = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer)
            self.ls2: nn.Module = LayerScale(dim, init_values) if init_values else nn.Identity()
        else:
            self.norm2, self.mlp, self.ls2 = None, None, nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, C, H, W]``."""
        if x.dim() != 4 or x.shape[1] != self.dim:
            raise ValueError(f"Plug expects a feature map [B, {self.dim}, H, W], got {tuple(x.shape)}")
        x = x.permute(0, 2, 3, 1)  # [B, H, W, C]
        x = x + self.ls1(apply_attention(self.attn, self.norm1(x)))  # the blocks' adapter
        if self.mlp is not None and self.norm2 is not None:
            x = x + self.ls2(self.mlp(self.norm2(x)))
        return x.permute(0, 3, 1, 2).contiguous()  # [B, C, H, W]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, layout={self.layout!r}"


def plug(mechanism: str | nn.Module, dim: int | None = None, num_heads: int | None = None, *,
         mlp_ratio: float | None = None, **kwargs: Any) -> Plug:
    """Wrap ``mechanism`` (a registered name or a module) for ``[B, C, H, W]`` networks; see :class:`Plug`."""
    return Plug(mechanism, dim, num_heads, mlp_ratio=mlp_ratio, **kwargs)
