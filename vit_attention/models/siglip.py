"""SigLIP image towers (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training"; SigLIP 2,
Tschannen et al. 2025, FixRes checkpoints of the same architecture).

A ViT without a class token: learned position table over the patches ``[1, N, C]``, pre-LN blocks (LN eps
1e-6), the final norm, then multi-head attention pooling (MAP: a learned latent query attends to every
token, ``attn_pool.*`` in timm's layout) giving the image embedding. ``vit_*_siglip_gap_*`` average the
normalised patch tokens instead (no fc_norm). No classifier by default (``num_classes=0``).

Activation: the presets here use **exact** GELU, as timm 1.0.31 builds these names
(``vit_base_patch16_siglip_*``, ``vit_large_patch16_siglip_{256,384}``, ``vit_so400m_patch14_siglip_*``), except
``vit_base_patch32_siglip_256``, which timm builds with the tanh GELU (``act="gelu_tanh"``); the reference
(big_vision) and Hugging Face
``SiglipVisionModel`` use the tanh approximation (``act="gelu_tanh"``), a difference of about 1e-4
on the tokens (docs/siglip.md). Pass ``act="gelu_tanh"`` to match Hugging Face exactly.

The backbone is :class:`~vit_attention.models.vit.VisionTransformer`; Hugging Face layouts are
converted in :mod:`vit_attention.weights.siglip`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .pretrained_tags import INCEPTION_MEAN, INCEPTION_STD, data_cfg, pretrained_tags
from .registry import published_meta, register_family
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["SigLIP", "reduced_config"]


class SigLIP(VisionTransformer):
    """SigLIP image tower, ``[B, 3, H, W] -> [B, C]`` (no classifier by default).

    ``forward_features`` gives normalised patch tokens ``[B, H/p·W/p, C]`` (no prefix tokens);
    ``forward_head(pre_logits=True)`` the MAP-pooled embedding ``[B, C]`` (the patch mean for ``_gap_``).
    """

    family = "siglip"

    def _embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Images ``[B, Cin, H, W]`` -> the blocks' input ``[B, N, C]`` and the grid ``(H // p, W // p)``.

        Like the stride-``p`` convolution of timm and Hugging Face, trailing rows / columns that fill no
        whole patch are ignored (``vit_so400m_patch14_siglip_384``: 384 px, a 27x27 grid of 14 px patches
        covering 378 px; the preset's ``img_size`` is 378), unless ``dynamic_img_pad`` pads them instead.
        """
        ph, pw = self.patch_embed.patch_size
        H, W = x.shape[-2:]
        if not self.cfg.dynamic_img_pad and (H % ph or W % pw):
            x = x[..., : H - H % ph, : W - W % pw]
        return super()._embed(x)


_BASE = dict(embed_dim=768, depth=12, num_heads=12, patch_size=16)
_LARGE = dict(embed_dim=1024, depth=24, num_heads=16, patch_size=16)
_SO400M = dict(embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, patch_size=14)  # MLP int(1152·3.7362)=4304
_SIGLIP = dict(class_token=False, global_pool="map", num_classes=0, act="gelu")
_GAP = dict(class_token=False, global_pool="avg", fc_norm=False, num_classes=0, act="gelu")

_PRESETS: dict[str, dict[str, Any]] = {
    **{f"vit_base_patch16_siglip_{img}": dict(_BASE, img_size=img, **_SIGLIP) for img in (224, 256, 384, 512)},
    "vit_base_patch16_siglip_gap_224": dict(_BASE, img_size=224, **_GAP),
    # timm builds this one (a SigLIP 2 checkpoint only) with the tanh GELU
    "vit_base_patch32_siglip_256": dict(_BASE, img_size=256, **dict(_SIGLIP, patch_size=32, act="gelu_tanh")),
    **{f"vit_large_patch16_siglip_{img}": dict(_LARGE, img_size=img, **_SIGLIP) for img in (256, 384)},
    "vit_so400m_patch14_siglip_224": dict(_SO400M, img_size=224, **_SIGLIP),
    # 384 px is no multiple of 14: the conv covers 27 x 14 = 378 px (the rest ignored, as in timm / HF)
    "vit_so400m_patch14_siglip_384": dict(_SO400M, img_size=378, **_SIGLIP),
}

