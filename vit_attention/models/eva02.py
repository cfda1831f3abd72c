"""EVA-02 (Fang et al. 2023, "EVA-02: A Visual Representation for Neon Genesis", arXiv 2303.11331): the
masked-image-modelling (MIM) pretrained ViTs at patch 14, 224 px.

Pre-LN blocks (LayerNorm eps 1e-6, no LayerScale) over ``[cls, patches]`` with a learned absolute
position embedding (class slot included) **and** 2-D RoPE in every block's attention, EVA's
convention (:class:`~vit_attention.attention.rope.RotaryEmbedding` ``convention="eva"``: frequencies
``10000^(-i/nb)``, grid indices rescaled to the 16x16 pretraining grid, ``ref_feat_shape=(16, 16)``,
(y, x) order, interleaved channel pairs; docs/rope.md); the class token is not rotated. q and v have
biases, the key none (``qkv_bias="qv"``). The MLP is a SwiGLU (SiLU gate first) of hidden width
``int(C·8/3)``: packed in one ``fc1`` for Ti / S (``mlp_layer="glu"``), split ``fc1_g`` / ``fc1_x`` with a
LayerNorm over the hidden width before ``fc2`` for B / L (``mlp_layer="swiglu"``, ``mlp_norm``: EVA's
"sub-LN"). Pooling: the mean of the patch tokens, then ``fc_norm`` (no final norm: timm moves the MIM
checkpoints' final norm there). No classifier (``num_classes=0``; the MIM weights are features).

Also: the ImageNet fine-tuned classifiers ``eva02_{tiny,small}_patch14_336`` / ``eva02_{base,large}_patch14_448``
(the same blocks, 1000 classes) and the EVA-CLIP image towers ``eva02_*_clip_*`` (class-token pooling through
the final norm, the CLIP projection as ``head``, and a LayerNorm after attention before ``proj``:
``attn_norm=True``, key ``attn.norm``, timm's ``scale_attn_inner``; docs/eva02.md).

The backbone is :class:`~vit_attention.models.vit.VisionTransformer`; this file names the family and
its presets. Keys: timm's VisionTransformer layout; timm's Eva files (B / L: ``q_proj`` / ``k_proj`` /
``v_proj``) and the original baaivision/EVA files (``mlp.w12`` / ``w1`` / ``w2`` / ``w3``, ``ffn_ln``,
MIM ``norm`` / ``mask_token`` / ``lm_head``) are converted in :mod:`vit_attention.weights.eva`.
"""

from __future__ import annotations

from typing import Any

from .pretrained_tags import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, data_cfg, pretrained_tags
from .registry import published_meta, register_family
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["Eva02", "reduced_config"]


class Eva02(VisionTransformer):
    """EVA-02, ``[B, 3, H, W] -> [B, num_classes]`` (``[B, C]`` features by default: ``num_classes=0``).

    ``forward_features`` gives tokens ``[B, 1 + H/14·W/14, C]`` (class token first; not normalised: the
    norm follows the pooling, ``fc_norm``); ``forward_head(pre_logits=True)`` ``fc_norm(mean of patches)``.
    """

    family = "eva02"


_SWIGLU = 4 * 2 / 3  # timm's mlp_ratio: hidden int(C * 8/3) (512 / 1024 / 2048 / 2730)
_SIZES: dict[str, dict[str, Any]] = {
    # packed SwiGLU: fc1 holds both halves, int(C * 16/3) = 2 * int(C * 8/3) outputs
    "tiny": dict(embed_dim=192, depth=12, num_heads=3, mlp_layer="glu", mlp_ratio=_SWIGLU * 2),
    "small": dict(embed_dim=384, depth=12, num_heads=6, mlp_layer="glu", mlp_ratio=_SWIGLU * 2),
    "base": dict(embed_dim=768, depth=12, num_heads=12, mlp_layer="swiglu", mlp_norm=True, mlp_ratio=_SWIGLU),
    "large": dict(embed_dim=1024, depth=24, num_heads=16, mlp_layer="swiglu", mlp_norm=True, mlp_ratio=_SWIGLU),
}
_EVA02 = dict(patch_size=14, img_size=224, num_classes=0, global_pool="avg", qkv_bias="qv", act="silu",
              rope="axial", rope_kwargs={"convention": "eva", "ref_feat_shape": [16, 16]})  # a list: JSON round trip

_PRESETS: dict[str, dict[str, Any]] = {f"eva02_{s}_patch14_224": dict(_SIZES[s], **_EVA02) for s in _SIZES}
# fine-tuned ImageNet classifiers (timm's defs: the 224 models at 336 / 448, mean-pooled patches + fc_norm, 1000
# classes; the RoPE reference grid stays 16x16, so the coordinates are rescaled to it)
for _s, _img in (("tiny", 336), ("small", 336), ("base", 448), ("large", 448)):
    _PRESETS[f"eva02_{_s}_patch14_{_img}"] = dict(_SIZES[_s], **dict(_EVA02, img_size=_img, num_classes=1000))
