"""Classifier heads: average pooling (+ norm) + linear over a map, and multi-head attention pooling (MAP)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention
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
    """Multi-head attention pooling (MAP, Zhai et al. 2022): a learned query attends to the tokens.

    ``[B, N, C] -> [B, C]``: ``latent`` query -> :class:`MultiHeadAttention` -> ``+ mlp(norm(.))``.
    Keys: ``latent``, ``attn.*``, ``norm``, ``mlp.*``.
    """

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, *,
                 norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
                 act_layer: Callable[[], nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.attn = MultiHeadAttention(dim, num_heads)
        self.norm = norm_layer(dim)
        self.mlp = Mlp(dim, mlp_dim, act_layer=act_layer)
        nn.init.trunc_normal_(self.latent, std=dim ** -0.5)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, N, C] -> [B, C]``."""
        q = self.latent.expand(x.shape[0], -1, -1)  # [B, 1, C]
        x, _ = self.attn(q, x, x)  # [B, 1, C]
        x = x + self.mlp(self.norm(x))
        return x[:, 0]  # [B, C]
