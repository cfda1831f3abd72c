"""Head split / merge: the one place tokens are reshaped into and out of attention heads."""

from __future__ import annotations

from torch import Tensor

__all__ = ["split_heads", "merge_heads", "split_qkv"]


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


def split_qkv(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Packed projections ``[B, N, 3*C]`` -> q, k, v each ``[B, nh, N, hd]``.

    The packed layout is ``[q | k | v]`` along channels, heads contiguous inside each
    (the timm / torchvision / nn.MultiheadAttention layout).
    """
    B, N, C3 = qkv.shape
    if C3 % (3 * num_heads):
        raise ValueError(f"packed qkv width {C3} is not divisible by 3*num_heads={3 * num_heads}")
    hd = C3 // (3 * num_heads)
    qkv = qkv.view(B, N, 3, num_heads, hd).permute(2, 0, 3, 1, 4)  # [3, B, nh, N, hd]
    return qkv.unbind(0)
