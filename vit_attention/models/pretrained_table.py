"""Pretrained weights and data configs of the presets: every family's ``PRETRAINED`` tags, expanded.

Each family file declares its tags compactly (``PRETRAINED = pretrained_tags({"name.tag": overrides},
license=...)``, timm 1.0.31's pretrained configs: :mod:`vit_attention.models.pretrained_tags`);
``scripts/make_pretrained_table.py`` prints those declarations from timm or checks them against it.

``DEFAULT_TAGS[name]``: the tag ``create_model(name, pretrained=True)`` loads (timm's default: the
name's first tag in its family file).
``PRETRAINED_CFGS["name.tag"]``: where the weights are (``hf_hub_id``: a Hugging Face repository;
``hf_hub_filename``: the file when it is not ``model.safetensors``; ``None``: no weights), their
``license``, the classes of their head (``num_classes``; 0 = no head) and the eval data config
(``input_size`` ``(C, H, W)``, ``interpolation``, ``crop_pct``, ``crop_mode``, ``mean``, ``std``).
Repositories under ``timm/`` hold timm-layout state dicts; others are transformers model folders.
Both are sorted by name. Importing this module imports every family module (the registry's
:func:`~vit_attention.models.families.builtin_families`).
"""

from __future__ import annotations

import importlib
from typing import Any

from .families import builtin_families
from .pretrained_tags import PretrainedTags, build_tables

__all__ = ["DEFAULT_TAGS", "PRETRAINED_CFGS", "family_pretrained_tags"]


def family_pretrained_tags() -> dict[str, PretrainedTags]:
    """``{family module: its PRETRAINED}`` for every built-in family module that declares pretrained tags."""
    out: dict[str, PretrainedTags] = {}
    for module in builtin_families():
        tags = getattr(importlib.import_module(f"{__package__}.{module}"), "PRETRAINED", None)
        if tags is not None:
            if not isinstance(tags, PretrainedTags):
                raise TypeError(f"{module}.PRETRAINED must come from pretrained_tags(), got {type(tags).__name__}")
            out[module] = tags
    return out


DEFAULT_TAGS: dict[str, str]
PRETRAINED_CFGS: dict[str, dict[str, Any]]
DEFAULT_TAGS, PRETRAINED_CFGS = build_tables(family_pretrained_tags().values())
