"""Head split / merge: the one place tokens are reshaped into and out of attention heads."""

from __future__ import annotations

from torch import Tensor

__all__ = ["split_heads", "merge_heads", "split_qkv", "split_packed"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``[B, N, nh*hd]`` -> ``[B, nh, N, hd]``."""
    B, N, C = x.shape
    if C % num_heads:
        raise ValueError(f"channel dim {C} is not divisible by num_heads={num_heads}")
    return x.view(B, N, num_heads, C // num_heads).transpose(1, 2)  # [B, nh, N, hd]


def merge_heads(x: Tensor) -> Tensor:
    """``[B, nh, N, hd]`` -> ``[B, N, nh*hd]``."""
    B, nh, N, hd = x.shape
    return x.transpose(1, 2).reshape(B, N, nh * hd)  # [B, N, C]


def split_packed(x: Tensor, num_heads: int, parts: int, what: str = "packed") -> tuple[Tensor, ...]:
    """Packed projections ``[B, N, parts·C]`` -> ``parts`` tensors, each ``[B, nh, N, hd]``.

    The packed layout is ``[q | k | v]`` (or ``[k | v]``) along channels, heads contiguous inside
    each (the timm / torchvision / nn.MultiheadAttention layout).
    """
    B, N, Cp = x.shape
    if Cp % (parts * num_heads):
        raise ValueError(f"{what} width {Cp} is not divisible by {parts}*num_heads={parts * num_heads}")
    hd = Cp // (parts * num_heads)
    x = x.view(B, N, parts, num_heads, hd).permute(2, 0, 3, 1, 4)  # [parts, B, nh, N, hd]
    return x.unbind(0)


def split_qkv(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Packed ``[B, N, 3·C]`` -> q, k, v each ``[B, nh, N, hd]`` (see :func:`split_packed`)."""
    return split_packed(qkv, num_heads, 3, "packed qkv")  # type: ignore[return-value]
