"""Swin window attention (Liu et al. 2021): W-MSA and, with ``shift_size > 0``, SW-MSA.

Channels-last maps ``[B, H, W, C]`` in and out. The map is (optionally cyclically shifted and)
padded to a multiple of the window, cut into ``nW`` windows of ``N = Wh·Ww`` tokens, and each
window attends to itself with a learned relative-position bias. The bias and the shift mask are
added into ONE additive mask handed to the library's single attention function, so the fused
kernel runs whenever the weights are not needed (except CPU training, where torch's fused kernel
has no gradient for the learned mask and the core takes its explicit path instead). On the
``"flex"`` backend the whole map runs as ONE FlexAttention call over a window-major sequence, the
bias table and the shift term read in its score_mod
(:func:`~vit_attention.functional.window_attention.window_pattern`; docs/swin.md).

Order of shift and padding at sizes that are not multiples of the window (see docs/swin.md):

* ``pad_first=True`` (default, torchvision's order): pad, then roll; the region mask separates
  every token that wrapped around; an axis whose padded length fits in one window is not shifted.
* ``pad_first=False`` (timm and the original repository): roll the unpadded map, then pad; the
  region mask is computed on the padded size, so at odd sizes edge tokens can see wrapped ones.

Both agree when ``H`` and ``W`` are multiples of the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..functional.flex import PatternDoc
from ..functional.linear import apply_linear
from ..functional.window import fit_window, relative_position_index, to_pair
from ..functional.window_attention import window_attention, window_tokens
from .base import (
    AttentionCall,
    AttentionModule,
    ParamCache,
    check_spatial_call,
    packed_prefix_attention,
    uncacheable,
)
from .registry import covering_window_kwargs, register_attention, small_window_kwargs
from .transfer import PACKED_QKV_SLOTS, fit_offset_grid

__all__ = ["WindowAttentionBase", "WindowAttention", "resize_window_bias_table"]


def _geometric_offsets(src: int, dst: int) -> list[float]:
    """Source sample positions of a ``src``-long table axis stretched over ``dst`` offsets (BEiT / timm).

    The ``src // 2`` steps either side of 0 grow geometrically, ratio ``q`` found by bisection so
    that their sum reaches about ``dst // 2``: near offsets keep their spacing, far ones spread out.
    """
    lo, hi = 1.01, 1.5
    n = src // 2
    while hi - lo > 1e-6:
        q = (lo + hi) / 2.0
        if (1.0 - q ** n) / (1.0 - q) > dst // 2:
            hi = q
        else:
            lo = q
    steps, cur = [], 1.0
    for i in range(n):
        steps.append(cur)
        cur += q ** (i + 1)
    return [-d for d in reversed(steps)] + [0.0] + steps


def _linear_weights(points: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Left / right sample indices and their weights for each ``x`` on the sorted ``points`` (clamped at the ends)."""
    right = torch.bucketize(x, points).clamp(max=points.shape[0] - 1)
    left = (right - 1).clamp(min=0)
    d_left = (x - points[left]).clamp(min=0)
    d_right = (points[right] - x).clamp(min=0)
    both = (d_left == 0) & (d_right == 0)
    d_left, d_right = torch.where(both, 1.0, d_left), torch.where(both, 1.0, d_right)
    total = d_left + d_right
    return left, right, d_right / total, d_left / total  # weight of left = distance to right