# EVA-CLIP image towers (timm scale_attn_inner=True: a LayerNorm after attention, before proj, key attn.norm);
# class-token pooling through the final norm, the head is the CLIP projection (512 / 768 wide)
_CLIP = dict(_EVA02, global_pool="token", attn_norm=True)
_PRESETS.update({
    "eva02_base_patch16_clip_224": dict(_SIZES["base"], **dict(_CLIP, patch_size=16, num_classes=512)),
    "eva02_large_patch14_clip_224": dict(_SIZES["large"], **dict(_CLIP, num_classes=768)),
    "eva02_large_patch14_clip_336": dict(_SIZES["large"], **dict(_CLIP, img_size=336, num_classes=768)),
})

# timm 1.0.31 parameters on the meta device (num_classes=0) and GMACs at 224 from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs; attention matmuls included).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "eva02_tiny_patch14_224": (5.502, 1.7),
    "eva02_small_patch14_224": (21.621, 6.14),
    "eva02_base_patch14_224": (85.759, 23.22),
    "eva02_large_patch14_224": (303.269, 81.15),
}
_SOURCE = "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs at 224"
# parameters only (heads included), counted by timm 1.0.31 on the meta device
_PARAMS_ONLY: dict[str, float] = {
    "eva02_tiny_patch14_336": 5.757, "eva02_small_patch14_336": 22.129, "eva02_base_patch14_448": 87.118,
    "eva02_large_patch14_448": 305.080, "eva02_base_patch16_clip_224": 86.263,
    "eva02_large_patch14_clip_224": 304.105, "eva02_large_patch14_clip_336": 304.433,
}
_META = published_meta({**_PUBLISHED, **{name: (params, None) for name, params in _PARAMS_ONLY.items()}}, _SOURCE,
                       meta_device=_PARAMS_ONLY)


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink an EVA-02 preset for tests: ViT's (:func:`~vit_attention.models.vit.reduced_config`:
    width 32, 2 heads of 16 channels, 2 blocks, a 3x3 grid of 14 px patches); the RoPE reference grid
    (16x16, so the coordinates are rescaled), q / v biases, the SwiGLU and its sub-LN are kept."""
    return vit_reduced_config(cfg)


register_family("eva02", Eva02, VisionTransformerConfig, _PRESETS, reduced=reduced_config, meta=_META)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.9, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
_336 = data_cfg(336, 1.0, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
_448 = data_cfg(448, 1.0, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
_448_SQUASH_BICUBIC = data_cfg(448, 1.0, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, crop_mode="squash")
PRETRAINED = pretrained_tags({
    "eva02_base_patch14_224.mim_in22k": dict(_224, num_classes=0),
    "eva02_base_patch14_448.mim_in22k_ft_in22k_in1k": _448_SQUASH_BICUBIC,
    "eva02_base_patch14_448.mim_in22k_ft_in1k": _448,
    "eva02_base_patch14_448.mim_in22k_ft_in22k": dict(_448_SQUASH_BICUBIC, num_classes=21841),
    "eva02_base_patch16_clip_224.merged2b": dict(_224, num_classes=512),
    "eva02_large_patch14_224.mim_in22k": dict(_224, num_classes=0),
    "eva02_large_patch14_224.mim_m38m": dict(_224, num_classes=0),
    "eva02_large_patch14_448.mim_in22k_ft_in22k_in1k": _448_SQUASH_BICUBIC,
    "eva02_large_patch14_448.mim_m38m_ft_in22k_in1k": _448_SQUASH_BICUBIC,
    "eva02_large_patch14_448.mim_in22k_ft_in1k": _448,
    "eva02_large_patch14_448.mim_m38m_ft_in1k": _448,
    "eva02_large_patch14_448.mim_in22k_ft_in22k": dict(_448_SQUASH_BICUBIC, num_classes=21841),
    "eva02_large_patch14_448.mim_m38m_ft_in22k": dict(_448_SQUASH_BICUBIC, num_classes=21841),
    "eva02_large_patch14_clip_224.merged2b": dict(_224, num_classes=768),
    "eva02_large_patch14_clip_336.merged2b": dict(_336, num_classes=768),
    "eva02_small_patch14_224.mim_in22k": dict(_224, num_classes=0),
    "eva02_small_patch14_336.mim_in22k_ft_in1k": _336,
    "eva02_tiny_patch14_224.mim_in22k": dict(_224, num_classes=0),
    "eva02_tiny_patch14_336.mim_in22k_ft_in1k": _336,
}, license="mit")

