"""The digits presets, re-exported for the training code (they are registered in :mod:`vit_attention.models.digits`).

Kept so ``from vit_attention.train.presets import DEFAULT_MODEL`` (and the preset tables) keep
working; registration lives in ``models/`` so the registry never depends on what was imported.
"""

from __future__ import annotations

from ..models.digits import DEFAULT_MODEL, DIGITS_PRESETS, SWIN_DIGITS_PRESETS

__all__ = ["DIGITS_PRESETS", "SWIN_DIGITS_PRESETS", "DEFAULT_MODEL"]
