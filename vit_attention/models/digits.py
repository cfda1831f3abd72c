"""Small ViT / DeiT / Swin presets sized for the embedded digits data set (8x8 grayscale, 10 classes).

Registered as data, like every preset, and with the other families, so ``create_model`` knows
them whatever was imported first. ``vit_digits_patch2_8`` is the default model of
``vit-attention train``: a 4-block ViT over a 4x4 grid of 2x2 patches with a one-stage
convolutional stem (Xiao et al. 2021: early convolutions make small-data ViTs train well).
Like every preset they keep the registry's defaults (3 input channels, 1000 classes), so
registry-wide checks treat them like the others; ``train`` sizes the stem and the classifier to
the data (1 channel and 10 classes for the digits), and the saved file records that config, so
:func:`vit_attention.load_model` rebuilds the trained model. The ``*_gap`` variants pool the grid
tokens instead of a class token, so any mechanism, token or spatial (``attn_layer="window"``),
can replace global attention; ``compare`` uses them. ``swin_digits_patch2_window2_8`` is a
two-stage Swin for the same input.
"""

from __future__ import annotations

from typing import Any

from .registry import register_family
from .swin import SwinTransformer, SwinTransformerConfig, reduced_config
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["DIGITS_PRESETS", "SWIN_DIGITS_PRESETS", "DEFAULT_MODEL"]

_DIGITS_BASE: dict[str, Any] = dict(img_size=8, patch_size=2, embed_dim=64, depth=4,
                                    num_heads=4, mlp_ratio=2.0, conv_stem=(32,), drop_path_rate=0.1)

DIGITS_PRESETS: dict[str, dict[str, Any]] = {
    "vit_digits_patch2_8": dict(_DIGITS_BASE),
    "vit_digits_patch2_8_gap": dict(_DIGITS_BASE, class_token=False, global_pool="avg"),
    "deit_digits_distilled_patch2_8": dict(_DIGITS_BASE, distilled=True),
}

# A two-stage Swin for the digits: 4x4 grid of 2x2 patches, 2x2 windows (shifted in every other block),
# patch merging to 2x2, then one window covering the map.
SWIN_DIGITS_PRESETS: dict[str, dict[str, Any]] = {
    "swin_digits_patch2_window2_8": dict(img_size=8, patch_size=2, embed_dim=48,
                                         depths=(2, 2), num_heads=(2, 4), window_size=2, mlp_ratio=2.0,
                                         drop_path_rate=0.1),
}

DEFAULT_MODEL = "vit_digits_patch2_8"

register_family("vit", VisionTransformer, VisionTransformerConfig, DIGITS_PRESETS, reduced=vit_reduced_config)
register_family("swin", SwinTransformer, SwinTransformerConfig, SWIN_DIGITS_PRESETS, reduced=reduced_config)
