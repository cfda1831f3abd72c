"""Window partition / reverse, padding, the cyclic-shift region mask and relative-position helpers.

Pure functions for Swin-style window attention (Liu et al. 2021, "Swin Transformer"; Liu et al.
2022, "Swin Transformer V2") on channels-last maps ``[B, H, W, C]``. Everything that depends only
on sizes (the shift mask, the relative-position index, the SwinV2 log-spaced coordinates) is
built once per (sizes, device) and cached: callers must treat the returned tensors as read-only.

Conventions (identical in timm, torchvision, Hugging Face and the original repository):

* windows are taken in row-major order of windows, tokens row-major inside a window;
* relative offset of token ``i`` to token ``j`` is ``c_i - c_j`` (query minus key), flattened as
  ``(dh + Wh - 1) * (2Ww - 1) + (dw + Ww - 1)`` into a table of ``(2Wh - 1)(2Ww - 1)`` rows;
* the shift mask labels 3 regions per shifted axis, ``[0, L-Ws)``, ``[L-Ws, L-s)``, ``[L-s, L)``
  of the (padded) length ``L``; tokens of different regions get ``-100`` (the reference value).
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .fast_paths import untraced, untraced_available

__all__ = [
    "to_pair",
    "fit_window",
    "window_partition",
    "window_reverse",
    "pad_to_window",
    "num_windows",
    "shift_window_mask",
    "window_gather_index",
    "window_head_gather_index",
    "window_sequence_stride",
    "window_sequence_gather_index",
    "window_sequence_tables",
    "relative_position_index",
    "log_relative_coords_table",
]

_F = TypeVar("_F", bound=Callable[..., Any])

_CPU = torch.device("cpu")  # where cached index / mask tensors are built
MASK_VALUE = -100.0  # the value all reference implementations use; exp(-100) underflows in fp32 softmax


def to_pair(x: int | Sequence[int], name: str = "window_size") -> tuple[int, int]:
    """``7 -> (7, 7)``; a pair of ints passes through; anything else raises naming ``name``."""
    def is_int(v: object) -> bool:  # ints, numpy / torch integers (anything with __index__), not bools
        return not isinstance(v, bool) and hasattr(type(v), "__index__")

    if is_int(x):
        return (operator.index(x), operator.index(x))  # type: ignore[arg-type]
    if isinstance(x, (str, bytes)) or not isinstance(x, Sequence) or len(x) != 2 or not all(map(is_int, x)):
        raise ValueError(f"{name} must be an int or a pair of ints, got {x!r}")
    return (operator.index(x[0]), operator.index(x[1]))


class CacheInfo(NamedTuple):
    """Counters of a :func:`_cached` builder (``functools.lru_cache``'s ``cache_info`` fields)."""

    hits: int
    misses: int
    maxsize: int
    currsize: int


def assume_constant_result(fn: _F) -> _F:
    """``torch.compiler.assume_constant_result`` without importing ``torch._dynamo`` (over half of
    ``import torch``'s time again) when this package is imported: the mark is the attribute torch's own
    decorator sets (torch 2.14: ``fn._dynamo_marked_constant = True``; a test checks they agree). Under
    ``torch.compile`` ``fn`` runs eagerly at trace time and its result is a constant of the graph."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


_MISSING = object()


def _cached(maxsize: int, *, constant_under_compile: bool = False) -> Callable[[_F], _F]:
    """A least-recently-used cache (``maxsize`` entries, ``cache_info`` / ``cache_clear`` as
    ``functools.lru_cache``) whose tensors are built outside inference mode, so autograd may save them later.

    They are built outside ``torch.jit.trace`` (:func:`.fast_paths.untraced`) and ``torch.export``'s fake
    mode too: a capture records them as constants whether the first call builds them or a later call finds
    them cached (the tracer's check runs twice), and a fake tensor never lands in the cache. Where the trace
    cannot be suspended (fast paths off, or a torch without the API) a trace records the build and stores nothing.
    Builders create their tensors on ``_CPU`` explicitly (whatever default device is active, e.g.
    meta, index arithmetic needs real values) and move the result to the requested device.

    Under ``torch.compile`` the cache is bypassed and dynamo traces the builder into the graph (what it
    does with an ``lru_cache``, which it ignores with a warning per function; this plain store gives
    none). ``constant_under_compile``: the builder would break the graph where it reads a tensor back
    to Python (``.item()``, ``nonzero``); marked so (:func:`assume_constant_result`), it runs once at
    trace time and its result is a constant of the graph (its arguments are sizes, static for a model
    compiled at one input size). Opt-in: a builder whose result a graph must see as an input (the flex
    paths' index tensors) stays unmarked.
    """

    def deco(fn: _F) -> _F:
        def build(*args: Any) -> Any:
            # real tensors even inside torch.export's fake mode: a fake one cached here would leak
            # into every later eager call
            # (not under dynamo, which cannot trace the mode switch and keeps its own constants)
            real = contextlib.nullcontext() if torch.compiler.is_dynamo_compiling() else unset_fake_temporarily()
            with untraced(), torch.inference_mode(False), real:
                return fn(*args)

        store: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        counts = [0, 0]  # hits, misses

        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            if torch.compiler.is_dynamo_compiling() or (not untraced_available() and torch.jit.is_tracing()):
                return build(*args)
            value = store.get(args, _MISSING)  # one lookup: another thread may evict between two
            if value is not _MISSING:
                try:
                    store.move_to_end(args)
                except KeyError:  # evicted meanwhile: the value is still right
                    pass
                counts[0] += 1
                return value
            counts[1] += 1
            value = store[args] = build(*args)
            if len(store) > maxsize:
                store.popitem(last=False)
            return value

        def cache_info() -> CacheInfo:
            return CacheInfo(counts[0], counts[1], maxsize, len(store))

        def cache_clear() -> None:
            store.clear()
            counts[:] = [0, 0]

        wrapper.cache_info = cache_info  # type: ignore[attr-defined]
        wrapper.cache_clear = cache_clear  # type: ignore[attr-defined]
        if not constant_under_compile:
            return wrapper  # type: ignore[return-value]

        @assume_constant_result
        def constant(*args: Any) -> Any:
            return wrapper(*args)

        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            return constant(*static_args(args))

        call.cache_clear = cache_clear  # type: ignore[attr-defined]
        call.cache_info = cache_info  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return deco


def static_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with every ``torch.SymInt`` (a size torch.compile made dynamic, e.g. after a second input
    resolution) made a Python int, also inside tuples: a builder whose result is a graph constant
    (``assume_constant_result``) needs constant arguments, and a symbolic one breaks the graph. Specialising
    adds a guard, so each map size gets its own graph, as a static compile has (dynamo specialises on
    ``operator.index``; ``int()`` would keep the size symbolic)."""
    # (a traced SymInt answers isinstance(a, int); operator.index is the identity on a Python int)
    return tuple(operator.index(a) if isinstance(a, (int, torch.SymInt)) and not isinstance(a, bool)
                 else static_args(a) if isinstance(a, tuple) else a for a in args)


def _check_map(x: Tensor, what: str) -> None:
    if x.dim() != 4:
        raise ValueError(f"{what} expects a channels-last map [B, H, W, C], got shape {tuple(x.shape)}")


def window_partition(x: Tensor, window_size: int | Sequence[int]) -> Tensor:
    """Cut a map into non-overlapping windows: ``[B, H, W, C] -> [B·nW, Wh·Ww, C]``.

    ``H`` and ``W`` must be multiples of the window (see :func:`pad_to_window`). Windows are in
    row-major window order, per image: window ``w`` of image ``b`` is row ``b·nW + w``.
    """
    _check_map(x, "window_partition")
    wh, ww = to_pair(window_size)
    B, H, W, C = x.shape
    if H % wh or W % ww:
        raise ValueError(f"window_partition: map {H}x{W} is not a multiple of window_size {(wh, ww)}; "
                         "pad it first (pad_to_window)")
    x = x.view(B, H // wh, wh, W // ww, ww, C).permute(0, 1, 3, 2, 4, 5)  # [B, nWh, nWw, Wh, Ww, C]
    return x.reshape(-1, wh * ww, C)  # [B·nW, Wh·Ww, C]


def window_reverse(windows: Tensor, window_size: int | Sequence[int], H: int, W: int) -> Tensor:
    """Inverse of :func:`window_partition`: ``[B·nW, Wh·Ww, C]`` (or ``[B·nW, Wh, Ww, C]``) -> ``[B, H, W, C]``."""
    wh, ww = to_pair(window_size)
    if H % wh or W % ww:
        raise ValueError(f"window_reverse: map {H}x{W} is not a multiple of window_size {(wh, ww)}")
    C = windows.shape[-1]
    if windows.shape[1:-1].numel() != wh * ww:
        raise ValueError(f"window_reverse: windows {tuple(windows.shape)} do not hold {wh}x{ww} tokens each")
    nWh, nWw = H // wh, W // ww
    if windows.shape[0] % (nWh * nWw):
        raise ValueError(f"window_reverse: {windows.shape[0]} windows is not a multiple of the {nWh * nWw} "
                         f"windows of one {H}x{W} map")
    x = windows.reshape(-1, nWh, nWw, wh, ww, C).permute(0, 1, 3, 2, 4, 5)  # [B, nWh, Wh, nWw, Ww, C]
    return x.reshape(-1, H, W, C)  # [B, H, W, C]


def fit_window(size: tuple[int, int], window: tuple[int, int], shift: tuple[int, int] = (0, 0)
               ) -> tuple[tuple[int, int], tuple[int, int]]:
    """The window and shift on a map of ``size = (H, W)``: ``((wh, ww), (sh, sw))``.

    Swin's per-axis rule (timm 1.0.31 ``swin_transformer.py``, ``_calc_window_shift``): an axis the window
    covers whole gets window = the map's side and no shift, so a window larger than the map never pads it.
    """
    win = (min(size[0], window[0]), min(size[1], window[1]))
    sft = tuple(0 if n <= w else s for n, w, s in zip(size, window, shift))
    return win, sft  # type: ignore[return-value]


def pad_to_window(x: Tensor, window_size: int | Sequence[int]) -> tuple[Tensor, tuple[int, int]]:
    """Zero-pad the bottom / right of ``[B, H, W, C]`` to multiples of the window.

    Returns ``(x_padded [B, Hp, Wp, C], (pad_h, pad_w))``; ``x`` itself when no padding is needed.
    """
    _check_map(x, "pad_to_window")
    wh, ww = to_pair(window_size)
    pad_h, pad_w = (-x.shape[1]) % wh, (-x.shape[2]) % ww
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))  # [B, Hp, Wp, C]
    return x, (pad_h, pad_w)


def num_windows(H: int, W: int, window_size: int | Sequence[int]) -> int:
    """Windows per image for an ``H x W`` map after padding to the window."""
    wh, ww = to_pair(window_size)
    return math.ceil(H / wh) * math.ceil(W / ww)


def _regions(length: int, window: int, shift: int) -> Tensor:
    """Region label per position along one axis: 0, 1, 2 (all 0 when the axis is not shifted)."""
    idx = torch.arange(length, device=_CPU)
    if shift == 0:
        return torch.zeros(length, dtype=torch.long, device=_CPU)
    return (idx >= length - window).long() + (idx >= length - shift).long()


@_cached(maxsize=256)
def _shift_window_mask(Hp: int, Wp: int, wh: int, ww: int, sh: int, sw: int, device: torch.device) -> Tensor:
    labels = _regions(Hp, wh, sh)[:, None] * 3 + _regions(Wp, ww, sw)[None, :]  # [Hp, Wp]
    win = window_partition(labels.view(1, Hp, Wp, 1), (wh, ww)).squeeze(-1)  # [nW, N]
    mask = torch.zeros(win.shape[0], wh * ww, wh * ww, device=_CPU)
    mask.masked_fill_(win[:, :, None] != win[:, None, :], MASK_VALUE)  # [nW, N, N]
    return mask.to(device)


def shift_window_mask(H: int, W: int, window_size: int | Sequence[int], shift_size: int | Sequence[int], *,
                      device: torch.device | str | None = None) -> Tensor:
    """Additive float32 mask ``[nW, N, N]`` (``N = Wh·Ww``) for shifted-window attention.

    ``H x W`` is the (padded) map the windows are cut from, a multiple of the window. After the
    cyclic shift, tokens that came from different regions of the map share a window; the mask is
    0 between tokens of the same region and ``-100`` otherwise. An axis with shift 0 is not split.
    Cached per (sizes, device): do not modify the result.
    """
    wh, ww = to_pair(window_size)
    sh, sw = to_pair(shift_size, "shift_size")
    if H % wh or W % ww:
        raise ValueError(f"shift_window_mask: map {H}x{W} is not a multiple of window_size {(wh, ww)}")
    if not (0 <= sh < wh and 0 <= sw < ww):
        raise ValueError(f"shift_size {(sh, sw)} must be >= 0 and smaller than window_size {(wh, ww)}")
    return _shift_window_mask(H, W, wh, ww, sh, sw, torch.device(device or "cpu"))


@_cached(maxsize=256)
def _window_gather_index(H: int, W: int, wh: int, ww: int, sh: int, sw: int, pad_first: bool,
                         device: torch.device) -> tuple[Tensor, Tensor]:
    Hp, Wp = H + (-H) % wh, W + (-W) % ww
    i = torch.arange(Hp, device=_CPU)[:, None].expand(Hp, Wp)
    j = torch.arange(Wp, device=_CPU)[None, :].expand(Hp, Wp)
    if pad_first:  # pad, then roll the padded map: position (i, j) holds padded (i + s) mod Hp
        si, sj = (i + sh) % Hp, (j + sw) % Wp
        valid = (si < H) & (sj < W)
    else:  # roll the map, then pad: position (i, j) < (H, W) holds (i + s) mod H
        valid = (i < H) & (j < W)
        si, sj = (i + sh) % H, (j + sw) % W
    src = torch.where(valid, si * W + sj, H * W)  # [Hp, Wp]; H·W = the zero token
    fwd = window_partition(src.reshape(1, Hp, Wp, 1), (wh, ww)).reshape(-1)  # [nW·N]
    # every map token sits in exactly one window slot; padded slots all land on the discarded last entry
    # (a scatter rather than boolean indexing: no data-dependent shapes, so torch.compile traces it)
    inv = torch.zeros(H * W + 1, dtype=torch.long, device=_CPU)
    inv.scatter_(0, fwd, torch.arange(fwd.numel(), device=_CPU))
    return fwd.to(device), inv[: H * W].to(device)


def window_gather_index(H: int, W: int, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0, *,
                        pad_first: bool = False, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Indices that do shift + pad + partition (and the inverse) as one gather each.

    Returns ``(fwd [nW·N], inv [H·W])`` int64: ``x.view(B, H·W, C)`` with a zero token appended at
    index ``H·W``, gathered at ``fwd``, is the window tokens ``[B, nW·N, C]`` of the shifted,
    padded map (``pad_first``: torchvision order pad-then-roll; else roll-then-pad); gathering those
    at ``inv`` gives back ``[B, H·W, C]`` (reverse, crop and roll back). Cached per (sizes, device).
    """
    wh, ww = to_pair(window_size)
    sh, sw = to_pair(shift_size, "shift_size")
    return _window_gather_index(H, W, wh, ww, sh, sw, bool(pad_first), torch.device(device or "cpu"))


@_cached(maxsize=256)
def _window_head_gather_index(H: int, W: int, wh: int, ww: int, sh: int, sw: int, pad_first: bool, nh: int,
                              device: torch.device) -> tuple[Tensor, Tensor]:
    fwd, inv = _window_gather_index(H, W, wh, ww, sh, sw, pad_first, _CPU)
    N = wh * ww
    nW = fwd.numel() // N
    heads = torch.arange(nh, device=_CPU)
    which = torch.arange(3, device=_CPU)  # q, k, v
    src = fwd.view(1, nW, 1, N)  # map token (or the zero token H·W) in each window slot
    qkv_rows = (src * 3 + which.view(3, 1, 1, 1)) * nh + heads.view(1, 1, nh, 1)  # [3, nW, nh, N]
    w, n = inv // N, inv % N  # window and slot of every map token
    out_rows = (w[:, None] * nh + heads[None, :]) * N + n[:, None]  # [H·W, nh]
    return qkv_rows.reshape(-1).to(device), out_rows.reshape(-1).to(device)


def window_head_gather_index(H: int, W: int, window_size: int | Sequence[int], shift_size: int | Sequence[int],
                             num_heads: int, *, pad_first: bool = False, device: torch.device | str | None = None
                             ) -> tuple[Tensor, Tensor]:
    """Row indices that go from token order to per-window heads and back, one gather each way.

    With ``hd`` the head width, rows are ``hd``-wide slices:

    * ``qkv_rows [3·nW·nh·N]``: the packed projection of the map's tokens ``[B, T, 3, nh, hd]``
      (``T = H·W``, plus one last token, the projection of a zero input, when the map is padded),
      viewed as ``[B, T·3·nh, hd]`` and gathered at these rows, is ``[B, 3, nW·nh, N, hd]``: q, k, v
      of every window of the shifted, padded map, windows folded into heads;
    * ``out_rows [H·W·nh]``: attention outputs ``[B, nW·nh, N, hd]`` (contiguous; the same memory as
      ``[B·nW, nh, N, hd]``) viewed as ``[B, nW·nh·N, hd]`` and gathered at these rows are the map's
      tokens ``[B, H·W, nh·hd]``, heads merged, windows reversed, shift undone, padding cropped.

    Shift and padding follow :func:`window_gather_index`. Cached per (sizes, heads, device).
    """
    wh, ww = to_pair(window_size)
    sh, sw = to_pair(shift_size, "shift_size")
    if not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    return _window_head_gather_index(H, W, wh, ww, sh, sw, bool(pad_first), num_heads,
                                     torch.device(device or "cpu"))


FLEX_BLOCK = 128  # FlexAttention's default block size (its block masks are built on this grid)


@_cached(maxsize=256)
def _computed_blocks(num_windows: int, N: int, stride: int, block: int) -> int:
    """Blocks of the ``L x L`` logits (``L = nW·stride``) a block-diagonal mask of ``N``-token windows touches."""
    pairs: set[tuple[int, int]] = set()
    for w in range(num_windows):
        span = range(w * stride // block, (w * stride + N - 1) // block + 1)
        pairs.update((a, b) for a in span for b in span)
    return len(pairs)


def window_sequence_stride(num_windows: int, window_tokens: int, block: int = FLEX_BLOCK) -> int:
    """Positions given to each window in the window-major sequence: ``N`` or ``N`` padded to fit the blocks.

    ``N`` (no padding) or the next power of two (``N < block``: windows then never straddle a
    block) or multiple of ``block`` (``N > block``), whichever leaves the block mask fewer blocks to
    compute (ties: ``N``). Swin-T (``N = 49``): 64, which takes the blocks computed at 56x56 from 73 of 625
    to 32 of the 1024 and at 14x14 from 4 of 4 to 2 of 4.
    """
    N = window_tokens
    padded = 1 << (N - 1).bit_length() if N < block else -(-N // block) * block
    if padded == N or num_windows == 1:
        return N
    if _computed_blocks(num_windows, N, padded, block) < _computed_blocks(num_windows, N, N, block):
        return padded
    return N


@_cached(maxsize=256)
def _window_sequence_gather_index(H: int, W: int, wh: int, ww: int, sh: int, sw: int, pad_first: bool, nh: int,
                                  stride: int, partitioned: bool, device: torch.device) -> tuple[Tensor, Tensor]:
    fwd, inv = _window_gather_index(H, W, wh, ww, sh, sw, pad_first, _CPU)
    N = wh * ww
    nW = fwd.numel() // N
    if partitioned:  # the input is already the windows [B·nW, N, ·]: row w·N + n holds slot n of window w
        fwd = torch.arange(nW * N, device=_CPU)
    # window w's slot n sits at w·stride + n; the slots past N read token 0 (masked keys, discarded queries)
    src = F.pad(fwd.view(nW, N), (0, stride - N)).reshape(-1)  # [L]
    L = src.numel()
    heads = torch.arange(nh, device=_CPU)
    which = torch.arange(3, device=_CPU)  # q, k, v
    qkv_rows = (src.view(1, 1, L) * 3 + which.view(3, 1, 1)) * nh + heads.view(1, nh, 1)  # [3, nh, L]
    pos = (inv // N) * stride + inv % N  # [H·W]: sequence position of every map token
    out_rows = heads.view(1, nh) * L + pos.view(-1, 1)  # [H·W, nh]
    return qkv_rows.reshape(-1).to(device), out_rows.reshape(-1).to(device)


def window_sequence_gather_index(H: int, W: int, window_size: int | Sequence[int],
                                 shift_size: int | Sequence[int], num_heads: int, *, pad_first: bool = False,
                                 stride: int | None = None, partitioned: bool = False,
                                 device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Row indices from token order to one window-major sequence per head and back (the FlexAttention layout).

    The sequence of the shifted, padded map holds its ``nW`` windows one after the other,
    ``stride >= N`` positions each (default ``N = Wh·Ww``; see :func:`window_sequence_stride`),
    tokens row-major inside a window: position ``p = w·stride + n`` is slot ``n`` of window ``w``,
    ``L = nW·stride`` positions; positions with ``n >= N`` read token 0 (to be masked as keys).
    With ``hd`` the head width, rows are ``hd``-wide slices:

    * ``qkv_rows [3·nh·L]``: the packed projection of the map's tokens ``[B, T, 3, nh, hd]`` (``T = H·W``,
      plus one last zero-input token when the map is padded; ``partitioned``: of the windows
      ``[B·nW, N, 3, nh, hd]`` of an unshifted, unpadded map) viewed as ``[B, T·3·nh, hd]`` and
      gathered at these rows is ``[B, 3, nh, L, hd]``: q, k, v per head over the whole sequence;
    * ``out_rows [H·W·nh]``: outputs ``[B, nh, L, hd]`` viewed as ``[B, nh·L, hd]`` and gathered at
      these rows are the map's tokens ``[B, H·W, nh·hd]``, heads merged, shift undone, padding cropped.

    Shift and padding follow :func:`window_gather_index`. Cached per (sizes, heads, device).
    """
    wh, ww = to_pair(window_size)
    sh, sw = to_pair(shift_size, "shift_size")
    if not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    stride = wh * ww if stride is None else int(stride)
    if stride < wh * ww:
        raise ValueError(f"stride {stride} is smaller than the {wh * ww} tokens of a window")
    return _window_sequence_gather_index(H, W, wh, ww, sh, sw, bool(pad_first), num_heads, stride,
                                         bool(partitioned), torch.device(device or "cpu"))


@_cached(maxsize=256)
def _window_sequence_tables(H: int, W: int, wh: int, ww: int, sh: int, sw: int, pad_first: bool, stride: int,
                            mask_padding: bool, device: torch.device) -> tuple[Tensor, Tensor]:
    Hp, Wp = H + (-H) % wh, W + (-W) % ww
    N = wh * ww
    labels = _regions(Hp, wh, sh)[:, None] * 3 + _regions(Wp, ww, sw)[None, :]  # [Hp, Wp]
    region = window_partition(labels.view(1, Hp, Wp, 1), (wh, ww)).view(-1, N)  # [nW, N]
    fwd, _ = _window_gather_index(H, W, wh, ww, sh, sw, pad_first, _CPU)
    valid = fwd.view(-1, N) != H * W if mask_padding else torch.ones(region.shape, dtype=torch.bool, device=_CPU)
    region = F.pad(region, (0, stride - N)).reshape(-1)  # [L]
    valid = F.pad(valid, (0, stride - N), value=False).reshape(-1)  # [L]
    return region.to(device), valid.to(device)


def window_sequence_tables(H: int, W: int, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0, *,
                           pad_first: bool = False, stride: int | None = None, mask_padding: bool = False,
                           device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Per-position tables of the window-major sequence of :func:`window_sequence_gather_index`.

    Returns ``(region [L] int64, valid [L] bool)``: the shift region label (0..8) of each position
    of the shifted, padded map (two positions of one window whose labels differ get Swin's ``-100``,
    exactly the entries of :func:`shift_window_mask`), and whether the position may be attended to
    as a key: a window slot (``n < N``) and, with ``mask_padding``, one that holds a map token
    (not a padded slot). ``shift_size`` is the shift actually applied (see
    ``window_attention.window_geometry``). Cached per (sizes, device): do not modify the results.
    """
    wh, ww = to_pair(window_size)
    sh, sw = to_pair(shift_size, "shift_size")
    stride = wh * ww if stride is None else int(stride)
    return _window_sequence_tables(H, W, wh, ww, sh, sw, bool(pad_first), stride, bool(mask_padding),
                                   torch.device(device or "cpu"))


@_cached(maxsize=64)
def _relative_position_index(wh: int, ww: int, device: torch.device) -> Tensor:
    rows, cols = torch.arange(wh, device=_CPU), torch.arange(ww, device=_CPU)
    coords = torch.stack(torch.meshgrid(rows, cols, indexing="ij")).flatten(1)  # [2, N]
    rel = coords[:, :, None] - coords[:, None, :]  # [2, N, N], query minus key
    index = (rel[0] + wh - 1) * (2 * ww - 1) + (rel[1] + ww - 1)  # [N, N]
    return index.to(device)


def relative_position_index(window_size: int | Sequence[int], *, device: torch.device | str | None = None) -> Tensor:
    """Row of the relative-position table for each (query, key) pair of a window: int64 ``[N, N]``.

    Values lie in ``[0, (2Wh-1)(2Ww-1))``. Cached per (window, device): do not modify the result.
    """
    wh, ww = to_pair(window_size)
    return _relative_position_index(wh, ww, torch.device(device or "cpu"))


@_cached(maxsize=64)
def _log_relative_coords_table(wh: int, ww: int, pwh: int, pww: int, device: torch.device) -> Tensor:
    dh = torch.arange(-(wh - 1), wh, device=_CPU).to(torch.float32)
    dw = torch.arange(-(ww - 1), ww, device=_CPU).to(torch.float32)
    table = torch.stack(torch.meshgrid(dh, dw, indexing="ij")).permute(1, 2, 0).contiguous()  # [2Wh-1, 2Ww-1, 2]
    if pwh > 0:
        table[:, :, 0] /= max(pwh - 1, 1)
        table[:, :, 1] /= max(pww - 1, 1)
    else:
        table[:, :, 0] /= max(wh - 1, 1)
        table[:, :, 1] /= max(ww - 1, 1)
    table *= 8  # normalise to [-8, 8]
    table = torch.sign(table) * torch.log2(torch.abs(table) + 1.0) / math.log2(8)
    return table.to(device)


def log_relative_coords_table(window_size: int | Sequence[int], pretrained_window_size: int | Sequence[int] = 0,
                              *, device: torch.device | str | None = None) -> Tensor:
    """SwinV2 log-spaced relative coordinates, float32 ``[2Wh-1, 2Ww-1, 2]``.

    Offsets ``(dh, dw)`` are divided by ``(pretrained_window - 1)`` (or ``(window - 1)`` when
    ``pretrained_window_size`` is 0), scaled to ``[-8, 8]`` and mapped through
    ``sign(t)·log2(1 + |t|) / log2(8)``. Cached per (sizes, device): do not modify the result.
    """
    wh, ww = to_pair(window_size)
    pwh, pww = to_pair(pretrained_window_size, "pretrained_window_size")
    return _log_relative_coords_table(wh, ww, pwh, pww, torch.device(device or "cpu"))
