"""Data configs: what a model expects of its input images (size, normalisation, crop, interpolation).

Every preset carries the data config of its pretrained weights, the same as timm's for the same
name and tag (the table :mod:`vit_attention.models.pretrained_table`, expanded from each family file's ``PRETRAINED``
block, which ``scripts/make_pretrained_table.py`` writes from timm 1.0.31);
presets without published weights get a generic ImageNet config. A model built by
``create_model`` keeps its config in ``model.pretrained_cfg``; ``load_model`` restores it from
the file (``save_weights`` records it, training runs record their normalisation).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["DataConfig", "resolve_data_config", "IMAGENET_MEAN", "IMAGENET_STD", "INTERPOLATIONS", "CROP_MODES",
           "TRANSFORM_KEYS"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "lanczos", "box", "hamming")
CROP_MODES = ("center", "squash", "border")
# The keys of a DataConfig read as a mapping: the eval-transform fields, the keys of timm's
# resolve_data_config dict, so `create_transform(**config)` works as in timm.
TRANSFORM_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


@dataclass(frozen=True)
class DataConfig(Mapping[str, Any]):
    """The eval data config of a model and where its weights come from (JSON-serialisable, read-only).

    ``input_size``: ``(C, H, W)``; ``crop_pct``: any positive number, crop size / resize size (the
    image is resized to ``floor(size / crop_pct)``, then centre-cropped to ``size``: below 1 the
    border is cut off, above 1, as timm's VOLO 448 / 512 px tags' 1.15, the resized image is
    smaller than the crop and padded); ``crop_mode``: ``"center"`` (shorter side, keep aspect,
    centre crop, padding black as torchvision's ``CenterCrop``), ``"squash"`` (both sides, aspect
    not kept, padding black), ``"border"`` (longer side, padded with the mean colour as timm's
    ``CenterCropOrPad(fill=mean)``); ``interpolation``: a Pillow filter name;
    ``mean`` / ``std``: per channel, on ``[0, 1]`` pixels. ``num_classes``, ``hf_hub_id``,
    ``license``, ``tag`` and ``label_names`` (class names, when the weights carry them) describe
    the weights.

    It is also a read-only mapping of the transform fields (:data:`TRANSFORM_KEYS`, the keys of
    timm's ``resolve_data_config`` dict): ``config["input_size"]``, ``dict(config)`` and
    ``create_transform(**config)`` work as with timm; the fields describing the weights stay
    attributes. Assignment (``config.crop_pct = 1`` or ``config["crop_pct"] = 1``) raises; use
    ``dataclasses.replace(config, crop_pct=1.0)`` or ``resolve_data_config(model, crop_pct=1.0)``.
    """

    input_size: tuple[int, int, int] = (3, 224, 224)
    interpolation: str = "bicubic"
    crop_pct: float = 0.875
    crop_mode: str = "center"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    num_classes: int | None = None
    hf_hub_id: str | None = None
    license: str | None = None
    tag: str | None = None
    label_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        size = self.input_size
        if (not isinstance(size, Sequence) or len(size) != 3
                or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in size)):
            raise ValueError(f"input_size must be (C, H, W), three positive ints, got {size!r}")
        object.__setattr__(self, "input_size", tuple(int(v) for v in size))
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}; got {self.interpolation!r}")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"crop_mode must be one of {', '.join(CROP_MODES)}; got {self.crop_mode!r}")
        if not isinstance(self.crop_pct, numbers.Real) or isinstance(self.crop_pct, bool) \
                or not 0 < self.crop_pct < math.inf:
            raise ValueError(f"crop_pct must be a positive number (crop size / resize size; above 1 pads the "
                             f"resized image), got {self.crop_pct!r}")
        if math.floor(min(self.input_size[1:]) / self.crop_pct) < 1:
            raise ValueError(f"crop_pct {self.crop_pct!r} resizes the images to less than 1 pixel for input_size "
                             f"{self.input_size}; give a smaller crop_pct")
        for name in ("mean", "std"):
            v = getattr(self, name)
            if not isinstance(v, Sequence) or not all(isinstance(x, numbers.Real) for x in v):
                raise ValueError(f"{name} must be a sequence of numbers (one per channel), got {v!r}")
            if len(v) != self.input_size[0]:
                raise ValueError(f"{name} has {len(v)} values for {self.input_size[0]} channels (input_size "
                                 f"{self.input_size}); give one per channel")
            object.__setattr__(self, name, tuple(float(x) for x in v))
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std must be positive, got {self.std!r}")
        if self.label_names is not None:
            object.__setattr__(self, "label_names", tuple(str(n) for n in self.label_names))

    def __getitem__(self, key: str) -> Any:
        """``config["input_size"]`` ...: one of :data:`TRANSFORM_KEYS` (``KeyError`` for others)."""
        if key in TRANSFORM_KEYS:
            return getattr(self, key)
        hint = f"; {key} is an attribute: config.{key}" if key in {f.name for f in dataclasses.fields(self)} else ""
        raise KeyError(f"DataConfig has no key {key!r} (its keys: {', '.join(TRANSFORM_KEYS)}){hint}")

    def __iter__(self) -> Iterator[str]:
        """The transform keys, in :data:`TRANSFORM_KEYS` order."""
        return iter(TRANSFORM_KEYS)

    def __len__(self) -> int:
        return len(TRANSFORM_KEYS)

    @property
    def img_size(self) -> tuple[int, int]:
        """``(H, W)``."""
        return self.input_size[1], self.input_size[2]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the fields (``None`` fields left out)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()
                if v is not None}

    def to_json(self) -> str:
        """The config as JSON text."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DataConfig:
        """Build from a dict such as a ``pretrained_cfg`` (unknown keys such as ``architecture`` are ignored)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in fields})


def _fit_channels(values: tuple[float, ...], channels: int) -> tuple[float, ...]:
    """Per-channel values for ``channels``: RGB -> grey is their mean; one value repeats."""
    if len(values) == channels:
        return values
    if len(values) == 1:
        return values * channels
    if channels == 1:
        return (sum(values) / len(values),)
    raise ValueError(f"cannot fit {len(values)} per-channel values to {channels} channels")


def _model_pretrained_cfg(model: nn.Module) -> dict[str, Any]:
    from ..weights.hub import pretrained_cfg_for

    cfg = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg, Mapping):
        return dict(cfg)
    name = getattr(model, "registry_name", None)
    if name:
        return pretrained_cfg_for(str(name))
    return {}


def resolve_data_config(model: nn.Module | str | Mapping[str, Any] | None = None, **overrides: Any) -> DataConfig:
    """The eval data config of ``model`` -> :class:`DataConfig`.

    ``model``: a model (its ``pretrained_cfg`` from ``create_model`` / ``load_model``, else its
    registered name's default tag; ``input_size`` is the model's own ``in_chans`` and
    ``img_size``, so a model built at another size gets that size), a registered name
    (``"vit_base_patch16_224"`` or ``"NAME.TAG"``), a ``pretrained_cfg`` dict, a
    :class:`DataConfig`, or ``None`` (the generic ImageNet config). ``overrides``: fields to
    replace (``crop_pct=1.0``, ...).
    """
    from ..weights.hub import pretrained_cfg_for, split_model_tag

    if model is None:
        cfg: dict[str, Any] = {}
    elif isinstance(model, DataConfig):  # (a mapping too, of its transform keys only: take every field)
        cfg = model.to_dict()
    elif isinstance(model, str):
        from ..models.registry import resolve_model_name

        base, tag = split_model_tag(model)
        cfg = pretrained_cfg_for(resolve_model_name(base), tag)
    elif isinstance(model, Mapping):
        cfg = dict(model)
    elif isinstance(model, nn.Module):
        cfg = _model_pretrained_cfg(model)
        mcfg = getattr(model, "cfg", None)
        if mcfg is not None and hasattr(mcfg, "img_size") and hasattr(mcfg, "in_chans"):
            size = mcfg.img_size
            hw = (size, size) if isinstance(size, int) else tuple(size)
            cfg["input_size"] = (int(mcfg.in_chans), *hw)
        if "num_classes" in cfg or hasattr(model, "num_classes"):
            cfg["num_classes"] = getattr(model, "num_classes", cfg.get("num_classes"))
    else:
        raise TypeError(f"model must be a model, a registered name or a pretrained_cfg dict, got "
                        f"{type(model).__name__}")
    cfg.update(overrides)
    channels = int(tuple(cfg.get("input_size", (3,)))[0])
    for key, default in (("mean", IMAGENET_MEAN), ("std", IMAGENET_STD)):
        cfg[key] = _fit_channels(tuple(cfg.get(key) or default), channels)
    names = cfg.get("label_names")
    if names is not None and cfg.get("num_classes") is not None and len(names) != cfg["num_classes"]:
        cfg["label_names"] = None  # the head was replaced: the weights' names no longer apply
    for key in ("interpolation", "crop_pct", "crop_mode"):  # None in a cfg means "the default"
        if cfg.get(key) is None:
            cfg.pop(key, None)
    return DataConfig.from_dict(cfg)
