"""Published compute figures the analytic FLOPs are checked against (GMACs at the preset's input size).

The papers' "FLOPs" are multiply-adds, the unit timm's tables call GMACs. Figures are given with
one decimal, so a check allows 2 % or the rounding of the last digit, whichever is larger.
New families declare their figures in the model registry instead (``meta={"published_gmacs": 1.2,
"published_gmacs_source": "..."}`` per preset, next to ``published_params_m``); :func:`published_gmacs`
merges both. Convention of every figure: patch embedding, all blocks, final norm and classifier counted; softmax,
activations, biases and residual adds not (our :func:`vit_attention.analysis.flops` does the same
and adds normalisation layers as fvcore does, < 0.2 % of any total here).
"""

from __future__ import annotations

__all__ = ["PUBLISHED_GMACS", "PUBLISHED_SOURCES", "matches_published", "published_gmacs"]

PUBLISHED_GMACS: dict[str, float] = {
    "vit_small_patch16_224": 4.6,
    "vit_base_patch16_224": 17.6,
    "vit_large_patch16_224": 61.6,
    "deit_tiny_patch16_224": 1.3,
    "swin_tiny_patch4_window7_224": 4.5,
    "swin_small_patch4_window7_224": 8.7,
    "swin_base_patch4_window7_224": 15.4,
    "swinv2_tiny_window8_256": 5.9,
}

PUBLISHED_SOURCES: dict[str, str] = {
    "vit_small_patch16_224": "timm model table (ViT-S/16, = DeiT-S architecture)",
    "vit_base_patch16_224": "timm model table; ViT-B/16 = DeiT-B architecture",
    "vit_large_patch16_224": "timm model table (ViT-L/16 at 224)",
    "deit_tiny_patch16_224": "DeiT (Touvron et al. 2021) / timm model table, one decimal (ours 1.258)",
    "swin_tiny_patch4_window7_224": "Swin (Liu et al. 2021), Table 1, Swin-T",
    "swin_small_patch4_window7_224": "Swin (Liu et al. 2021), Table 1, Swin-S",
    "swin_base_patch4_window7_224": "Swin (Liu et al. 2021), Table 1, Swin-B",
    "swinv2_tiny_window8_256": "SwinV2 (Liu et al. 2022) model zoo, SwinV2-T 256, window 8",
}


def matches_published(gmacs: float, published: float) -> bool:
    """Within 2 % of ``published``, or within the rounding of a one-decimal figure (0.05)."""
    return abs(gmacs - published) <= max(0.02 * published, 0.05)


def published_gmacs() -> dict[str, tuple[float, str]]:
    """``{model name: (GMACs, source)}``: the table above plus every preset's ``published_gmacs`` meta."""
    from ..models.registry import get_model_entry, list_models

    out = {name: (g, PUBLISHED_SOURCES[name]) for name, g in PUBLISHED_GMACS.items()}
    for name in list_models():
        meta = get_model_entry(name).meta
        if "published_gmacs" in meta:
            out[name] = (float(meta["published_gmacs"]), str(meta.get("published_gmacs_source", "")))
    return out
