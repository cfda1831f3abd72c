"""RoPE-ViT (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", ECCV, arXiv 2403.13298):
DeiT-III ViTs with 2-D rotary positions, naver-ai/rope-vit's ImageNet-1k models at patch 16, 224 px.

DeiT-III blocks (pre-LN, LayerNorm eps 1e-6, LayerScale ``init_values=1e-5``, fused ``qkv`` with bias,
exact GELU), class token pooled after the final norm. Every block's attention turns q and k of the
patch tokens (the class token is not rotated; docs/rope.md):

* ``vit_*_patch16_rope_224``: **RoPE-Axial**, :class:`~vit_attention.attention.rope.RotaryEmbedding`
  ``convention="naver"``: frequencies ``100^(-4i/hd)`` on the raw integer column and row indices, the
  x bands first, interleaved channel pairs;
* ``vit_*_patch16_rope_mixed_224``: **RoPE-Mixed**, learned frequencies per block and head
  (``blocks.N.attn.rope.freqs [2, nh, hd/2]``, ``angle = fx·x + fy·y``; theta 10 at init, no weight decay);
* ``_ape`` adds a learned absolute position embedding over the patches only (``no_embed_class``).

No absolute position embedding otherwise (``pos_embed="none"``). The integer coordinates are
recomputed for any grid (extrapolation, as the original does; timm keeps one grid and changes it
with ``set_input_size``).

The backbone is :class:`~vit_attention.models.vit.VisionTransformer`; this file names the family and
its presets. Keys: timm's VisionTransformer layout; timm's Eva files (``gamma_1`` / ``gamma_2``, the
model-level ``rope.freqs [2, depth, nh, hd/2]``) and the original naver-ai/rope-vit files are converted
in :mod:`vit_attention.weights.eva`.
"""

from __future__ import annotations

from typing import Any

from .pretrained_tags import data_cfg, pretrained_tags
from .registry import register_family
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["RopeViT", "reduced_config"]


class RopeViT(VisionTransformer):
    """RoPE-ViT, ``[B, 3, H, W] -> [B, num_classes]``; ``forward_features`` gives normalised tokens
    ``[B, 1 + H/16·W/16, C]`` (class token first), ``forward_head`` classifies the class token."""

    family = "rope_vit"


_SIZES: dict[str, dict[str, Any]] = {
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
}
_ROPE_VIT = dict(patch_size=16, img_size=224, init_values=1e-5, pos_embed="none")
_VARIANTS: dict[str, dict[str, Any]] = {
    "rope": dict(rope="axial", rope_kwargs={"convention": "naver"}),
    "rope_mixed": dict(rope="mixed"),
    "rope_ape": dict(rope="axial", rope_kwargs={"convention": "naver"}, pos_embed="learn", no_embed_class=True),
    "rope_mixed_ape": dict(rope="mixed", pos_embed="learn", no_embed_class=True),
}

_PRESETS: dict[str, dict[str, Any]] = {
    f"vit_{size}_patch16_{variant}_224": dict(_SIZES[size], **dict(_ROPE_VIT, **_VARIANTS[variant]))
    for size in _SIZES for variant in _VARIANTS}

# timm 1.0.31 parameters on the meta device (1000 classes) and GMACs at 224 from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs). timm's table lists the axial
# models and base's variants; the other variants are computed from their axial model: mixed adds the
# learned frequencies (C per block), _ape the patch position table (196·C); neither adds matmul MACs.
_AXIAL: dict[str, tuple[float, float]] = {"small": (21.984, 4.61), "base": (86.435, 17.58), "large": (304.174, 61.6)}
_LISTED = {"vit_base_patch16_rope_mixed_224": 86.444, "vit_base_patch16_rope_ape_224": 86.585,
           "vit_base_patch16_rope_mixed_ape_224": 86.595}
_SOURCE = "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs at 224"
_META: dict[str, dict[str, Any]] = {}
for _size, (_params, _gmacs) in _AXIAL.items():
    _c, _d = _SIZES[_size]["embed_dim"], _SIZES[_size]["depth"]
    for _variant in _VARIANTS:
        _name = f"vit_{_size}_patch16_{_variant}_224"
        _extra = (_c * _d if "mixed" in _variant else 0) + (196 * _c if "ape" in _variant else 0)
        _META[_name] = {"published_params_m": _LISTED.get(_name, round(_params + _extra / 1e6, 3)),
                        "published_gmacs": _gmacs, "published_gmacs_source": _SOURCE}


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a RoPE-ViT preset for tests: ViT's (:func:`~vit_attention.models.vit.reduced_config`:
    width 32, 2 heads of 16 channels, 2 blocks, a 2x2 grid of 16 px patches); the RoPE kind, LayerScale
    and the patch-only position table of ``_ape`` are kept."""
    return vit_reduced_config(cfg)


register_family("rope_vit", RopeViT, VisionTransformerConfig, _PRESETS, reduced=reduced_config, meta=_META)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.9)
PRETRAINED = pretrained_tags({
    "vit_base_patch16_rope_224.naver_in1k": _224,
    "vit_base_patch16_rope_ape_224.naver_in1k": _224,
    "vit_base_patch16_rope_mixed_224.naver_in1k": _224,
    "vit_base_patch16_rope_mixed_ape_224.naver_in1k": _224,
    "vit_large_patch16_rope_224.naver_in1k": _224,
    "vit_large_patch16_rope_ape_224.naver_in1k": _224,
    "vit_large_patch16_rope_mixed_224.naver_in1k": _224,
    "vit_large_patch16_rope_mixed_ape_224.naver_in1k": _224,
    "vit_small_patch16_rope_224.naver_in1k": _224,
    "vit_small_patch16_rope_ape_224.naver_in1k": _224,
    "vit_small_patch16_rope_mixed_224.naver_in1k": _224,
    "vit_small_patch16_rope_mixed_ape_224.naver_in1k": _224,
}, license="apache-2.0")

