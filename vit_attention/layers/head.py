"""Classifier heads: average pooling (+ norm) + linear over a map, and multi-head attention pooling (MAP)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.base import check_heads
from ..functional import merge_heads, scaled_dot_product_attention, split_heads, split_packed
from ..functional.layout import token_layout
from ..functional.linear import apply_linear
from ..functional.observers import attention_observed
from ..functional.runtime import ATTENTION_BACKEND, FUSED_ATTENTION
from .mlp import Mlp

__all__ = ["ClassifierHead", "AttentionPoolHead", "reset_head", "init_linear_weights"]


def reset_head(model: nn.Module, num_classes: int, global_pool: str | None = None, *,
               pools: tuple[str, ...] = ("avg", ""), fc_attr: str | None = "fc") -> None:
    """``model.reset_classifier``: a fresh classifier for ``num_classes`` (0 = none) on ``model.num_features``.

    ``global_pool`` (one of ``pools``; None = keep) is recorded on the model, its config and its
    head. The new layer is ``model.head.<fc_attr>`` (``ClassifierHead``'s ``fc``), or ``model.head``
    itself with ``fc_attr=None`` (a bare ``Linear`` head); it is created on the model's device.
    """
    if not isinstance(num_classes, int) or isinstance(num_classes, bool):
        raise TypeError(f"num_classes must be an int >= 0, got {num_classes!r} ({type(num_classes).__name__})")
    if num_classes < 0:
        raise ValueError(f"num_classes must be an int >= 0, got {num_classes!r}")
    cfg = getattr(model, "cfg", None)
    if global_pool is not None:
        if global_pool not in pools:
            raise ValueError(f"global_pool must be one of {', '.join(repr(p) for p in pools)}; got {global_pool!r}")
        model.global_pool = global_pool
        if cfg is not None and hasattr(cfg, "global_pool"):
            cfg.global_pool = global_pool
        if hasattr(model.head, "global_pool"):
            model.head.global_pool = global_pool
    model.num_classes = num_classes
    if cfg is not None and hasattr(cfg, "num_classes"):
        cfg.num_classes = num_classes
    device = next(model.parameters()).device
    fc = nn.Linear(model.num_features, num_classes, device=device) if num_classes > 0 else nn.Identity()
    if fc_attr is None:
        model.head = fc
    else:
        setattr(model.head, fc_attr, fc)


@torch.no_grad()
def init_linear_weights(module: nn.Module, std: float = 0.02) -> None:
    """Every ``Linear`` below ``module``: weights ~ truncated N(0, ``std``), biases 0 (the ViT-family init)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class ClassifierHead(nn.Module):
    """Global average pool over ``H, W`` + optional norm + dropout + ``fc``: ``[B, H, W, C] -> [B, num_classes]``.

    ``global_pool=""`` keeps the input unpooled (a :class:`~vit_attention.models.backbone.Backbone`
    pools before its head). ``norm_layer``: a norm on the pooled features before the dropout and
    ``fc`` (DaViT's head, timm's ``NormMlpClassifierHead`` without hidden layer); None = none.
    Keys: ``norm`` (with ``norm_layer``), ``fc`` (timm layout).
    """

    def __init__(self, in_features: int, num_classes: int, *, global_pool: str = "avg", drop: float = 0.0,
                 norm_layer: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        self.global_pool = global_pool
        self.norm = norm_layer(in_features) if norm_layer is not None else nn.Identity()
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(in_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """``[B, H, W, C]`` (or pooled ``[B, C]``) -> ``[B, num_classes]`` (the normalised pooled ``[B, C]``
        with ``pre_logits``)."""
        if self.global_pool == "avg":
            x = x.mean(dim=(1, 2))  # [B, C]
        x = self.drop(self.norm(x))
        return x if pre_logits else self.fc(x)


class AttentionPoolHead(nn.Module):
    """Multi-head attention pooling (MAP, Zhai et al. 2022; SigLIP's head): a learned query attends to the tokens.

    ``[B, N, C] -> [B, C]``::

        q = latent W_q;  k, v = x W_kv                  # latent [1, 1, C]
        o = softmax(q kᵀ · hd^-1/2 [+ key mask]) v W_o  # no residual from the latent
        y = o + mlp(norm(o));  return y[:, 0]

    Keys (timm's ``AttentionPoolLatent``): ``latent``, ``q``, ``kv`` (k rows then v), ``proj``,
    ``norm``, ``mlp.fc1`` / ``mlp.fc2``. The attention goes through the library's one core, so
    hooks and attention maps see it. Checkpoints of the earlier layout (``attn.{q,k,v,out}_proj``)
    still load.
    """

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, *,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 act_layer: Callable[[], nn.Module] = nn.GELU, qkv_bias: bool = True) -> None:
        super().__init__()
        self.head_dim = check_heads(dim, num_heads)
        self.dim, self.num_heads = dim, num_heads
        self.fused_attention = FUSED_ATTENTION.default  # captured when built (runtime.switched flips it)
        self.attention_backend = ATTENTION_BACKEND.default  # "auto" | "sdpa" | "explicit" | "flex" (captured)
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.norm = norm_layer(dim)
        self.mlp = Mlp(dim, mlp_dim, act_layer=act_layer)
        nn.init.trunc_normal_(self.latent, std=dim ** -0.5)

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """``[B, N, C] -> [B, C]``; ``key_mask [B, N]`` bool, True = a real token (padding left out, NaFlex)."""
        B = x.shape[0]
        q = split_heads(apply_linear(self.q, self.latent.expand(B, -1, -1)), self.num_heads)  # [B, nh, 1, hd]
        k, v = split_packed(apply_linear(self.kv, x), self.num_heads, 2, "packed kv")  # each [B, nh, N, hd]
        mask = None if key_mask is None else key_mask.to(torch.bool)[:, None, None, :]  # [B, 1, 1, N]
        layout = token_layout(1, None, 1, num_context=x.shape[1]) if attention_observed() else None
        o = scaled_dot_product_attention(q, k, v, mask=mask, layout=layout,
                                         fused=self.fused_attention, backend=self.attention_backend)
        o = apply_linear(self.proj, merge_heads(o))  # [B, 1, C]
        o = o + self.mlp(self.norm(o))
        return o[:, 0]  # [B, C]

    def _load_from_state_dict(self, state_dict: dict[str, Tensor], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Accept the earlier layout: ``attn.{q,k,v}_proj`` -> ``q`` / ``kv``, ``attn.out_proj`` -> ``proj``."""
        old = prefix + "attn."
        if any(k.startswith(old) for k in state_dict):
            for kind in ("weight", "bias"):
                qk = [state_dict.pop(f"{old}{n}_proj.{kind}", None) for n in "qkv"]
                if qk[0] is not None:
                    state_dict[f"{prefix}q.{kind}"] = qk[0]
                if qk[1] is not None and qk[2] is not None:
                    state_dict[f"{prefix}kv.{kind}"] = torch.cat([qk[1], qk[2]])
                out = state_dict.pop(f"{old}out_proj.{kind}", None)
                if out is not None:
                    state_dict[f"{prefix}proj.{kind}"] = out
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

