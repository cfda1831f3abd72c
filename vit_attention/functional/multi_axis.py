"""MaxViT's multi-axis partitions (Tu et al., ECCV 2022): block (window) and grid (dilated) partitions of a map.

Pure functions on channels-last maps ``[B, H, W, C]`` for :mod:`vit_attention.attention.multi_axis`. With the
partition side ``(ph, pw)`` (P for block, the group side G for grid; timm 1.0.31 ``timm/models/maxxvit.py``
``window_partition`` / ``grid_partition``) and ``(gh, gw) = (H / ph, W / pw)``:

* block: partition ``(r // ph, c // pw)``, position inside ``(r % ph, c % pw)``: a contiguous window;
* grid: partition ``(r % gh, c % gw)``, position inside ``(r // gh, c // gw)``: ``ph x pw`` tokens spread over
  the whole map, ``gh`` rows and ``gw`` columns apart.

Partitions in row-major order of partitions, tokens row-major inside one (timm's and torchvision's order), so
grid attention is window attention on the map whose rows ``r -> (r % gh)·ph + r // gh`` (and columns likewise)
are regrouped. The relative-position bias uses the TF table layout ``[nh, 2ph-1, 2pw-1]`` read at
``(r_k - r_q + ph-1, c_k - c_q + pw-1)`` (key minus query, in-partition coordinates;
google-research/maxvit ``attention_utils.py``, timm ``RelPosBiasTf``).

Sizes the partition does not tile: an axis no longer than the side takes the map's side (one partition along it);
otherwise the map is zero-padded bottom / right to a multiple of the side (no reference pads: the library's
policy, the padded keys masked by the caller; :func:`partition_positions` marks them ``-1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .flex import AttentionPattern, flex_buffer
from .window import _CPU, _cached, to_pair

__all__ = ["PartitionKind", "PARTITION_KINDS", "partition_geometry", "multi_axis_partition", "multi_axis_reverse",
           "partition_positions", "tf_relative_position_index", "multi_axis_pattern"]

PartitionKind = Literal["block", "grid"]
PARTITION_KINDS: tuple[str, ...] = ("block", "grid")


def _check_kind(kind: str) -> None:
    if kind not in PARTITION_KINDS:
        raise ValueError(f"kind must be 'block' or 'grid', got {kind!r}")


def partition_geometry(H: int, W: int, partition_size: int | Sequence[int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The partition side used on an ``H x W`` map and the padded map: ``((ph, pw), (Hp, Wp))``.

    Per axis: a side no smaller than the map becomes the map's side (one partition across it, no padding); else
    the map is padded up to a multiple of the side. The same for block and grid partitions.
    """
    sh, sw = to_pair(partition_size, "window_size")
    ph, pw = min(sh, H), min(sw, W)
    ph, pw = max(ph, 1), max(pw, 1)
    return (ph, pw), (H + (-H) % ph, W + (-W) % pw)


