"""EfficientViT-MIT's lightweight multi-scale linear attention, LiteMLA (Cai et al., ICCV 2023), on maps.

One 1x1 projection gives per pixel and per head a query, a key and a value (``hd`` each, interleaved per head:
the ``3·hd`` channels of head ``h`` are ``[q_h | k_h | v_h]``). Each scale ``s`` of ``scales`` adds a second set of
heads from the same projection, aggregated over an ``s x s`` neighbourhood: a depthwise ``s x s`` convolution,
then a 1x1 convolution with ``3·nh`` groups (it mixes channels within one head's q, k or v only). The
``G = nh·(1 + len(scales))`` heads then each run ReLU linear attention over every pixel
(:func:`~vit_attention.functional.lite_mla.relu_linear_attention`): no softmax, no logit scale, cost linear in
``H·W``, computed in float32. The heads' outputs are concatenated (``G·hd`` channels) and projected back to ``C``
by a 1x1 convolution followed by BatchNorm.

Layout: timm 1.0.31 (``timm/models/efficientvit_mit.py`` ``LiteMLA``) and the original (mit-han-lab/efficientvit
``models/nn/ops.py``) take NCHW maps; this module takes channels-last maps ``[B, H, W, C]``. The 1x1 convolutions
are ``Linear`` layers on the last axis (timm's ``qkv.conv.weight [3C, C, 1, 1]`` is ``qkv.weight [3C, C]``, same
row order; ``proj.conv.weight`` -> ``proj.weight``, ``proj.norm.*`` -> ``norm.*``); the aggregation convolutions
(``aggreg.{i}.0`` / ``aggreg.{i}.1``, the same keys) run on the NCHW view of the projected map (a permute, no
copy). The head ``g`` and channel ``d`` of the concatenated output sit at channel ``g·hd + d``, as in timm.

There are no attention weights: the core is never called, so attention maps, the attention backends and
FlexAttention do not apply (recording refuses the module, naming why). Token merging is not available (the
aggregation convolutions need every pixel of the map).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..functional.batch_norm import can_fold_batch_norm, fold_batch_norm
from ..functional.linear import apply_linear, linear
from ..functional.lite_mla import relu_linear_attention, relu_linear_attention_flops
from .base import AttentionCall, AttentionModule, check_spatial_call
from .registry import register_attention

__all__ = ["LiteMLA"]

NO_WEIGHTS = ("ReLU linear attention forms no attention weights: each output is a ratio of two linear sums, "
              "computed as phi(k)ᵀ [v | 1] first, so no query-key matrix exists to record")


def _check_scales(scales: Sequence[int]) -> tuple[int, ...]:
    """``scales`` as a tuple of odd positive kernel sizes (same padding), or ``ValueError`` naming it."""
    if isinstance(scales, int) or not all(isinstance(s, int) and s > 0 and s % 2 for s in scales):
        raise ValueError(f"scales must be a sequence of odd positive ints (aggregation kernel sizes), got {scales!r}")
    return tuple(scales)


@register_attention(
    "lite_mla", layout="spatial",
    description="EfficientViT-MIT LiteMLA: ReLU linear attention over multi-scale (conv-aggregated) q, k, v",
    example_kwargs=dict(scales=(3,)), paper="https://arxiv.org/abs/2205.14756", fused=False,
    backends=("auto", "sdpa", "explicit"),
    weights_note=NO_WEIGHTS,
    backend_note="FlexAttention always applies a softmax and ReLU linear attention has none; it never calls the "
                 "attention core, so the other backends run the same two products",
    formula=(
        "Lightweight multi-scale linear attention (EfficientViT-MIT, Cai et al. 2023; timm's `LiteMLA`). One "
        "1x1 projection gives `q, k, v` per head; each scale `s` adds as many heads again, aggregated by a "
        "depthwise `s x s` convolution and a grouped 1x1 convolution of the projection. Every one of the "
        "`G = nh·(1 + len(scales))` heads runs ReLU linear attention over all pixels, with no softmax and no "
        "scale:\n\n"
        "    qkv = x W_qkv;   qkv_s = Conv1x1_g(DWConv_s(qkv))             # [B, H, W, 3C] each\n"
        "    q, k, v = split(cat[qkv, qkv_s, ...])                        # [B, G, N, hd] each\n"
        "    out = ReLU(q) (ReLU(k)ᵀ [v | 1])                             # [B, G, N, hd + 1]\n"
        "    out = out[..., :hd] / (out[..., hd] + eps)                   # eps = 1e-5, float32\n"
        "    y = BN(out W_proj)                                           # [B, H, W, C]\n\n"
        "`kv` is `hd x (hd + 1)` per head, so no `N x N` matrix exists: cost and memory grow linearly with the "
        "pixels, and there are no attention weights to record."),
    cost="HW·(3C² + 3C·Σs² + 3C·hd·S + (1+S)·C² + 5C) + 2·G·HW·hd·(hd+1) multiply-adds, S = len(scales) "
         "(linear in the pixels HW)",
    doc_example=(dict(scales=(5,)), (1, 14, 14, 96)))
class LiteMLA(AttentionModule):
    """LiteMLA, ``[B, H, W, C] -> [B, H, W, C]``, cost linear in ``H·W``.

    Keys: ``qkv`` (``Linear(C, 3C)``, rows per head ``[q_h | k_h | v_h]``), ``aggreg.{i}.0`` (depthwise
    ``s x s`` conv on ``3C`` channels) and ``aggreg.{i}.1`` (1x1 conv, ``3·nh`` groups) per scale, ``proj``
    (``Linear((1 + len(scales))·C, C)``) and ``norm`` (BatchNorm over ``C``).

    Args:
        dim: channels ``C``; num_heads: heads ``nh`` of the projection (``hd = C / nh``; EfficientViT: ``hd``
            16 or 32).
        scales: aggregation kernel sizes (odd); ``()`` = single-scale linear attention. EfficientViT: ``(5,)``.
        qkv_bias: bias of ``qkv`` and the aggregation convolutions (timm: False). proj_bias: bias of ``proj``
            (timm: False, BatchNorm follows).
        attn_drop: must be 0 (there are no attention weights to drop). proj_drop: after the BatchNorm.
        eps: added to the denominator (timm 1e-5). bn_eps: the BatchNorm's (EfficientViT-L: 1e-7).
    """

    # q / k / v: row blocks 0 / 1 / 2 of each head's three in qkv; the output takes (1 + S)·C channels: no o slot
    transfer_slots = {"q": "qkv:0/3h", "k": "qkv:1/3h", "v": "qkv:2/3h"}

    accepts = frozenset({"residual"})

    def __init__(self, dim: int, num_heads: int = 8, *, scales: Sequence[int] = (5,), qkv_bias: bool = False,
                 proj_bias: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0, eps: float = 1e-5,
                 bn_eps: float = 1e-5) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        if self.attn_drop:
            raise ValueError(f"attn_drop={attn_drop!r}: lite_mla has no attention weights to drop ({NO_WEIGHTS}); "
                             "pass attn_drop=0")
        if not (isinstance(eps, (int, float)) and eps >= 0):
            raise ValueError(f"eps must be a float >= 0, got {eps!r}")
        self.scales = _check_scales(scales)
        self.eps = float(eps)
        td = 3 * dim
        self.qkv = nn.Linear(dim, td, bias=qkv_bias)
        self.aggreg = nn.ModuleList([
            nn.Sequential(nn.Conv2d(td, td, s, padding=s // 2, groups=td, bias=qkv_bias),
                          nn.Conv2d(td, td, 1, groups=3 * num_heads, bias=qkv_bias))
            for s in self.scales])
        self.proj = nn.Linear(dim * (1 + len(self.scales)), dim, bias=proj_bias)
        self.norm = nn.BatchNorm1d(dim, eps=bn_eps)

    @property
    def num_groups(self) -> int:
        """``G = nh·(1 + len(scales))``: the heads of every scale, each one linear attention."""
        return self.num_heads * (1 + len(self.scales))

    def multi_scale_qkv(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, 3C·(1 + S)]``: the projection, then each scale's aggregation of it."""
        qkv = apply_linear(self.qkv, x)  # [B, H, W, 3C]
        if not self.aggreg:
            return qkv
        nchw = qkv.permute(0, 3, 1, 2)  # [B, 3C, H, W] view
        return torch.cat([qkv, *(op(nchw).permute(0, 2, 3, 1) for op in self.aggreg)], dim=-1)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``; any ``H, W``. ``call.residual [B, H, W, C]`` is added to the output
        (into the projection at inference). No prefix tokens, no context (:func:`check_spatial_call`)."""
        B, H, W, C = check_spatial_call(self, x, call)
        hd, G = self.head_dim, self.num_groups
        ms = self.multi_scale_qkv(x).reshape(B, H * W, G, 3 * hd).transpose(1, 2)  # [B, G, N, 3hd]
        q, k, v = ms.split(hd, dim=-1)  # [B, G, N, hd] each
        out = relu_linear_attention(q, k, v, self.eps)  # [B, G, N, hd]
        out = out.transpose(1, 2).reshape(B, H, W, G * hd)  # channel g·hd + d
        return self._project(out, call.residual)  # [B, H, W, C]

    def _project(self, out: Tensor, residual: Tensor | None) -> Tensor:
        """``residual + proj_drop(norm(proj(out)))``, ``[..., G·hd] -> [..., C]``; at inference the BatchNorm is
        folded into ``proj`` and the residual added inside the one linear."""
        if can_fold_batch_norm(self.proj, self.norm) and not (self.training and self.proj_drop.p > 0):
            weight, bias = fold_batch_norm(self.proj, self.norm)  # type: ignore[arg-type]
            return linear(out, weight, bias, residual=residual)
        y = apply_linear(self.proj, out)  # [..., C]
        y = self.norm(y.reshape(-1, self.dim)).reshape(y.shape)
        y = self.proj_drop(y)
        return y if residual is None else residual + y

    def attend_prefix(self, prefix: Tensor, tokens: Tensor) -> Tensor:
        """Prefix tokens ``[B, P, C]`` read every token of ``tokens [B, P + H·W, C]``: ``[B, P, C]``.

        The adapter's rule for class / register tokens in front of the grid. A token sequence carries no map, so
        every token is taken as a map of its own: each scale's aggregation sees only its centre tap (the depthwise
        kernel's centre, then the grouped 1x1); the ``G`` heads then run the same ReLU linear attention of the
        prefix queries over all tokens, through ``proj`` and ``norm``.
        """
        B, N, C = tokens.shape
        P, hd, G = prefix.shape[1], self.head_dim, self.num_groups
        ms = self.multi_scale_qkv(tokens.reshape(B * N, 1, 1, C))  # [B·N, 1, 1, 3C·(1 + S)]: one-pixel maps
        ms = ms.reshape(B, N, G, 3 * hd).transpose(1, 2)  # [B, G, N, 3hd]
        q, k, v = ms.split(hd, dim=-1)  # [B, G, N, hd]
        out = relu_linear_attention(q[:, :, :P], k, v, self.eps)  # [B, G, P, hd]
        return self._project(out.transpose(1, 2).reshape(B, P, G * hd), None)

    def transfer_init(self) -> list[str]:
        """Each scale's aggregation as the identity (depthwise centre tap 1, the grouped 1x1 the identity within
        each group, biases 0), so every scale's heads repeat the carried projection's, and ``norm`` neutral at
        inference (running statistics 0 / 1, weight ``sqrt(1 + eps)``, bias 0). ``proj`` has no counterpart (it
        takes ``(1 + S)·C`` channels): left as it is."""
        with torch.no_grad():
            for dw, pw in self.aggreg:  # type: ignore[misc]
                k = dw.kernel_size[0] // 2
                dw.weight.zero_()
                dw.weight[:, :, k, k] = 1.0
                per_group = pw.weight.shape[1]  # hd channels in, hd out per group
                eye = torch.eye(per_group, dtype=pw.weight.dtype, device=pw.weight.device)
                pw.weight.copy_(eye.repeat(pw.weight.shape[0] // per_group, 1)[:, :, None, None])
                for conv in (dw, pw):
                    if conv.bias is not None:
                        conv.bias.zero_()
            self.norm.running_mean.zero_()
            self.norm.running_var.fill_(1.0)
            self.norm.weight.fill_((1.0 + self.norm.eps) ** 0.5)
            self.norm.bias.zero_()
        notes = ["norm: the identity at inference (BatchNorm neutral)",
                 "proj: no counterpart (it takes (1 + len(scales))·C channels), left as it is"]
        if self.aggreg:
            notes.insert(0, "aggreg: the identity (depthwise centre tap 1, grouped 1x1 the identity): every scale's "
                            "heads repeat the carried q / k / v")
        return notes

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds on ``input_shape = (B, H, W, C)``: the projections ``HW·(3C² + (1+S)·C²)``, each scale's
        depthwise ``HW·3C·s²`` and grouped 1x1 ``HW·3C·hd``, and the two products of the linear attention
        ``2·G·HW·hd·(hd+1)``, and the BatchNorm ``5·C`` per pixel (fvcore's rule, as
        :mod:`vit_attention.analysis.flops` counts every norm). ReLU and the division are not counted."""
        B, H, W, C = input_shape
        n, S, hd = H * W, len(self.scales), self.head_dim
        proj = n * (3 * C * C + (1 + S) * C * C)
        aggreg = sum(n * 3 * C * (s * s + hd) for s in self.scales)
        return B * (proj + aggreg + 5 * n * C + relu_linear_attention_flops(self.num_groups, n, hd))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, scales={self.scales}, eps={self.eps}"

