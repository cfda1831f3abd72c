"""Model registry: ``list_models(pattern)``, ``get_model_entry(name)``, ``model_config(name, ...)``.

Each family registers its presets as data (a dict of config overrides per registered name)
with :func:`register_family`; torchvision-style names are aliases of the timm-style names.
Every look-up first imports the built-in family modules (:func:`builtin_families`: every module of
this package that is not infrastructure, one file per family), so what ``list_models()`` /
``create_model()`` know never depends on what was imported before. A new family is a new file
here that calls :func:`register_family` at import; nothing else lists it.

The registry knows which class and config a name builds (:meth:`ModelEntry.build`, the one place a
registered model is constructed), nothing of checkpoints: building a model
and loading its weights is :func:`vit_attention.factory.create_model`, which sits above this
package and :mod:`vit_attention.weights`; nothing in this package imports the factory.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .families import builtin_families
from .features import features_class

__all__ = ["ModelEntry", "register_family", "register_model", "list_models",
           "get_model_entry", "resolve_model_name", "model_config", "with_published_gmacs"]


@dataclass(frozen=True)
class ModelEntry:
    """One registered model: its family, the class and config it builds, and its preset overrides."""

    name: str
    family: str
    model_cls: type[nn.Module]
    config_cls: type
    preset: Mapping[str, Any]
    meta: Mapping[str, Any] = field(default_factory=dict)
    reduced: Callable[[Any], dict[str, Any]] | None = field(default=None, compare=False)

    def reduced_overrides(self) -> dict[str, Any]:
        """Config overrides that shrink this preset for tests while keeping its code paths (the family's
        ``reduced`` rule, applied to the preset's config): ``{}`` when the family declares none."""
        return dict(self.reduced(self.config())) if self.reduced is not None else {}

    def config(self, **overrides: Any) -> Any:
        """The config dataclass for this preset with ``overrides`` applied (unknown keys raise).

        ``num_classes``, when neither ``overrides`` nor the preset set it, is :meth:`default_num_classes`.
        """
        fields = {f.name for f in dataclasses.fields(self.config_cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            close = {k: difflib.get_close_matches(k, fields, n=1) for k in unknown}
            hints = ", ".join(f"{k!r}" + (f" (did you mean {c[0]!r}?)" if c else "") for k, c in close.items())
            raise TypeError(f"{self.name}: unknown config option(s) {hints}; valid options: {sorted(fields)}")
        values = {**self.preset, **overrides}
        if "num_classes" not in values and "num_classes" in fields:
            default = self.default_num_classes()
            if default is not None:
                values["num_classes"] = default
        return self.config_cls(**values)

    def build(self, cfg: Any = None, *, features: Mapping[str, Any] | None = None) -> nn.Module:
        """The model this entry names, built from config ``cfg`` (None: the preset's, :meth:`config`): the one
        place a registered model is constructed (``create_model``, ``load_model`` and the checks of a file's
        config against its tensors all come here). ``features``: the options of a features model
        (``out_indices``, ``output_fmt``, ``norm``, ``prune``): then the family's features class
        (:func:`~vit_attention.models.features.features_class`) is built, ``[B, Cin, H, W] -> [maps]``; else the
        family's class, ``[B, Cin, H, W] -> [B, num_classes]``. The model's ``registry_name`` is this entry's name.
        No weights: loading them is :mod:`vit_attention.weights`'."""
        cfg = self.config() if cfg is None else cfg
        model = features_class(self.model_cls)(cfg, **features) if features is not None else self.model_cls(cfg)
        model.registry_name = self.name  # type: ignore[assignment]
        return model

    def default_num_classes(self) -> int | None:
        """The classes this preset is built with when nobody says: its default pretrained tag's head.

        timm builds a model with the ``num_classes`` of its default pretrained config, so a tower
        published without a classifier (``davit_base_fl``: Florence-2's vision tower; ``vit_huge_patch14_224``:
        ``orig_in21k``) has ``num_classes=0`` and ``swinv2_base_window12_192`` (``ms_in22k``) has 21841;
        here the same. A preset that sets ``num_classes`` itself keeps it; ``None``: no tag says (the
        config's default, 1000, applies).
        """
        if "num_classes" in self.preset:
            return int(self.preset["num_classes"])
        from .pretrained_table import DEFAULT_TAGS, PRETRAINED_CFGS  # data only; imported at the first look-up

        tag = DEFAULT_TAGS.get(self.name)
        classes = PRETRAINED_CFGS.get(f"{self.name}.{tag}", {}).get("num_classes") if tag else None
        return classes if isinstance(classes, int) and classes >= 0 else None


_MODELS: dict[str, ModelEntry] = {}
_ALIASES: dict[str, str] = {}

_builtins_loaded = False


def _ensure_builtin_families() -> None:
    """Import every built-in family module once, so the registry is complete at the first look-up."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True  # set first: the family modules call register_model while importing
    try:
        for module in builtin_families():
            importlib.import_module(f"{__package__}.{module}")
    except BaseException:
        _builtins_loaded = False
        raise


def register_model(name: str, family: str, model_cls: type[nn.Module], config_cls: type,
                   preset: Mapping[str, Any], *, aliases: tuple[str, ...] = (), meta: Mapping[str, Any] | None = None,
                   reduced: Callable[[Any], dict[str, Any]] | None = None) -> None:
    """Register one preset ``name`` (and its ``aliases``) of ``family``; ``reduced``: see :func:`register_family`."""
    if name in _MODELS or name in _ALIASES:
        raise ValueError(f"model {name!r} is already registered")
    _MODELS[name] = ModelEntry(name, family, model_cls, config_cls, dict(preset), dict(meta or {}), reduced)
    for alias in aliases:
        if alias in _MODELS or alias in _ALIASES:
            raise ValueError(f"alias {alias!r} is already registered")
        _ALIASES[alias] = name


def with_published_gmacs(meta: Mapping[str, Mapping[str, Any]], gmacs: Mapping[str, tuple[float, str]]
                         ) -> dict[str, dict[str, Any]]:
    """A family's ``meta`` with ``gmacs[name] = (GMACs, source)`` added as ``published_gmacs`` /
    ``published_gmacs_source`` (the keys :mod:`vit_attention.analysis.published` reads); a name
    without meta yet gets an entry. ``{name: {field: value}}`` -> a new dict of the same form.
    """
    out = {k: dict(v) for k, v in meta.items()}
    for name, (value, source) in gmacs.items():
        out.setdefault(name, {}).update(published_gmacs=value, published_gmacs_source=source)
    return out


def published_meta(published: Mapping[str, tuple[float, float | None]], gmacs_source: str,
                   meta_device: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """A family's ``meta`` from ``{name: (parameters in millions, GMACs or None)}``: ``published_params_m``, and
    ``published_gmacs`` / ``published_gmacs_source`` (``gmacs_source``) where GMACs are given; the names in
    ``meta_device`` have their parameters counted by timm 1.0.31 on the meta device (``published_params_source``).
    """
    meta_device = set(meta_device)
    out: dict[str, dict[str, Any]] = {}
    for name, (params, gmacs) in published.items():
        meta: dict[str, Any] = {"published_params_m": params}
        if name in meta_device:
            meta["published_params_source"] = "timm 1.0.31 on the meta device"
        if gmacs is not None:
            meta.update(published_gmacs=gmacs, published_gmacs_source=gmacs_source)
        out[name] = meta
    return out


def register_family(family: str, model_cls: type[nn.Module], config_cls: type,
                    presets: Mapping[str, Mapping[str, Any]], *, aliases: Mapping[str, str] | None = None,
                    meta: Mapping[str, Mapping[str, Any]] | None = None,
                    reduced: Callable[[Any], dict[str, Any]] | None = None) -> None:
    """Register every preset of a family; ``aliases`` maps alias -> registered name.

    ``reduced(cfg) -> overrides``: how the family's tests shrink a preset's config (small widths,
    depths and image size, every code path the preset selects kept); the registry-wide tests and
    the saved outputs (``tests/model_outputs.py``) build every preset with it.
    """
    by_target: dict[str, list[str]] = {}
    for alias, target in (aliases or {}).items():
        by_target.setdefault(target, []).append(alias)
    for name, preset in presets.items():
        register_model(name, family, model_cls, config_cls, preset, aliases=tuple(by_target.pop(name, ())),
                       meta=(meta or {}).get(name), reduced=reduced)
    if by_target:
        raise ValueError(f"aliases point at unregistered models: {by_target}")


def resolve_model_name(name: str) -> str:
    """Registered name for ``name`` (resolving aliases); unknown names raise with suggestions."""
    if not isinstance(name, str):
        raise TypeError(f"model name must be a str, got {type(name).__name__}")
    _ensure_builtin_families()
    if name in _MODELS:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    close = difflib.get_close_matches(name, list(_MODELS) + list(_ALIASES), n=5, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise KeyError(f"unknown model {name!r}.{hint} All {len(_MODELS)} names: `vit-attention models` on the command "
                   "line (a glob narrows it: `vit-attention models 'swin*'`) or vit_attention.list_models()")


def get_model_entry(name: str) -> ModelEntry:
    """The :class:`ModelEntry` for ``name`` or an alias of it."""
    return _MODELS[resolve_model_name(name)]


def list_models(pattern: str = "*", *, family: str | None = None, include_aliases: bool = False) -> list[str]:
    """Registered model names matching the glob ``pattern`` (optionally of one ``family``), sorted."""
    _ensure_builtin_families()
    names = [n for n, e in _MODELS.items() if family is None or e.family == family]
    if include_aliases:
        names += [a for a, t in _ALIASES.items() if family is None or _MODELS[t].family == family]
    return sorted(n for n in names if fnmatch.fnmatch(n, pattern))


def aliases_of(name: str) -> list[str]:
    """Aliases registered for ``name``."""
    target = resolve_model_name(name)
    return sorted(a for a, t in _ALIASES.items() if t == target)


def model_config(name: str, **overrides: Any) -> Any:
    """The config dataclass ``create_model(name, **overrides)`` would build from."""
    return get_model_entry(name).config(**overrides)

