"""BEiT's attention (Bao et al., ICLR 2022): global self-attention with a learned relative-position bias per head and
2-D offset, the class token included through three extra table rows.

A mechanism of its own rather than an option of ``rel_pos`` (:mod:`.rel_pos`): that one is ViTDet / MViTv2's
decomposed term ``q·R_h[Δrow] + q·R_w[Δcol]``, which depends on the query, has per-axis tables shared by the heads
and runs on maps without prefix tokens. BEiT's bias is a constant per head and joint offset ``(Δy, Δx)``:
Swin's table (:mod:`.window`, the same index and the same resize rule) with the window the whole grid, plus three
rows for the class token, on a token layout ``[B, 1 + H·W, C]``. The logits get ``B[h, i, j] = table[idx(i, j),
h]`` with, for the grid ``H x W`` and ``L = (2H-1)(2W-1) + 3`` rows (timm 1.0.31 ``timm/models/beit.py``
``gen_relative_position_index``; microsoft/unilm ``beit/modeling_finetune.py``):

* grid query -> grid key: Swin's ``(Δy + H-1)·(2W-1) + (Δx + W-1)`` (``Δ`` = query minus key);
* class query -> grid key: ``L-3``; grid query -> class key: ``L-2``; class -> class: ``L-1``.

The bias is one dense ``[1, nh, N, N]`` term handed to the attention core (the fused kernel takes it as a float
mask); on the ``"flex"`` backend a ``score_mod`` reads the table at the index computed from the query and key
positions instead, with no ``[N, N]`` tensor (:func:`beit_rel_pos_pattern`). q and v have learned biases, the key
none (BEiT's ``q_bias`` / ``v_bias``; ``qkv`` itself has no bias). Token merging is refused (``tome`` is not in
``accepts``): the table is indexed by each token's place on the grid, and a merged token has none.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_qkv
from ..functional.flex import AttentionPattern, PatternDoc, use_flex
from ..functional.layout import token_layout
from ..functional.linear import linear
from ..functional.observers import attention_observed
from ..functional.window import _CPU, _cached, relative_position_index, to_pair
from .base import AttentionCall, AttentionModule, check_map_tokens_call, grid_of
from .registry import register_attention
from .transfer import PACKED_QKV_SLOTS, fit_offset_grid
from .window import resize_window_bias_table

__all__ = ["BeitRelPosAttention", "beit_rel_pos_pattern", "beit_relative_position_index", "resize_beit_bias_table"]

NUM_PREFIX_ROWS = 3  # the table's last rows: class -> grid, grid -> class, class -> class


@_cached(maxsize=64)
def _beit_index(H: int, W: int, P: int, device: torch.device) -> Tensor:
    L = (2 * H - 1) * (2 * W - 1) + NUM_PREFIX_ROWS
    index = torch.empty(P + H * W, P + H * W, dtype=torch.long, device=_CPU)
    index[P:, P:] = relative_position_index((H, W))
    index[:P, :] = L - 3  # prefix query -> any key
    index[:, :P] = L - 2  # any query -> prefix key
    index[:P, :P] = L - 1  # prefix -> prefix
    return index.to(device)


def beit_relative_position_index(grid: int | Sequence[int], num_prefix_tokens: int = 1, *,
                                 device: torch.device | str | None = None) -> Tensor:
    """BEiT's table index ``[P + H·W, P + H·W]`` (long) for a grid ``(H, W)`` after ``P`` prefix tokens.

    The grid block is Swin's :func:`~vit_attention.functional.window.relative_position_index`; with
    ``L = (2H-1)(2W-1) + 3``, prefix rows read ``L-3``, prefix columns ``L-2`` and prefix-to-prefix ``L-1`` (timm's
    order of assignment: rows, then columns, then the corner). ``P = 1`` is BEiT's class token; more prefix tokens
    (distillation, registers) share the class token's rows; ``P = 0`` gives the grid block alone. Cached per
    (grid, P, device), built outside any trace (a constant of an exported graph): do not modify the result.
    """
    H, W = to_pair(grid, "window_size")
    if not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be an int >= 0, got {num_prefix_tokens!r}")
    return _beit_index(H, W, num_prefix_tokens, torch.device(device or "cpu"))


def resize_beit_bias_table(table: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int]) -> Tensor:
    """A BEiT table ``[(2H-1)(2W-1) + 3, nh]`` for another grid ``-> [(2H'-1)(2W'-1) + 3, nh]``.

    timm 1.0.31's ``resize_rel_pos_bias_table`` (``timm/layers/pos_embed_rel.py``, its default linear path, as
    its ``Beit.set_input_size`` and ``checkpoint_filter_fn`` use it): the three class-token rows are split off and
    appended unchanged, the grid rows resampled on BEiT's geometric offset grid
    (:func:`~vit_attention.attention.window.resize_window_bias_table`). Same grid: the table itself.
    """
    grid_rows = (2 * old_grid[0] - 1) * (2 * old_grid[1] - 1)
    if table.dim() != 2 or table.shape[0] != grid_rows + NUM_PREFIX_ROWS:
        raise ValueError(f"a BEiT table of grid {tuple(old_grid)} has {grid_rows + NUM_PREFIX_ROWS} rows "
                         f"((2H-1)(2W-1) + 3), got shape {tuple(table.shape)}")
    if tuple(old_grid) == tuple(new_grid):
        return table
    patch = resize_window_bias_table(table[:grid_rows], tuple(old_grid), tuple(new_grid))
    return torch.cat([patch, table[grid_rows:]], dim=0)


def beit_rel_pos_pattern(table: Tensor, grid: tuple[int, int], num_prefix_tokens: int) -> AttentionPattern:
    """The BEiT bias as a FlexAttention ``score_mod``: ``score + table[idx(q, kv), h]`` with the index computed from
    the two positions (:func:`beit_relative_position_index`'s rule), so no ``[N, N]`` tensor is built; every key
    is visible. ``table``: ``[(2H-1)(2W-1) + 3, nh]`` of ``grid`` (gradients reach it through FlexAttention)."""
    H, W = grid
    P, L = num_prefix_tokens, table.shape[0]
    N = P + H * W

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qg, kg = (q_idx - P).clamp(min=0), (kv_idx - P).clamp(min=0)  # grid indices (prefix rows replaced below)
        grid_row = (qg // W - kg // W + H - 1) * (2 * W - 1) + (qg % W - kg % W + W - 1)
        row = torch.where(q_idx < P, torch.where(kv_idx < P, L - 1, L - 3), torch.where(kv_idx < P, L - 2, grid_row))
        return score + table[row, h]

    return AttentionPattern(N, N, score_mod=score_mod, cache_key=("beit_rel_pos", H, W, P))


@register_attention(
    "beit_rel_pos", layout="tokens", needs_feat_size=True, dense_bias=True,
    description="global attention with BEiT's per-head relative-position table (class-token rows included)",
    paper="https://arxiv.org/abs/2106.08254",
    formula=(
        "Global multi-head self-attention with a learned bias per head and 2-D offset (BEiT, Bao et al. 2022):\n\n"
        "    q, k, v = split_heads(x W_qkv + [b_q | 0 | b_v])      # no key bias\n"
        "    A = softmax(q kᵀ · hd^-1/2 + T[idx])                 # T [(2H-1)(2W-1) + 3, nh]\n"
        "    out = merge_heads(A v) W_proj\n\n"
        "`idx` is Swin's relative index on the whole `H x W` grid; the class token reads three extra rows "
        "(class -> patch, patch -> class, class -> class). The table belongs to one grid: another grid reads "
        "it resampled (timm's geometric rule); `set_window_size` / a model's `set_input_size` resample it for good."),
    cost="4·N·C² + 2·N²·C multiply-adds (the bias is a gather)",
    example_kwargs={"window_size": 4}, example_shape=(2, 16, 32), doc_example=({"window_size": 14}, (1, 196, 96)),
    grid_kwargs=lambda grid: {"window_size": grid}, global_kwargs=lambda grid: {"window_size": grid},
    qkv_bias_split=True)
class BeitRelPosAttention(AttentionModule):
    """BEiT self-attention on ``[B, P + H·W, C] -> [B, P + H·W, C]``, the table built for the grid ``window_size``.

    Keys (timm / unilm): ``qkv`` (no bias), ``q_bias`` / ``v_bias`` (``qkv_bias=True``),
    ``relative_position_bias_table`` ``[(2H-1)(2W-1) + 3, nh]`` (zeros at init), ``proj``.
    Prefix tokens read the class-token rows (:func:`beit_relative_position_index`).
    Cost: ``4·N·C² + 2·N²·C`` multiply-adds.
    """

    # docs/flex.md's row of patterns (analysis.docs.pattern_table)
    flex_pattern = PatternDoc(
        families="BEiT", keys="every key",
        term="`table[idx(q, kv), h]`, the row computed from the two positions (prefix tokens: the class-token "
             "rows), never an `N x N` bias",
        order="row-major, prefix tokens first", example=(dict(window_size=8), (1, 64, 96)))

    transfer_slots = PACKED_QKV_SLOTS
    offset_bias_params = ("relative_position_bias_table",)
    accepts = frozenset({"mask", "residual"})

    def __init__(self, dim: int, num_heads: int = 8, *, window_size: int | Sequence[int] = 14, qkv_bias: bool = True,
                 qk_scale: float | None = None, proj_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.window_size = to_pair(window_size, "window_size")
        if min(self.window_size) <= 0:
            raise ValueError(f"window_size must be positive (the token grid (H, W) of the table), got {window_size!r}")
        if not isinstance(qkv_bias, bool):
            raise ValueError(f"qkv_bias must be True (q and v biases, none on k, BEiT's layout) or False, "
                             f"got {qkv_bias!r}")
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        self.q_bias: nn.Parameter | None = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.v_bias: nn.Parameter | None = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        H, W = self.window_size
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * H - 1) * (2 * W - 1) + NUM_PREFIX_ROWS, num_heads))  # [L, nh]
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def _qkv_bias(self) -> Tensor | None:
        """``[q_bias | 0 | v_bias]`` ``[3C]`` (None without biases)."""
        if self.q_bias is None or self.v_bias is None:
            return None
        return torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])

    def position_bias(self, grid: tuple[int, int], num_prefix_tokens: int) -> Tensor:
        """The logit bias ``[1, nh, P + H·W, P + H·W]`` of the table on ``grid``; a grid other than ``window_size``
        reads the table resampled to it (:func:`resize_beit_bias_table`, the rule ``set_window_size`` applies for
        good)."""
        table = self.relative_position_bias_table
        if tuple(grid) != self.window_size:
            table = resize_beit_bias_table(table, self.window_size, tuple(grid))  # [L', nh]
        index = beit_relative_position_index(grid, num_prefix_tokens, device=table.device)
        bias = table[index.view(-1)].view(index.shape[0], index.shape[1], -1)  # [N, N, nh]
        return bias.permute(2, 0, 1).unsqueeze(0)  # [1, nh, N, N]

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, P + H·W, C] -> [B, P + H·W, C]``.

        ``call.feat_size`` is the grid (default: the square the tokens after ``num_prefix_tokens`` fill); another
        grid than ``window_size`` reads the table resampled to it (:meth:`position_bias`).
        ``mask``: bool, broadcastable to ``[B, nh, N, N]``, True = may attend.
        ``residual``: added to the output (fused into ``proj`` at inference).
        """
        B, N, C, P = check_map_tokens_call(self, x, call)
        grid = grid_of(N - P, call.feat_size)
        q, k, v = split_qkv(linear(x, self.qkv.weight, self._qkv_bias()), self.num_heads)  # each [B, nh, N, hd]
        layout = token_layout(N, grid, P) if attention_observed() else None  # observers only
        if use_flex(self.attention_backend, self.fused_attention, x.device):  # the table read in a score_mod
            table = self.relative_position_bias_table
            if grid != self.window_size:
                table = resize_beit_bias_table(table, self.window_size, grid)  # [L', nh]
            out = self.attend(q, k, v, pattern=beit_rel_pos_pattern(table, grid, P), mask=call.mask,
                              scale=self.scale, layout=layout)  # [B, nh, N, hd]
        else:
            out = self.attend(q, k, v, bias=self.position_bias(grid, P), mask=call.mask, scale=self.scale,
                              layout=layout)  # [B, nh, N, hd]; bias [1, nh, N, N]
        return self.project_out(merge_heads(out), call.residual)  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds for one forward on ``input_shape = (B, N, C)``: ``4·N·C² + 2·N²·C`` (the bias is a gather)."""
        B, N, C = input_shape
        return B * (4 * N * C * C + 2 * N * N * C)

    def set_window_size(self, window_size: int | Sequence[int], shift_size: int | Sequence[int] = 0) -> None:
        """Rebuild the table for another grid ``(H', W')`` in place (:func:`resize_beit_bias_table`, timm's rule);
        the window is the whole grid, so ``shift_size`` must be 0."""
        if to_pair(shift_size, "shift_size") != (0, 0):
            raise ValueError(f"shift_size must be 0: BEiT's window is the whole grid, got {shift_size!r}")
        window = to_pair(window_size, "window_size")
        if min(window) <= 0:
            raise ValueError(f"window_size must be positive (the token grid (H, W) of the table), got {window_size!r}")
        old = self.relative_position_bias_table
        if window != self.window_size:
            with torch.no_grad():
                table = resize_beit_bias_table(old.detach(), self.window_size, window).clone()
            self.relative_position_bias_table = nn.Parameter(table, requires_grad=old.requires_grad)
        self.window_size = window

    def transfer_init(self) -> list[str]:
        """A zero table: no position term beyond what the carried projections compute."""
        with torch.no_grad():
            self.relative_position_bias_table.zero_()
        return ["relative_position_bias_table: zeros (no position term)"]

    def get_offset_bias(self) -> Tensor:
        """The grid rows as an offset grid ``[nh, 2H-1, 2W-1]`` (key minus query; the table is indexed by query minus
        key, hence the flips); the class-token rows have no offset and stay out."""
        (H, W), table = self.window_size, self.relative_position_bias_table.detach()
        return table[:-NUM_PREFIX_ROWS].view(2 * H - 1, 2 * W - 1, -1).permute(2, 0, 1).flip(1, 2).clone()

    def set_offset_bias(self, grid: Tensor) -> bool:
        """Write an offset grid ``[nh, 2a-1, 2b-1]`` into the grid rows (offsets beyond its reach zero; the
        class-token rows kept) -> whether the heads matched."""
        H, W = self.window_size
        if grid.shape[0] != self.num_heads:
            return False
        fitted = fit_offset_grid(grid, (2 * H - 1, 2 * W - 1)).flip(1, 2).permute(1, 2, 0)
        with torch.no_grad():
            self.relative_position_bias_table[:-NUM_PREFIX_ROWS].copy_(fitted.reshape(-1, self.num_heads))
        return True
