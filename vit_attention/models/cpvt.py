"""CPVT (Chu et al. 2021, "Conditional Positional Encodings for Vision Transformers").

CPVT is DeiT with the learned position embedding replaced by a conditional one: a PEG
(:class:`~vit_attention.layers.pos_embed.PosConv`, ``x + DWConv3x3(x)`` on the patch grid, the
class token passed around it) after the first encoder block, the paper's best placement. The
encoding is computed from the tokens, so the model takes any input size (a multiple of the
patch) with nothing to resample. ``cpvt_gap_*`` drop the class token and average the normalised
patch tokens (CPVT-GAP).

The backbone is :class:`~vit_attention.models.vit.VisionTransformer` with ``pos_embed="none"``
and ``peg_after=(0,)`` (the PEG runs on block 0's output); this file only names the family and
its presets. Keys: timm's ViT layout plus ``pos_block.0.proj.{weight,bias}``.
There is no official CPVT code or checkpoint (the Meituan-AutoML/CPVT README points to Twins);
the PEG is checked against timm's Twins ``PosConv`` (tests/layers/test_peg.py).
"""

from __future__ import annotations

from typing import Any

from .registry import published_meta, register_family
from .vit import VisionTransformer, VisionTransformerConfig
from .vit import reduced_config as vit_reduced_config

__all__ = ["CPVT", "reduced_config"]


class CPVT(VisionTransformer):
    """DeiT with a PEG after block 0 instead of a position table, ``[B, 3, H, W] -> [B, num_classes]``.

    Any ``H, W`` that are patch multiples (``dynamic_img_size``). ``forward_features`` gives tokens
    ``[B, P + H/16·W/16, C]`` (``P = 1`` with the class token, 0 for the GAP variants).
    """

    family = "cpvt"
    late_stem_modules = ("pos_block",)  # the PEG (after block 0): positions, grouped with the stem as tables are


_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
}
_CPVT = dict(patch_size=16, img_size=224, pos_embed="none", peg_after=(0,), dynamic_img_size=True)
_GAP = dict(class_token=False, global_pool="avg", fc_norm=False)  # norm, then mean of the patch tokens

_PRESETS: dict[str, dict[str, Any]] = {}
for _size in _SIZES:
    _PRESETS[f"cpvt_{_size}_patch16_224"] = dict(_SIZES[_size], **_CPVT)
    _PRESETS[f"cpvt_gap_{_size}_patch16_224"] = dict(_SIZES[_size], **_CPVT, **_GAP)

# Computed (CPVT = DeiT with a PEG for the position embedding): DeiT (timm 1.0.31) − pos-embed + PEG; GAP
# also drops the class token (C).
# GMACs: DeiT-Ti / S / B 1.26 / 4.61 / 17.58 (timm table) + 9·N·C for the PEG (< 0.003 G).
_PUBLISHED = {
    "tiny": (5.68, 1.26), "small": (21.98, 4.61), "base": (86.42, 17.58),
}
_SOURCE = "DeiT (timm 1.0.31 table) − position embedding + PEG (10·C params, 9·N·C MACs); computed"


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a CPVT preset for tests: ViT's (:func:`~vit_attention.models.vit.reduced_config`:
    width 32, 2 heads, 2 blocks) on a 3x3 patch grid, so the PEG after block 0 sees borders and a centre."""
    return dict(vit_reduced_config(cfg), img_size=cfg.patch_size * 3)


register_family(
    "cpvt", CPVT, VisionTransformerConfig, _PRESETS, reduced=reduced_config,
    meta=published_meta({name: _PUBLISHED[size] for size in _SIZES
                         for name in (f"cpvt_{size}_patch16_224", f"cpvt_gap_{size}_patch16_224")}, _SOURCE))
