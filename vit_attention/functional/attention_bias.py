"""LeViT's attention bias (Graham et al., ICCV 2021): a learned table per head indexed by the absolute offset
``(|Δy|, |Δx|)`` between a query and a key, and the BatchNorm folds of LeViT's linears.

For a key grid ``H x W`` and queries on the same grid read every ``stride``-th row and column (``stride = 1``: the
grid itself; 2: LeViT's shrink attention, ``ceil(H/2) x ceil(W/2)`` queries at the grid points ``0, 2, 4, ...``)::

    idx[i, j] = |s·yq_i - y_j| · W + |s·xq_i - x_j|        table [nh, H·W],  bias[h, i, j] = table[h, idx[i, j]]

timm 1.0.31 ``timm/models/levit.py`` (``Attention`` / ``AttentionDownsample._compute_attention_bias_idxs``, ndgrid
order); facebookresearch/LeViT ``levit.py`` builds the same index from a dict of offsets in first-seen order, which
for ``(0, 0)`` first is row-major ``(|Δy|, |Δx|)``. The bias is even in both offsets, so the table has ``H·W``
entries, not ``(2H-1)(2W-1)``. A table belongs to one grid: another grid reads it resampled as an ``(H, W)`` image
(:func:`resize_attention_bias_table`, the rule timm's ``resize_rel_pos_bias_table_levit`` applies).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .flex import AttentionPattern
from .window import _CPU, _cached, to_pair

__all__ = ["attention_bias_index", "attention_bias_pattern", "query_grid", "resize_attention_bias_table",
           "fold_norm_linear"]


def query_grid(grid: tuple[int, int], stride: int) -> tuple[int, int]:
    """The query grid of a key grid ``(H, W)`` read every ``stride``-th point: ``(ceil(H/s), ceil(W/s))``."""
    return (grid[0] - 1) // stride + 1, (grid[1] - 1) // stride + 1


@_cached(maxsize=64)
def _index(H: int, W: int, stride: int, device: torch.device) -> Tensor:
    ky, kx = torch.meshgrid(torch.arange(H, device=_CPU), torch.arange(W, device=_CPU), indexing="ij")
    qy, qx = ky[::stride, ::stride].reshape(-1, 1), kx[::stride, ::stride].reshape(-1, 1)  # [Nq, 1]
    index = (qy - ky.reshape(1, -1)).abs() * W + (qx - kx.reshape(1, -1)).abs()  # [Nq, H·W]
    return index.to(device)


def attention_bias_index(grid: int | tuple[int, int], stride: int = 1, *,
                         device: torch.device | str | None = None) -> Tensor:
    """The table index ``[Nq, H·W]`` (long) of a key grid ``(H, W)`` with queries every ``stride``-th point.

    ``Nq = ceil(H/s)·ceil(W/s)``; entry ``(i, j)`` is ``|s·yq_i - y_j|·W + |s·xq_i - x_j|`` (row-major positions).
    Cached per (grid, stride, device), built outside any trace (a constant of an exported graph): do not modify
    the result.
    """
    H, W = to_pair(grid, "grid")
    if min(H, W) <= 0:
        raise ValueError(f"grid must be positive (the key grid (H, W)), got {grid!r}")
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
        raise ValueError(f"stride must be an int >= 1 (queries every stride-th grid point), got {stride!r}")
    return _index(H, W, stride, torch.device(device or "cpu"))


def attention_bias_pattern(table: Tensor, grid: tuple[int, int], stride: int = 1,
                           num_prefix_tokens: int = 0) -> AttentionPattern:
    """The bias as a FlexAttention ``score_mod``: ``score + table[h, |s·yq - yk|·W + |s·xq - xk|]`` with the index
    computed from the two positions (:func:`attention_bias_index`'s rule), so no ``[Nq, N]`` tensor is built; every
    key is visible. ``table``: ``[nh, H·W]`` of the key grid ``grid`` (gradients reach it through FlexAttention);
    queries on every ``stride``-th point; ``num_prefix_tokens`` tokens in front of both sequences get no bias."""
    H, W = grid
    h, w = query_grid(grid, stride)
    P = num_prefix_tokens

    def score_mod(score: Tensor, b: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qg, kg = (q_idx - P).clamp(min=0), (kv_idx - P).clamp(min=0)  # grid indices (prefix tokens masked below)
        index = (qg // w * stride - kg // W).abs() * W + (qg % w * stride - kg % W).abs()
        return score + torch.where((q_idx < P) | (kv_idx < P), 0.0, table[head, index])

    return AttentionPattern(P + h * w, P + H * W, score_mod=score_mod, cache_key=("attention_bias", H, W, stride, P))


def resize_attention_bias_table(table: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int]) -> Tensor:
    """A table ``[nh, H·W]`` of grid ``old_grid`` for ``new_grid`` ``-> [nh, H'·W']``.

    The table is an image ``[nh, H, W]`` of the offsets ``(|Δy|, |Δx|)``, resampled bicubic with antialiasing in
    float32 and cast back: timm 1.0.31 ``resize_rel_pos_bias_table_levit`` (``timm/layers/pos_embed_rel.py``, from
    TinyViT), which takes square grids; a non-square grid is resampled to ``(H', W')`` by the same rule. Same grid:
    the table itself.
    """
    H, W = old_grid
    if table.dim() != 2 or table.shape[1] != H * W:
        raise ValueError(f"a LeViT table of grid {tuple(old_grid)} has shape [nh, {H * W}] (one entry per "
                         f"(|dy|, |dx|)), got {tuple(table.shape)}")
    if tuple(old_grid) == tuple(new_grid):
        return table
    image = table.float().reshape(1, table.shape[0], H, W)
    out = F.interpolate(image, size=tuple(new_grid), mode="bicubic", antialias=True)  # [1, nh, H', W']
    return out.reshape(table.shape[0], -1).to(table.dtype)


def fold_norm_linear(bn: nn.modules.batchnorm._BatchNorm, linear: nn.Linear) -> tuple[Tensor, Tensor]:
    """``(weight [Cout, Cin], bias [Cout])`` of ``linear(bn(x))`` as one linear layer (BatchNorm in eval mode).

    The head's order (BatchNorm before the linear, LeViT's ``NormLinear``): with ``s = γ / sqrt(σ² + ε)`` and
    ``t = β - μ·s``, ``W' = W·diag(s)`` and ``b' = W t + b``. The other order (linear, then BatchNorm) is
    :func:`~vit_attention.functional.batch_norm.fold_batch_norm`.
    """
    assert bn.running_var is not None and bn.running_mean is not None
    scale = bn.running_var.add(bn.eps).rsqrt()  # [Cin]
    if bn.weight is not None:
        scale = scale * bn.weight
    shift = -bn.running_mean * scale if bn.bias is None else bn.bias - bn.running_mean * scale  # [Cin]
    bias = linear.weight @ shift  # [Cout]
    if linear.bias is not None:
        bias = bias + linear.bias
    return linear.weight * scale.view(1, -1), bias
