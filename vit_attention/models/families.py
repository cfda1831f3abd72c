"""Which modules of :mod:`vit_attention.models` are model families: every public module but the infrastructure.

The registry imports them all at its first look-up, and the pretrained table reads each one's
``PRETRAINED`` tags; both ask :func:`builtin_families`, so a new family is a new file and nothing
else lists it.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path

__all__ = ["INFRASTRUCTURE", "builtin_families"]

# Modules of this package that are not families (every other public module registers presets when imported).
INFRASTRUCTURE = frozenset({"backbone", "families", "features", "layer_groups", "pretrained_table", "pretrained_tags",
                            "registry", "token_merging"})


def builtin_families() -> tuple[str, ...]:
    """Names of the family modules of this package (every public module but the infrastructure), sorted."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                        if not m.name.startswith("_") and m.name not in INFRASTRUCTURE))
