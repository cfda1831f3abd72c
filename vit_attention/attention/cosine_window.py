"""SwinV2 scaled cosine window attention (Liu et al. 2022), ``[B, H, W, C] -> [B, H, W, C]``.

Same windows, shift and padding as :class:`~vit_attention.attention.window.WindowAttention`; what
changes is inside a window:

* logits are cosine similarities times a learned per-head temperature,
  ``cos(q, k) · exp(min(logit_scale, log 100))`` (no ``hd ** -0.5``);
* the position bias is continuous: a small MLP (``2 -> 512 -> nh``, ReLU) maps log-spaced relative
  coordinates to ``16·sigmoid(·)``; ``pretrained_window_size`` keeps the coordinates of the window
  the weights were trained with, so a model transfers to larger windows;
* the qkv projection has a q and a v bias but no k bias.

The per-head temperature is folded into the normalised queries (``q̂ · τ``, logit scale 1) by
:func:`~vit_attention.functional.window_attention.window_attention`, so the core sees a plain
float scale. Bias and shift mask form one additive bias, as in W-MSA; on the ``"flex"`` backend the
CPB MLP's bias is read in the score_mod of one call over the whole map, as W-MSA's table is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..functional.flex import PatternDoc
from ..functional.linear import apply_linear, linear
from ..functional.window import log_relative_coords_table, relative_position_index, to_pair
from .registry import register_attention, small_window_kwargs
from .transfer import PACKED_QKV_SLOTS
from .window import WindowAttentionBase

__all__ = ["CosineWindowAttention"]

LOGIT_SCALE_MAX = math.log(1.0 / 0.01)  # temperature at most 100


@register_attention(
    "cosine_window", layout="spatial", description="SwinV2 scaled cosine (shifted) window attention with "
    "log-spaced continuous position bias", example_kwargs=dict(window_size=4, shift_size=2),
    paper="https://arxiv.org/abs/2111.09883",
    formula=(
        "SwinV2 scaled cosine window attention (Liu et al. 2022): Swin's (shifted) windows, but the logits "
        "are cosine similarities times a learned, clamped per-head temperature, and the position bias "
        "comes from a small MLP over log-spaced relative coordinates (continuous position bias), so a "
        "model transfers across window sizes:\n\n"
        "    A = softmax(cos(q, k) · exp(min(τ, log 100)) + 16·sigmoid(CPB_MLP(Δ)) + mask)\n"
        "    out = window_reverse(A v W_proj)               # [B, H, W, C]"),
    cost="4·hw·C² + 2·M²·hw·C multiply-adds, plus the CPB MLP on (2M-1)² coordinates once per forward",
    doc_example=(dict(window_size=8, shift_size=4), (1, 16, 16, 96)), grid_kwargs=small_window_kwargs,
    qkv_bias_split=True)
class CosineWindowAttention(WindowAttentionBase):
    """SwinV2 window attention, ``[B, H, W, C] -> [B, H, W, C]``.

    Keys (timm layout): ``qkv.weight``, ``q_bias``, ``v_bias``, ``logit_scale [nh, 1, 1]``,
    ``cpb_mlp.0.{weight,bias}``, ``cpb_mlp.2.weight``, ``proj``. Cost as W-MSA plus the CPB MLP
    on ``(2Wh-1)(2Ww-1)`` coordinates.

    Args:
        dim, num_heads, window_size, shift_size, attn_drop, proj_drop, pad_first, allow_padding, clamp_window:
            as :class:`~vit_attention.attention.window.WindowAttention`.
        qkv_bias: learn ``q_bias`` and ``v_bias`` (the k bias is always zero).
        pretrained_window_size: window the coordinates are normalised by (0 = own window).
        cpb_hidden: width of the continuous position bias MLP.
    """

    # docs/flex.md's row of patterns (analysis.docs.pattern_table); skipped blocks counted on `example`
    flex_pattern = PatternDoc(
        families="SwinV2",
        keys="same (shifted) window; not a padded key where padding is masked",
        term="the continuous position bias (CPB MLP output) at `[h, q % S, kv % S]`, -100 between shift "
            "regions",
        order="window-major, each window spaced to `S` slots",
        example=(dict(window_size=8, shift_size=4), (1, 32, 32, 96)))

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    def __init__(self, dim: int, num_heads: int, *, window_size: int | Sequence[int] = 8,
                 shift_size: int | Sequence[int] = 0, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, pretrained_window_size: int | Sequence[int] = 0, cpb_hidden: int = 512,
                 pad_first: bool = True, allow_padding: bool = True, clamp_window: bool = True) -> None:
        super().__init__(dim, num_heads, window_size=window_size, shift_size=shift_size, attn_drop=attn_drop,
                         proj_drop=proj_drop, pad_first=pad_first, allow_padding=allow_padding,
                         clamp_window=clamp_window)
        self.pretrained_window_size = to_pair(pretrained_window_size, "pretrained_window_size")
        self.logit_scale = nn.Parameter(torch.full((num_heads, 1, 1), math.log(10.0)))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, cpb_hidden), nn.ReLU(inplace=True),
                                     nn.Linear(cpb_hidden, num_heads, bias=False))
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        if qkv_bias:
            self.q_bias: nn.Parameter | None = nn.Parameter(torch.zeros(dim))
            self.v_bias: nn.Parameter | None = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = self.v_bias = None

    def project_qkv(self, x: Tensor) -> Tensor:
        """``[..., C] -> [..., 3C]`` with bias ``[q_bias | 0 | v_bias]``."""
        if self.q_bias is None or self.v_bias is None:
            return apply_linear(self.qkv, x)
        bias = torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])  # [3C]
        return linear(x, self.qkv.weight, bias)

    def bias_parameters(self) -> list[Tensor]:
        """The CPB MLP parameters."""
        return list(self.cpb_mlp.parameters())

    def compute_position_bias(self, window: tuple[int, int]) -> Tensor:
        """``16·sigmoid(cpb_mlp(log coords))`` of ``window`` gathered by relative offset: ``[nh, N, N]`` (a clamped
        window's coordinates as a module built with that window: normalised by it, or by the pretrained one)."""
        w = self.cpb_mlp[0].weight
        coords = log_relative_coords_table(window, self.pretrained_window_size, device=w.device)
        table = self.cpb_mlp(coords.to(w.dtype).view(-1, 2))  # [(2h-1)(2w-1), nh]
        index = relative_position_index(window, device=w.device)  # [N, N]
        N = index.shape[0]
        bias = table[index.view(-1)].view(N, N, -1).permute(2, 0, 1)  # [nh, N, N]
        return (16 * torch.sigmoid(bias)).contiguous()

    def logit_temperature(self) -> Tensor:
        """The clamped per-head temperature ``exp(min(logit_scale, log 100))``, ``[nh, 1, 1]``."""
        return torch.clamp(self.logit_scale, max=LOGIT_SCALE_MAX).exp()  # [nh, 1, 1]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """W-MSA multiply-adds plus the CPB MLP (once per forward, on the clamped window's coordinates)."""
        wh, ww = self.fitted_window(input_shape[1], input_shape[2])[0]
        n_coords = (2 * wh - 1) * (2 * ww - 1)
        hidden = self.cpb_mlp[0].out_features
        return super().flops(input_shape) + n_coords * (2 * hidden + hidden * self.num_heads)
