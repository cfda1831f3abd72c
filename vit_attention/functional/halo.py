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

**FlexAttention** (backend ``"flex"``, :func:`halo_pattern`): one call over all ``Nq`` queries of the
query map against the ``(Hp + 2h)·(Wp + 2h)`` keys of the halo-padded map (no block partition, no
gathered windows): ``mask_mod`` = the key lies in the window of the query's block (and inside the image
with ``pad_mask``), ``score_mod`` = the relative logits, read from the per-query tables ``q · R_hᵀ``,
``q · R_wᵀ`` ``[B, nh, Nq, 2·win - 1]`` at ``ky - qy + win - 1`` / ``kx - qx + win - 1`` (the small
tensors FlexAttention differentiates through). Queries run row-major or block-major (each ``bq x bq``
block contiguous), keys row-major or in ``b x b`` tiles of the padded map: whichever pair skips the most
128 x 128 blocks for the geometry (counted exactly, :data:`ORDERS`; block / tile on large maps).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import scaled_dot_product_attention
from .flex import AttentionPattern, flex_buffer, use_flex
from .layout import PAD, AttentionLayout
from .neighborhood import _FLEX_BLOCK, _graph_inputs, token_order
from .observers import attention_observed
from .window import _CPU, _cached, assume_constant_result

__all__ = ["halo_key_index", "halo_rel_index", "halo_rel_bias", "halo_layout", "halo_attention", "halo_pattern",
           "halo_rel_logits", "ORDERS"]


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
        backend: the caller's captured attention backend (None: the process default; :mod:`.flex`). When
            it selects FlexAttention (:func:`.flex.use_flex`) the whole map is one :func:`halo_pattern`.
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
    if use_flex(backend, fused, kv.device, mechanism="halo"):
        return _halo_flex(q, kv, nh, block_size, halo_size, height_rel=height_rel, width_rel=width_rel, scale=scale,
                          scale_pos_embed=scale_pos_embed, pad_mask=pad_mask, dropout_p=dropout_p, grid=grid,
                          fused=fused)
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


# ----------------------------------------------------------------------------- FlexAttention: one pattern
# Token orders of the flex path: queries "row" (row-major on the query map) or "block" (each bq x bq query block
# contiguous), keys "row" (row-major on the halo-padded map) or "tile" (b x b tiles of it). Which skips the most
# 128 x 128 blocks depends on the map (share of blocks skipped, measured: row/row, block/row, row/tile,
# block/tile):
#   64 x 64, b = 8, h = 3: 77.9 %, 78.8 %, 75.6 %, 88.2 %     96 x 96, b = 8, h = 3: 85.3 %, 86.0 %, 83.5 %, 94.4 %
#   56 x 56, b = 7, h = 2: 75.9 %, 77.1 %, 72.6 %, 82.3 %     32 x 32, b = 8, h = 2: 61.4 %, 62.5 %, 54.5 %, 63.6 %
#   16 x 16, b = 8, h = 2: 37.5 %, 37.5 %, 25.0 %, 25.0 %     32 x 32, b = 8, h = 2, stride 2: 40.9 %, 40.9 %,
#   36.4 %, 36.4 %
# so each geometry takes the pair with the fewest visited blocks, counted exactly from the blocks' windows
# (:func:`_flex_orders`, cheap: one entry per block and window key); ties keep row-major (no gathers).
ORDERS: tuple[tuple[str, str], ...] = (("row", "row"), ("block", "row"), ("row", "tile"), ("block", "tile"))
FLEX_ORDER: tuple[str, str] | None = None  # None: the best of ORDERS per geometry; a pair forces one (tests)


def _order(H: int, W: int, order: str, tile: int) -> Tensor:
    """Sequence position -> flat index on an ``H x W`` grid: ``"row"`` or ``tile x tile`` tiles (``"block"`` /
    ``"tile"``). CPU, cached through :func:`.neighborhood.token_order`."""
    return token_order(H, W, "row" if order == "row" else "tile", tile)


