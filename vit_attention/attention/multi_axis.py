"""MaxViT's multi-axis attention (Tu et al., ECCV 2022, arXiv 2204.01697): ``block`` and ``grid`` attention.

One implementation, two registrations. The channels-last map ``[B, H, W, C]`` is cut into partitions of
``N = ph·pw`` tokens (:mod:`vit_attention.functional.multi_axis`):

* ``block``: contiguous ``P x P`` windows (local attention, Swin's windows without a shift);
* ``grid``: ``G x G`` groups whose members lie ``H/G`` rows and ``W/G`` columns apart (sparse, global mixing;
  ``G`` is the group side, TF's ``grid_size``, not the number of groups). Grid attention is window attention on
  the map with rows and columns regrouped, so both run through the same code.

Each partition attends to itself with a learned relative-position bias per head, the TF table layout
``relative_position_bias_table [nh, 2P-1, 2P-1]`` read at ``(r_k - r_q + P-1, c_k - c_q + P-1)`` (key minus query,
in-partition coordinates; google-research/maxvit ``maxvit/models/attention_utils.py``, timm 1.0.31
``timm/layers/pos_embed_rel.py`` ``RelPosBiasTf``); for the grid an offset step is one group step on the map.
Logit scale ``hd^-1/2``; ``qkv`` rows ``[q | k | v]`` (timm's ``head_first=False``, the TF / torchvision layout).
With ``rel_pos="mlp"`` (timm's ``rmlp`` models, ``RelPosMlp`` mode ``cr``) the table is computed instead of learned:
``MLP(f(Δ))`` with ``Δ`` the (row, col) offset query minus key, ``f(d) = sign(d)·ln(1 + |d|)`` per axis and the
MLP ``2 -> 512 -> nh`` (ReLU, dropout 0.125 on its hidden layer while training).

Sizes (no reference pads: MaxViT's models take maps that the partition tiles, timm asserts it): an axis no longer
than the partition side runs as one partition of the map's side (the table's central offsets), and a map the side
does not tile is zero-padded bottom / right to a multiple of it, the padded keys masked (no real token sees
padding), unless ``allow_padding=False``, which refuses it naming the rule. On the ``"flex"`` backend one
FlexAttention call runs over the partition-major sequence (:func:`~vit_attention.functional.multi_axis.
multi_axis_pattern`: block-diagonal, the table read in the score_mod).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import merge_heads, split_qkv
from ..functional.flex import PatternDoc, use_flex
from ..functional.layout import AttentionLayout
from ..functional.linear import apply_linear
from ..functional.multi_axis import (
    PartitionKind,
    multi_axis_partition,
    multi_axis_pattern,
    multi_axis_reverse,
    partition_geometry,
    partition_positions,
    tf_relative_position_index,
)
from ..functional.observers import attention_observed
from ..functional.window import to_pair, window_sequence_stride
from .base import AttentionCall, AttentionModule, ParamCache, check_spatial_call, packed_prefix_attention, uncacheable
from .registry import covering_window_kwargs, register_attention, small_window_kwargs
from .transfer import PACKED_QKV_SLOTS, fit_offset_grid
from .window import resize_window_bias_table

__all__ = ["MultiAxisAttention", "BlockAttention", "GridAttention", "RelPosMlp", "resize_tf_bias_table"]


def resize_tf_bias_table(table: Tensor, new_size: tuple[int, int]) -> Tensor:
    """A TF table ``[nh, 2P-1, 2Q-1]`` resampled for another partition ``[nh, 2P'-1, 2Q'-1]``.

    timm 1.0.31's ``resize_rel_pos_bias_table`` on a 3-D (``RelPosBiasTf``) table, its scipy-free linear path: the
    rule of :func:`~vit_attention.attention.window.resize_window_bias_table` applied to each head's offset grid
    (BEiT's geometric sampling). The same size: the table itself.
    """
    nh, a, b = table.shape
    old = ((a + 1) // 2, (b + 1) // 2)
    if old == tuple(new_size):
        return table
    flat = resize_window_bias_table(table.reshape(nh, -1).T, old, tuple(new_size))  # [(2P'-1)(2Q'-1), nh]
    return flat.T.reshape(nh, 2 * new_size[0] - 1, 2 * new_size[1] - 1).contiguous()


class RelPosMlp(nn.Module):
    """timm's relative-position MLP (``RelPosMlp``, mode ``cr``): ``fc2(dropout_0.125(ReLU(fc1(c))))``, log-spaced
    offsets ``c [..., 2] -> [..., nh]``. Keys ``fc1``, ``fc2``."""

    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, hidden)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(0.125)
        self.fc2 = nn.Linear(hidden, num_heads)

    def forward(self, coords: Tensor) -> Tensor:
        """``[..., 2] -> [..., nh]``."""
        return self.fc2(self.drop(self.act(self.fc1(coords))))


class MultiAxisAttention(AttentionModule):
    """Partition attention with MaxViT's TF relative-position table, ``[B, H, W, C] -> [B, H, W, C]``.

    The shared implementation of ``block`` and ``grid`` (:attr:`kind`); see the module docstring.
    Keys (timm's, ``rel_pos.`` dropped): ``qkv``, ``relative_position_bias_table`` ``[nh, 2P-1, 2P-1]`` (or, with
    ``rel_pos="mlp"``, ``rel_pos_mlp.fc1`` / ``fc2``), ``proj``.
    Cost: ``4·hw·C² + 2·N·hw·C`` multiply-adds (``N = P²``; on a padded map the qkv and attention terms count the
    padded ``hw``).

    Args:
        dim: channels ``C``; num_heads: ``nh`` (must divide ``dim``; MaxViT uses ``hd = 32``).
        window_size: the partition side ``P`` (block) or ``G`` (grid), an int or ``(h, w)``.
        qkv_bias, proj_bias: biases of the two projections. qk_scale: logit scale (default ``hd^-1/2``).
        allow_padding: pad a map the partition does not tile (masked padding), else raise.
        rel_pos: ``"table"`` (a learned TF table) or ``"mlp"`` (the table computed by an MLP of the log-spaced
            offsets, ``rel_pos_dim`` hidden units: timm's ``rmlp``).
    """

    kind: ClassVar[PartitionKind] = "block"
    accepts = frozenset({"residual"})
    transfer_slots = PACKED_QKV_SLOTS

    def __init__(self, dim: int, num_heads: int, *, window_size: int | Sequence[int] = 7, qkv_bias: bool = True,
                 proj_bias: bool = True, qk_scale: float | None = None, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, allow_padding: bool = True, rel_pos: Literal["table", "mlp"] = "table",
                 rel_pos_dim: int = 512) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.window_size = self._check_window(window_size)
        if not isinstance(allow_padding, bool):
            raise TypeError(f"allow_padding must be a bool, got {allow_padding!r}")
        self.allow_padding = allow_padding
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        if rel_pos not in ("table", "mlp"):
            raise ValueError(f"rel_pos must be 'table' or 'mlp', got {rel_pos!r}")
        if not isinstance(rel_pos_dim, int) or isinstance(rel_pos_dim, bool) or rel_pos_dim <= 0:
            raise ValueError(f"rel_pos_dim must be a positive int, got {rel_pos_dim!r}")
        self.rel_pos = rel_pos
        P, Q = self.window_size
        if rel_pos == "table":
            self.relative_position_bias_table = nn.Parameter(torch.zeros(num_heads, 2 * P - 1, 2 * Q - 1))
            nn.init.normal_(self.relative_position_bias_table, std=0.02)  # TF / timm bias_tf init
        else:  # timm RelPosMlp (mode "cr"): dropout 0.125 on the hidden layer
            self.rel_pos_mlp = RelPosMlp(rel_pos_dim, num_heads)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self._bias_cache = ParamCache()  # the [nh, N, N] bias while the table is unchanged

    @staticmethod
    def _check_window(window_size: int | Sequence[int]) -> tuple[int, int]:
        window = to_pair(window_size, "window_size")
        if min(window) <= 0:
            raise ValueError(f"window_size must be positive (the partition side), got {window_size!r}")
        return window

    # ---------------------------------------------------------------- bias
    def bias_table(self) -> Tensor:
        """The TF table ``[nh, 2P-1, 2Q-1]`` of the own side: the learned one, or the MLP's values at each offset
        (``[h, a, b]``: key minus query ``(a - P + 1, b - Q + 1)``)."""
        if self.rel_pos == "table":
            return self.relative_position_bias_table
        P, Q = self.window_size
        fc1 = self.rel_pos_mlp.fc1.weight
        dr = torch.arange(P - 1, -P, -1, device=fc1.device, dtype=torch.float32)  # query minus key, per row a
        dc = torch.arange(Q - 1, -Q, -1, device=fc1.device, dtype=torch.float32)
        coords = torch.stack(torch.meshgrid(dr, dc, indexing="ij"), dim=-1)  # [2P-1, 2Q-1, 2]
        coords = (torch.sign(coords) * torch.log1p(coords.abs())).to(fc1.dtype)
        return self.rel_pos_mlp(coords).permute(2, 0, 1)  # [nh, 2P-1, 2Q-1]

    def bias_parameters(self) -> list[Tensor]:
        """The parameters the bias is computed from (the cache compares their values)."""
        if self.rel_pos == "table":
            return [self.relative_position_bias_table]
        return list(self.rel_pos_mlp.parameters())

    def compute_position_bias(self, size: tuple[int, int]) -> Tensor:
        """The table gathered for a partition of side ``size`` (the own side, or a smaller one clamped to the map:
        the table's central offsets): ``[nh, N, N]``."""
        table = self.bias_table()
        (P, Q), (h, w) = self.window_size, size
        if (h, w) != (P, Q):
            table = table[:, P - h:P + h - 1, Q - w:Q + w - 1]  # [nh, 2h-1, 2w-1]
        index = tf_relative_position_index((h, w), device=table.device)  # [N, N]
        N = index.shape[0]
        return table.reshape(table.shape[0], -1)[:, index.view(-1)].view(-1, N, N)  # [nh, N, N]

    def position_bias(self, size: tuple[int, int] | None = None) -> Tensor:
        """:meth:`compute_position_bias`, cached while the table holds the same values (CPU inference)."""
        size = size or self.window_size
        params = self.bias_parameters()
        if uncacheable(params) or (self.training and self.rel_pos == "mlp"):  # the MLP's dropout draws anew
            self._bias_cache.clear()
            return self.compute_position_bias(size)
        key = (torch.is_inference_mode_enabled(), size)
        if not self._bias_cache.lookup(params, key):
            self._bias_cache.store(params, key, self.compute_position_bias(size))
        return self._bias_cache.value

    # ---------------------------------------------------------------- forward
    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``: each partition attends to itself (module docstring).

        ``call.residual [B, H, W, C]`` is added to the output (fused into ``proj`` at inference).
        """
        B, H, W, C = check_spatial_call(self, x, call)
        kind = self.kind
        (ph, pw), (Hp, Wp) = partition_geometry(H, W, self.window_size)
        padded = (Hp, Wp) != (H, W)
        if padded and not self.allow_padding:
            raise ValueError(f"{self.attention_name or kind} attention: window_size={(ph, pw)} does not tile the "
                             f"{H}x{W} map and allow_padding=False (MaxViT's rule: H and W multiples of the "
                             "partition side); pad the map or build with allow_padding=True")
        xp = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H)) if padded else x  # [B, Hp, Wp, C]
        parts = multi_axis_partition(xp, (ph, pw), kind)  # [B·nP, N, C]
        q, k, v = split_qkv(apply_linear(self.qkv, parts), self.num_heads)  # each [B·nP, nh, N, hd]
        nP, N = (Hp // ph) * (Wp // pw), ph * pw
        bias = self.position_bias((ph, pw))  # [nh, N, N]
        positions = partition_positions(H, W, (ph, pw), kind, device=x.device) if padded else None  # [nP, N]
        if B and use_flex(self.attention_backend, self.fused_attention, x.device, mechanism=kind):
            out = self._flex(q, k, v, bias, positions, nP, N, (H, W, ph, pw, kind))  # [B·nP, nh, N, hd]
        else:
            mask = None
            if positions is not None:  # padded keys are not attended to: [B·nP, 1, 1, N]
                mask = (positions >= 0).view(1, nP, 1, 1, N).expand(B, -1, -1, -1, -1).reshape(B * nP, 1, 1, N)
            layout = None
            if attention_observed():  # observers only: where each row sits on the map
                pos = partition_positions(H, W, (ph, pw), kind)
                layout = AttentionLayout((H, W), pos, pos, fold="batch")
            out = self.attend(q, k, v, bias=bias.unsqueeze(0).to(q.dtype), mask=mask, scale=self.scale,
                              layout=layout)  # [B·nP, nh, N, hd]
        out = multi_axis_reverse(merge_heads(out), (ph, pw), (Hp, Wp), kind)  # [B, Hp, Wp, C]
        if padded:
            out = out[:, :H, :W]
        return self.project_out(out, call.residual)  # [B, H, W, C]

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, positions: Tensor | None, nP: int, N: int,
              geometry: tuple[object, ...]) -> Tensor:
        """The partitions as one FlexAttention call over the partition-major sequence ``[B, nh, nP·S, hd]``."""
        S = window_sequence_stride(nP, N)  # N, or N padded so that partitions fit the block mask's blocks
        nh, hd = q.shape[1], q.shape[-1]
        B = q.shape[0] // nP

        def seq(t: Tensor) -> Tensor:  # [B·nP, nh, N, hd] -> [B, nh, nP·S, hd]
            t = t.reshape(B, nP, nh, N, hd)
            if S != N:
                t = F.pad(t, (0, 0, 0, S - N))
            return t.permute(0, 2, 1, 3, 4).reshape(B, nh, nP * S, hd)

        valid = None
        if positions is not None:
            valid = F.pad(positions >= 0, (0, S - N), value=False).reshape(-1)  # [nP·S]
        pattern = multi_axis_pattern(nP, N, S, bias.to(q.dtype), valid, geometry)
        out = self.attend(seq(q), seq(k), seq(v), scale=self.scale, pattern=pattern)  # [B, nh, nP·S, hd]
        out = out.view(B, nh, nP, S, hd)[:, :, :, :N].permute(0, 2, 1, 3, 4)  # [B, nP, nh, N, hd]
        return out.reshape(B * nP, nh, N, hd)

    def attend_prefix(self, prefix: Tensor, tokens: Tensor) -> Tensor:
        """Prefix tokens ``[B, P, C]`` attend globally to ``tokens [B, P + H·W, C]``: ``[B, P, C]``; the same
        projections and scale, no position bias (the partitions keep their pattern)."""
        return packed_prefix_attention(self, prefix, tokens, apply_linear(self.qkv, tokens), scale=self.scale)

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``(B, H, W, C)``: ``3·hw_p·C² + hw·C² + 2·N·hw_p·C`` per image (``hw_p`` the padded map,
        on which qkv and attention run; ``N`` the partition's tokens)."""
        B, H, W, C = input_shape
        (ph, pw), (Hp, Wp) = partition_geometry(H, W, self.window_size)
        macs = B * (3 * Hp * Wp * C * C + H * W * C * C + 2 * ph * pw * Hp * Wp * C)
        if self.rel_pos == "mlp":  # the table, once per forward: (2P-1)(2Q-1) offsets through 2 -> hidden -> nh
            P, Q = self.window_size
            hidden = self.rel_pos_mlp.fc1.out_features
            macs += (2 * P - 1) * (2 * Q - 1) * (2 * hidden + hidden * self.num_heads)
        return macs

    # ---------------------------------------------------------------- sizes
    def set_window_size(self, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0) -> None:
        """Another partition side in place (a model's ``set_input_size``): the table resampled by timm's rule
        (:func:`resize_tf_bias_table`). MaxViT's partitions are never shifted: ``shift_size`` must be 0."""
        if to_pair(shift_size, "shift_size") != (0, 0):
            raise ValueError(f"shift_size must be 0: {self.kind} partitions are not shifted, got {shift_size!r}")
        window = self._check_window(window_size)
        if window != self.window_size and self.rel_pos == "table":
            old = self.relative_position_bias_table
            with torch.no_grad():
                table = resize_tf_bias_table(old.detach(), window).clone()
            self.relative_position_bias_table = nn.Parameter(table, requires_grad=old.requires_grad)
        self.window_size = window
        self._bias_cache.clear()

    def transfer_init(self) -> list[str]:
        """A zero table (or a zero MLP output layer): no position term beyond what the carried projections compute."""
        with torch.no_grad():
            if self.rel_pos == "mlp":
                self.rel_pos_mlp.fc2.weight.zero_()
                self.rel_pos_mlp.fc2.bias.zero_()
                return ["rel_pos_mlp.fc2: zeros (no position term)"]
            self.relative_position_bias_table.zero_()
        return ["relative_position_bias_table: zeros (no position term)"]

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, kind={self.kind!r}, "
                f"allow_padding={self.allow_padding}, rel_pos={self.rel_pos!r}")


_COST = "4·hw·C² + 2·N·hw·C multiply-adds (N = P² tokens per partition: linear in the map size hw)"


@register_attention(
    "block", layout="spatial",
    description="MaxViT block attention: P x P windows with a TF relative-position table (key minus query)",
    paper="https://arxiv.org/abs/2204.01697", example_kwargs=dict(window_size=4),
    formula=(
        "MaxViT's block attention (Tu et al. 2022): the map `[B, H, W, C]` is cut into contiguous `P x P` "
        "windows (partition `(r // P, c // P)`, position `(r % P, c % P)`); each attends to itself with a learned "
        "bias per head and offset:\n\n"
        "    parts = block_partition(x)                      # [B·nP, P², C]\n"
        "    A = softmax(q kᵀ · hd^-1/2 + T[h, Δr + P-1, Δc + P-1])   # Δ = key - query\n"
        "    out = block_reverse(A v) W_proj                 # [B, H, W, C]\n\n"
        "`T [nh, 2P-1, 2P-1]` is the TF table layout. A map the window does not tile is zero-padded, the padded "
        "keys masked; an axis shorter than `P` is one window."),
    cost=_COST, doc_example=(dict(window_size=7), (1, 14, 14, 96)), grid_kwargs=small_window_kwargs,
    global_kwargs=covering_window_kwargs)
class BlockAttention(MultiAxisAttention):
    """MaxViT block (window) attention, ``[B, H, W, C] -> [B, H, W, C]``: :class:`MultiAxisAttention` on contiguous
    ``P x P`` windows."""

    kind: ClassVar[PartitionKind] = "block"
    flex_pattern = PatternDoc(
        families="MaxViT", keys="same `P x P` window; not a padded key",
        term="the TF table at `[h, Δr + P-1, Δc + P-1]` (key minus query), gathered by offset",
        order="window-major (row-major windows, tokens row-major inside), each window spaced to `S` slots",
        example=(dict(window_size=7), (1, 28, 28, 96)))

    # ---- attention.transfer: the table is an offset grid already (key minus query)
    offset_bias_params = ("relative_position_bias_table",)

    def get_offset_bias(self) -> Tensor:
        """The table as an offset grid ``[nh, 2P-1, 2Q-1]`` (key minus query: the table itself; with ``rel_pos="mlp"``
        the MLP's values)."""
        with torch.no_grad():
            return self.bias_table().detach().clone()

    def set_offset_bias(self, grid: Tensor) -> bool:
        """Write an offset grid ``[nh, 2a-1, 2b-1]`` (offsets beyond its reach zero) -> whether it was written (the
        heads match and the table is learned, not an MLP's)."""
        P, Q = self.window_size
        if grid.shape[0] != self.num_heads or self.rel_pos != "table":
            return False
        with torch.no_grad():
            self.relative_position_bias_table.copy_(fit_offset_grid(grid, (2 * P - 1, 2 * Q - 1)))
        return True


@register_attention(
    "grid", layout="spatial",
    description="MaxViT grid attention: G x G groups strided over the whole map, TF relative-position table",
    paper="https://arxiv.org/abs/2204.01697", example_kwargs=dict(window_size=4),
    formula=(
        "MaxViT's grid attention (Tu et al. 2022): with `(gh, gw) = (H / G, W / G)` the map is cut into "
        "`gh·gw` groups of `G x G` tokens spread over the whole map (partition `(r % gh, c % gw)`, position "
        "`(r // gh, c // gw)`: members `gh` rows and `gw` columns apart); each group attends to itself:\n\n"
        "    parts = grid_partition(x)                       # [B·gh·gw, G², C]\n"
        "    A = softmax(q kᵀ · hd^-1/2 + T[h, Δr + G-1, Δc + G-1])   # Δ in group steps, key - query\n"
        "    out = grid_reverse(A v) W_proj                  # [B, H, W, C]\n\n"
        "It is block attention on the map with rows `r -> (r % gh)·G + r // gh` (and columns) regrouped. "
        "`G` is the group side, not the number of groups. A map `G` does not tile is zero-padded, the padded "
        "keys masked; an axis shorter than `G` is one group."),
    cost=_COST, doc_example=(dict(window_size=7), (1, 14, 14, 96)), grid_kwargs=small_window_kwargs,
    global_kwargs=covering_window_kwargs)
class GridAttention(MultiAxisAttention):
    """MaxViT grid (dilated) attention, ``[B, H, W, C] -> [B, H, W, C]``: :class:`MultiAxisAttention` on ``G x G``
    groups strided over the map. Its table's offsets are in group steps (``H/G`` tokens on the map), so it offers
    no offset grid to weight transfer."""

    kind: ClassVar[PartitionKind] = "grid"
    flex_pattern = PatternDoc(
        families="MaxViT", keys="same strided `G x G` group (`r % (H/G)`, `c % (W/G)` equal); not a padded key",
        term="the TF table at `[h, Δr + G-1, Δc + G-1]`, offsets in group steps",
        order="group-major after the row / column regrouping (block-diagonal), each group spaced to `S` slots",
        example=(dict(window_size=7), (1, 28, 28, 96)))
