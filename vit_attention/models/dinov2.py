"""DINOv2 (Oquab et al. 2023, "DINOv2: Learning Robust Visual Features without Supervision") and DINOv2 with
registers (Darcet et al. 2024, "Vision Transformers Need Registers").

Self-supervised ViT backbones at patch 14 and 518 px (a 37x37 grid): pre-LN blocks with LayerScale
(``init_values=1e-5``, the training value), LayerNorm eps 1e-6, exact GELU; the giant model replaces the
MLP with a packed SwiGLU (``mlp_layer="glu"``, SiLU gate first, ``fc1: 1536 -> 8192``, ``fc2: 4096 -> 1536``).
The register models add ``R = 4`` learned tokens after the class token that carry no position embedding
and are dropped by every pool; as in timm they keep ``no_embed_class=True`` (the class slot of the
original table is folded into ``cls_token`` at load, an exact rewrite). No classifier by default
(``num_classes=0``), the class token is the embedding.

The backbone is :class:`~vit_attention.models.vit.VisionTransformer`; this file names the family and
its presets. Keys: timm's (``cls_token``, ``reg_token``, ``pos_embed``, ``blocks.N.ls1.gamma`` ...), so
``timm/vit_*_dinov2.lvd142m`` loads directly; Hugging Face and the original facebookresearch/dinov2
layouts are converted in :mod:`vit_attention.weights.dinov2`.

Position embeddings at other sizes are resampled bicubically with antialias to the new grid, timm's
rule (``pos_embed_resize="timm"``, the default), which equals the original register models and Hugging Face
``Dinov2WithRegistersModel``. The original plain models resample with offset 0.1 and no antialias
(``pos_embed_resize="dinov2"``), Hugging Face ``Dinov2Model`` with ``size=`` and no antialias
(``pos_embed_resize="bicubic"``); docs/dinov2.md. At 518 px all agree exactly.
"""

from __future__ import annotations

from typing import Any

from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["Dinov2", "reduced_config"]


class Dinov2(VisionTransformer):
    """DINOv2 ViT backbone, ``[B, 3, H, W] -> [B, C]`` (no classifier by default).

    ``forward_features`` gives normalised tokens ``[B, 1 + R + H/14·W/14, C]``: the class token, ``R``
    register tokens (0 or 4), then the patch tokens row-major; ``forward_head(pre_logits=True)`` the class
    token ``[B, C]`` (``global_pool="avg"``: the mean of the patch tokens only, registers excluded).
    ``forward_intermediates`` grids ``[B, C, H/14, W/14]`` hold patch tokens only (prefix tokens with
    ``return_prefix_tokens=True``).
    """

    family = "dinov2"


_SIZES: dict[str, dict[str, Any]] = {
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
    # packed SwiGLU: timm's mlp_ratio 2.66667 * 2 -> int(1536 * 5.33334) = 8192 fc1 outputs (both halves)
    "giant": dict(embed_dim=1536, depth=40, num_heads=24, mlp_layer="glu", act="silu", mlp_ratio=2.66667 * 2),
}
_DINOV2 = dict(patch_size=14, img_size=518, init_values=1e-5, num_classes=0)
_REG4 = dict(reg_tokens=4, no_embed_class=True)

_PRESETS: dict[str, dict[str, Any]] = {}
for _size in _SIZES:
    _PRESETS[f"vit_{_size}_patch14_dinov2"] = dict(_SIZES[_size], **_DINOV2)
    _PRESETS[f"vit_{_size}_patch14_reg4_dinov2"] = dict(_SIZES[_size], **_DINOV2, **_REG4)

# timm 1.0.31 parameters on the meta device (num_classes=0), and GMACs at 518 px from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs; attention matmuls included).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "vit_small_patch14_dinov2": (22.056, 46.76), "vit_base_patch14_dinov2": (86.580, 151.71),
    "vit_large_patch14_dinov2": (304.368, 507.15), "vit_giant_patch14_dinov2": (1136.479, 1784.2),
    "vit_small_patch14_reg4_dinov2": (22.057, 46.95), "vit_base_patch14_reg4_dinov2": (86.582, 152.25),
    "vit_large_patch14_reg4_dinov2": (304.371, 508.9), "vit_giant_patch14_reg4_dinov2": (1136.484, 1790.08),
}
_SOURCE = "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs at 518"


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a DINOv2 preset for tests: ViT's (:func:`~vit_attention.models.vit.reduced_config`:
    width 32, 2 heads, 2 blocks, a 3x3 grid of 14 px patches); the registers, LayerScale, the packed SwiGLU
    (its ``mlp_ratio``, 170 fc1 outputs at width 32) and ``no_embed_class`` are kept."""
    return vit_reduced_config(cfg)


register_family(
    "dinov2", Dinov2, VisionTransformerConfig, _PRESETS, reduced=reduced_config,
    meta=published_meta(_PUBLISHED, _SOURCE))

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_518 = data_cfg(518, 1.0)
PRETRAINED = pretrained_tags({
    "vit_base_patch14_dinov2.lvd142m": dict(_518, num_classes=0),
    "vit_base_patch14_reg4_dinov2.lvd142m": dict(_518, num_classes=0),
    "vit_giant_patch14_dinov2.lvd142m": dict(_518, num_classes=0),
    "vit_giant_patch14_reg4_dinov2.lvd142m": dict(_518, num_classes=0),
    "vit_large_patch14_dinov2.lvd142m": dict(_518, num_classes=0),
    "vit_large_patch14_reg4_dinov2.lvd142m": dict(_518, num_classes=0),
    "vit_small_patch14_dinov2.lvd142m": dict(_518, num_classes=0),
    "vit_small_patch14_reg4_dinov2.lvd142m": dict(_518, num_classes=0),
}, license="apache-2.0")
