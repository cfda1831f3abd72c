"""The one transformer block: attention and MLP branches with residuals, in one of four styles.

``style`` (``BLOCK_STYLES``):

* ``"pre"`` (ViT, Swin v1): ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``;
* ``"post"`` (original Transformer / BERT): ``norm1(x + attn(x))``, then ``norm2(x + mlp(x))``;
* ``"res_post"`` (SwinV2): ``x + norm1(attn(x))``, then ``x + norm2(mlp(x))``;
* ``"parallel"`` (ViT-22B): ``x + attn(norm1(x)) + mlp(norm1(x))`` (one norm; no ``norm2``).

Each branch may carry LayerScale (``init_values``) and drop path. An optional position layer
(PEG / CPE, :class:`~vit_attention.layers.pos_embed.PosConv`) runs first, on the block input;
a second one (``pos_mlp_layer``, DaViT's ``cpe2``) may run between the two branches.

With ``context`` (``"pre"`` style only) the block is CaiT's class-attention block: ``x [B, Nq, C]``
queries, keys and values come from ``u = norm1([x; context])`` (``attn(u[:, :Nq], AttentionCall(context=u))``),
the MLP updates ``x`` alone and ``context`` is not returned (it passes on unchanged).

Input is tokens ``[B, P + H·W, C]`` (with the grid ``feat_size`` and ``P`` prefix tokens) or a
channels-last map ``[B, H, W, C]`` (hierarchical stages). Any registered mechanism can be the
attention: the one adapter (:func:`~vit_attention.layers.layout_adapter.apply_attention`) hands it the
layout it takes, and at inference fuses the residual into its output projection where it can.
The block's own attention keywords (``qkv_bias``, ``qk_norm``, ``proj_bias``, dropouts) reach a
mechanism only when its constructor accepts them (the registry spec's ``init_kwargs``, read from
its signature at registration; :func:`accepted_kwargs`); one it does not accept must keep the
block's default, or building the block raises naming it.

State-dict keys: ``norm1``, ``attn.*``, ``ls1.gamma``, ``norm2``, ``mlp.*``, ``ls2.gamma``
(timm's ViT and Swin layouts alike).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..attention import create_attention, get_attention_spec
from ..attention.base import AttentionCall
from ..functional.linear import hookless
from ..functional.tome import TokenMergeState
from .drop_path import DropPath
from .layer_scale import LayerScale
from .layout_adapter import apply_attention
from .mlp import Mlp

__all__ = ["Block", "BLOCK_STYLES", "BlockStyle", "accepted_kwargs"]

BlockStyle = Literal["pre", "post", "res_post", "parallel"]
BLOCK_STYLES: tuple[str, ...] = ("pre", "post", "res_post", "parallel")


def accepted_kwargs(attn_layer: str, offered: Mapping[str, Any], neutral: Mapping[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The ``offered`` keywords that mechanism ``attn_layer``'s constructor accepts.

    One it does not accept is dropped, unless ``neutral`` names it with another value (a setting
    the caller asked for and the mechanism cannot honour): then ``ValueError`` names both.
    """
    spec = get_attention_spec(attn_layer)
    out: dict[str, Any] = {}
    for name, value in offered.items():
        if name in spec.init_kwargs or spec.init_accepts_any:
            out[name] = value
        elif neutral is not None and name in neutral and value != neutral[name]:
            raise ValueError(f"attn_layer {attn_layer!r} does not take {name} (its constructor has no such "
                             f"keyword); leave {name}={neutral[name]!r} or choose another mechanism")
    return out