def multi_axis_partition(x: Tensor, partition_size: tuple[int, int], kind: PartitionKind) -> Tensor:
    """``[B, H, W, C] -> [B·nP, ph·pw, C]``: block windows or grid groups (module docstring); ``H, W`` multiples
    of the side (pad first)."""
    _check_kind(kind)
    B, H, W, C = x.shape
    ph, pw = partition_size
    if H % ph or W % pw:
        raise ValueError(f"multi_axis_partition: map {H}x{W} is not a multiple of the partition {(ph, pw)}; pad it")
    if kind == "block":
        x = x.view(B, H // ph, ph, W // pw, pw, C).permute(0, 1, 3, 2, 4, 5)  # [B, gh, gw, ph, pw, C]
    else:
        x = x.view(B, ph, H // ph, pw, W // pw, C).permute(0, 2, 4, 1, 3, 5)  # [B, gh, gw, ph, pw, C]
    return x.reshape(B * (H // ph) * (W // pw), ph * pw, C)


def multi_axis_reverse(parts: Tensor, partition_size: tuple[int, int], size: tuple[int, int],
                       kind: PartitionKind) -> Tensor:
    """Inverse of :func:`multi_axis_partition`: ``[B·nP, ph·pw, C] -> [B, H, W, C]`` (``size = (H, W)``)."""
    _check_kind(kind)
    ph, pw = partition_size
    H, W = size
    C = parts.shape[-1]
    x = parts.reshape(-1, H // ph, W // pw, ph, pw, C)  # [B, gh, gw, ph, pw, C]
    if kind == "block":
        x = x.permute(0, 1, 3, 2, 4, 5)  # [B, gh, ph, gw, pw, C]
    else:
        x = x.permute(0, 3, 1, 4, 2, 5)  # [B, ph, gh, pw, gw, C]
    return x.reshape(-1, H, W, C)


@_cached(maxsize=128)
def _partition_positions(H: int, W: int, ph: int, pw: int, kind: str, device: torch.device) -> Tensor:
    Hp, Wp = H + (-H) % ph, W + (-W) % pw
    rows = torch.arange(Hp, device=_CPU)[:, None].expand(Hp, Wp)
    cols = torch.arange(Wp, device=_CPU)[None, :].expand(Hp, Wp)
    flat = torch.where((rows < H) & (cols < W), rows * W + cols, -1)  # [Hp, Wp]; -1 = padding
    parts = multi_axis_partition(flat.reshape(1, Hp, Wp, 1), (ph, pw), kind)  # type: ignore[arg-type]
    return parts.reshape(-1, ph * pw).to(device)  # [nP, N]


def partition_positions(H: int, W: int, partition_size: tuple[int, int], kind: PartitionKind, *,
                        device: torch.device | str | None = None) -> Tensor:
    """Flat map index ``r·W + c`` of each slot of each partition, ``-1`` for a padded slot: long ``[nP, N]``.

    The partitions of the ``H x W`` map padded to ``partition_size`` multiples (:func:`partition_geometry`'s
    ``(Hp, Wp)``). Cached per (sizes, kind, device): do not modify the result.
    """
    _check_kind(kind)
    ph, pw = partition_size
    return _partition_positions(int(H), int(W), int(ph), int(pw), kind, torch.device(device or "cpu"))


@_cached(maxsize=64)
def _tf_relative_position_index(ph: int, pw: int, device: torch.device) -> Tensor:
    rows, cols = torch.arange(ph, device=_CPU), torch.arange(pw, device=_CPU)
    coords = torch.stack(torch.meshgrid(rows, cols, indexing="ij")).flatten(1)  # [2, N]
    rel = coords[:, None, :] - coords[:, :, None]  # [2, N(q), N(k)]: key minus query
    return ((rel[0] + ph - 1) * (2 * pw - 1) + (rel[1] + pw - 1)).to(device)  # [N, N]


def tf_relative_position_index(partition_size: int | Sequence[int], *,
                               device: torch.device | str | None = None) -> Tensor:
    """Index into a flattened TF table ``[nh, (2ph-1)·(2pw-1)]`` for each (query, key) pair: long ``[N, N]``.

    ``(r_k - r_q + ph-1)·(2pw-1) + (c_k - c_q + pw-1)`` (key minus query; google-research/maxvit and timm
    ``RelPosBiasTf``). Cached per (size, device): do not modify the result.
    """
    ph, pw = to_pair(partition_size, "window_size")
    return _tf_relative_position_index(ph, pw, torch.device(device or "cpu"))


def multi_axis_pattern(num_partitions: int, tokens: int, stride: int, position_bias: Tensor | None,
                       valid: Tensor | None = None, geometry: tuple[object, ...] = ()) -> AttentionPattern:
    """Block or grid attention over the partition-major sequence as one :class:`AttentionPattern`.

    The sequence holds the ``nP`` partitions one after the other, ``stride >= N`` positions each (the slots past
    ``N = tokens`` are never attended to), tokens row-major inside a partition: block-diagonal for both
    partitions (the grid's regrouping happened when the sequence was built).

    * ``mask_mod``: query and key in the same partition and the key a real slot (``valid [nP·stride]`` bool:
      not padding; None = every slot ``< N``);
    * ``score_mod``: ``position_bias[h, q % stride, kv % stride]`` (``[nh, N, N]``, padded to the stride).

    ``geometry``: what ``valid`` depends on (map size, partition, kind), part of the block mask's cache key.
    """
    S, N = int(stride), int(tokens)
    L = num_partitions * S
    pos = None
    if position_bias is not None:
        pos = position_bias if S == N else F.pad(position_bias, (0, S - N, 0, S - N))  # [nh, S, S]
    pos = flex_buffer(pos)
    keep = flex_buffer(valid)

    if keep is not None:
        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return (q_idx // S == kv_idx // S) & keep[kv_idx]
        key: tuple[object, ...] = ("multi_axis", N, S, "valid", *geometry)
    elif S != N:
        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return (q_idx // S == kv_idx // S) & (kv_idx % S < N)
        key = ("multi_axis", N, S)
    else:
        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return q_idx // S == kv_idx // S
        key = ("multi_axis", N, S)

    score_mod = None
    if pos is not None:
        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + pos[h, q_idx % S, kv_idx % S].to(score.dtype)

    return AttentionPattern(L, L, mask_mod=mask_mod, score_mod=score_mod, cache_key=key)
