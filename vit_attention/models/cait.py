"""CaiT (Touvron et al., 2021, "Going deeper with Image Transformers"): class-attention image transformers.

Config dataclass -> :class:`Cait` -> presets registered as data (timm's names).

* Patch embedding plus a learned position embedding over the patches only (no class slot);
  another grid resamples it (``dynamic_img_size=True`` at run time; ``load_weights`` for a model
  built at another ``img_size``; :meth:`Cait.set_input_size` permanently, the patch kernel too).
* Self-attention stage: ``depth`` pre-norm :class:`~vit_attention.layers.Block` s with
  ``attn_layer="talking_heads"`` and LayerScale (``init_values``: 1e-5 for XXS / XS / S24, 1e-6
  for S36 / M36 / M48) over the patch tokens alone.
* Class-attention stage: ``depth_token_only`` (2) blocks, the same :class:`Block` called with a
  ``context``: ``u = norm1([x_cls; x])``, ``x_cls += γ1 · class_attn(u[:, :1], AttentionCall(context=u))``,
  ``x_cls += γ2 · mlp(norm2(x_cls))``; the patch tokens pass unchanged.
* Final norm over ``[x_cls; x]``, the head on the class token (or the patch mean, ``global_pool="avg"``).

State-dict keys are timm's except LayerScale: ours are ``blocks.N.ls1.gamma`` / ``ls2.gamma`` (the
one Block's names) where timm and the original facebookresearch/deit code have ``gamma_1`` /
``gamma_2``; :mod:`vit_attention.weights.cait` renames them (``load_weights``, tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..attention import get_attention_spec, list_attention
from ..functional import resample_abs_pos_embed
from ..layers import Block, PatchEmbed, run_blocks_with_taps, stage_feature_info
from ..layers.head import init_linear_weights
from ._config import ConfigMixin, check_attn_layer, check_common, check_float, check_int, check_size, check_width_heads
from .backbone import ClassAttentionBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family
from .token_merging import TokenMergingMixin

__all__ = ["CaitConfig", "Cait", "reduced_config"]

_POOLS = ("token", "avg", "")


@dataclass
class CaitConfig(ConfigMixin):
    """Everything a :class:`Cait` is built from (JSON-serialisable)."""

    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["token", "avg", ""] = "token"
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    init_values: float = 1e-4  # LayerScale init of every block (both stages)
    depth_token_only: int = 2  # class-attention blocks
    mlp_ratio_token_only: float = 4.0
    attn_layer: str = "talking_heads"  # the self-attention stage's mechanism
    attn_kwargs: dict[str, Any] = field(default_factory=dict)
    token_attn_layer: str = "class_attn"  # the class-attention stage's mechanism (must take a context)
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    drop_path_rate: float = 0.0  # the same rate in every self-attention block (as in the paper / timm)
    dynamic_img_size: bool = False  # accept any patch-multiple size, resampling the position embedding

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        img = check_common(self, _POOLS)
        patch = check_size(self.patch_size, "patch_size")
        dim, heads = check_width_heads(self)
        check_int(self.depth, "depth", min_value=0)
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_float(self.mlp_ratio_token_only, "mlp_ratio_token_only", low_open=True)
        check_float(self.norm_eps, "norm_eps")
        check_float(self.init_values, "init_values", low=-math.inf)
        check_int(self.depth_token_only, "depth_token_only", min_value=0)
        check_attn_layer(self.attn_layer, self.attn_kwargs)
        if not isinstance(self.token_attn_layer, str) or self.token_attn_layer not in list_attention() \
                or not get_attention_spec(self.token_attn_layer).supports_context:
            takes = [n for n in list_attention() if get_attention_spec(n).supports_context]
            raise ValueError(f"token_attn_layer must be a registered mechanism that takes a context "
                             f"(one of {', '.join(map(repr, takes))}); got {self.token_attn_layer!r}")
        if img[0] % patch[0] or img[1] % patch[1]:
            raise ValueError(f"img_size={self.img_size!r} is not divisible by patch_size={self.patch_size!r}")


class Cait(TokenMergingMixin, ClassAttentionBackbone):
    """CaiT backbone with a classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives normalised tokens ``[B, 1 + N, C]`` (class token first; ``N`` patches),
    ``forward_head`` takes the class token (or the patch mean, :meth:`Backbone.pool`) and classifies.
    A :class:`~vit_attention.models.backbone.ClassAttentionBackbone`: one stage of ``blocks``, then the
    class-attention blocks ``blocks_token_only``; the head is a bare ``Linear`` (key ``head``).
    """

    family = "cait"
    class_blocks_attr = "blocks_token_only"
    config_cls = CaitConfig
    no_weight_decay_keys = ("pos_embed", "cls_token")
    pools = _POOLS
    head_fc = None

    def __init__(self, cfg: CaitConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        C = cfg.embed_dim
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        self.global_pool = cfg.global_pool
        self.embed_dim = self.num_features = C
        self.num_prefix_tokens = 1
        self.dynamic_img_size = cfg.dynamic_img_size
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, C,
                                      strict_img_size=not cfg.dynamic_img_size,
                                      size_options=("dynamic_img_size=True", None))
        assert self.patch_embed.grid_size is not None
        self.grid_size = self.patch_embed.grid_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, C))  # patches only
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)

        block = partial(Block, C, cfg.num_heads, qkv_bias=cfg.qkv_bias, init_values=cfg.init_values,
                        norm_layer=norm_layer, act_layer=nn.GELU)
        self.blocks = nn.Sequential(*[
            block(mlp_ratio=cfg.mlp_ratio, drop=cfg.proj_drop_rate, attn_drop=cfg.attn_drop_rate,
                  drop_path=cfg.drop_path_rate, attn_layer=cfg.attn_layer, attn_kwargs=cfg.attn_kwargs, depth_index=i)
            for i in range(cfg.depth)])
        self.feature_info = stage_feature_info((C,) * cfg.depth, (self.patch_embed.patch_size[0],) * cfg.depth,
                                               "blocks")
        self.blocks_token_only = nn.ModuleList([
            block(mlp_ratio=cfg.mlp_ratio_token_only, attn_layer=cfg.token_attn_layer, depth_index=cfg.depth + i)
            for i in range(cfg.depth_token_only)])
        self.norm = norm_layer(C)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(C, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self._init_weights()

    # ------------------------------------------------------------------ construction
    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        init_linear_weights(self)

    # ------------------------------------------------------------------ API
    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None, *, interpolation: str = "bicubic",
                       antialias: bool = True) -> None:
        """Change the input resolution and / or the patch size permanently, in place (as ViT's
        ``set_input_size``; timm's ``Cait`` has none: this is what its ``resample_abs_pos_embed`` /
        ``resample_patch_embed`` do to a checkpoint loaded at another size).

        ``img_size`` (None = keep) must be a multiple of the patch size; ``patch_size`` (None = keep)
        rebuilds ``patch_embed.proj`` with its kernel ``[C, Cin, P, P'] -> [C, Cin, Q, Q']`` resampled by
        :func:`~vit_attention.functional.resample_patch_embed`. The patch-only ``pos_embed``
        ``[1, gh·gw, C]`` is replaced by its resampling to the new grid ``[1, gh'·gw', C]``
        (:func:`~vit_attention.functional.resample_abs_pos_embed`, no prefix rows: the class token has
        no position). ``interpolation`` / ``antialias`` apply to both (timm: bicubic, anti-aliased).
        ``grid_size``, ``cfg.img_size`` / ``cfg.patch_size`` and the ``reduction`` of ``feature_info``
        follow. Every argument is checked before anything changes (an error names it).
        """
        prev_grid = self.grid_size
        self.patch_embed.set_input_size(img_size, patch_size, interpolation=interpolation, antialias=antialias)
        assert self.patch_embed.grid_size is not None and self.patch_embed.img_size is not None
        grid = self.patch_embed.grid_size
        if grid != prev_grid:
            with torch.no_grad():
                pos = resample_abs_pos_embed(self.pos_embed.detach(), grid, prev_grid, num_prefix_tokens=0,
                                             interpolation=interpolation, antialias=antialias)  # [1, gh'·gw', C]
            self.pos_embed = nn.Parameter(pos.contiguous(), requires_grad=self.pos_embed.requires_grad)
        self._record_patch_embed_size()  # grid_size, cfg sizes, feature reductions

    def feat_size(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Token grid for an image of size ``hw``."""
        return self.patch_embed.dynamic_feat_size(hw) if self.dynamic_img_size else self.grid_size

    def _embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:  # type: ignore[override]
        """Images ``[B, Cin, H, W]`` -> patch tokens ``[B, N, C]`` with position embedding, and the grid."""
        feat_size = self.feat_size(tuple(x.shape[-2:]))
        x = self.patch_embed(x)  # [B, N, C]
        pos = self.pos_embed
        if tuple(feat_size) != self.grid_size:
            pos = resample_abs_pos_embed(pos, feat_size, self.grid_size, num_prefix_tokens=0)
        return self.pos_drop(x + pos), feat_size

    def _run_blocks(self, x: Tensor, feat_size: tuple[int, int], indices: set[int] | None = None, *,
                    stop: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Patch tokens ``[B, N, C]`` through the self-attention blocks:
        ``-> (tokens [B, N, C], [outputs of blocks indices])``; with token merging (:meth:`set_token_merging`) the
        self-attention blocks merge and the class-attention stage sees the tokens back in image space.
        ``stop``: no block after the last of ``indices`` runs."""
        if self.token_merging is not None:
            return self._run_blocks_merging(x, feat_size, indices, num_prefix=0, stop=stop)
        return run_blocks_with_taps(self.blocks, x, feat_size, 0, checkpoint=self.grad_checkpointing and self.training,
                                    taps=indices, stop_at_last_tap=stop)

    def forward_cls(self, x: Tensor, feat_size: tuple[int, int] | None = None) -> Tensor:
        """Class-attention stage: patch tokens ``[B, N, C]`` -> ``[B, 1 + N, C]`` (class token first).

        Only the class token changes; the patch tokens are the keys' and values' source, unchanged.
        ``feat_size``: their grid (recorded class-attention maps are placed on it). After
        ``prune_intermediate_layers(prune_head=True)`` there is no class token: ``x`` is returned.
        """
        if self.cls_token is None:
            return x
        cls = self.cls_token.expand(x.shape[0], -1, -1)  # [B, 1, C]
        for blk in self.blocks_token_only:
            cls = blk(cls, feat_size, context=x)  # [B, 1, C]
        return torch.cat([cls, x], dim=1)  # [B, 1 + N, C]



# ---------------------------------------------------------------------------- presets (data)
# (embed_dim, depth, num_heads, LayerScale init) per size; the class-attention stage is 2 blocks throughout.
_SIZES: dict[str, dict[str, Any]] = {
    "xxs24": dict(embed_dim=192, depth=24, num_heads=4, init_values=1e-5),
    "xxs36": dict(embed_dim=192, depth=36, num_heads=4, init_values=1e-5),
    "xs24": dict(embed_dim=288, depth=24, num_heads=6, init_values=1e-5),
    "s24": dict(embed_dim=384, depth=24, num_heads=8, init_values=1e-5),
    "s36": dict(embed_dim=384, depth=36, num_heads=8, init_values=1e-6),
    "m36": dict(embed_dim=768, depth=36, num_heads=16, init_values=1e-6),
    "m48": dict(embed_dim=768, depth=48, num_heads=16, init_values=1e-6),
}

# name -> (size, image size, published params M, published GMACs); timm's
# results/benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv (param_count, infer_gmacs)
_MODELS: dict[str, tuple[str, int, float, float]] = {
    "cait_xxs24_224": ("xxs24", 224, 11.96, 2.53),
    "cait_xxs24_384": ("xxs24", 384, 12.03, 9.63),
    "cait_xxs36_224": ("xxs36", 224, 17.30, 3.77),
    "cait_xxs36_384": ("xxs36", 384, 17.37, 14.35),
    "cait_xs24_384": ("xs24", 384, 26.67, 19.28),
    "cait_s24_224": ("s24", 224, 46.92, 9.35),
    "cait_s24_384": ("s24", 384, 47.06, 32.17),
    "cait_s36_384": ("s36", 384, 68.37, 47.99),
    "cait_m36_384": ("m36", 384, 271.22, 173.11),
    "cait_m48_448": ("m48", 448, 356.46, 329.41),
}
_SOURCE = "timm benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv (infer_gmacs); deit README_cait.md agrees"

_PRESETS: dict[str, dict[str, Any]] = {n: dict(_SIZES[s], img_size=img) for n, (s, img, _, _) in _MODELS.items()}
_META = published_meta({n: (p, g) for n, (_, _, p, g) in _MODELS.items()}, _SOURCE)


def reduced_config(cfg: CaitConfig) -> dict[str, Any]:
    """Overrides that shrink a CaiT preset for tests: width 32, 2 heads, 2 talking-heads blocks and both
    class-attention blocks (LayerScale init kept) on a 3x3 patch grid."""
    return dict(embed_dim=32, num_heads=2, depth=2, depth_token_only=2, img_size=cfg.patch_size * 3)


register_family("cait", Cait, CaitConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 1.0)
_384 = data_cfg(384, 1.0)
_448 = data_cfg(448, 1.0)
PRETRAINED = pretrained_tags({
    "cait_m36_384.fb_dist_in1k": _384,
    "cait_m48_448.fb_dist_in1k": _448,
    "cait_s24_224.fb_dist_in1k": _224,
    "cait_s24_384.fb_dist_in1k": _384,
    "cait_s36_384.fb_dist_in1k": _384,
    "cait_xs24_384.fb_dist_in1k": _384,
    "cait_xxs24_224.fb_dist_in1k": _224,
    "cait_xxs24_384.fb_dist_in1k": _384,
    "cait_xxs36_224.fb_dist_in1k": _224,
    "cait_xxs36_384.fb_dist_in1k": _384,
}, license="apache-2.0")
