"""BEiT (Bao et al., "BEiT: BERT Pre-Training of Image Transformers", ICLR 2022, arXiv 2106.08254) and BEiT v2
(Peng et al. 2022, "BEiT v2: Masked Image Modeling with Vector-Quantized Visual Tokenizers", arXiv 2208.06366):
the ImageNet fine-tuned classifiers at patch 16.

Pre-LN blocks (LayerNorm eps 1e-6) with LayerScale (timm ``gamma_1`` / ``gamma_2``, here ``ls1`` / ``ls2``) over
``[cls, patches]``, no absolute position embedding: every block's attention carries its own relative-position
table with three class-token rows (:mod:`vit_attention.attention.beit_rel_pos`, ``attn_layer="beit_rel_pos"``),
q and v biases, none on k. Pooling: the mean of the patch tokens, then ``fc_norm`` (no final norm). v2 has the
same architecture; its pre-training, LayerScale init and normalisation (ImageNet mean / std instead of 0.5)
differ. timm 1.0.31's presets use per-block tables; a checkpoint with one shared table (the ``*_pt22k``
pre-training files, ``use_shared_rel_pos_bias``) has it copied into every block when loaded
(:mod:`vit_attention.weights.beit`, as unilm's ``run_class_finetuning.py`` does before fine-tuning).

The backbone is :class:`~vit_attention.models.vit.VisionTransformer`; this file names the family, its presets,
the grid the tables are built for and how they follow another input size (:meth:`Beit.set_input_size`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..attention.beit_rel_pos import BeitRelPosAttention
from ..layers.block import accepted_kwargs
from .pretrained_tags import INCEPTION_MEAN, INCEPTION_STD, data_cfg, pretrained_tags
from .registry import published_meta, register_family
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["Beit", "reduced_config"]


class Beit(VisionTransformer):
    """BEiT / BEiT v2, ``[B, 3, H, W] -> [B, num_classes]``.

    ``forward_features`` gives tokens ``[B, 1 + H/16·W/16, C]`` (class token first, not normalised: the norm
    follows the pooling, ``fc_norm``); ``forward_head(pre_logits=True)`` ``fc_norm(mean of patches)`` ``[B, C]``.
    Each block's relative-position table is built for the patch grid (``window_size`` of its attention).
    """

    family = "beit"
    no_weight_decay_keys = (*VisionTransformer.no_weight_decay_keys, "relative_position_bias_table")

    def _grid_attn_kwargs(self) -> dict[str, Any]:
        """The patch grid as the tables' ``window_size`` (for a mechanism that takes one)."""
        return accepted_kwargs(self.cfg.attn_layer, {"window_size": tuple(self.grid_size)})

    def _init_weights(self) -> None:
        """ViT's init, then timm's BEiT rules (they matter from scratch only): the class token trunc-normal 0.02,
        each block's ``attn.proj`` / ``mlp.fc2`` weights divided by ``sqrt(2·(l + 1))``, the head scaled by 0.001."""
        super()._init_weights()
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        with torch.no_grad():
            for i, blk in enumerate(self.blocks):
                for name in ("attn.proj", "mlp.fc2"):
                    lin = blk.get_submodule(name) if _has(blk, name) else None
                    if isinstance(lin, nn.Linear):
                        lin.weight.div_(math.sqrt(2.0 * (i + 1)))
            if isinstance(self.head, nn.Linear):
                self.head.weight.mul_(0.001)
                self.head.bias.mul_(0.001)

    def _merging_obstacle(self) -> str | None:
        """BEiT's tables index each token's place on the grid, which a merged token no longer has."""
        if any(isinstance(getattr(blk, "attn", None), BeitRelPosAttention) for blk in self.blocks):
            return ("BEiT's relative-position tables (attn_layer='beit_rel_pos') index each token's place on the "
                    "grid, which a merged token no longer has")
        return super()._merging_obstacle()

    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None, *, interpolation: str = "bicubic",
                       antialias: bool = True) -> None:
        """ViT's :meth:`~vit_attention.models.vit.VisionTransformer.set_input_size`, then every block's table is
        resampled to the new patch grid (:meth:`BeitRelPosAttention.set_window_size`: timm 1.0.31's
        ``resize_rel_pos_bias_table`` rule, geometric offsets read linearly, the class-token rows kept), as timm's
        ``Beit.set_input_size`` does; a model built at that size and given the resampled tables is the same."""
        super().set_input_size(img_size, patch_size, interpolation=interpolation, antialias=antialias)
        for blk in self.blocks:
            attn = getattr(blk, "attn", None)
            if isinstance(attn, BeitRelPosAttention):
                attn.set_window_size(tuple(self.grid_size))


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


