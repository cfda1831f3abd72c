"""CLIP image towers (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language
Supervision"), and the OpenCLIP / MetaCLIP / DFN towers of the same architecture, as timm names them.

A ViT with a LayerNorm after the embeddings (``pre_norm=True``: ``norm_pre``, OpenAI's ``ln_pre``), a patch
convolution without bias, LayerNorm eps 1e-5, the class token pooled after the final norm, then the head:
the CLIP projection (``head.weight`` = OpenAI ``proj``ᵀ, zero bias; 512 / 768-d) for the raw CLIP tags, or
an ImageNet classifier for the fine-tuned tags (timm's default tags of the plain names,
``laion2b_ft_in12k_in1k``).

``act``: exact GELU for the plain names, QuickGELU (``x·σ(1.702x)``) for ``*_clip_quickgelu_*``. Trap: the
OpenAI, MetaCLIP and some DFN / LAION-400M weights were *trained* with QuickGELU; timm lists those tags under
the plain names too (its notes say "use quickgelu model variant for original results"): load them into the
``_quickgelu_`` preset (same weights) to get the original embeddings.

The backbone is :class:`~vit_attention.models.vit.VisionTransformer`; Hugging Face and OpenAI layouts are
converted in :mod:`vit_attention.weights.clip`.
"""

from __future__ import annotations

from typing import Any

from .pretrained_tags import INCEPTION_MEAN, INCEPTION_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, data_cfg, pretrained_tags
from .registry import published_meta, register_family
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["CLIP", "reduced_config"]


class CLIP(VisionTransformer):
    """CLIP image tower, ``[B, 3, H, W] -> [B, num_classes]`` (the projected embedding for CLIP heads).

    ``forward_features`` gives tokens after the final norm ``[B, 1 + H/p·W/p, C]`` (Hugging Face's
    ``last_hidden_state`` is *before* it); ``forward_head(pre_logits=True)`` the normalised class token
    ``[B, C]`` (HF ``pooler_output``); ``forward`` the head's output (HF ``image_embeds`` for a projection).
    """

    family = "clip"


_SIZES: dict[str, dict[str, Any]] = {
    "base_patch16": dict(embed_dim=768, depth=12, num_heads=12, patch_size=16),
    "base_patch32": dict(embed_dim=768, depth=12, num_heads=12, patch_size=32),
    "large_patch14": dict(embed_dim=1024, depth=24, num_heads=16, patch_size=14),
}
_CLIP = dict(img_size=224, pre_norm=True, norm_eps=1e-5)
# classes of timm's default tag: laion2b_ft_in12k_in1k (1000) for the plain names; for the quickgelu
# names metaclip_2pt5b (512), laion400m_e32 (512) and dfn2b (768): CLIP projections
_QUICKGELU_DIM = {"base_patch16": 512, "base_patch32": 512, "large_patch14": 768}

_PRESETS: dict[str, dict[str, Any]] = {}
for _size in _SIZES:
    _PRESETS[f"vit_{_size}_clip_224"] = dict(_SIZES[_size], **_CLIP, act="gelu", num_classes=1000)
    _PRESETS[f"vit_{_size}_clip_quickgelu_224"] = dict(_SIZES[_size], **_CLIP, act="quick_gelu",
                                                       num_classes=_QUICKGELU_DIM[_size])
# ViT-H/14 (timm's default tag laion2b_ft_in12k_in1k: 1000 classes); its quickgelu / 336 / 378 names are not here
_PRESETS["vit_huge_patch14_clip_224"] = dict(embed_dim=1280, depth=32, num_heads=16, patch_size=14, **_CLIP,
                                             act="gelu", num_classes=1000)

# timm 1.0.31 parameters on the meta device with the default tag's head (measured);
# GMACs from timm's results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv where it lists them.
_PARAMS = {"vit_base_patch16_clip_224": 86.568, "vit_base_patch32_clip_224": 88.225,
           "vit_large_patch14_clip_224": 304.205, "vit_base_patch16_clip_quickgelu_224": 86.193,
           "vit_base_patch32_clip_quickgelu_224": 87.850, "vit_large_patch14_clip_quickgelu_224": 303.967,
           "vit_huge_patch14_clip_224": 632.047}  # timm 1.0.31 on the meta device
_GMACS = {"vit_base_patch16_clip_224": 17.58, "vit_base_patch16_clip_quickgelu_224": 17.58,
          "vit_large_patch14_clip_224": 81.08}
_SOURCE = "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs at 224"


