"""Hiera's token order (Ryali et al., "Hiera: A Hierarchical Vision Transformer without the Bells-and-Whistles",
ICML 2023): the unroll of a map, its inverse (reroll), and the grid positions of the unrolled tokens.

Hiera keeps its tokens in an *unrolled* order so that 2x2 max-pooling and mask-unit attention are plain reshapes.
With ``k`` unroll steps of stride 2x2 on an ``H x W`` map (timm 1.0.31 ``timm/models/hiera.py`` ``Unroll``,
facebookresearch/hiera ``hiera_utils.py``), the token at ``(y, x)`` moves to position::

    n = (((a_1·4 + a_2)·4 + ...)·4 + a_k)·nMU + (y >> k)·(W >> k) + (x >> k)
    a_j = ((y >> (j-1)) & 1)·2 + ((x >> (j-1)) & 1),      nMU = (H >> k)·(W >> k)

(the finest stride bit slowest, the mask-unit index fastest). Consequences the mechanism uses:

* the tokens of one mask unit (a ``2^k x 2^k`` window of the map) are those with the same ``n mod nMU``;
* a 2x2 max-pool of any per-token tensor is ``x.view(B, 4, N/4, C).amax(1)``, whose result is in the unrolled
  order of ``k - 1`` steps on the ``H/2 x W/2`` map.

Everything here is a view / permute (no gather), so it traces, exports and runs on an empty batch.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = ["check_unroll_grid", "unroll", "reroll", "unrolled_positions", "unit_positions"]


def check_unroll_grid(grid: tuple[int, int], steps: int, what: str = "feat_size") -> tuple[int, int]:
    """``(H, W)`` as ints after checking both are divisible by ``2^steps`` (a mask unit of the unrolled order);
    a ``ValueError`` names ``what`` and the rule otherwise."""
    H, W = int(grid[0]), int(grid[1])
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"steps must be an int >= 0 (unroll steps of stride 2), got {steps!r}")
    side = 1 << steps
    if H < 1 or W < 1 or H % side or W % side:
        raise ValueError(f"{what}={(H, W)} must be positive multiples of {side} (the mask unit side 2^{steps} of "
                         f"Hiera's unrolled token order)")
    return H, W


def _unroll_perm(steps: int) -> list[int]:
    """The permutation of ``[B, Hh, b_k .. b_1, Wh, c_k .. c_1, C]`` into ``[B, (b_1, c_1), .., (b_k, c_k), Hh, Wh,
    C]`` (the unrolled order)."""
    k = steps
    y_bits = {j: 2 + (k - j) for j in range(1, k + 1)}  # dim of bit j of y (b_j), after [B, Hh]
    x_bits = {j: 3 + k + (k - j) for j in range(1, k + 1)}  # dim of bit j of x (c_j), after [.., Wh]
    perm = [0]
    for j in range(1, k + 1):
        perm += [y_bits[j], x_bits[j]]
    return perm + [1, 2 + k, 3 + 2 * k]


def unroll(x: Tensor, steps: int) -> Tensor:
    """A channels-last map ``[B, H, W, C]`` -> tokens ``[B, H·W, C]`` in Hiera's unrolled order of ``steps`` 2x2
    steps (``H``, ``W`` multiples of ``2^steps``)."""
    B, H, W, C = x.shape
    H, W = check_unroll_grid((H, W), steps, "the map size (H, W)")
    k = steps
    Hh, Wh = H >> k, W >> k
    x = x.reshape(B, Hh, *([2] * k), Wh, *([2] * k), C)
    return x.permute(_unroll_perm(k)).reshape(B, H * W, C)


def reroll(x: Tensor, grid: tuple[int, int], steps: int) -> Tensor:
    """Tokens ``[B, H·W, C]`` in Hiera's unrolled order of ``steps`` steps on ``grid = (H, W)`` -> the map
    ``[B, H, W, C]`` in image order (the inverse of :func:`unroll`)."""
    H, W = check_unroll_grid(grid, steps, "grid")
    B, N, C = x.shape
    if N != H * W:
        raise ValueError(f"x has {N} tokens, the grid {H}x{W} holds {H * W}")
    k = steps
    perm = _unroll_perm(k)
    inverse = [perm.index(i) for i in range(len(perm))]
    x = x.reshape(B, *([2] * (2 * k)), H >> k, W >> k, C)
    return x.permute(inverse).reshape(B, H, W, C)


@functools.lru_cache(maxsize=64)
def _positions(H: int, W: int, steps: int) -> Tensor:
    grid = torch.arange(H * W, device="cpu").view(1, H, W, 1)
    return unroll(grid, steps).view(-1)


def unrolled_positions(grid: tuple[int, int], steps: int) -> Tensor:
    """long ``[H·W]`` (CPU, cached): the row-major grid index ``y·W + x`` of each token of the unrolled order."""
    H, W = check_unroll_grid(grid, steps, "grid")
    return _positions(H, W, int(steps))


def unit_positions(grid: tuple[int, int], steps: int) -> Tensor:
    """long ``[nMU, 4^steps]`` (CPU): the grid index of each mask unit's tokens, in the order the unrolled
    sequence holds them (token ``t`` of unit ``u`` is unrolled position ``t·nMU + u``)."""
    pos = unrolled_positions(grid, steps)
    w = 4 ** int(steps)
    return pos.view(w, -1).t().contiguous()
