"""MobileViT v1 global attention across unfolded patches (Mehta & Rastegari 2022), on maps ``[B, H, W, C]``.

The map is cut into ``p x p`` patches; the pixels at the same intra-patch offset (one per patch)
form one sequence, and each of the ``P = p²`` sequences of ``N = HW/P`` tokens runs ordinary
multi-head self-attention (:mod:`vit_attention.functional.unfold` has the order, timm's / HF's).
The unfold is folded into the head split (one copy of q|k|v, as a plain head split costs), and
the ``P`` offsets are a batch dimension of ONE call of the attention core, so the fused kernel
runs whenever nothing needs the weights.

Maps that are not patch multiples (``resize``):

* ``"bilinear"`` (default): the references' rule (timm ``MobileVitBlock``, HF ``MobileViTLayer``,
  ml-cvnets): bilinear ``align_corners=False`` up to the next multiple, attend, bilinear back
  down. The MobileViT models resize once around the whole transformer instead (as the references
  do), so inside a model this mechanism always sees multiples.
* ``"mask"``: zero-pad to a multiple and mask the padded slots out of every softmax: exact
  attention between the real pixels of each offset, and maps that land on the input grid.
"""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..functional.linear import apply_linear
from ..functional.observers import attention_observed
from ..functional.unfold import patch_grid, patch_key_mask, unfold_layout
from .base import AttentionCall, PackedQKVAttention, check_spatial_call
from .registry import register_attention
from .transfer import PACKED_QKV_SLOTS

__all__ = ["UnfoldAttention"]

Resize = Literal["bilinear", "mask"]


def check_patch_size(patch_size: int) -> int:
    """``patch_size`` as a positive int (raises naming it)."""
    if not isinstance(patch_size, int) or isinstance(patch_size, bool) or patch_size <= 0:
        raise ValueError(f"patch_size must be a positive int, got {patch_size!r}")
    return patch_size


@register_attention(
    "unfold", layout="spatial", description="MobileViT v1: global attention across unfolded p x p patches",
    example_kwargs=dict(patch_size=2, resize="mask"), paper="https://arxiv.org/abs/2110.02178",
    formula=(
        "MobileViT v1 (Mehta & Rastegari 2022). The map `[B, H, W, C]` is cut into `p x p` patches; "
        "the `N = HW/p²` pixels at the same offset inside their patch form one sequence, and each of the "
        "`P = p²` sequences runs multi-head self-attention:\n\n"
        "    q, k, v = unfold(x W_qkv)                     # each [B, P·nh, N, hd]\n"
        "    A = softmax(q kᵀ · hd^-1/2)                   # [B, P·nh, N, N]\n"
        "    out = fold(A v) W_proj                        # [B, H, W, C]\n\n"
        "A pixel sees every patch of the image (global receptive field) at `1/P` of ViT's attention cost. "
        "Maps that are not patch multiples are resized bilinearly up and back (the references' rule, "
        "`resize='bilinear'`) or padded with the padding masked out (`resize='mask'`)."),
    cost="4·HW·C² + 2·HW·(HW/p²)·C multiply-adds (quadratic in the tokens, divided by the patch area p²)",
    doc_example=(dict(patch_size=2), (1, 16, 16, 96)))
