"""Blocked local attention with halos (HaloNet, Vaswani et al. 2021), as timm's ``HaloAttn`` computes it.

A ``Hp x Wp`` map (each side a multiple of the block size ``b``) is cut into non-overlapping
``b x b`` query blocks; every query of a block attends to the same ``win x win`` key window
(``win = b + 2h``, ``h`` = ``halo_size``) centred on its block. Keys outside the map are the zeros
of the halo padding (timm pads the projected keys / values with zeros and does not mask them);
``pad_mask=True`` masks them instead.

Queries may be subsampled by a block stride ``s`` (timm's strided 1x1 ``q`` conv): the query map is
``Hp/s x Wp/s`` with ``b/s x b/s`` query blocks, keys stay at full resolution.

The relative logits are timm's factorised embedding (``PosEmbedRel``): tables ``height_rel`` and
``width_rel`` ``[2·win - 1, hd_qk]``; the logit of query ``(qy, qx)`` (inside its query block) and
key ``(ky, kx)`` (inside the window) gets ``q · height_rel[ky - qy + win - 1] + q · width_rel[kx - qx
+ win - 1]``. Here each is one small contraction against the per-row slice of the table (no
``2·win - 1`` logits computed and shifted as timm does), handed to the single attention function
as an additive ``bias``.

Index plans depend only on sizes and are cached (read-only CPU tensors).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import attention_observed, scaled_dot_product_attention
from .layout import PAD, AttentionLayout
from .window import _CPU, _cached

__all__ = ["halo_key_index", "halo_rel_index", "halo_rel_bias", "halo_layout", "halo_attention"]


def _check_sizes(Hp: int, Wp: int, block_size: int, halo_size: int, block_stride: int) -> None:
    if block_size < 1 or halo_size < 0 or block_stride < 1 or block_size % block_stride:
        raise ValueError(f"block_size must be >= 1 and divisible by the block stride, halo_size >= 0: got "
                         f"block_size={block_size}, halo_size={halo_size}, block_stride={block_stride}")
    if Hp % block_size or Wp % block_size:
        raise ValueError(f"the map {Hp}x{Wp} must be a multiple of block_size={block_size} on both sides; pad it first")


@_cached(maxsize=64)
def _key_index(Hp: int, Wp: int, block_size: int, halo_size: int) -> Tensor:
    b, h = block_size, halo_size
    win, Wpad = b + 2 * h, Wp + 2 * h
    rows = torch.arange(0, Hp, b, device=_CPU)[:, None] + torch.arange(win, device=_CPU)  # [nbh, win] (padded map)
    cols = torch.arange(0, Wp, b, device=_CPU)[:, None] + torch.arange(win, device=_CPU)  # [nbw, win]
    flat = rows[:, None, :, None] * Wpad + cols[None, :, None, :]  # [nbh, nbw, win, win]
    return flat.reshape(-1, win * win)


def halo_key_index(Hp: int, Wp: int, block_size: int, halo_size: int) -> Tensor:
    """Flat index of each block's window keys in the halo-padded ``(Hp + 2h) x (Wp + 2h)`` map:
    ``[nB, win²]`` (blocks row-major, keys ``ky·win + kx``). Cached."""
    _check_sizes(Hp, Wp, block_size, halo_size, 1)
    return _key_index(int(Hp), int(Wp), int(block_size), int(halo_size))


@_cached(maxsize=64)
def _rel_index(block_q: int, win: int) -> Tensor:
    return torch.arange(win, device=_CPU)[None, :] - torch.arange(block_q, device=_CPU)[:, None] + win - 1


def halo_rel_index(block_q: int, win: int) -> Tensor:
    """Row of the relative table per (query offset in its block, key offset in the window): ``[bq, win]``,
    ``k - q + win - 1`` (in ``[win - bq, 2·win - 2]``). Cached."""
    return _rel_index(int(block_q), int(win))


def halo_rel_bias(q: Tensor, height_rel: Tensor, width_rel: Tensor) -> Tensor:
    """Factorised relative logits of query blocks ``q [*b, bq, bq, hd]`` -> ``[*b, bq², win²]``.

    ``height_rel`` / ``width_rel`` ``[2·win - 1, hd]``; the logit of ``(qy, qx) -> (ky, kx)`` is
    ``q · height_rel[ky - qy + win - 1] + q · width_rel[kx - qx + win - 1]`` (timm's ``PosEmbedRel``).
    """
    bq, win = q.shape[-2], (height_rel.shape[0] + 1) // 2
    if q.shape[-3] != bq or width_rel.shape != height_rel.shape or height_rel.shape[-1] != q.shape[-1]:
        raise ValueError(f"q must be square query blocks [*b, bq, bq, hd] and the tables [2·win-1, hd] alike, got "
                         f"q {tuple(q.shape)}, height_rel {tuple(height_rel.shape)}, "
                         f"width_rel {tuple(width_rel.shape)}")
    idx = halo_rel_index(bq, win).to(height_rel.device)
    rel_h = torch.einsum("...yxd,ykd->...yxk", q, height_rel[idx])  # [*b, bq, bq, win] (key rows)
    rel_w = torch.einsum("...yxd,xkd->...yxk", q, width_rel[idx])  # [*b, bq, bq, win] (key cols)
    return (rel_h[..., :, None] + rel_w[..., None, :]).flatten(-4, -3).flatten(-2)  # [*b, bq², win²]


@_cached(maxsize=64)
def _key_inside(Hp: int, Wp: int, block_size: int, halo_size: int, H: int, W: int) -> Tensor:
    """``[nB, win²]`` True where the window key lies inside the ``H x W`` image (not padding)."""
    flat = _key_index(Hp, Wp, block_size, halo_size)
    Wpad = Wp + 2 * halo_size
    r, c = flat // Wpad - halo_size, flat % Wpad - halo_size
    return (r >= 0) & (r < H) & (c >= 0) & (c < W)


def halo_layout(H: int, W: int, Hp: int, Wp: int, block_size: int, halo_size: int,
                block_stride: int = 1) -> AttentionLayout:
    """Where the blocks' rows sit: groups = blocks; queries on the ``ceil(H/s) x ceil(W/s)`` query grid, keys on
    the ``H x W`` image (halo and block padding are PAD)."""
    _check_sizes(Hp, Wp, block_size, halo_size, block_stride)
    b, s = block_size, block_stride
    bq = b // s
    Hq, Wq, Wqp = (H + s - 1) // s, (W + s - 1) // s, Wp // s  # ceil (ONNX-safe form)
    rows = torch.arange(0, Hp // s, bq)[:, None] + torch.arange(bq)  # [nbh, bq]
    cols = torch.arange(0, Wqp, bq)[:, None] + torch.arange(bq)  # [nbw, bq]
    r, c = rows[:, None, :, None], cols[None, :, None, :]
    qpos = torch.where((r < Hq) & (c < Wq), r * Wq + c, PAD).reshape(-1, bq * bq)  # [nB, bq²]
    flat = halo_key_index(Hp, Wp, b, halo_size)
    Wpad = Wp + 2 * halo_size
    kr, kc = flat // Wpad - halo_size, flat % Wpad - halo_size
    kpos = torch.where((kr >= 0) & (kr < H) & (kc >= 0) & (kc < W), kr * W + kc, PAD)  # [nB, win²]
    return AttentionLayout((Hq, Wq), qpos, kpos, key_grid=(H, W))


def halo_attention(q: Tensor, kv: Tensor, num_heads: int, block_size: int, halo_size: int, *,
                   height_rel: Tensor | None = None, width_rel: Tensor | None = None, scale: float | None = None,
                   scale_pos_embed: bool = False, pad_mask: bool = False, dropout_p: float = 0.0,
                   grid: tuple[int, int] | None = None, fused: bool | None = None,
                   backend: str | None = None) -> Tensor:
    """Halo attention of channels-last projections -> ``[B, Hp/s, Wp/s, nh·hd_v]``.

    Args:
        q: queries ``[B, Hp/s, Wp/s, nh·hd_qk]`` (``s`` the block stride, read from the sizes).
        kv: keys and values ``[B, Hp, Wp, nh·(hd_qk + hd_v)]``, per head ``k`` then ``v`` (timm's ``kv`` conv).
            ``Hp, Wp`` multiples of ``block_size``.
        height_rel, width_rel: the relative tables ``[2·win - 1, hd_qk]`` (both or neither).
        scale: logit scale (default ``hd_qk^-1/2``); ``scale_pos_embed``: it multiplies the relative logits too.
        pad_mask: mask keys outside the ``grid`` image instead of attending to the zero padding (timm).
        grid: the unpadded ``(H, W)`` image inside ``Hp x Wp`` (default the whole map): recorded maps and ``pad_mask``.
        fused: the caller's captured fused-attention switch (None: the process default; see
            :func:`.attention.scaled_dot_product_attention`).
        backend: the caller's captured attention backend (None: the process default; :mod:`.flex`).
    """
    B, Hp, Wp, Ckv = kv.shape
    Bq, Hq, Wq, Cqk = q.shape
    if B != Bq or Hq == 0 or Hp % Hq or Wp % Wq or Hp // Hq != Wp // Wq:
        raise ValueError(f"q [B, Hp/s, Wp/s, C] and kv [B, Hp, Wp, C'] disagree: q {tuple(q.shape)}, "
                         f"kv {tuple(kv.shape)}")
    s = Hp // Hq
    _check_sizes(Hp, Wp, block_size, halo_size, s)
    nh = num_heads
    if Cqk % nh or (Ckv - Cqk) % nh or Ckv <= Cqk:
        raise ValueError(f"q channels {Cqk} and kv channels {Ckv} must split into num_heads={nh} heads of q/k and v")
    dqk, dv = Cqk // nh, (Ckv - Cqk) // nh
    if (height_rel is None) != (width_rel is None):
        raise ValueError("height_rel and width_rel go together (both or neither)")
    b, h, bq = block_size, halo_size, block_size // s
    win = b + 2 * h
    nbh, nbw = Hp // b, Wp // b
    nB = nbh * nbw
    # [B, nbh, bq, nbw, bq, nh, dqk] -> [B, nB, nh, bq, bq, dqk]
    qb = q.reshape(B, nbh, bq, nbw, bq, nh, dqk).permute(0, 1, 3, 5, 2, 4, 6).reshape(B, nB, nh, bq, bq, dqk)
    kvp = torch.nn.functional.pad(kv, (0, 0, h, h, h, h)).flatten(1, 2)  # [B, (Hp+2h)(Wp+2h), Ckv], zero halo
    ki = halo_key_index(Hp, Wp, b, h).to(kv.device)  # [nB, win²]
    kvw = kvp[:, ki.reshape(-1)].view(B, nB, win * win, nh, dqk + dv).transpose(2, 3)  # [B, nB, nh, win², dqk+dv]
    k, v = kvw[..., :dqk], kvw[..., dqk:]
    scale = dqk ** -0.5 if scale is None else scale
    bias = None
    if height_rel is not None:
        bias = halo_rel_bias(qb, height_rel, width_rel)  # [B, nB, nh, bq², win²]
        if scale_pos_embed:
            bias = bias * scale
    H, W = grid or (Hp, Wp)
    mask = None
    if pad_mask:
        mask = _key_inside(Hp, Wp, b, h, H, W).to(kv.device)[:, None, None, :]  # [nB, 1, 1, win²]
    layout = halo_layout(H, W, Hp, Wp, b, h, s) if attention_observed() else None
    out = scaled_dot_product_attention(qb.flatten(-3, -2), k, v, bias=bias, mask=mask, scale=scale,
                                       dropout_p=dropout_p, layout=layout,
                                       fused=fused, backend=backend)  # [B, nB, nh, bq², dv]
    # [B, nbh, nbw, nh, bq, bq, dv] -> [B, nbh, bq, nbw, bq, nh, dv]
    out = out.view(B, nbh, nbw, nh, bq, bq, dv).permute(0, 1, 4, 2, 5, 3, 6)
    return out.reshape(B, nbh * bq, nbw * bq, nh * dv)