_META_DEVICE = ("vit_huge_patch14_clip_224",)  # counted by timm on the meta device (heads included)


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a CLIP preset for tests: ViT's (:func:`~vit_attention.models.vit.reduced_config`:
    width 32, 2 heads, 2 blocks, a small grid); ``norm_pre``, the bias-free patch conv, eps 1e-5 and the
    activation are kept."""
    return vit_reduced_config(cfg)


register_family("clip", CLIP, VisionTransformerConfig, _PRESETS, reduced=reduced_config,
                meta=published_meta({n: (_PARAMS[n], _GMACS.get(n)) for n in _PRESETS}, _SOURCE, _META_DEVICE))

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224_CLIP_C100 = data_cfg(224, 1.0, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
_224_INCEPTION = data_cfg(224, 1.0, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_224_CLIP_C95 = data_cfg(224, 0.95, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
_224_CLIP_C90 = data_cfg(224, 0.9, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
PRETRAINED = pretrained_tags({
    "vit_base_patch16_clip_224.laion2b_ft_in12k_in1k": _224_CLIP_C95,
    "vit_base_patch16_clip_224.openai_ft_in12k_in1k": _224_CLIP_C95,
    "vit_base_patch16_clip_224.laion2b_ft_in1k": _224_CLIP_C100,
    "vit_base_patch16_clip_224.openai_ft_in1k": _224_CLIP_C90,
    "vit_base_patch16_clip_224.laion2b_ft_in12k": dict(_224_CLIP_C90, num_classes=11821),
    "vit_base_patch16_clip_224.openai_ft_in12k": dict(_224_CLIP_C90, num_classes=11821),
    "vit_base_patch16_clip_224.laion2b": dict(_224_CLIP_C100, num_classes=512),
    "vit_base_patch16_clip_224.laion400m_e32": dict(_224_CLIP_C100, num_classes=512, license="mit"),
    "vit_base_patch16_clip_224.datacompxl": dict(_224_CLIP_C100, num_classes=512),
    "vit_base_patch16_clip_224.dfn2b": dict(_224_CLIP_C100, num_classes=512, license="apple-ascl"),
    "vit_base_patch16_clip_224.metaclip_2pt5b": dict(_224_CLIP_C100, num_classes=512, license="cc-by-nc-4.0"),
    "vit_base_patch16_clip_224.metaclip_400m": dict(_224_CLIP_C100, num_classes=512, license="cc-by-nc-4.0"),
    "vit_base_patch16_clip_224.openai": dict(_224_CLIP_C90, num_classes=512),
    "vit_base_patch16_clip_quickgelu_224.metaclip_2pt5b": dict(_224_CLIP_C100,
                                                               hf_hub_id="timm/vit_base_patch16_clip_224.metaclip_2pt5b",
                                                               num_classes=512, license="cc-by-nc-4.0"),
    "vit_base_patch16_clip_quickgelu_224.metaclip_400m": dict(_224_CLIP_C100,
                                                              hf_hub_id="timm/vit_base_patch16_clip_224.metaclip_400m",
                                                              num_classes=512, license="cc-by-nc-4.0"),
    "vit_base_patch16_clip_quickgelu_224.openai": dict(_224_CLIP_C90, hf_hub_id="timm/vit_base_patch16_clip_224.openai",
                                                       num_classes=512),
    "vit_base_patch32_clip_224.laion2b_ft_in12k_in1k": _224_CLIP_C90,
    "vit_base_patch32_clip_224.laion2b_ft_in1k": _224_CLIP_C90,
    "vit_base_patch32_clip_224.openai_ft_in1k": _224_CLIP_C90,
    "vit_base_patch32_clip_224.laion2b": dict(_224_CLIP_C90, num_classes=512),
    "vit_base_patch32_clip_224.laion400m_e32": dict(_224_CLIP_C90, num_classes=512, license="mit"),
    "vit_base_patch32_clip_224.datacompxl": dict(_224_CLIP_C100, num_classes=512),
    "vit_base_patch32_clip_224.metaclip_2pt5b": dict(_224_CLIP_C100, num_classes=512, license="cc-by-nc-4.0"),
    "vit_base_patch32_clip_224.metaclip_400m": dict(_224_CLIP_C100, num_classes=512, license="cc-by-nc-4.0"),
    "vit_base_patch32_clip_224.openai": dict(_224_CLIP_C90, num_classes=512),
    "vit_base_patch32_clip_quickgelu_224.laion400m_e32": dict(_224_CLIP_C90,
                                                              hf_hub_id="timm/vit_base_patch32_clip_224.laion400m_e32",
                                                              num_classes=512, license="mit"),
    "vit_base_patch32_clip_quickgelu_224.metaclip_2pt5b": dict(_224_CLIP_C100,
                                                               hf_hub_id="timm/vit_base_patch32_clip_224.metaclip_2pt5b",
                                                               num_classes=512, license="cc-by-nc-4.0"),
    "vit_base_patch32_clip_quickgelu_224.metaclip_400m": dict(_224_CLIP_C100,
                                                              hf_hub_id="timm/vit_base_patch32_clip_224.metaclip_400m",
                                                              num_classes=512, license="cc-by-nc-4.0"),
    "vit_base_patch32_clip_quickgelu_224.openai": dict(_224_CLIP_C90, hf_hub_id="timm/vit_base_patch32_clip_224.openai",
                                                       num_classes=512),
    "vit_huge_patch14_clip_224.laion2b_ft_in12k_in1k": _224_CLIP_C100,
    "vit_huge_patch14_clip_224.laion2b_ft_in1k": _224_CLIP_C100,
    "vit_huge_patch14_clip_224.laion2b_ft_in12k": dict(_224_CLIP_C100, num_classes=11821),
    "vit_huge_patch14_clip_224.laion2b": dict(_224_CLIP_C100, num_classes=1024),
    "vit_huge_patch14_clip_224.dfn5b": dict(_224_CLIP_C100, num_classes=1024, license="apple-ascl"),
    "vit_huge_patch14_clip_224.metaclip2_worldwide": dict(_224_CLIP_C100, num_classes=1024, license="cc-by-nc-4.0"),
    "vit_huge_patch14_clip_224.metaclip_2pt5b": dict(_224_CLIP_C100, num_classes=1024, license="cc-by-nc-4.0"),
    "vit_huge_patch14_clip_224.metaclip_altogether": dict(_224_CLIP_C100, num_classes=1024, license="cc-by-nc-4.0"),
    "vit_large_patch14_clip_224.laion2b_ft_in12k_in1k": _224_INCEPTION,
    "vit_large_patch14_clip_224.openai_ft_in12k_in1k": _224_CLIP_C100,
    "vit_large_patch14_clip_224.laion2b_ft_in1k": _224_INCEPTION,
    "vit_large_patch14_clip_224.openai_ft_in1k": _224_CLIP_C100,
    "vit_large_patch14_clip_224.laion2b_ft_in12k": dict(_224_INCEPTION, num_classes=11821),
    "vit_large_patch14_clip_224.openai_ft_in12k": dict(_224_CLIP_C100, num_classes=11821),
    "vit_large_patch14_clip_224.laion2b": dict(_224_INCEPTION, num_classes=768),
    "vit_large_patch14_clip_224.laion400m_e32": dict(_224_CLIP_C100, num_classes=768, license="mit"),
    "vit_large_patch14_clip_224.datacompxl": dict(_224_CLIP_C100, num_classes=768),
    "vit_large_patch14_clip_224.dfn2b_s39b": dict(_224_CLIP_C100, num_classes=768, license="apple-ascl"),
    "vit_large_patch14_clip_224.dfn2b": dict(_224_CLIP_C100, num_classes=768, license="apple-ascl"),
    "vit_large_patch14_clip_224.metaclip_2pt5b": dict(_224_CLIP_C100, num_classes=768, license="cc-by-nc-4.0"),
    "vit_large_patch14_clip_224.metaclip_400m": dict(_224_CLIP_C100, num_classes=768, license="cc-by-nc-4.0"),
    "vit_large_patch14_clip_224.openai": dict(_224_CLIP_C100, num_classes=768),
    "vit_large_patch14_clip_224.apple_mclip2_dfndr2b": dict(_224_CLIP_C100, num_classes=768, license="apple-amlr"),
    "vit_large_patch14_clip_quickgelu_224.dfn2b": dict(_224_CLIP_C100,
                                                       hf_hub_id="timm/vit_large_patch14_clip_224.dfn2b",
                                                       num_classes=768, license="apple-ascl"),
    "vit_large_patch14_clip_quickgelu_224.metaclip_2pt5b": dict(_224_CLIP_C100,
                                                                hf_hub_id="timm/vit_large_patch14_clip_224.metaclip_2pt5b",
                                                                num_classes=768, license="cc-by-nc-4.0"),
    "vit_large_patch14_clip_quickgelu_224.metaclip_400m": dict(_224_CLIP_C100,
                                                               hf_hub_id="timm/vit_large_patch14_clip_224.metaclip_400m",
                                                               num_classes=768, license="cc-by-nc-4.0"),
    "vit_large_patch14_clip_quickgelu_224.openai": dict(_224_CLIP_C100,
                                                        hf_hub_id="timm/vit_large_patch14_clip_224.openai",
                                                        num_classes=768),
}, license="apache-2.0")