# timm 1.0.31 parameters on the meta device (num_classes=0; measured); GMACs from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv where it lists them.
_PARAMS = {"vit_base_patch16_siglip_224": 92.884, "vit_base_patch16_siglip_256": 92.930,
           "vit_base_patch16_siglip_384": 93.176, "vit_base_patch16_siglip_512": 93.520,
           "vit_base_patch16_siglip_gap_224": 85.797, "vit_so400m_patch14_siglip_224": 427.681,
           "vit_so400m_patch14_siglip_384": 428.226,
           # timm 1.0.31 on the meta device
           "vit_base_patch32_siglip_256": 94.552, "vit_large_patch16_siglip_256": 315.956,
           "vit_large_patch16_siglip_384": 316.284}
_GMACS = {"vit_base_patch16_siglip_224": 17.73, "vit_base_patch16_siglip_gap_224": 17.49,
          "vit_so400m_patch14_siglip_224": 110.26, "vit_so400m_patch14_siglip_384": 335.4}
_SOURCE = "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs"


# counted by timm on the meta device (heads included)
_META_DEVICE = ("vit_base_patch32_siglip_256", "vit_large_patch16_siglip_256", "vit_large_patch16_siglip_384")


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a SigLIP preset for tests: ViT's (:func:`~vit_attention.models.vit.reduced_config`:
    width 32, 2 heads, 2 blocks, a small grid); the MAP head (its MLP at the preset's ``mlp_ratio``), the
    missing class token and the activation are kept."""
    return vit_reduced_config(cfg)


register_family("siglip", SigLIP, VisionTransformerConfig, _PRESETS, reduced=reduced_config,
                meta=published_meta({n: (_PARAMS[n], _GMACS.get(n)) for n in _PRESETS}, _SOURCE, _META_DEVICE))

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.9, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_256 = data_cfg(256, 0.9, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_384 = data_cfg(384, 0.9, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_512 = data_cfg(512, 0.9, mean=INCEPTION_MEAN, std=INCEPTION_STD)
PRETRAINED = pretrained_tags({
    "vit_base_patch16_siglip_224.v2_webli": dict(_224, num_classes=0),
    "vit_base_patch16_siglip_224.webli": dict(_224, num_classes=0),
    "vit_base_patch16_siglip_256.v2_webli": dict(_256, num_classes=0),
    "vit_base_patch16_siglip_256.webli": dict(_256, num_classes=0),
    "vit_base_patch16_siglip_256.webli_i18n": dict(_256, num_classes=0),
    "vit_base_patch16_siglip_384.v2_webli": dict(_384, num_classes=0),
    "vit_base_patch16_siglip_384.webli": dict(_384, num_classes=0),
    "vit_base_patch16_siglip_512.v2_webli": dict(_512, num_classes=0),
    "vit_base_patch16_siglip_512.webli": dict(_512, num_classes=0),
    "vit_base_patch16_siglip_gap_224.v2_webli": dict(_224, num_classes=0),
    "vit_base_patch16_siglip_gap_224.webli": dict(_224, num_classes=0),
    "vit_base_patch32_siglip_256.v2_webli": dict(_256, num_classes=0),
    "vit_large_patch16_siglip_256.v2_webli": dict(_256, num_classes=0),
    "vit_large_patch16_siglip_256.webli": dict(_256, num_classes=0),
    "vit_large_patch16_siglip_384.v2_webli": dict(_384, num_classes=0),
    "vit_large_patch16_siglip_384.webli": dict(_384, num_classes=0),
    "vit_so400m_patch14_siglip_224.v2_webli": dict(_224, num_classes=0),
    "vit_so400m_patch14_siglip_224.webli": dict(_224, num_classes=0),
    "vit_so400m_patch14_siglip_384.webli": dict(_384, num_classes=0),
}, license="apache-2.0")