def resize_window_bias_table(table: Tensor, old_window: tuple[int, int], new_window: tuple[int, int]) -> Tensor:
    """A Swin relative-position table ``[(2Wh-1)(2Ww-1), nh]`` for a new window ``[(2Wh'-1)(2Ww'-1), nh]``.

    timm's ``resize_rel_pos_bias_table`` (its default, scipy-free path): the old table's offsets are
    placed on a geometrically spaced grid reaching the new table's extent (:func:`_geometric_offsets`)
    and read linearly at the integer offsets ``-(W'-1) .. W'-1``, per axis, held constant outside.
    Computed in float32 on the table's device, returned in its dtype. Same window: the table itself.
    """
    src = (2 * old_window[0] - 1, 2 * old_window[1] - 1)
    dst = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
    L, nh = table.shape
    if L != src[0] * src[1]:
        raise ValueError(f"a table of {L} rows is not a ({src[0]} x {src[1]}) table of window {old_window}")
    if src == dst:
        return table
    z = table.float().T.reshape(nh, src[0], src[1])  # [nh, 2Wh-1, 2Ww-1]
    idx = []
    for s, d in zip(src, dst):
        points = torch.tensor(_geometric_offsets(s, d), dtype=torch.float32, device=table.device)
        t = float(d // 2)
        idx.append(_linear_weights(points, torch.arange(-t, t + 0.1, 1.0, device=table.device)))
    (hl, hr, hwl, hwr), (wl, wr, wwl, wwr) = idx
    out = ((z[:, hl][:, :, wl] * wwl + z[:, hl][:, :, wr] * wwr) * hwl[:, None]
           + (z[:, hr][:, :, wl] * wwl + z[:, hr][:, :, wr] * wwr) * hwr[:, None])  # [nh, 2Wh'-1, 2Ww'-1]
    return out.reshape(nh, -1).T.contiguous().to(table.dtype)  # [(2Wh'-1)(2Ww'-1), nh]


class WindowAttentionBase(AttentionModule):
    """Shift / pad / partition / attend / reverse around a per-window attention, ``[B, H, W, C] -> [B, H, W, C]``.

    A thin owner of parameters and caches: the math is
    :func:`vit_attention.functional.window_attention.window_attention`. Subclasses define the
    projection (:meth:`project_qkv`), the per-head position bias (:meth:`compute_position_bias`,
    ``[nh, N, N]``) and the logit scaling (``scale``, or :meth:`logit_temperature` for cosine
    attention).
    """

    accepts = frozenset({"residual"})

    def __init__(self, dim: int, num_heads: int, *, window_size: int | Sequence[int] = 7,
                 shift_size: int | Sequence[int] = 0, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 pad_first: bool = True, allow_padding: bool = True, clamp_window: bool = True) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.window_size = to_pair(window_size, "window_size")
        self.shift_size = to_pair(shift_size, "shift_size")
        if min(self.window_size) <= 0:
            raise ValueError(f"window_size must be positive, got {window_size!r}")
        for s, w in zip(self.shift_size, self.window_size):
            if not 0 <= s < w:
                raise ValueError(f"shift_size={shift_size!r} must be >= 0 and smaller than window_size="
                                 f"{window_size!r} (a shift of a whole window is no shift)")
        self.pad_first = bool(pad_first)
        self.allow_padding = bool(allow_padding)
        if not isinstance(clamp_window, bool):
            raise TypeError(f"clamp_window must be a bool, got {clamp_window!r}")
        self.clamp_window = clamp_window
        self.proj = nn.Linear(dim, dim)
        self._bias_cache = ParamCache()  # the [nh, N, N] position bias, while the bias parameters are unchanged
        self._mask_cache: dict[tuple[Any, ...], Tensor] = {}  # [1, nW·nh, N, N] bias + shift masks built from it

    # ---------------------------------------------------------------- subclass hooks
    def project_qkv(self, x: Tensor) -> Tensor:
        """Windows ``[B·nW, N, C]`` or map tokens ``[B, T, C]`` (:func:`window_tokens`) -> packed ``[..., 3C]``."""
        raise NotImplementedError

    def compute_position_bias(self, window: tuple[int, int]) -> Tensor | None:
        """Per-head additive bias ``[nh, N, N]`` of a ``window`` (``N = h·w``; the own window, or the clamped
        window of a smaller map, :meth:`fitted_window`), uncached; None = no position bias."""
        raise NotImplementedError

    def bias_parameters(self) -> list[Tensor]:
        """The parameters :meth:`compute_position_bias` reads (the cache compares their values)."""
        raise NotImplementedError

    scale: float | None = None  # dot-product logit scale (W-MSA); None with a logit temperature
    pad_mask: bool = False  # mask padded keys (True) or let the zero-input padded tokens attend (timm)

    def logit_temperature(self) -> Tensor | None:
        """SwinV2 cosine attention's per-head temperature ``[nh, 1, 1]``; None for dot-product attention."""
        return None

    def set_window_size(self, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0) -> None:
        """Change the window ``(Wh, Ww)`` and the cyclic shift in place (a model's ``set_input_size``).

        Checked like the constructor's arguments before anything changes; the position bias is
        refitted to the new window (:meth:`_resize_position_bias`) and the cached bias and masks dropped.
        """
        window = to_pair(window_size, "window_size")
        shift = to_pair(shift_size, "shift_size")
        if min(window) <= 0:
            raise ValueError(f"window_size must be positive, got {window_size!r}")
        for s, w in zip(shift, window):
            if not 0 <= s < w:
                raise ValueError(f"shift_size={shift_size!r} must be >= 0 and smaller than window_size="
                                 f"{window_size!r} (a shift of a whole window is no shift)")
        old = self.window_size
        self.window_size, self.shift_size = window, shift
        if window != old:
            self._resize_position_bias(old)
        self._bias_cache.clear()
        self._mask_cache.clear()

    def _resize_position_bias(self, old_window: tuple[int, int]) -> None:
        """Refit learned position-bias parameters from ``old_window`` to ``self.window_size`` (none here)."""

    def fitted_window(self, H: int, W: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The window and shift used on an ``H x W`` map: ``((wh, ww), (sh, sw))``.

        With ``clamp_window`` (default) each axis the window covers whole gets window = the map's side
        and no shift, Swin's per-stage rule (timm) applied at forward time: a window larger than the map
        never pads it (``window_size=256`` on a 4x4 map runs as ``window_size=4``). Without it (the
        Swin / Twins / DaViT models, which set their windows per stage as their references do) the
        configured window and shift, the map padded up to the window.
        """
        if not self.clamp_window:
            return self.window_size, self.shift_size
        return fit_window((H, W), self.window_size, self.shift_size)

    # ---------------------------------------------------------------- bias and masks
    def position_bias(self, window: tuple[int, int] | None = None) -> Tensor | None:
        """Per-head bias ``[nh, N, N]`` (None: none, Twins LSA), cached while no gradient is recorded.

        What invalidates the cache: any change of the :meth:`bias_parameters`' values, dtype, device
        or shape (compared with a snapshot on each call, :class:`.base.ParamCache`), so an
        optimizer step, ``load_state_dict``, an in-place edit under ``torch.no_grad()`` (EMA) and
        ``.to()`` all refresh it, and nothing has to be cleared by hand; entering or leaving
        ``torch.inference_mode``. The ``[1, nW·nh, N, N]`` bias + shift masks built from it are
        dropped with it. Not cached (computed on each call) while autograd records through a bias
        parameter, while torch captures a graph, or on the meta device. ``window``: the (clamped)
        window to build it for (default: the own window).
        """
        return self._position_bias(window or self.window_size)[0]

    def _position_bias(self, window: tuple[int, int]) -> tuple[Tensor | None, bool]:
        """:meth:`position_bias` and whether it is the cached one (the masks built from it may be reused)."""
        params = self.bias_parameters()
        if uncacheable(params):
            self._bias_cache.clear()
            return self.compute_position_bias(window), False
        key = (torch.is_inference_mode_enabled(), window)  # an inference tensor must not reach autograd later
        if not self._bias_cache.lookup(params, key):
            self._mask_cache.clear()
            self._bias_cache.store(params, key, self.compute_position_bias(window))
        return self._bias_cache.value, True

    # ---------------------------------------------------------------- forward
    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``; any ``H, W`` (padded to the window internally; a window
        larger than the map is clamped to it, :meth:`fitted_window`).

        The call: ``feat_size`` is the map's own ``(H, W)`` when given; a spatial mechanism never sees
        prefix tokens (``num_prefix_tokens`` must be 0) nor a ``context``. ``residual [B, H, W, C]`` (the
        blocks' speed path) is added to the output, fused into ``proj`` at inference.
        """
        B, H, W, C = check_spatial_call(self, x, call)
        residual = call.residual
        window, shift = self.fitted_window(H, W)
        wh, ww = window
        if (H % wh or W % ww) and not self.allow_padding:
            raise ValueError(f"window_size={window} does not tile the {H}x{W} map and "
                             "allow_padding=False; pad the map or build with allow_padding=True")
        tokens = window_tokens(x, window, shift, pad_first=self.pad_first)  # windows or tokens
        position_bias, cached = self._position_bias(window)  # [nh, N, N]
        out = window_attention(self.project_qkv(tokens), position_bias, feat_size=(H, W), num_heads=self.num_heads,
                               window_size=window, shift_size=shift, pad_first=self.pad_first,
                               scale=self.scale, logit_scale=self.logit_temperature(),
                               attn_drop=self.attn_drop, training=self.training,
                               bias_cache=self._mask_cache if cached else None,
                               mechanism=getattr(self, "attention_name", "window"),
                               mask_padding=self.pad_mask,
                               fused=self.fused_attention, backend=self.attention_backend)  # [B, H·W, C]
        res = None if residual is None else residual.reshape(B, H * W, C)
        return self.project_out(out, res).view(B, H, W, C)  # [B, H, W, C]

    def attend_prefix(self, prefix: Tensor, tokens: Tensor) -> Tensor:
        """Prefix tokens ``[B, P, C]`` attend globally to ``tokens [B, P + H·W, C]`` (all of them): ``[B, P, C]``.

        The adapter's rule for class / register tokens in front of the grid (the windows keep their
        pattern): the same q / k / v and output projections and logit scaling (SwinV2: cosine with the
        per-head temperature), no position bias and no shift.
        """
        temperature = self.logit_temperature()
        return packed_prefix_attention(self, prefix, tokens, self.project_qkv(tokens),
                                       scale=self.scale if temperature is None else temperature)

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``input_shape = (B, H, W, C)``: ``4·hw·C² + 2·M·hw_p·C`` per image.

        ``hw = H·W`` tokens are projected (plus one zero token for the qkv projection when the map
        is padded: padded slots all share its projection), attention runs on the padded map
        ``hw_p`` and ``M = Wh·Ww`` is the tokens of a window (the paper's ``M²``).
        """
        B, H, W, C = input_shape
        wh, ww = self.fitted_window(H, W)[0]
        hw = H * W
        hwp = (H + (-H) % wh) * (W + (-W) % ww)
        qkv_tokens = hw + (hwp != hw)
        return B * (3 * qkv_tokens * C * C + hw * C * C + 2 * wh * ww * hwp * C)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, "
                f"shift_size={self.shift_size}, pad_first={self.pad_first}, clamp_window={self.clamp_window}")


@register_attention(
    "window", layout="spatial", description="Swin (shifted) window attention with relative position bias",
    example_kwargs=dict(window_size=4, shift_size=2), paper="https://arxiv.org/abs/2103.14030",
    formula=(
        "Swin window attention (Liu et al. 2021). The map `[B, H, W, C]` is cut into non-overlapping "
        "`M x M` windows; each window attends to itself with a learned relative-position bias. With "
        "`shift_size > 0` (SW-MSA) the map is first rolled by `-shift`, and a region mask keeps tokens "
        "that were not neighbours before the roll from attending to each other:\n\n"
        "    windows = window_partition(roll(x, -s))        # [B·nW, M², C]\n"
        "    A = softmax(q kᵀ · hd^-1/2 + B_rel + mask)     # [B·nW, nh, M², M²]\n"
        "    out = roll(window_reverse(A v W_proj), +s)     # [B, H, W, C]\n\n"
        "`B_rel[i, j] = table[index(Δrow, Δcol)]` with a table of `(2M-1)²` entries per head."),
    cost="4·hw·C² + 2·M²·hw·C multiply-adds (linear in the map size hw for a fixed window M)",
    doc_example=(dict(window_size=7, shift_size=3), (1, 14, 14, 96)), grid_kwargs=small_window_kwargs,
    global_kwargs=covering_window_kwargs)
class WindowAttention(WindowAttentionBase):
    """Swin W-MSA / SW-MSA, ``[B, H, W, C] -> [B, H, W, C]``.

    ``softmax(q kᵀ / sqrt(hd) + B_rel + M_shift) v`` in ``Wh x Ww`` windows, where ``B_rel`` is read
    from a learned table ``[(2Wh-1)(2Ww-1), nh]`` by relative offset and ``M_shift`` is the cyclic
    shift region mask (``shift_size > 0``). Keys: ``qkv``, ``proj``, ``relative_position_bias_table``
    (timm layout). Cost: ``4·hw·C² + 2·Wh·Ww·hw·C`` multiply-adds.

    Args:
        dim: channels ``C``; num_heads: ``nh`` (must divide ``dim``).
        window_size: ``Ws`` or ``(Wh, Ww)``. shift_size: cyclic shift, ``0 <= s < Ws`` per axis.
        qkv_bias: bias on the qkv projection. qk_scale: logit scale (default ``hd ** -0.5``).
        pad_first: pad before the shift (default; torchvision order), else timm's roll-then-pad.
        allow_padding: pad maps that are not window multiples (else raise).
        clamp_window: an axis of the map no longer than the window gets window = that side, no shift
            (Swin's rule, at forward time; :meth:`~WindowAttentionBase.fitted_window`); False pads the map
            up to the window (the Swin / Twins / DaViT models, which set their windows per stage).
    """

    # docs/flex.md's row of patterns (analysis.docs.pattern_table); skipped blocks counted on `example`
    flex_pattern = PatternDoc(
        families="Swin",
        keys="same (shifted) window; not a padded key where padding is masked",
        term="Swin's bias table at `[h, q % S, kv % S]` (gathered by offset), -100 between shift regions",
        order="window-major, each window spaced to `S` slots (`S = 64` for 7 x 7 windows: two per block)",
        example=(dict(window_size=7, shift_size=3), (1, 28, 28, 96)))

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    def __init__(self, dim: int, num_heads: int, *, window_size: int | Sequence[int] = 7,
                 shift_size: int | Sequence[int] = 0, qkv_bias: bool = True, qk_scale: float | None = None,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, pad_first: bool = True,
                 allow_padding: bool = True, clamp_window: bool = True) -> None:
        super().__init__(dim, num_heads, window_size=window_size, shift_size=shift_size, attn_drop=attn_drop,
                         proj_drop=proj_drop, pad_first=pad_first, allow_padding=allow_padding,
                         clamp_window=clamp_window)
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        wh, ww = self.window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def project_qkv(self, x: Tensor) -> Tensor:
        """``[..., C] -> [..., 3C]``."""
        return apply_linear(self.qkv, x)

    def bias_parameters(self) -> list[Tensor]:
        """The relative-position table."""
        return [self.relative_position_bias_table]

    def _resize_position_bias(self, old_window: tuple[int, int]) -> None:
        """Replace the table by its resampling to the new window (:func:`resize_window_bias_table`, timm's)."""
        old = self.relative_position_bias_table
        with torch.no_grad():
            new = resize_window_bias_table(old.detach(), old_window, self.window_size)
        self.relative_position_bias_table = nn.Parameter(new.contiguous(), requires_grad=old.requires_grad)

    def compute_position_bias(self, window: tuple[int, int]) -> Tensor:
        """Gather the table by relative offset: ``[nh, N, N]``; a clamped (smaller) window reads the table's
        central ``(2h-1) x (2w-1)`` offsets, the same entries each offset has in the full window."""
        table = self.relative_position_bias_table
        (wh, ww), (h, w) = self.window_size, window
        if (h, w) != (wh, ww):
            table = table.view(2 * wh - 1, 2 * ww - 1, -1)[wh - h:wh + h - 1, ww - w:ww + w - 1]
            table = table.reshape((2 * h - 1) * (2 * w - 1), -1)  # [(2h-1)(2w-1), nh]
        index = relative_position_index(window, device=table.device)  # [N, N]
        N = index.shape[0]
        return table[index.view(-1)].view(N, N, -1).permute(2, 0, 1).contiguous()  # [nh, N, N]

    # ---- attention.transfer: another mechanism's weights into this one
    offset_bias_params = ("relative_position_bias_table",)

    def transfer_init(self) -> list[str]:
        """A zero table: no position term beyond what the carried projections compute."""
        with torch.no_grad():
            self.relative_position_bias_table.zero_()
        return ["relative_position_bias_table: zeros (no position term)"]

    def get_offset_bias(self) -> Tensor:
        """The table as an offset grid ``[nh, 2Wh-1, 2Ww-1]`` (key minus query; the table is indexed by query
        minus key, hence the flips)."""
        (wh, ww), table = self.window_size, self.relative_position_bias_table.detach()
        return table.view(2 * wh - 1, 2 * ww - 1, -1).permute(2, 0, 1).flip(1, 2).clone()

    def set_offset_bias(self, grid: Tensor) -> bool:
        """Write an offset grid ``[nh, 2a-1, 2b-1]`` (:func:`~vit_attention.attention.transfer.fit_offset_grid`:
        offsets beyond its reach are zero) -> whether the heads matched."""
        wh, ww = self.window_size
        if grid.shape[0] != self.num_heads:
            return False
        fitted = fit_offset_grid(grid, (2 * wh - 1, 2 * ww - 1)).flip(1, 2).permute(1, 2, 0)
        with torch.no_grad():
            self.relative_position_bias_table.copy_(fitted.reshape(-1, self.num_heads))
        return True