class UnfoldAttention(PackedQKVAttention):
    """Attention across unfolded patches, ``[B, H, W, C] -> [B, H, W, C]``.

    ``softmax(q kᵀ / sqrt(hd)) v`` within each intra-patch offset: pixel ``(y, x)`` attends to the
    pixels ``(y', x')`` with ``y' ≡ y``, ``x' ≡ x (mod p)``. Keys: ``qkv`` (packed ``Linear(C, 3C)``)
    and ``proj`` (timm's ``MobileVitBlock`` transformer layout). Cost ``4·HW·C² + 2·HW·N·C``.

    Args:
        dim: channels ``C``; num_heads: ``nh`` (must divide ``dim``).
        patch_size: ``p`` (MobileViT: 2).
        resize: ``"bilinear"`` (reference rule) or ``"mask"`` for maps that are not patch multiples.
        qkv_bias, qk_scale, attn_drop, proj_drop: as in ViT's attention.
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    accepts = frozenset({"residual"})

    def __init__(self, dim: int, num_heads: int = 4, *, patch_size: int = 2, resize: Resize = "bilinear",
                 qkv_bias: bool = True, qk_scale: float | None = None, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.patch_size = check_patch_size(patch_size)
        if resize not in ("bilinear", "mask"):
            raise ValueError(f"resize must be 'bilinear' or 'mask', got {resize!r}")
        self.resize = resize
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``; any ``H, W`` (see ``resize``).

        The call: ``feat_size`` is the map's own ``(H, W)`` when given; no prefix tokens, no context.
        ``residual [B, H, W, C]`` (the blocks' speed path) is added to the output, fused into ``proj`` at
        inference.
        """
        B, H, W, C = check_spatial_call(self, x, call)
        residual = call.residual
        p = self.patch_size
        nh, nw = patch_grid(H, W, p)
        Hp, Wp = nh * p, nw * p
        resized = (Hp, Wp) != (H, W) and self.resize == "bilinear"
        if resized:  # the references' rule: bilinear up to a patch multiple (and back below)
            x = F.interpolate(x.permute(0, 3, 1, 2), size=(Hp, Wp), mode="bilinear",
                              align_corners=False).permute(0, 2, 3, 1)  # [B, Hp, Wp, C]
            res, residual = residual, None
        qkv = apply_linear(self.qkv, x)  # [B, H', W', 3C]
        mask = None
        if not resized and (Hp, Wp) != (H, W):  # zero-pad the projections; padded keys masked below
            qkv = F.pad(qkv, (0, 0, 0, Wp - W, 0, Hp - H))  # [B, Hp, Wp, 3C]
            mask = patch_key_mask(H, W, p, self.num_heads, device=x.device)  # [1, P·nh, 1, N]
        q, k, v = rearrange(qkv, "b (nh ph) (nw pw) (t h d) -> t b (ph pw h) (nh nw) d", ph=p, pw=p, t=3,
                            h=self.num_heads).unbind(0)  # each [B, P·nh, N, hd]: offsets folded into heads
        grid = (Hp, Wp) if resized else (H, W)
        out = self.attend(q, k, v, mask=mask, scale=self.scale,
                          layout=(lambda: unfold_layout(*grid, p)) if attention_observed() else None
                          )  # [B, P·nh, N, hd]
        out = rearrange(out, "b (ph pw h) (nh nw) d -> b (nh ph) (nw pw) (h d)", ph=p, pw=p, nh=nh)  # [B, Hp, Wp, C]
        if (Hp, Wp) != (H, W) and not resized:
            out = out[:, :H, :W]  # [B, H, W, C]
        out = self.project_out(out, residual)  # [B, H', W', C]
        if resized:
            out = F.interpolate(out.permute(0, 3, 1, 2), size=(H, W), mode="bilinear",
                                align_corners=False).permute(0, 2, 3, 1)  # [B, H, W, C]
            out = out if res is None else res + out
        return out

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``input_shape = (B, H, W, C)``: ``4·hw·C² + 2·hw_p·N·C``.

        ``hw_p = Hp·Wp`` is the map padded (or resized) to a patch multiple and ``N = hw_p / p²`` the
        tokens of one sequence; the projections run on ``hw = H·W`` tokens (``hw_p`` when resized).
        """
        B, H, W, C = input_shape
        nh, nw = patch_grid(H, W, self.patch_size)
        hwp = nh * nw * self.patch_size ** 2
        hw = hwp if self.resize == "bilinear" else H * W
        return B * (4 * hw * C * C + 2 * hwp * (nh * nw) * C)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, patch_size={self.patch_size}, resize={self.resize!r}"
