"""MobileViT's patch unfolding: pixels at the same offset inside ``p x p`` patches form one sequence.

A channels-last map ``[B, H, W, C]`` with ``H = nh·p``, ``W = nw·p`` is cut into ``N = nh·nw``
patches of ``P = p·p`` pixels. Unfolding gathers, for each intra-patch offset ``(py, px)``, the
``N`` pixels at that offset (one per patch, patches row-major), so attention over a sequence runs
*across* patches between pixels at the same offset (Mehta & Rastegari 2022, "MobileViT"):

    [B, nh·p, nw·p, C]  ->  [B, P, N, C]     offset index py·p + px, patch index ny·nw + nx

This is the order of timm / Hugging Face / ml-cvnets (batch index ``b·P + offset`` there).
Maps that are not patch multiples are either resized (the references' bilinear rule, done by
the caller) or zero-padded with the padded slots masked out of every softmax
(:func:`patch_positions` marks them ``-1``). Index tensors are built once per size (cached).
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from .layout import PAD, AttentionLayout
from .window import _CPU, _cached

__all__ = ["patch_grid", "unfold_patches", "fold_patches", "patch_positions", "patch_key_mask", "unfold_layout",
           "separable_layout"]


def patch_grid(H: int, W: int, patch_size: int) -> tuple[int, int]:
    """Patches ``(nh, nw)`` covering an ``H x W`` map (the last row / column padded when needed)."""
    if patch_size <= 0:
        raise ValueError(f"patch_size must be a positive int, got {patch_size!r}")
    p = patch_size  # positive operands only: ONNX divides by truncation, Python by floor
    return (H + p - 1) // p, (W + p - 1) // p


def unfold_patches(x: Tensor, patch_size: int) -> Tensor:
    """``[..., nh·p, nw·p, C] -> [..., P, N, C]``: the pixels at each intra-patch offset, patches row-major."""
    return rearrange(x, "... (nh ph) (nw pw) c -> ... (ph pw) (nh nw) c", ph=patch_size, pw=patch_size)


def fold_patches(x: Tensor, patch_size: int, grid: tuple[int, int]) -> Tensor:
    """Inverse of :func:`unfold_patches`: ``[..., P, N, C] -> [..., nh·p, nw·p, C]`` with ``grid = (nh, nw)``."""
    return rearrange(x, "... (ph pw) (nh nw) c -> ... (nh ph) (nw pw) c", ph=patch_size, pw=patch_size,
                     nh=grid[0], nw=grid[1])


@_cached(maxsize=64)
def _patch_positions(H: int, W: int, p: int) -> Tensor:
    nh, nw = patch_grid(H, W, p)
    idx = torch.full((nh * p, nw * p), PAD, dtype=torch.long, device=_CPU)
    idx[:H, :W] = torch.arange(H * W, device=_CPU).view(H, W)
    return unfold_patches(idx[..., None], p)[..., 0].contiguous()  # [P, N]


def patch_positions(H: int, W: int, patch_size: int) -> Tensor:
    """``[P, N]``: flat index ``row·W + col`` of the pixel in each (offset, patch) slot, ``-1`` where padded.

    Cached; read-only.
    """
    return _patch_positions(int(H), int(W), int(patch_size))


@_cached(maxsize=64)
def _patch_key_mask(H: int, W: int, p: int, nh: int, device: torch.device) -> Tensor:
    real = patch_positions(H, W, p) >= 0  # [P, N]
    return real[:, None, None, :].expand(-1, nh, 1, -1).reshape(1, -1, 1, real.shape[1]).to(device)


def patch_key_mask(H: int, W: int, patch_size: int, num_heads: int = 1, device: torch.device | str | None = None
                   ) -> Tensor | None:
    """``[1, P·nh, 1, N]`` bool, True on real (not padded) key slots of each (offset, head) row of
    offsets folded into heads; None when the map is a patch multiple. Cached; read-only."""
    if H % patch_size == 0 and W % patch_size == 0:
        return None
    return _patch_key_mask(int(H), int(W), int(patch_size), int(num_heads), torch.device(device or "cpu"))


@_cached(maxsize=64)
def _unfold_layout(H: int, W: int, p: int) -> AttentionLayout:
    pos = patch_positions(H, W, p)  # [P, N]
    return AttentionLayout((H, W), pos, pos, fold="heads")


def unfold_layout(H: int, W: int, patch_size: int) -> AttentionLayout:
    """Attention across unfolded patches of an ``H x W`` map: ``P`` groups (offsets) of ``N`` tokens each,
    weights ``[B, P·nh, N, N]`` (offsets folded into the heads). Cached."""
    return _unfold_layout(int(H), int(W), int(patch_size))


@_cached(maxsize=64)
def _separable_layout(H: int, W: int, p: int) -> AttentionLayout:
    pos = patch_positions(H, W, p)  # [P, N]
    query = torch.full((pos.shape[0], 1), PAD, dtype=torch.long, device=_CPU)  # the one all-ones query per group
    return AttentionLayout((H, W), query, pos, fold="heads", query_cells=pos[:, None, :])


def separable_layout(H: int, W: int, patch_size: int) -> AttentionLayout:
    """Separable attention (MobileViT v2) over unfolded patches: per offset group ONE shared query row
    (standing for every pixel of the group) over its ``N`` keys; weights ``[B, P·nh, 1, N]``. Cached."""
    return _separable_layout(int(H), int(W), int(patch_size))