@_cached(maxsize=64)
def _visited_blocks(Hp: int, Wp: int, block_size: int, halo_size: int, stride: int, orders: tuple[str, str]) -> int:
    """How many ``128 x 128`` blocks of the ``Nq x M`` logits in ``orders`` hold a (query, window key) pair."""
    b, h, s = block_size, halo_size, stride
    bq, Wq, Wk = b // s, Wp // s, Wp + 2 * h
    qperm = _order(Hp // s, Wq, orders[0], bq)
    kpos = torch.argsort(_order(Hp + 2 * h, Wk, orders[1], b))  # flat padded-map index -> key position
    block = (qperm // Wq) // bq * (Wp // b) + (qperm % Wq) // bq  # each query position's block
    n_q, n_k = -(-qperm.numel() // _FLEX_BLOCK), -(-kpos.numel() // _FLEX_BLOCK)
    holds = torch.zeros(n_q, (Hp // b) * (Wp // b), dtype=torch.bool, device=_CPU)
    holds[torch.arange(qperm.numel(), device=_CPU) // _FLEX_BLOCK, block] = True  # query chunk holds a block's query
    chunk, blk = holds.nonzero().unbind(1)
    visited = torch.zeros(n_q, n_k, dtype=torch.bool, device=_CPU)
    visited[chunk[:, None], kpos[_key_index(Hp, Wp, b, h)[blk]] // _FLEX_BLOCK] = True  # ... and its window's keys
    return int(visited.sum())


@assume_constant_result  # under torch.compile: counted eagerly (a Python pair)
def _flex_orders(Hp: int, Wp: int, block_size: int, halo_size: int, stride: int) -> tuple[str, str]:
    """The pair of :data:`ORDERS` whose block mask visits the fewest blocks (the first of equals)."""
    if FLEX_ORDER is not None:
        return FLEX_ORDER
    return min(ORDERS, key=lambda o: _visited_blocks(Hp, Wp, block_size, halo_size, stride, o))


@_graph_inputs
@_cached(maxsize=64)
def _flex_index(Hp: int, Wp: int, block_size: int, halo_size: int, stride: int, H: int, W: int,
                orders: tuple[str, str], device: torch.device) -> tuple[Tensor | None, Tensor | None,
                                                                        Tensor | None, tuple[Tensor, ...]]:
    """Query order ``[Nq]`` and its inverse (None: row-major), key order ``[M]`` (None: row-major), and the mods'
    per-position tensors: per query the window's first padded row / column and the relative-row base
    (``ky - base`` = the table row), per key its padded row / column and whether it lies inside the ``H x W``
    image."""
    b, h, s = block_size, halo_size, stride
    bq, win = b // s, b + 2 * h
    Hq, Wq, Hk, Wk = Hp // s, Wp // s, Hp + 2 * h, Wp + 2 * h
    qperm, kperm = _order(Hq, Wq, orders[0], bq), _order(Hk, Wk, orders[1], b)
    qy, qx = qperm // Wq, qperm % Wq  # query map coordinates per query position
    ky, kx = kperm // Wk, kperm % Wk  # padded key map coordinates per key position
    wy, wx = qy // bq * b, qx // bq * b  # the window's first padded row / column
    base_y, base_x = wy + qy % bq - (win - 1), wx + qx % bq - (win - 1)
    inside = (ky >= h) & (ky < h + H) & (kx >= h) & (kx < h + W)
    qinv = torch.argsort(qperm)
    tensors = tuple(t.to(device) for t in (wy, wx, base_y, base_x, ky, kx, inside))
    q_identity, k_identity = orders[0] == "row", orders[1] == "row"
    return (None if q_identity else qperm.to(device), None if q_identity else qinv.to(device),
            None if k_identity else kperm.to(device), tensors)


def halo_rel_logits(q: Tensor, height_rel: Tensor, width_rel: Tensor) -> tuple[Tensor, Tensor]:
    """Per-query relative logits against every table row: ``q [..., Nq, hd]`` -> ``q · height_rel``ᵀ, ``q ·
    width_rel``ᵀ, each ``[..., Nq, 2·win - 1]`` (the flex score_mod reads them at the key's offset)."""
    return q @ height_rel.transpose(0, 1).to(q.dtype), q @ width_rel.transpose(0, 1).to(q.dtype)


def halo_pattern(Hp: int, Wp: int, block_size: int, halo_size: int, block_stride: int = 1, *,
                 grid: tuple[int, int] | None = None, pad_mask: bool = False,
                 rel_logits: tuple[Tensor, Tensor] | None = None, orders: tuple[str, str] | None = None,
                 device: torch.device | str = "cpu") -> tuple[AttentionPattern, Tensor | None, Tensor | None,
                                                              Tensor | None]:
    """Halo attention as one :class:`~.flex.AttentionPattern`: the ``Nq = (Hp/s)·(Wp/s)`` queries of the query
    map against the ``M = (Hp + 2h)·(Wp + 2h)`` keys of the halo-padded key map.

    ``mask_mod``: the key lies in the ``win x win`` window of the query's block (and, with ``pad_mask``, inside
    the ``grid`` image ``(H, W)``, default ``(Hp, Wp)``). ``score_mod`` with ``rel_logits`` (the per-query logits
    of :func:`halo_rel_logits`, ``[B, nh, Nq, 2·win - 1]`` each, already scaled when the caller scales them):
    ``+ rel_h[b, h, q, ky - qy + win - 1] + rel_w[b, h, q, kx - qx + win - 1]`` (offsets inside block and window,
    as :func:`halo_rel_index`). ``orders``: (query order ``"row"`` | ``"block"``, key order ``"row"`` |
    ``"tile"``), default: the pair whose block mask visits the fewest 128 x 128 blocks. Returns the pattern
    (rows / columns in those orders), the query order ``[Nq]`` (position -> flat query-map index) and its
    inverse, and the key order ``[M]`` (position -> flat padded-map index); None where row-major. The block
    mask is cached per geometry, orders and device.
    """
    b, h, s = int(block_size), int(halo_size), int(block_stride)
    _check_sizes(Hp, Wp, b, h, s)
    orders = _flex_orders(int(Hp), int(Wp), b, h, s) if orders is None else tuple(orders)
    if orders not in ORDERS:
        raise ValueError(f"orders must be one of {ORDERS} (query order, key order), got {orders!r}")
    H, W = (grid or (Hp, Wp)) if pad_mask else (Hp, Wp)  # the image matters to pad_mask only
    win = b + 2 * h
    qperm, qinv, kperm, tables = _flex_index(int(Hp), int(Wp), b, h, s, int(H), int(W), orders, torch.device(device))
    wy, wx, base_y, base_x, ky, kx, inside = (flex_buffer(t) for t in tables)  # captured by the mods

    def mask_mod(bi: Tensor, hi: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        dy, dx = ky[kv] - wy[q], kx[kv] - wx[q]
        keep = (dy >= 0) & (dy < win) & (dx >= 0) & (dx < win)
        return keep & inside[kv] if pad_mask else keep

    score_mod = None
    if rel_logits is not None:
        rel_h, rel_w = (flex_buffer(t) for t in rel_logits)
        if rel_h.shape[-1] != 2 * win - 1 or rel_w.shape[-1] != 2 * win - 1:
            raise ValueError(f"rel_logits must be [B, nh, Nq, {2 * win - 1}] each, got {tuple(rel_h.shape)}, "
                             f"{tuple(rel_w.shape)}")

        def score_mod(score: Tensor, bi: Tensor, hi: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            # outside the window (masked) the offset may leave the table: clamped, the value is never used
            iy = (ky[kv] - base_y[q]).clamp(0, 2 * win - 2)
            ix = (kx[kv] - base_x[q]).clamp(0, 2 * win - 2)
            return score + rel_h[bi, hi, q, iy] + rel_w[bi, hi, q, ix]

    key = ("halo", int(Hp), int(Wp), b, h, s, (int(H), int(W)) if pad_mask else None, orders)
    pattern = AttentionPattern((Hp // s) * (Wp // s), (Hp + 2 * h) * (Wp + 2 * h), mask_mod, score_mod,
                               cache_key=key)
    return pattern, qperm, qinv, kperm


def _halo_flex(q: Tensor, kv: Tensor, nh: int, block_size: int, halo_size: int, *, height_rel: Tensor | None,
               width_rel: Tensor | None, scale: float | None, scale_pos_embed: bool, pad_mask: bool,
               dropout_p: float, grid: tuple[int, int] | None, fused: bool | None) -> Tensor:
    """The flex path of :func:`halo_attention` (arguments checked there): one core call, queries
    ``[B, nh, Nq, hd_qk]`` against the halo-padded keys ``[B, nh, M, hd_qk]`` -> ``[B, Hp/s, Wp/s, nh·hd_v]``."""
    B, Hp, Wp, Ckv = kv.shape
    _, Hq, Wq, Cqk = q.shape
    s, h = Hp // Hq, halo_size
    dqk, dv = Cqk // nh, (Ckv - Cqk) // nh
    Nq, M = Hq * Wq, (Hp + 2 * h) * (Wp + 2 * h)
    if B == 0:  # nothing to attend (flex cannot index the per-query logits of an empty batch); still on the graph
        return kv[:, ::s, ::s, Cqk:]  # [0, Hp/s, Wp/s, nh·hd_v]
    H, W = (grid or (Hp, Wp)) if pad_mask else (Hp, Wp)
    orders = _flex_orders(Hp, Wp, block_size, h, s)
    qperm, qinv, kperm, _ = _flex_index(Hp, Wp, block_size, h, s, H, W, orders, kv.device)  # cached
    qs = q.reshape(B, Nq, nh, dqk)
    kvp = torch.nn.functional.pad(kv, (0, 0, h, h, h, h)).reshape(B, M, nh, dqk + dv)  # zero halo
    if qperm is not None:
        qs = qs[:, qperm]
    if kperm is not None:
        kvp = kvp[:, kperm]
    qs, kvp = qs.transpose(1, 2), kvp.transpose(1, 2)  # [B, nh, Nq, dqk], [B, nh, M, dqk + dv]
    scale = dqk ** -0.5 if scale is None else scale
    rel = None
    if height_rel is not None:
        rel = halo_rel_logits(qs, height_rel, width_rel)  # [B, nh, Nq, 2·win - 1] each
        if scale_pos_embed:
            rel = (rel[0] * scale, rel[1] * scale)
    pattern = halo_pattern(Hp, Wp, block_size, h, s, grid=grid, pad_mask=pad_mask, rel_logits=rel,
                           orders=orders, device=kv.device)[0]
    out = scaled_dot_product_attention(qs, kvp[..., :dqk], kvp[..., dqk:], scale=scale, dropout_p=dropout_p,
                                       fused=fused, backend="flex", pattern=pattern)  # [B, nh, Nq, dv]
    out = out.transpose(1, 2).reshape(B, Nq, nh * dv)
    if qinv is not None:
        out = out[:, qinv]
    return out.view(B, Hq, Wq, nh * dv)
