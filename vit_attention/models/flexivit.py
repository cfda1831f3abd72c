"""FlexiViT (Beyer et al. 2023, "FlexiViT: One Model for All Patch Sizes", CVPR).

A plain ViT trained with a patch size drawn at random per batch (8 to 48) on 240 px images: the
patch kernel and the position table are stored at one size (patch 16, a 7x7 underlying table in
big_vision, 15x15 = 240/16 in the released/timm layout) and resized on the fly, the kernel by the
pseudo-inverse of the patch resize (:func:`~vit_attention.functional.resample_patch_embed`), so
one set of weights runs at any patch size. The architecture is
:class:`~vit_attention.models.vit.VisionTransformer` with ``no_embed_class=True`` (the class token
carries no position) and class-token pooling; this file names the family and its presets.

Change the patch size (and image size) of a model in place with
:meth:`~vit_attention.models.vit.VisionTransformer.set_input_size` (``model.set_input_size(
img_size=240, patch_size=30)``: an 8x8 grid, 4x fewer tokens), or build the preset at another patch
size and load the weights: the ``flexivit`` load adapter resizes the kernel and the table with
bilinear, un-antialiased resizes, the rule timm applies to every ``flexivit*`` checkpoint (big_vision
resizes with ``tf.image.resize(method="bilinear")``); ``set_input_size`` defaults to timm's
bicubic, anti-aliased resize (pass ``interpolation="bilinear", antialias=False`` for big_vision's).
Keys: timm's ViT layout (``cls_token``, ``pos_embed [1, 225, C]``, ``patch_embed.proj``, ``blocks.N``).
"""

from __future__ import annotations

from typing import Any

from .pretrained_tags import INCEPTION_MEAN, INCEPTION_STD, data_cfg, pretrained_tags
from .registry import published_meta, register_family
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["FlexiViT", "reduced_config"]


class FlexiViT(VisionTransformer):
    """ViT with a flexible patch size, ``[B, 3, H, W] -> [B, num_classes]``.

    Built at 240 px, patch 16: ``forward_features`` gives ``[B, 1 + 15·15, C]`` (the class token
    first, no position embedding on it). :meth:`set_input_size` moves it to another patch size.
    """

    family = "flexivit"


_SIZES: dict[str, dict[str, Any]] = {
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
}
_FLEXI = dict(img_size=240, patch_size=16, no_embed_class=True, global_pool="token")

_PRESETS: dict[str, dict[str, Any]] = {f"flexivit_{size}": dict(_SIZES[size], **_FLEXI) for size in _SIZES}

# timm 1.0.31 params on meta (1000 classes) and GMACs at 240 from timm's
# benchmark-infer-amp-nchw-pt291-cu128-4090.csv.
_PUBLISHED = {"small": (22.061, 5.35), "base": (86.589, 20.29), "large": (304.355, 70.99)}
_SOURCE = "timm 1.0.31 results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs @240)"


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a FlexiViT preset for tests: ViT's (:func:`~vit_attention.models.vit.reduced_config`:
    width 32, 2 heads, 2 blocks) on a 3x3 grid of 16 px patches (a position table with a centre row)."""
    p = cfg.patch_size if isinstance(cfg.patch_size, int) else cfg.patch_size[0]
    return dict(vit_reduced_config(cfg), img_size=p * 3)


register_family(
    "flexivit", FlexiViT, VisionTransformerConfig, _PRESETS, reduced=reduced_config,
    meta=published_meta({f"flexivit_{size}": _PUBLISHED[size] for size in _SIZES}, _SOURCE))

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_240 = data_cfg(240, 0.95, mean=INCEPTION_MEAN, std=INCEPTION_STD)
PRETRAINED = pretrained_tags({
    "flexivit_base.1200ep_in1k": _240,
    "flexivit_base.600ep_in1k": _240,
    "flexivit_base.300ep_in1k": _240,
    "flexivit_base.1000ep_in21k": dict(_240, num_classes=21843),
    "flexivit_base.300ep_in21k": dict(_240, num_classes=21843),
    "flexivit_base.patch16_in21k": dict(_240, num_classes=21843),
    "flexivit_base.patch30_in21k": dict(_240, num_classes=21843),
    "flexivit_large.1200ep_in1k": _240,
    "flexivit_large.600ep_in1k": _240,
    "flexivit_large.300ep_in1k": _240,
    "flexivit_small.1200ep_in1k": _240,
    "flexivit_small.600ep_in1k": _240,
    "flexivit_small.300ep_in1k": _240,
}, license="apache-2.0")
