"""Window or global attention with MViTv2's decomposed relative positions (ViTDet; SAM's image encoder).

Channels-last maps ``[B, H, W, C]`` in and out. Two modes, chosen by ``window_size``:

* ``window_size = ws > 0``: the map is zero-padded bottom / right to multiples of ``ws`` and cut
  into ``ws x ws`` windows, each attending to itself, with no shift and **no mask**: the padded
  slots (zero inputs after the block's norm, so ``k = b_k``, ``v = b_v``) take part in the softmax,
  as in detectron2, Hugging Face ``VitDet`` and timm ``samvit``; the output is cropped.
* ``window_size = 0``: global attention over all ``H·W`` tokens.

Both add the decomposed bias of :func:`~vit_attention.functional.rel_pos.decomposed_rel_pos_bias`
(``q·R_h[Δrow] + q·R_w[Δcol]``, from the unscaled queries) as the ``bias`` of the one attention
function; the window mode goes through
:func:`~vit_attention.functional.window_attention.window_attention` (its ``query_bias``), so
the partition, the padding, the fused kernel and the attention-map layout are Swin's.

Keys (detectron2 / timm ``samvit`` / Hugging Face ``VitDet``): ``qkv``, ``proj``, ``rel_pos_h``
``[2·K_h - 1, hd]``, ``rel_pos_w`` ``[2·K_w - 1, hd]`` with ``K = ws`` in window mode and
``K = input_size`` (the token grid the model is built for) in global mode; a table of another
length (another image size) is resized linearly at run time.

``rel_pos_impl="augment"`` (global mode) computes the same logits without materialising the
``[B, nh, N, N]`` bias (:func:`~vit_attention.functional.rel_pos.decomposed_rel_pos_qk`: the
position term appended to q and k as one-hot key coordinates), so the fused kernel runs in O(N)
memory, for ``nh·(H + W)·N²`` more multiply-adds. Measured on an H100, ViTDet-B's 64x64 global
attention: 3x faster in bf16 and a tenth of the memory. Window blocks always use the bias
(there the augmented form measured slower).

On the ``"flex"`` backend a global block is one call with the pattern of
:func:`~vit_attention.functional.rel_pos.decomposed_rel_pos_pattern` (whatever ``rel_pos_impl``): the
position term is a ``score_mod`` reading the per-query ``q·R_h`` ``[B, nh, N, H]`` and ``q·R_w``
``[B, nh, N, W]``, never an ``N x N`` bias. Window blocks go through ``window_attention`` as on the
other backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_qkv
from ..functional.flex import AttentionPattern, PatternDoc, use_flex
from ..functional.layout import token_layout
from ..functional.linear import apply_linear
from ..functional.observers import attention_observed
from ..functional.rel_pos import decomposed_rel_pos_bias, decomposed_rel_pos_pattern, decomposed_rel_pos_qk
from ..functional.window import fit_window, to_pair
from ..functional.window_attention import window_attention, window_tokens
from .base import AttentionCall, PackedQKVAttention, check_spatial_call
from .registry import register_attention, small_window_kwargs
from .transfer import PACKED_QKV_SLOTS

__all__ = ["RelPosAttention"]


@register_attention(
    "rel_pos", layout="spatial",
    description="window (unshifted, unmasked padding) or global attention with MViTv2's decomposed "
                "relative positions (ViTDet)",
    example_kwargs=dict(window_size=4, rel_pos_zero_init=False), paper="https://arxiv.org/abs/2203.16527",
    formula=(
        "Decomposed-position window / global attention (ViTDet, Li et al. 2022; the position term is "
        "MViTv2's, Li et al. 2021). With `window_size = ws > 0` the map `[B, H, W, C]` is zero-padded to "
        "multiples of `ws` and cut into `ws x ws` windows (no shift, no mask: padded slots take part in the "
        "softmax, as in the references); with `window_size = 0` all `H·W` tokens attend to each other. "
        "Either way the logits get a relative-position term read through the *unscaled* query, one table "
        "per axis:\n\n"
        "    q, k, v = split_heads(x W_qkv)                        # [B·nW, nh, N, hd]\n"
        "    rel[i, j] = q_i · R_h[r_i - r_j + K_h - 1]\n"
        "              + q_i · R_w[c_i - c_j + K_w - 1]            # [B·nW, nh, N, N]\n"
        "    A = softmax(q kᵀ · hd^-1/2 + rel)                     # the core's `bias`\n"
        "    out = crop(window_reverse(A v)) W_proj                # [B, H, W, C]\n\n"
        "`R_h [2·K_h - 1, hd]`, `R_w [2·K_w - 1, hd]` are shared by the heads (`K` = the window, or the "
        "token grid of global blocks); a table of another length is resized linearly, and coordinates are "
        "stretched when the query and key grids differ. ViTDet-B uses `ws = 14` on the 64x64 map of a 1024² "
        "image (padded to 70x70) and 4 global blocks."),
    cost="window: 4·hw·C² + 2·ws²·hw_p·C + 2·ws·hw_p·C multiply-adds (hw_p: the map padded to multiples "
         "of ws); global: 4·hw·C² + 2·(hw)²·C + (H + W)·hw·C",
    doc_example=(dict(window_size=7, rel_pos_zero_init=False), (1, 16, 16, 96)), grid_kwargs=small_window_kwargs,
    global_kwargs=lambda grid: {"input_size": grid})  # window_size=0: ViTDet's global blocks
class RelPosAttention(PackedQKVAttention):
    """ViTDet attention, ``[B, H, W, C] -> [B, H, W, C]``: window (``window_size > 0``) or global (``0``).

    ``softmax(q kᵀ / sqrt(hd) + q·R_h[Δrow] + q·R_w[Δcol]) v`` inside unshifted ``ws x ws`` windows
    of the zero-padded map (padding unmasked, as the references), or over the whole map.

    Args:
        dim: channels ``C``; num_heads: ``nh`` (must divide ``dim``).
        window_size: ``ws`` (an int or ``(Wh, Ww)``); 0 = global attention.
        input_size: the token grid ``(H, W)`` global blocks are built for (sizes their tables
            ``2·H - 1``, ``2·W - 1``); unused in window mode. Default: the 224-px pre-training grid.
        use_rel_pos: add the decomposed relative positions (False: plain window / global attention).
        rel_pos_zero_init: tables start at zero (detectron2's default); else truncated normal, std 0.02.
        rel_pos_impl: ``"bias"`` (the references' materialised bias) or ``"augment"`` (global mode:
            the same logits through augmented q / k, O(N) memory in the fused kernel; module docstring).
        qkv_bias: bias on the qkv projection. qk_scale: logit scale (default ``hd ** -0.5``).
        attn_drop, proj_drop: dropout on the weights and after ``proj``.
        clamp_window: window mode, an axis of the map no longer than the window gets window = that side
            (Swin's rule at forward time, :meth:`fitted_window`: ``window_size=256`` on a 4x4 map runs as
            ``4``); False pads the map up to the window (ViTDet, as detectron2 and timm).
    """

    # docs/flex.md's row of patterns (analysis.docs.pattern_table); skipped blocks counted on `example`
    flex_pattern = PatternDoc(
        families="ViTDet",
        keys="windowed blocks: same window (as `window`); global blocks: every key",
        term="the query-dependent decomposed term `rel_h[b, h, q, kv // W] + rel_w[b, h, q, kv % W]` "
            "from `[B, nh, N, H]` / `[B, nh, N, W]`, never an `N x N` bias",
        order="window-major (windowed), row-major (global)",
        example=(dict(window_size=0), (1, 16, 16, 96)))

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    accepts = frozenset({"residual"})

    def __init__(self, dim: int, num_heads: int, *, window_size: int | Sequence[int] = 0,
                 input_size: int | Sequence[int] = 14, use_rel_pos: bool = True, rel_pos_zero_init: bool = True,
                 rel_pos_impl: str = "bias", qkv_bias: bool = True, qk_scale: float | None = None,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, clamp_window: bool = True) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.window_size = to_pair(window_size, "window_size")
        if min(self.window_size) < 0 or (0 in self.window_size and max(self.window_size) > 0):
            raise ValueError(f"window_size must be positive, or 0 for global attention, got {window_size!r}")
        if not isinstance(clamp_window, bool):
            raise TypeError(f"clamp_window must be a bool, got {clamp_window!r}")
        self.clamp_window = clamp_window
        self.input_size = to_pair(input_size, "input_size")
        if min(self.input_size) <= 0:
            raise ValueError(f"input_size must be a positive token grid (H, W), got {input_size!r}")
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.use_rel_pos = bool(use_rel_pos)
        if rel_pos_impl not in ("bias", "augment"):
            raise ValueError(f"rel_pos_impl must be 'bias' or 'augment', got {rel_pos_impl!r}")
        self.rel_pos_impl = rel_pos_impl
        if self.use_rel_pos:
            kh, kw = self.window_size if self.is_windowed else self.input_size
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * kh - 1, self.head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * kw - 1, self.head_dim))
            if not rel_pos_zero_init:
                nn.init.trunc_normal_(self.rel_pos_h, std=0.02)
                nn.init.trunc_normal_(self.rel_pos_w, std=0.02)

    def transfer_init(self) -> list[str]:
        """Zero ``rel_pos_h`` / ``rel_pos_w``: no position term beyond what the carried projections compute."""
        if not self.use_rel_pos:
            return []
        with torch.no_grad():
            self.rel_pos_h.zero_()
            self.rel_pos_w.zero_()
        return ["rel_pos_h, rel_pos_w: zeros (no position term)"]

    @property
    def is_windowed(self) -> bool:
        """True in window mode (``window_size > 0``), False for global attention."""
        return self.window_size[0] > 0

    def fitted_window(self, H: int, W: int) -> tuple[int, int]:
        """The window used on an ``H x W`` map (window mode): with ``clamp_window`` each axis the window
        covers whole gets window = the map's side (no padding up to a larger window), else the own window."""
        if not self.clamp_window:
            return self.window_size
        return fit_window((H, W), self.window_size)[0]

    def rel_pos_bias(self, q: Tensor, grid: tuple[int, int]) -> Tensor:
        """Decomposed bias for queries ``q [*b, nh, N, hd]`` on a ``grid`` (keys on it too): ``[*b, nh, N, N]``.

        A clamped window (``grid`` smaller than the window the tables were built for) reads the tables'
        central ``2h - 1`` / ``2w - 1`` rows: each offset keeps its own entry.
        """
        rel_h, rel_w = self.rel_pos_h, self.rel_pos_w
        if self.is_windowed and tuple(grid) != self.window_size:
            (kh, kw), (h, w) = self.window_size, grid
            rel_h, rel_w = rel_h[kh - h:kh + h - 1], rel_w[kw - w:kw + w - 1]
        return decomposed_rel_pos_bias(q, rel_h, rel_w, grid, grid)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``; any ``H, W`` (padded to the window in window mode; a window
        larger than the map is clamped to it, :meth:`fitted_window`).

        The call: ``feat_size`` is the map's own ``(H, W)`` when given; a spatial mechanism never sees
        prefix tokens (``num_prefix_tokens`` must be 0) nor a ``context``. ``residual [B, H, W, C]`` (the
        blocks' speed path) is added to the output.
        """
        B, H, W, C = check_spatial_call(self, x, call)
        residual = call.residual
        if self.is_windowed:
            window = self.fitted_window(H, W)
            qkv = apply_linear(self.qkv, window_tokens(x, window))  # [B·nW, N, 3C] | [B, H·W (+1), 3C]
            query_bias = partial(self.rel_pos_bias, grid=window) if self.use_rel_pos else None
            out = window_attention(qkv, None, feat_size=(H, W), num_heads=self.num_heads,
                                   window_size=window, scale=self.scale, attn_drop=self.attn_drop,
                                   training=self.training, mechanism=self.attention_name,  # type: ignore[attr-defined]
                                   query_bias=query_bias,
                                   fused=self.fused_attention, backend=self.attention_backend)  # [B, H·W, C]
        else:
            q, k, v = split_qkv(apply_linear(self.qkv, x.reshape(B, H * W, C)), self.num_heads)  # [B, nh, N, hd]
            bias, scale, pattern = None, self.scale, None
            if use_flex(self.attention_backend, self.fused_attention, x.device, mechanism="rel_pos"):
                # one pattern over the map: the position term read per (query, key) from [B, nh, N, H | W]
                pattern = decomposed_rel_pos_pattern(q, self.rel_pos_h, self.rel_pos_w, (H, W)) \
                    if self.use_rel_pos else AttentionPattern(H * W, H * W, cache_key=("rel_pos", H, W))
            elif self.use_rel_pos and self.rel_pos_impl == "augment":  # same logits, no [N, N] bias: fused kernel
                q, k = decomposed_rel_pos_qk(q, k, self.rel_pos_h, self.rel_pos_w, (H, W), scale=scale)
                scale = 1.0  # [B, nh, N, hd + H + W] each
            elif self.use_rel_pos:
                bias = self.rel_pos_bias(q, (H, W))  # [B, nh, N, N]
            layout = token_layout(H * W, (H, W)) if attention_observed() else None
            out = merge_heads(self.attend(q, k, v, bias=bias, scale=scale, layout=layout,
                                          pattern=pattern))  # [B, H·W, C]
        res = None if residual is None else residual.reshape(B, H * W, C)
        return self.project_out(out, res).view(B, H, W, C)  # [B, H, W, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``input_shape = (B, H, W, C)``.

        Window mode: ``3·t·C² + hw·C² + 2·Wh·Ww·hw_p·C + (Wh + Ww)·hw_p·C`` per image, where the qkv
        projection runs on the ``hw`` tokens plus one zero token when the map is padded (every
        padded slot shares its projection), attention and the position term on the padded map
        ``hw_p``. Global: ``4·hw·C² + 2·(hw)²·C + (H + W)·hw·C``, plus ``nh·(H + W)·(hw)²`` with
        ``rel_pos_impl="augment"`` (the longer q / k rows).
        """
        B, H, W, C = input_shape
        hw = H * W
        rel = self.use_rel_pos
        if self.is_windowed:
            wh, ww = self.fitted_window(H, W)
            hwp = (H + (-H) % wh) * (W + (-W) % ww)
            t = hw + (hwp != hw)
            return B * (3 * t * C * C + hw * C * C + 2 * wh * ww * hwp * C + rel * (wh + ww) * hwp * C)
        augment = rel and self.rel_pos_impl == "augment"
        return B * (4 * hw * C * C + 2 * hw * hw * C + rel * (H + W) * hw * C
                    + augment * self.num_heads * (H + W) * hw * hw)

    def extra_repr(self) -> str:
        mode = f"window_size={self.window_size}" if self.is_windowed else f"global, input_size={self.input_size}"
        impl = f", rel_pos_impl={self.rel_pos_impl!r}" if self.rel_pos_impl != "bias" else ""
        return f"dim={self.dim}, num_heads={self.num_heads}, {mode}, use_rel_pos={self.use_rel_pos}{impl}"
