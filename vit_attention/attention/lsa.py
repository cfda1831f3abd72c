"""Twins locally-grouped self-attention (LSA; Chu et al. 2021), ``[B, H, W, C] -> [B, H, W, C]``.

LSA is plain window attention: the map is cut into non-overlapping ``ws x ws`` groups (windows)
and each attends to itself, with no relative-position bias and no shift. It is a configuration
of :class:`~vit_attention.attention.window.WindowAttentionBase` (the same partition, padding,
fused kernel and attention-map layout as Swin's W-MSA), registered under its own name with
Twins' keys (``qkv``, ``proj``: timm's ``LocallyGroupedAttn``). On the ``"flex"`` backend the groups
are one block-sparse FlexAttention call over the whole map (a same-window mask, no score_mod).

Padding policy (maps that are not multiples of ``ws``; Twins, arXiv 2104.13840, and timm 1.0.31
``twins.py``):

* ``pad_mask=False`` (default, timm): the normalised map is zero-padded bottom / right and the
  padded tokens (projected from zeros, so ``k = b_k``, ``v = b_v``) take part in the softmax; the
  output is cropped. This reproduces timm's ``LocallyGroupedAttn`` and its checkpoints exactly.
* ``pad_mask=True``: padded keys are masked out, so each real token attends only to the real
  tokens of its group (the original repository's commented-out ``forward_mask``).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from ..functional.flex import PatternDoc
from ..functional.linear import apply_linear
from .registry import covering_window_kwargs, register_attention, small_window_kwargs
from .transfer import PACKED_QKV_SLOTS
from .window import WindowAttentionBase

__all__ = ["LocallyGroupedAttention"]


@register_attention(
    "lsa", layout="spatial", description="Twins locally-grouped self-attention: non-overlapping windows, "
    "no position bias, no shift", example_kwargs=dict(window_size=4), paper="https://arxiv.org/abs/2104.13840",
    formula=(
        "Twins locally-grouped self-attention (Chu et al. 2021). The map `[B, H, W, C]` is zero-padded to a "
        "multiple of the group size `ws` and cut into `ws x ws` groups; each group attends to itself, with "
        "no position bias and no shift (position comes from the PEG, a depthwise conv between blocks):\n\n"
        "    groups = window_partition(pad(x))              # [B·nW, ws², C]\n"
        "    A = softmax(q kᵀ · hd^-1/2 [+ pad mask])       # [B·nW, nh, ws², ws²]\n"
        "    out = crop(window_reverse(A v)) W_proj         # [B, H, W, C]\n\n"
        "`pad_mask=False` (timm): padded slots are zero-input tokens that take part in the softmax; "
        "`pad_mask=True`: padded keys are masked out."),
    cost="4·hw·C² + 2·ws²·hw_p·C multiply-adds (hw_p: the map padded to multiples of ws), "
         "vs 4·hw·C² + 2·(hw)²·C for global attention",
    doc_example=(dict(window_size=7), (1, 14, 14, 96)), grid_kwargs=small_window_kwargs,
    global_kwargs=covering_window_kwargs)
class LocallyGroupedAttention(WindowAttentionBase):
    """Twins LSA, ``[B, H, W, C] -> [B, H, W, C]``: ``softmax(q kᵀ / sqrt(hd)) v`` in ``ws x ws`` groups.

    Keys (timm ``LocallyGroupedAttn``): ``qkv`` (packed, with bias), ``proj``. Cost:
    ``4·hw·C² + 2·ws²·hw_p·C`` multiply-adds (inherited :meth:`flops`).

    Args:
        dim: channels ``C``; num_heads: ``nh`` (must divide ``dim``).
        window_size: the group size ``ws`` (Twins: 7) or ``(Wh, Ww)``.
        qkv_bias: bias on the qkv projection. qk_scale: logit scale (default ``hd ** -0.5``).
        attn_drop, proj_drop: dropout on the weights and after ``proj``.
        pad_mask: mask padded keys (True) or let the zero-padded tokens attend (False, timm).
        allow_padding: pad maps that are not group multiples (else raise).
        clamp_window: an axis of the map no longer than the group gets group = that side (at forward
            time, as :class:`~vit_attention.attention.window.WindowAttention`); False pads it (Twins, DaViT).
    """

    # docs/flex.md's row of patterns (analysis.docs.pattern_table); skipped blocks counted on `example`
    flex_pattern = PatternDoc(
        families="Twins, DaViT",
        keys="same window; not a padded key where padding is masked",
        term="-",
        order="window-major, each window spaced to `S` slots",
        example=(dict(window_size=7), (1, 28, 28, 96)))

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    def __init__(self, dim: int, num_heads: int, *, window_size: int | Sequence[int] = 7, qkv_bias: bool = True,
                 qk_scale: float | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 pad_mask: bool = False, allow_padding: bool = True, clamp_window: bool = True) -> None:
        super().__init__(dim, num_heads, window_size=window_size, shift_size=0, attn_drop=attn_drop,
                         proj_drop=proj_drop, pad_first=True, allow_padding=allow_padding,
                         clamp_window=clamp_window)
        if not isinstance(pad_mask, bool):
            raise TypeError(f"pad_mask must be a bool (True = mask padded keys), got {pad_mask!r}")
        self.pad_mask = pad_mask
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)

    def project_qkv(self, x: Tensor) -> Tensor:
        """``[..., C] -> [..., 3C]``."""
        return apply_linear(self.qkv, x)

    def bias_parameters(self) -> list[Tensor]:
        """No position bias: nothing to key a cache on."""
        return []

    def compute_position_bias(self, window: tuple[int, int]) -> None:
        """LSA has no position bias."""
        return None

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, "
                f"pad_mask={self.pad_mask}")