class Block(nn.Module):
    """Transformer block, ``[B, N, C] -> [B, N, C]`` or ``[B, H, W, C] -> [B, H, W, C]``.

    Args:
        dim: channels ``C``; num_heads: ``nh``.
        style: ``"pre"`` | ``"post"`` | ``"res_post"`` | ``"parallel"`` (module docstring).
        mlp_ratio: MLP hidden width ``mlp_ratio · C``.
        qkv_bias, qk_norm, proj_bias: attention options, given where the mechanism takes them.
        mlp_bias: biases of the MLP's linear maps.
        drop: dropout after the attention projection and in the MLP; attn_drop: on attention weights.
        drop_path: stochastic depth of both branches.
        init_values: LayerScale initial value (None = no LayerScale).
        norm_layer, act_layer: ``norm_layer(C)``, ``act_layer()``.
        attn_layer: registered mechanism name; attn_kwargs: its own keywords (given as they are).
        depth_index: the block's 0-based index among the model's attention blocks (counted across stages),
            handed to a mechanism
            whose constructor takes ``depth_index`` (differential attention's ``λ_init``); others ignore it.
        mlp_layer: ``mlp_layer(C, hidden, act_layer=, bias=, drop=)`` (default :class:`Mlp`).
        pos_layer: ``pos_layer(C)``, a position layer called ``pos(x, feat_size, num_prefix_tokens)``
            on the block input (it adds its own residual).
        pos_mlp_layer: ``pos_mlp_layer(C)``, a position layer called like ``pos`` on the attention
            branch's output, before the MLP branch (DaViT's ``cpe2``; styles ``"pre"``, ``"post"``,
            ``"res_post"``). Key: ``pos2``.
    """

    def __init__(self, dim: int, num_heads: int, *, style: BlockStyle = "pre", mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, qk_norm: bool = False, proj_bias: bool = True, mlp_bias: bool = True,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 init_values: float | None = None, norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 act_layer: Callable[[], nn.Module] = nn.GELU, attn_layer: str = "mhsa",
                 attn_kwargs: Mapping[str, Any] | None = None, mlp_layer: Callable[..., nn.Module] = Mlp,
                 pos_layer: Callable[[int], nn.Module] | None = None,
                 pos_mlp_layer: Callable[[int], nn.Module] | None = None, depth_index: int = 0) -> None:
        super().__init__()
        if style not in BLOCK_STYLES:
            raise ValueError(f"style must be one of {', '.join(map(repr, BLOCK_STYLES))}; got {style!r}")
        self.style = style
        offered = dict(qkv_bias=qkv_bias, qk_norm=qk_norm, proj_bias=proj_bias, attn_drop=attn_drop, proj_drop=drop,
                       depth_index=depth_index)
        neutral = dict(qkv_bias=True, qk_norm=False, proj_bias=True, attn_drop=0.0, proj_drop=0.0)
        kw = {**accepted_kwargs(attn_layer, offered, neutral), **(attn_kwargs or {})}
        self.pos = pos_layer(dim) if pos_layer is not None else None
        if pos_mlp_layer is not None and style == "parallel":
            raise ValueError("pos_mlp_layer runs between the attention and MLP branches: not with style='parallel'")
        self.pos2 = pos_mlp_layer(dim) if pos_mlp_layer is not None else None
        self.norm1 = norm_layer(dim)
        self.attn = create_attention(attn_layer, dim, num_heads, **kw)
        self.layout = get_attention_spec(attn_layer).layout
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim) if style != "parallel" else nn.Identity()  # parallel: norm1 feeds both
        self.mlp = mlp_layer(dim, int(dim * mlp_ratio), act_layer=act_layer, bias=mlp_bias, drop=drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def _pos_mlp(self, x: Tensor, feat_size: tuple[int, int] | None, num_prefix_tokens: int) -> Tensor:
        """The position layer between the branches (``pos2``), when there is one."""
        return x if self.pos2 is None else self.pos2(x, feat_size, num_prefix_tokens)

    def _fused_pre(self, x: Tensor, call: AttentionCall) -> Tensor:
        """Pre-norm at inference: the residual adds fused into the attention ``proj`` and ``fc2`` (same math).

        ``call.residual`` is ``x``: the adapter fuses it where the mechanism can."""
        x = apply_attention(self.attn, self.norm1(x), call)
        x = self._pos_mlp(x, call.feat_size, call.num_prefix_tokens)
        return self._fused_mlp(x)

    def _fused_mlp(self, x: Tensor) -> Tensor:
        """``x + mlp(norm2(x))`` at inference without LayerScale: the add fused into ``fc2`` where it can be."""
        if getattr(self.mlp, "accepts_residual", False) and hookless(self.mlp):
            return self.mlp(self.norm2(x), residual=x)
        return x + self.mlp(self.norm2(x))

    def _residual(self, x: Tensor, branch: Tensor, ls: nn.Module, drop_path: nn.Module) -> Tensor:
        """``x + drop_path(ls(branch))``; LayerScale at inference as one ``addcmul`` pass (same math)."""
        if not self.training and type(ls) is LayerScale and hookless(ls):
            return torch.addcmul(x, branch, ls.gamma)  # [..., C]
        return x + drop_path(ls(branch))

    def _forward_context(self, x: Tensor, context: Tensor, feat_size: tuple[int, int] | None) -> Tensor:
        """Class-attention flow: ``x [B, Nq, C]`` queries ``norm1([x; context])``; ``[B, Nq, C]`` out.

        ``feat_size``: the grid of ``context``'s last ``H·W`` tokens, so recorded maps land on it.
        """
        if self.style != "pre" or self.pos is not None or self.pos2 is not None:
            raise ValueError(f"context needs a pre-norm block without a position layer (style={self.style!r})")
        if context.dim() != 3 or x.dim() != 3 or context.shape[0] != x.shape[0] or context.shape[-1] != x.shape[-1]:
            raise ValueError(f"context must be tokens [B, M, C] matching x {tuple(x.shape)}, "
                             f"got {tuple(context.shape)}")
        Nq = x.shape[1]
        u = self.norm1(torch.cat([x, context], dim=1))  # [B, Nq + M, C]
        call = AttentionCall(feat_size, num_prefix_tokens=Nq, context=u)  # keys / values from all of u
        a = apply_attention(self.attn, u[:, :Nq], call)  # [B, Nq, C]
        x = self._residual(x, a, self.ls1, self.drop_path1)
        return self._residual(x, self.mlp(self.norm2(x)), self.ls2, self.drop_path2)

    def _forward_merging(self, x: Tensor, call: AttentionCall, tome: TokenMergeState) -> Tensor:
        """Token merging (ToMe): the attention branch, ``tome.merge`` between the branches, the MLP branch.

        The same branches as :meth:`forward` (LayerScale, drop path and norms untouched), ``[B, T, C] ->
        [B, T - r, C]``; the mechanism adds ``log(size)`` to its logits and leaves the merge metric in
        ``tome``. ``parallel``: both branches read one norm, so the merge follows the block.
        """
        if self.pos is not None or self.pos2 is not None:
            raise ValueError("token merging: this block has a position layer, which needs the token grid")

        def attn(y: Tensor) -> Tensor:
            return apply_attention(self.attn, y, call)

        style = self.style
        if style == "pre":
            fused = not self.training  # inference: the residual adds fused as in forward (same math)
            if fused and isinstance(self.ls1, nn.Identity):
                x = apply_attention(self.attn, self.norm1(x), dataclasses.replace(call, residual=x))
            else:
                x = self._residual(x, attn(self.norm1(x)), self.ls1, self.drop_path1)
            x = tome.merge(x)
            if fused and isinstance(self.ls2, nn.Identity):
                return self._fused_mlp(x)
            return self._residual(x, self.mlp(self.norm2(x)), self.ls2, self.drop_path2)
        if style == "res_post":
            x = tome.merge(x + self.drop_path1(self.ls1(self.norm1(attn(x)))))
            return x + self.drop_path2(self.ls2(self.norm2(self.mlp(x))))
        if style == "post":
            x = tome.merge(self.norm1(x + self.drop_path1(self.ls1(attn(x)))))
            return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))
        y = self.norm1(x)  # parallel
        return tome.merge(x + self.drop_path1(self.ls1(attn(y))) + self.drop_path2(self.ls2(self.mlp(y))))

    def forward(self, x: Tensor, feat_size: tuple[int, int] | None = None, num_prefix_tokens: int = 0, *,
                context: Tensor | None = None, mask: Tensor | None = None, rope_coords: Tensor | None = None,
                rope_valid: Tensor | None = None, tome: TokenMergeState | None = None) -> Tensor:
        """``[B, P + H·W, C]`` (grid ``feat_size``, ``P`` prefix tokens) or ``[B, H, W, C]`` -> same shape.

        ``context [B, M, C]``: class-attention flow (module docstring), ``x [B, Nq, C] -> [B, Nq, C]``.
        ``mask``: bool attention mask broadcastable to ``[B, nh, N, N]`` (True = may attend; NaFlex's
        padding key mask ``[B, 1, 1, N]``), handed to the mechanism; None = unmasked, as before.
        ``rope_coords [B, L, 2]`` int ``(y, x)`` and ``rope_valid [B, L]`` bool (``L = N - P``): per-sample
        RoPE grids of a packed NaFlex batch, handed to a mechanism with a rotary embedding; None = not given.
        All of them reach the mechanism as one :class:`~vit_attention.attention.base.AttentionCall`.
        ``tome``: token merging's state (:meth:`_forward_merging`): ``[B, T, C] -> [B, T - r, C]``, ``r`` this
        block's share of ``tome``'s schedule.
        """
        if context is not None:
            if mask is not None or rope_coords is not None or rope_valid is not None:
                raise ValueError("mask / rope_coords / rope_valid are not supported with context "
                                 "(class-attention flow)")
            return self._forward_context(x, context, feat_size)
        if tome is not None:
            if mask is not None or rope_coords is not None or rope_valid is not None:
                raise ValueError("token merging takes no mask / rope_coords / rope_valid (packed NaFlex batches)")
            return self._forward_merging(x, AttentionCall(feat_size, num_prefix_tokens, tome=tome), tome)
        if self.pos is not None:
            x = self.pos(x, feat_size, num_prefix_tokens)
        style = self.style
        fused = style == "pre" and not self.training and isinstance(self.ls1, nn.Identity) \
            and isinstance(self.ls2, nn.Identity)  # inference: the residual adds fused (same math)
        call = AttentionCall(feat_size, num_prefix_tokens, mask=mask, rope_coords=rope_coords, rope_valid=rope_valid,
                             residual=x if fused else None)  # one call per forward
        if fused:
            return self._fused_pre(x, call)
        if style == "pre":
            x = self._residual(x, apply_attention(self.attn, self.norm1(x), call), self.ls1, self.drop_path1)
            x = self._pos_mlp(x, feat_size, num_prefix_tokens)
            return self._residual(x, self.mlp(self.norm2(x)), self.ls2, self.drop_path2)
        if style == "res_post":
            x = x + self.drop_path1(self.ls1(self.norm1(apply_attention(self.attn, x, call))))
            x = self._pos_mlp(x, feat_size, num_prefix_tokens)
            return x + self.drop_path2(self.ls2(self.norm2(self.mlp(x))))
        if style == "post":
            x = self.norm1(x + self.drop_path1(self.ls1(apply_attention(self.attn, x, call))))
            x = self._pos_mlp(x, feat_size, num_prefix_tokens)
            return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))
        y = self.norm1(x)  # parallel
        return (x + self.drop_path1(self.ls1(apply_attention(self.attn, y, call)))
                + self.drop_path2(self.ls2(self.mlp(y))))

    def extra_repr(self) -> str:
        return f"style={self.style!r}"