_SIZES: dict[str, dict[str, Any]] = {
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
}
# timm 1.0.31 Beit: use_abs_pos_emb=False, use_rel_pos_bias=True (per block), qkv_bias (q / v), mlp_ratio 4, GELU,
# LayerNorm eps 1e-6, global_pool="avg" with fc_norm
_BEIT = dict(patch_size=16, pos_embed="none", global_pool="avg", attn_layer="beit_rel_pos", qkv_bias=True,
             norm_eps=1e-6)
_PRESETS: dict[str, dict[str, Any]] = {
    "beit_base_patch16_224": dict(_SIZES["base"], **_BEIT, init_values=0.1),
    "beit_base_patch16_384": dict(_SIZES["base"], **_BEIT, img_size=384, init_values=0.1),
    "beit_large_patch16_224": dict(_SIZES["large"], **_BEIT, init_values=1e-5),
    "beit_large_patch16_384": dict(_SIZES["large"], **_BEIT, img_size=384, init_values=1e-5),
    "beit_large_patch16_512": dict(_SIZES["large"], **_BEIT, img_size=512, init_values=1e-5),
    "beitv2_base_patch16_224": dict(_SIZES["base"], **_BEIT, init_values=1e-5),
    "beitv2_large_patch16_224": dict(_SIZES["large"], **_BEIT, init_values=1e-5),
}

# timm 1.0.31 parameters on the meta device (1000 classes) and GMACs at the preset's size from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs; attention matmuls included).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "beit_base_patch16_224": (86.531, 17.58),
    "beit_base_patch16_384": (86.744, 55.54),
    "beit_large_patch16_224": (304.431, 61.60),
    "beit_large_patch16_384": (304.999, 191.21),
    "beit_large_patch16_512": (305.675, 362.24),
    "beitv2_base_patch16_224": (86.531, 17.58),
    "beitv2_large_patch16_224": (304.431, 61.60),
}
_META = published_meta(_PUBLISHED, "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs",
                       meta_device=_PUBLISHED)


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a BEiT preset for tests: ViT's (:func:`~vit_attention.models.vit.reduced_config`:
    width 32, 2 heads, 2 blocks) on a 3x3 patch grid (48 px); the relative-position tables (built for that grid),
    q / v biases, LayerScale and mean pooling with ``fc_norm`` are kept."""
    return dict(vit_reduced_config(cfg), img_size=48)


register_family("beit", Beit, VisionTransformerConfig, _PRESETS, reduced=reduced_config, meta=_META)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224_IMAGENET_C95 = data_cfg(224, 0.95)
_224_IMAGENET_C90 = data_cfg(224, 0.9)
_224_INCEPTION = data_cfg(224, 0.9, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_384 = data_cfg(384, 1.0, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_512 = data_cfg(512, 1.0, mean=INCEPTION_MEAN, std=INCEPTION_STD)
PRETRAINED = pretrained_tags({
    "beit_base_patch16_224.in22k_ft_in22k_in1k": _224_INCEPTION,
    "beit_base_patch16_224.in22k_ft_in22k": dict(_224_INCEPTION, num_classes=21841),
    "beit_base_patch16_384.in22k_ft_in22k_in1k": _384,
    "beit_large_patch16_224.in22k_ft_in22k_in1k": _224_INCEPTION,
    "beit_large_patch16_224.in22k_ft_in22k": dict(_224_INCEPTION, num_classes=21841),
    "beit_large_patch16_384.in22k_ft_in22k_in1k": _384,
    "beit_large_patch16_512.in22k_ft_in22k_in1k": _512,
    "beitv2_base_patch16_224.in1k_ft_in22k_in1k": _224_IMAGENET_C90,
    "beitv2_base_patch16_224.in1k_ft_in1k": _224_IMAGENET_C90,
    "beitv2_base_patch16_224.in1k_ft_in22k": dict(_224_IMAGENET_C90, num_classes=21841),
    "beitv2_large_patch16_224.in1k_ft_in22k_in1k": _224_IMAGENET_C95,
    "beitv2_large_patch16_224.in1k_ft_in1k": _224_IMAGENET_C95,
    "beitv2_large_patch16_224.in1k_ft_in22k": dict(_224_IMAGENET_C90, num_classes=21841),
}, license="apache-2.0")

