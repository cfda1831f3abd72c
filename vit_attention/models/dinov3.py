"""DINOv3 (Siméoni et al. 2025, "DINOv3", arXiv 2508.10104): self-supervised ViT backbones at patch 16.

Pre-LN blocks with LayerScale (``init_values=1e-5``), LayerNorm eps 1e-5, no absolute position
embedding: every block's attention turns q and k of the patch tokens with 2-D RoPE in the DINOv3
convention (:class:`~vit_attention.attention.rope.RotaryEmbedding` ``convention="dinov3"``: patch
centres normalised per axis to ``(-1, 1)``, periods ``100^(4j/hd)``, angle ``2π·c/period``, (y, x)
order, half-split channels; docs/rope.md). Tokens ``[cls, 4 registers, patches]``; the 5 prefix
tokens are never rotated. S / B / L use an exact-GELU MLP (x4); S+ and H+ a SwiGLU (SiLU gate,
``fc1_g`` / ``fc1_x`` / ``fc2``, hidden 4·C).

Defaults are timm's (``Eva(rope_type='dinov3')`` presets): no classifier (``num_classes=0``), input
256, any size that is a patch multiple (``dynamic_img_size``; the RoPE coordinates are recomputed
for every grid), final norm then the **mean of the patch tokens** (``global_pool="avg"``, no
fc_norm). The original and Hugging Face models use the class token after the final norm: pass
``global_pool="token"``. The ``_qkvb`` presets add learned q and v biases (``qkv_bias="qv"``, the key
bias fixed at zero: the original's masked third); timm notes the distilled B / L / H+ checkpoints have
all-zero q / v biases, so the bias-free presets are exact for those.

The backbone is :class:`~vit_attention.models.vit.VisionTransformer`; this file names the family and
its presets. Keys: timm's VisionTransformer layout (``reg_token``, ``blocks.N.ls1.gamma``, ``attn.q_bias``);
timm's Eva layout (``gamma_1``), Hugging Face ``DINOv3ViTModel`` files and the original
facebookresearch/dinov3 files are converted in :mod:`vit_attention.weights.eva`.
"""

from __future__ import annotations

from typing import Any

from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["DINOv3", "reduced_config"]


class DINOv3(VisionTransformer):
    """DINOv3 ViT, ``[B, 3, H, W] -> [B, num_classes]`` (``[B, C]`` features by default: ``num_classes=0``).

    ``forward_features`` gives normalised tokens ``[B, 5 + H/16·W/16, C]``: the class token, 4
    register tokens, then the patch tokens row-major. ``forward_head(pre_logits=True)`` pools
    ``[B, C]`` (the patch mean by default; the class token with ``global_pool="token"``).
    """

    family = "dinov3"


_SIZES: dict[str, dict[str, Any]] = {
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "small_plus": dict(embed_dim=384, depth=12, num_heads=6, mlp_layer="swiglu", act="silu"),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
    "huge_plus": dict(embed_dim=1280, depth=32, num_heads=20, mlp_layer="swiglu", act="silu"),
}
_DINOV3 = dict(patch_size=16, img_size=256, num_classes=0, global_pool="avg", fc_norm=False, pos_embed="none",
               reg_tokens=4, init_values=1e-5, norm_eps=1e-5, qkv_bias=False, rope="axial",
               rope_kwargs={"convention": "dinov3"}, dynamic_img_size=True)

_PRESETS: dict[str, dict[str, Any]] = {}
for _size in _SIZES:
    _PRESETS[f"vit_{_size}_patch16_dinov3"] = dict(_SIZES[_size], **_DINOV3)
    _PRESETS[f"vit_{_size}_patch16_dinov3_qkvb"] = dict(_SIZES[_size], **dict(_DINOV3, qkv_bias="qv"))

# timm 1.0.31 parameters on the meta device (num_classes=0) and GMACs at 256 from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs; attention matmuls included). The
# _qkvb presets timm's table does not list are the same network plus 2·C bias parameters per block (no MACs).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "vit_small_patch16_dinov3": (21.587, 6.26),
    "vit_small_patch16_dinov3_qkvb": (21.596, 6.26),
    "vit_small_plus_patch16_dinov3": (28.683, 8.11),
    "vit_base_patch16_dinov3": (85.641, 23.6),
    "vit_large_patch16_dinov3": (303.079, 82.43),
    "vit_huge_plus_patch16_dinov3": (840.509, 224.88),
}
for _size in ("small_plus", "base", "large", "huge_plus"):
    _params, _gmacs = _PUBLISHED[f"vit_{_size}_patch16_dinov3"]
    _c, _d = _SIZES[_size]["embed_dim"], _SIZES[_size]["depth"]
    _PUBLISHED[f"vit_{_size}_patch16_dinov3_qkvb"] = (round(_params + 2 * _c * _d / 1e6, 3), _gmacs)
_SOURCE = "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs at 256"


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a DINOv3 preset for tests: ViT's (:func:`~vit_attention.models.vit.reduced_config`:
    width 32, 2 heads of 16 channels, 2 blocks, a 2x2 grid of 16 px patches); the registers, RoPE,
    LayerScale, q / v biases and the SwiGLU are kept."""
    return vit_reduced_config(cfg)


register_family(
    "dinov3", DINOv3, VisionTransformerConfig, _PRESETS, reduced=reduced_config,
    meta=published_meta(_PUBLISHED, _SOURCE))

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_256_IMAGENET = data_cfg(256, 1.0)
_256_NORM = data_cfg(256, 1.0, mean=(0.43, 0.411, 0.296), std=(0.213, 0.156, 0.143))
PRETRAINED = pretrained_tags({
    "vit_base_patch16_dinov3.lvd1689m": dict(_256_IMAGENET, num_classes=0),
    "vit_base_patch16_dinov3_qkvb.lvd1689m": dict(_256_IMAGENET, num_classes=0),
    "vit_base_patch16_dinov3_qkvb.eupe_lvd1689m": dict(_256_IMAGENET, num_classes=0,
                                                       license="fair-noncommercial-research-license"),
    "vit_huge_plus_patch16_dinov3.lvd1689m": dict(_256_IMAGENET, num_classes=0),
    "vit_huge_plus_patch16_dinov3_qkvb.lvd1689m": dict(_256_IMAGENET, num_classes=0),
    "vit_large_patch16_dinov3.lvd1689m": dict(_256_IMAGENET, num_classes=0),
    "vit_large_patch16_dinov3.sat493m": dict(_256_NORM, num_classes=0),
    "vit_large_patch16_dinov3_qkvb.lvd1689m": dict(_256_IMAGENET, num_classes=0),
    "vit_large_patch16_dinov3_qkvb.sat493m": dict(_256_NORM, num_classes=0),
    "vit_small_patch16_dinov3.lvd1689m": dict(_256_IMAGENET, num_classes=0),
    "vit_small_patch16_dinov3_qkvb.lvd1689m": dict(_256_IMAGENET, num_classes=0),
    "vit_small_patch16_dinov3_qkvb.eupe_lvd1689m": dict(_256_IMAGENET, num_classes=0,
                                                        license="fair-noncommercial-research-license"),
    "vit_small_plus_patch16_dinov3.lvd1689m": dict(_256_IMAGENET, num_classes=0),
    "vit_small_plus_patch16_dinov3_qkvb.lvd1689m": dict(_256_IMAGENET, num_classes=0),
}, license="dinov3-license")

