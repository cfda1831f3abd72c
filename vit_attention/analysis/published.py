"""Published compute figures the analytic FLOPs are checked against (GMACs at the preset's input size).

The papers' "FLOPs" are multiply-adds, the unit timm's tables call GMACs. Figures are given with
one decimal, so a check allows 2 % or the rounding of the last digit, whichever is larger.
Every figure lives in its family file, in the preset's registry meta (``meta={"published_gmacs": 1.2,
"published_gmacs_source": "..."}``, next to ``published_params_m``); :func:`published_gmacs` collects
them, and ``PUBLISHED_GMACS`` / ``PUBLISHED_SOURCES`` are the same figures as two name-keyed dicts.
Convention of every figure: patch embedding, all blocks, final norm and classifier counted; softmax,
activations, biases and residual adds not (our :func:`vit_attention.analysis.flops` does the same
and adds normalisation layers as fvcore does, < 0.2 % of any total here).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PUBLISHED_GMACS", "PUBLISHED_SOURCES", "matches_published", "published_gmacs"]

PUBLISHED_GMACS: dict[str, float]  # {model name: GMACs}, from the registry meta (computed when first asked for)
PUBLISHED_SOURCES: dict[str, str]  # {model name: where the figure comes from}, the same names


def matches_published(gmacs: float, published: float) -> bool:
    """Within 2 % of ``published``, or within the rounding of a one-decimal figure (0.05)."""
    return abs(gmacs - published) <= max(0.02 * published, 0.05)


def published_gmacs() -> dict[str, tuple[float, str]]:
    """``{model name: (GMACs, source)}`` for every preset whose registry meta has ``published_gmacs``."""
    from ..models.registry import get_model_entry, list_models

    out: dict[str, tuple[float, str]] = {}
    for name in list_models():
        meta = get_model_entry(name).meta
        if "published_gmacs" in meta:
            out[name] = (float(meta["published_gmacs"]), str(meta.get("published_gmacs_source", "")))
    return out


def __getattr__(name: str) -> Any:
    """``PUBLISHED_GMACS`` / ``PUBLISHED_SOURCES``: :func:`published_gmacs` split into two dicts, built on access."""
    if name == "PUBLISHED_GMACS":
        return {n: g for n, (g, _) in published_gmacs().items()}
    if name == "PUBLISHED_SOURCES":
        return {n: s for n, (_, s) in published_gmacs().items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
