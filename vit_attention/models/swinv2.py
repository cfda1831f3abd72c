"""Swin Transformer V2 (Liu et al. 2022): the Swin backbone with scaled cosine attention,
log-spaced continuous position bias and res-post-norm blocks.

The backbone is :class:`~vit_attention.models.swin.SwinTransformer` (see that module for why
both versions share it); this module sets the three v2 switches as config defaults, names the
family ``swinv2`` (its own checkpoint converters) and registers the presets. State-dict layout
is timm's ``swin_transformer_v2`` (``attn.q_bias``, ``attn.v_bias``, ``attn.logit_scale``,
``attn.cpb_mlp.*``; PatchMerging ``reduction`` then ``norm``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .pretrained_tags import data_cfg, pretrained_tags
from .registry import register_family, with_published_gmacs
from .swin import SwinTransformer, SwinTransformerConfig, reduced_config

__all__ = ["SwinTransformerV2Config", "SwinTransformerV2"]


@dataclass
class SwinTransformerV2Config(SwinTransformerConfig):
    """:class:`SwinTransformerConfig` with the SwinV2 defaults (cosine attention, res-post-norm, window 8 @ 256)."""

    img_size: int | tuple[int, int] = 256
    window_size: int | tuple[int, int] = 8
    attn_layer: str = "cosine_window"
    res_post_norm: bool = True
    merge_norm_after: bool = True


class SwinTransformerV2(SwinTransformer):
    """SwinV2 backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]`` (API of :class:`SwinTransformer`)."""

    family = "swinv2"
    config_cls = SwinTransformerV2Config


# ---------------------------------------------------------------------------- presets (data)
_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    "small": dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    "base": dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    "large": dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
    # SwinV2-G (Liu et al. 2022, Table 1): C=512, blocks {2, 2, 42, 4}, head dim 32. Build on the meta device.
    "giant": dict(embed_dim=512, depths=(2, 2, 42, 4), num_heads=(16, 32, 64, 128)),
}

_PRESETS: dict[str, dict[str, Any]] = {}
for _size in ("tiny", "small", "base"):
    for _win in (8, 16):
        _PRESETS[f"swinv2_{_size}_window{_win}_256"] = dict(_SIZES[_size], window_size=_win, img_size=256)
for _size in ("base", "large"):
    _PRESETS[f"swinv2_{_size}_window12_192"] = dict(_SIZES[_size], window_size=12, img_size=192)
    # ImageNet-22k models (window 12 @ 192) fine-tuned at larger windows: CPB keeps the pre-training window.
    _PRESETS[f"swinv2_{_size}_window12to16_192to256"] = dict(_SIZES[_size], window_size=16, img_size=256,
                                                              pretrained_window_sizes=(12, 12, 12, 6))
    _PRESETS[f"swinv2_{_size}_window12to24_192to384"] = dict(_SIZES[_size], window_size=24, img_size=384,
                                                              pretrained_window_sizes=(12, 12, 12, 6))
_PRESETS["swinv2_giant_window12_192"] = dict(_SIZES["giant"], window_size=12, img_size=192)

# Published parameter counts (millions, 1000 classes; Liu et al. 2022 / timm model cards).
PUBLISHED_PARAMS_M: dict[str, float] = {
    "swinv2_tiny_window8_256": 28.3, "swinv2_tiny_window16_256": 28.3,
    "swinv2_small_window8_256": 49.7, "swinv2_small_window16_256": 49.7,
    "swinv2_base_window8_256": 87.9, "swinv2_base_window16_256": 87.9,
    "swinv2_base_window12to16_192to256": 87.9, "swinv2_base_window12to24_192to384": 87.9,
    "swinv2_large_window12to16_192to256": 196.7, "swinv2_large_window12to24_192to384": 196.7,
    "swinv2_giant_window12_192": 3000.0,  # "SwinV2-G, 3.0 billion parameters"
}

_ALIASES = {"swin_v2_t": "swinv2_tiny_window8_256", "swin_v2_s": "swinv2_small_window8_256",
            "swin_v2_b": "swinv2_base_window8_256", "swinv2_giant": "swinv2_giant_window12_192"}

# Published GMACs at the preset's input size (checked by tests/analysis/test_flops.py), with their source.
PUBLISHED_GMACS: dict[str, tuple[float, str]] = {
    "swinv2_tiny_window8_256": (5.9, "SwinV2 (Liu et al. 2022) model zoo, SwinV2-T 256, window 8"),
}

_META: dict[str, dict[str, Any]] = {k: {"published_params_m": v} for k, v in PUBLISHED_PARAMS_M.items()}
_META = with_published_gmacs(_META, PUBLISHED_GMACS)

register_family("swinv2", SwinTransformerV2, SwinTransformerV2Config, _PRESETS, aliases=_ALIASES, meta=_META,
                reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_192 = data_cfg(192, 0.9)
_256 = data_cfg(256, 0.9)
_384 = data_cfg(384, 1.0)
PRETRAINED = pretrained_tags({
    "swinv2_base_window12_192.ms_in22k": dict(_192, num_classes=21841),
    "swinv2_base_window12to16_192to256.ms_in22k_ft_in1k": _256,
    "swinv2_base_window12to24_192to384.ms_in22k_ft_in1k": _384,
    "swinv2_base_window16_256.ms_in1k": _256,
    "swinv2_base_window8_256.ms_in1k": _256,
    "swinv2_large_window12_192.ms_in22k": dict(_192, num_classes=21841),
    "swinv2_large_window12to16_192to256.ms_in22k_ft_in1k": _256,
    "swinv2_large_window12to24_192to384.ms_in22k_ft_in1k": _384,
    "swinv2_small_window16_256.ms_in1k": _256,
    "swinv2_small_window8_256.ms_in1k": _256,
    "swinv2_tiny_window16_256.ms_in1k": _256,
    "swinv2_tiny_window8_256.ms_in1k": _256,
}, license="mit")
