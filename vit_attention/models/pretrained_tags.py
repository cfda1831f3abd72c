"""Pretrained tags declared compactly per family, expanded into the full table (timm ``generate_default_cfgs`` style).

A family file lists its tags as ``"name.tag": overrides`` on top of a few named data configs
(:func:`data_cfg`) and family defaults (:func:`pretrained_tags`, e.g. ``license="mit"``)::

    _224 = data_cfg(224, 0.9)
    PRETRAINED = pretrained_tags({
        "swin_tiny_patch4_window7_224.ms_in1k": _224,             # the first tag of a name is its default
        "swin_tiny_patch4_window7_224.ms_in22k": dict(_224, num_classes=21841),
    }, license="mit")

:func:`expand` writes every entry out with all of :data:`FIELDS`: ``hf_hub_id`` defaults to
``"timm/<name>.<tag>"`` (``None``: no weights), ``hf_hub_filename`` to ``None``, ``num_classes`` to 1000.
:func:`build_tables` merges the families into ``DEFAULT_TAGS`` / ``PRETRAINED_CFGS``
(:mod:`vit_attention.models.pretrained_table`). The facts are timm 1.0.31's pretrained configs
(``scripts/make_pretrained_table.py`` prints or checks these declarations).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FIELDS", "IMAGENET_MEAN", "IMAGENET_STD", "INCEPTION_MEAN", "INCEPTION_STD", "OPENAI_CLIP_MEAN",
           "OPENAI_CLIP_STD", "PretrainedTags", "build_tables", "data_cfg", "expand", "pretrained_tags"]

# Every entry of the expanded table has exactly these fields, in this order.
FIELDS: tuple[str, ...] = ("hf_hub_id", "hf_hub_filename", "input_size", "interpolation", "crop_pct", "crop_mode",
                           "mean", "std", "num_classes", "license")
_DATA_FIELDS = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")

IMAGENET_MEAN: tuple[float, ...] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, ...] = (0.229, 0.224, 0.225)
INCEPTION_MEAN: tuple[float, ...] = (0.5, 0.5, 0.5)
INCEPTION_STD: tuple[float, ...] = (0.5, 0.5, 0.5)
OPENAI_CLIP_MEAN: tuple[float, ...] = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD: tuple[float, ...] = (0.26862954, 0.26130258, 0.27577711)


def data_cfg(size: int, crop_pct: float, *, mean: tuple[float, ...] = IMAGENET_MEAN,
             std: tuple[float, ...] = IMAGENET_STD, interpolation: str = "bicubic", crop_mode: str = "center"
             ) -> dict[str, Any]:
    """An eval data config: ``size`` x ``size`` RGB input, ``crop_pct``, normalisation, resize mode."""
    return dict(input_size=(3, size, size), interpolation=interpolation, crop_pct=crop_pct, crop_mode=crop_mode,
                mean=tuple(mean), std=tuple(std))


@dataclass(frozen=True)
class PretrainedTags:
    """One family's pretrained tags: ``cfgs`` (``"name.tag"`` -> overrides) on top of ``defaults``.

    The first tag listed for a name is its default tag (timm's convention).
    """

    cfgs: Mapping[str, Mapping[str, Any]]
    defaults: Mapping[str, Any] = field(default_factory=dict)


def pretrained_tags(cfgs: Mapping[str, Mapping[str, Any]], **defaults: Any) -> PretrainedTags:
    """A family's :class:`PretrainedTags`; ``defaults`` (e.g. ``license``) apply to every entry."""
    unknown = sorted(set(defaults) - set(FIELDS))
    if unknown:
        raise TypeError(f"unknown pretrained field(s) {unknown}; fields: {list(FIELDS)}")
    return PretrainedTags(dict(cfgs), dict(defaults))


def expand(tags: PretrainedTags) -> dict[str, dict[str, Any]]:
    """Every entry of ``tags`` written out: ``{"name.tag": {field: value for field in FIELDS}}``, in listed order."""
    out: dict[str, dict[str, Any]] = {}
    for key, overrides in tags.cfgs.items():
        name, sep, tag = key.partition(".")
        if not (name and sep and tag):
            raise ValueError(f"pretrained key {key!r} is not 'name.tag'")
        values = {"hf_hub_id": f"timm/{key}", "hf_hub_filename": None, "num_classes": 1000, "license": None,
                  **tags.defaults, **overrides}
        unknown = sorted(set(values) - set(FIELDS))
        missing = [f for f in _DATA_FIELDS if f not in values]
        if unknown or missing:
            raise ValueError(f"{key}: unknown field(s) {unknown}, missing data config field(s) {missing}")
        out[key] = {f: values[f] for f in FIELDS}
    return out


def build_tables(families: Iterable[PretrainedTags]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """``(DEFAULT_TAGS, PRETRAINED_CFGS)`` of all ``families``: default tag per name, entries by key, both sorted."""
    defaults: dict[str, str] = {}
    cfgs: dict[str, dict[str, Any]] = {}
    for family in families:
        for key, cfg in expand(family).items():
            if key in cfgs:
                raise ValueError(f"pretrained tag {key!r} declared twice")
            name, _, tag = key.partition(".")
            defaults.setdefault(name, tag)
            cfgs[key] = cfg
    return dict(sorted(defaults.items())), dict(sorted(cfgs.items()))
