"""Pretrained weights by name: ``create_model(name, pretrained=True)``, ``name.tag``, ``pretrained="hf-hub:ORG/REPO"``.

Weights come from the Hugging Face hub through ``huggingface_hub`` into the standard Hugging Face
cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``), read at each
call so a test or a job can point it elsewhere. ``HF_HUB_OFFLINE=1`` (or no network) uses the
cache only; a file that is not there raises :class:`PretrainedNotAvailableError`, naming the
repository, the file and how to place it by hand.

Which repository a preset's weights live in, and their data config, is the table in
:mod:`vit_attention.models.pretrained_table` (timm's repositories for the families timm has; the
original / Hugging Face repositories otherwise). A repository is read in either layout:

* timm's (``model.safetensors`` with timm's keys, ``config.json`` with ``architecture`` and
  ``pretrained_cfg``): the data config and classes come from its ``config.json``;
* a transformers model folder (``config.json`` with ``model_type``): its ``config.json``
  configures the model where it defines something (``layer_norm_eps``, activation, image size,
  widths, labels ...), through the family's reader (:func:`register_hf_config_reader`), so
  ``google/vit-base-patch16-224`` gets LayerNorm eps 1e-12 as in transformers.

Options given to ``create_model`` always win over what a repository or folder says. The widths and
depths a transformers ``config.json`` states are checked against its safetensors weights' header
before anything is built (:func:`~vit_attention.weights.header.check_folder_config`): a folder
that contradicts itself is refused naming the field.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..models.registry import get_model_entry, list_models
from .header import check_folder_config
from .io import features_metadata, read_metadata, regular_file

__all__ = ["HF_HUB_PREFIX", "PretrainedNotAvailableError", "PretrainedSource", "split_model_tag",
           "pretrained_cfg_for", "list_pretrained", "list_pretrained_tags", "hub_download", "hub_cache_dir",
           "resolve_pretrained", "register_hf_config_reader", "hf_config_overrides", "hub_endpoint", "hub_reachable"]

HF_HUB_PREFIX = "hf-hub:"
DEFAULT_FILENAME = "model.safetensors"
_FALLBACK_FILENAMES = ("pytorch_model.bin",)

# Generic eval data config for presets without published weights (timm's defaults for ImageNet models).
_GENERIC_CFG: dict[str, Any] = dict(hf_hub_id=None, hf_hub_filename=None, interpolation="bicubic", crop_pct=0.875,
                                    crop_mode="center", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                                    license=None)


class PretrainedNotAvailableError(FileNotFoundError):
    """Pretrained weights that cannot be had: not in the cache offline, no such tag, no published weights.

    ``reason``: ``"not_cached"`` (offline or the hub unreachable), ``"no_repository"``, ``"no_file"``
    or ``"no_weights"`` (the preset has none published).
    """

    def __init__(self, message: str, reason: str = "no_weights") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class PretrainedSource:
    """What ``create_model`` needs to build and load a pretrained model.

    ``weights``: a local file / folder or a state dict for :func:`~vit_attention.weights.load_weights`
    (``None``: build only, e.g. ``name.tag`` without ``pretrained``); ``pretrained_cfg``: the data
    config and provenance (``hf_hub_id``, ``license``, ``tag``, ``label_names`` ...);
    ``config_overrides``: model config fields the source defines (classes, eps, image size ...);
    ``features``: the ``out_indices`` / ``output_fmt`` / ``norm`` a features model's file of ours
    records (:func:`~vit_attention.weights.io.features_metadata`), else ``None``.
    """

    weights: str | Path | Mapping[str, Any] | None
    pretrained_cfg: dict[str, Any]
    config_overrides: dict[str, Any] = field(default_factory=dict)
    features: dict[str, Any] | None = None


# ---------------------------------------------------------------------------- the table
def split_model_tag(name: str) -> tuple[str, str | None]:
    """``"vit_base_patch16_224.augreg_in21k"`` -> ``("vit_base_patch16_224", "augreg_in21k")``; no tag -> ``None``."""
    base, sep, tag = name.partition(".")
    if sep and not tag:
        raise ValueError(f"model name {name!r} ends with '.': give NAME or NAME.TAG (e.g. vit_base_patch16_224."
                         "augreg_in21k)")
    return base, (tag or None)


def list_pretrained_tags(name: str, *, with_weights: bool = True) -> list[str]:
    """Tags known for registered preset ``name`` (the default first); ``with_weights``: only downloadable ones."""
    from ..models.pretrained_table import (  # every family's tags, expanded at the first look-up
        DEFAULT_TAGS,
        PRETRAINED_CFGS,
    )

    tags = [key.split(".", 1)[1] for key, cfg in PRETRAINED_CFGS.items()
            if key.split(".", 1)[0] == name and (cfg["hf_hub_id"] or not with_weights)]
    default = DEFAULT_TAGS.get(name)
    return sorted(tags, key=lambda t: (t != default, t))


def list_pretrained(pattern: str = "*") -> list[str]:
    """``NAME.TAG`` of every preset and tag with published weights whose name matches the glob ``pattern``, sorted."""
    import fnmatch

    from ..models.pretrained_table import PRETRAINED_CFGS  # every family's tags, expanded at the first look-up

    return sorted(k for k, cfg in PRETRAINED_CFGS.items() if cfg["hf_hub_id"] and fnmatch.fnmatch(k, pattern))


def pretrained_cfg_for(name: str, tag: str | None = None) -> dict[str, Any]:
    """The pretrained config of registered preset ``name`` and ``tag`` (default tag when ``None``).

    Presets with no entry get a generic ImageNet data config (bicubic, crop 0.875, ImageNet mean /
    std) sized from the preset's ``img_size`` / ``in_chans`` and no weights. An unknown ``tag``
    raises ``ValueError`` listing the known ones.
    """
    from ..models.pretrained_table import (  # every family's tags, expanded at the first look-up
        DEFAULT_TAGS,
        PRETRAINED_CFGS,
    )

    if tag is None:
        tag = DEFAULT_TAGS.get(name)
        if tag is None:
            return _generic_cfg(name)
    key = f"{name}.{tag}"
    if key not in PRETRAINED_CFGS:
        known = list_pretrained_tags(name, with_weights=False)
        raise ValueError(f"unknown tag {tag!r} for model {name!r}; known tags: "
                         f"{', '.join(known) if known else 'none (no published weights)'}")
    return dict(PRETRAINED_CFGS[key], tag=tag, architecture=name)


def _generic_cfg(name: str) -> dict[str, Any]:
    entry = get_model_entry(name)
    cfg = entry.config()
    size = cfg.img_size if not isinstance(cfg.img_size, int) else (cfg.img_size, cfg.img_size)
    return dict(_GENERIC_CFG, input_size=(cfg.in_chans, *size), num_classes=cfg.num_classes, tag=None,
                architecture=name)


# ---------------------------------------------------------------------------- the download
def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now: ``HF_HUB_CACHE`` > ``HF_HOME/hub`` > default."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def _offline() -> bool:
    from huggingface_hub import constants

    return _env_flag("HF_HUB_OFFLINE") or _env_flag("TRANSFORMERS_OFFLINE") or bool(constants.HF_HUB_OFFLINE)


def hub_endpoint() -> str:
    """The Hugging Face hub address, read from the environment now: ``HF_ENDPOINT``, else huggingface_hub's."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


_PROBE_TIMEOUT_S = 5.0  # connect / read limit of the reachability probe (a refused connection answers at once)
_PROBE_TTL_S = 60.0  # how long a probe's answer is reused in this process
_PROBES: dict[str, tuple[float, bool]] = {}


def hub_reachable(endpoint: str | None = None) -> bool:
    """Whether the hub at ``endpoint`` (default :func:`hub_endpoint`) answers at all, asked once a minute per process.

    One ``HEAD`` of the endpoint through huggingface_hub's own HTTP client (its proxies and
    certificates), no retries, at most ``_PROBE_TIMEOUT_S`` seconds; any HTTP answer counts as
    reachable but a gateway's 502 / 503 / 504 (a proxy that cannot reach the hub). Without it,
    ``hf_hub_download`` retries an unreachable hub for about 25 s before falling back to the cache.
    """
    import time

    import httpx2
    from huggingface_hub.utils import get_session

    endpoint = (endpoint or hub_endpoint()).rstrip("/")
    hit = _PROBES.get(endpoint)
    if hit is not None and time.monotonic() - hit[0] < _PROBE_TTL_S:
        return hit[1]
    try:
        status = get_session().head(endpoint, timeout=_PROBE_TIMEOUT_S, follow_redirects=False).status_code
        reachable = status not in (502, 503, 504)
    except httpx2.TransportError:  # refused, no route, DNS, proxy, timeout ...
        reachable = False
    _PROBES[endpoint] = (time.monotonic(), reachable)
    return reachable


def _cache_only() -> tuple[bool, str]:
    """(whether to read the cache only, why): offline mode, or a hub that does not answer (:func:`hub_reachable`)."""
    if _offline():
        return True, "offline (HF_HUB_OFFLINE is set)"
    if not hub_reachable():
        return True, f"the hub cannot be reached ({hub_endpoint()})"
    return False, ""


def _how_to_place(repo_id: str, filename: str, cache: Path) -> str:
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    return (f"On a machine with network: `hf download {repo_id} {filename}` (or huggingface_hub.hf_hub_download) "
            f"and copy its cache folder to {folder}; or place the file by hand as "
            f"{folder}/snapshots/<any-name>/{filename} and write <any-name> into {folder}/refs/main; "
            f"or download the file anywhere and give its path as the weights (--pretrained PATH, --checkpoint PATH)")


def hub_download(repo_id: str, filename: str = DEFAULT_FILENAME, *, revision: str | None = None) -> Path:
    """``filename`` of Hugging Face repository ``repo_id``, from the cache or downloaded into it -> local path.

    Offline (``HF_HUB_OFFLINE=1``) or without network, only the cache is used; a file that is not
    there raises :class:`PretrainedNotAvailableError` naming the repository, the file and how to
    place it by hand. A hub that does not answer is found out in seconds (:func:`hub_reachable`),
    not after huggingface_hub's retries. A repository or file the hub does not have raises it too.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    cache = hub_cache_dir()
    cache_only, why = _cache_only()
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache,
                                    local_files_only=cache_only, endpoint=hub_endpoint()))
    except LocalEntryNotFoundError:
        why = why or "the hub cannot be reached"
        raise PretrainedNotAvailableError(
            f"pretrained weights not available: {why} and {filename!r} of Hugging Face repository {repo_id!r} is "
            f"not in the cache {cache}. {_how_to_place(repo_id, filename, cache)}", "not_cached") from None
    except RepositoryNotFoundError:
        raise PretrainedNotAvailableError(f"Hugging Face repository {repo_id!r} does not exist (or is private: log "
                                          "in with `hf auth login`)", "no_repository") from None
    except EntryNotFoundError:
        raise PretrainedNotAvailableError(f"Hugging Face repository {repo_id!r} has no file {filename!r}",
                                          "no_file") from None


def _cached_or_missing(repo_id: str, filename: str, revision: str | None) -> Path | None:
    """``filename`` of ``repo_id`` if the hub (or, offline, the cache) has it; ``None`` when it does not."""
    from huggingface_hub import try_to_load_from_cache

    if _cache_only()[0]:
        hit = try_to_load_from_cache(repo_id, filename, cache_dir=hub_cache_dir(), revision=revision)
        return Path(hit) if isinstance(hit, str) else None
    try:
        return hub_download(repo_id, filename, revision=revision)
    except PretrainedNotAvailableError as e:
        if e.reason != "no_file":  # no repository, or no network: asking for other files would not help
            raise
        return None


def _download_weights(repo_id: str, filename: str | None, revision: str | None) -> Path:
    """The weights file of ``repo_id``: ``filename``, else ``model.safetensors``, else ``pytorch_model.bin``."""
    if filename:
        return hub_download(repo_id, filename, revision=revision)
    for name in (DEFAULT_FILENAME, *_FALLBACK_FILENAMES):  # no network: the first raises, naming the file
        hit = _cached_or_missing(repo_id, name, revision)
        if hit is not None:
            return hit
    return hub_download(repo_id, DEFAULT_FILENAME, revision=revision)  # raises, naming model.safetensors


# ---------------------------------------------------------------------------- transformers config.json
_HF_READERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {}
_HF_FAMILIES: dict[str, str] = {}


def register_hf_config_reader(model_type: str, reader: Callable[[Mapping[str, Any]], dict[str, Any]], *,
                              family: str) -> None:
    """Map a transformers ``config.json`` of ``model_type`` (``"vit"``, ``"swin"`` ...) to our ``family``'s fields."""
    _HF_READERS[model_type] = reader
    _HF_FAMILIES[model_type] = family


def _label_names(config: Mapping[str, Any]) -> list[str] | None:
    id2label = config.get("id2label")
    if not isinstance(id2label, Mapping) or not id2label:
        return None
    names = [str(id2label.get(str(i), id2label.get(i, ""))) for i in range(len(id2label))]  # type: ignore[call-overload]
    if all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return None  # transformers' placeholder names
    return names


def hf_config_overrides(config: Mapping[str, Any], config_cls: type | None = None) -> dict[str, Any]:
    """Our config fields that a transformers ``config.json`` defines (only fields of ``config_cls`` when given).

    Unknown ``model_type`` raises ``ValueError`` naming it and the known ones.
    """
    import dataclasses

    model_type = str(config.get("model_type", ""))
    if model_type not in _HF_READERS:
        raise ValueError(f"config.json has model_type {model_type!r}, which no converter reads; known: "
                         f"{', '.join(sorted(_HF_READERS))}")
    out = _HF_READERS[model_type](config)
    if config_cls is not None:
        fields = {f.name for f in dataclasses.fields(config_cls)}
        out = {k: v for k, v in out.items() if k in fields}
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(regular_file(path).read_text())  # a FIFO named config.json would block the read
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


_STRUCTURE = ("embed_dim", "depth", "depths", "num_heads", "patch_size", "window_size")


def _from_config_json(config: dict[str, Any], entry: Any, base_cfg: dict[str, Any], where: str
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config overrides, pretrained cfg) from a timm or transformers ``config.json``."""
    pcfg = dict(base_cfg)
    if "model_type" in config:  # transformers
        family = _HF_FAMILIES.get(str(config["model_type"]))
        if family is not None and family != entry.family:
            fits = ", ".join(n for n in _registered(family)[:4])
            raise ValueError(f"{where} holds a transformers {config['model_type']!r} model, which is no "
                             f"{entry.family} model like {entry.name}; build a {family} preset ({fits}, ...)")
        overrides = hf_config_overrides(config, entry.config_cls)
        preset = entry.config()
        differ = [k for k in _STRUCTURE if k in overrides and _norm(overrides[k]) != _norm(getattr(preset, k, None))]
        if differ:
            warnings.warn(f"{where} describes another architecture than {entry.name} ("
                          + ", ".join(f"{k}={overrides[k]!r} vs {getattr(preset, k)!r}" for k in differ)
                          + "); the model is built as the folder says", stacklevel=4)
        names = _label_names(config)
        if names is not None and len(names) == overrides.get("num_classes", len(names)):  # names of these classes
            pcfg["label_names"] = names
        if "num_classes" in overrides:
            pcfg["num_classes"] = overrides["num_classes"]
        size = overrides.get("img_size")
        if size is not None:
            hw = (size, size) if isinstance(size, int) else tuple(size)
            pcfg["input_size"] = (overrides.get("in_chans", pcfg["input_size"][0]), *hw)
        return overrides, pcfg
    # timm's hub layout
    overrides = {}
    if isinstance(config.get("num_classes"), int):
        overrides["num_classes"] = config["num_classes"]
        pcfg["num_classes"] = config["num_classes"]
    arch = config.get("architecture")
    if arch and arch != entry.name:
        warnings.warn(f"{where} holds weights of timm architecture {arch!r}, loading them into {entry.name}",
                      stacklevel=4)
    timm_cfg = config.get("pretrained_cfg") or {}
    for key in ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std", "license"):
        if key in timm_cfg:
            pcfg[key] = tuple(timm_cfg[key]) if isinstance(timm_cfg[key], list) else timm_cfg[key]
    if isinstance(config.get("label_names"), list):
        pcfg["label_names"] = [str(n) for n in config["label_names"]]
    return overrides, pcfg


def _registered(family: str) -> list[str]:
    return list_models(family=family)


def _norm(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _has_pooler(weights: Path) -> bool:
    """Whether a transformers checkpoint has ViT's ``pooler.dense`` (read from the safetensors header only)."""
    if weights.suffix != ".safetensors":
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            return any(k.endswith("pooler.dense.weight") for k in f.keys())
    except Exception:  # noqa: BLE001 - a damaged file is reported by the loader
        return False


def _weights_file(folder: Path) -> Path | None:
    for name in (DEFAULT_FILENAME, *_FALLBACK_FILENAMES):
        if (folder / name).is_file():
            return folder / name
    return None


def _hf_pooler_overrides(config: dict[str, Any], weights: Path | None, overrides: dict[str, Any],
                         entry: Any) -> None:
    """A bare ``ViTModel`` (no classifier) has ``num_classes=0`` and, with a pooler, a Linear + Tanh pre-logits;
    a CLIP tower with its projection (``CLIPVisionModelWithProjection``, ``CLIPModel``) has the projection as
    its head, ``num_classes = projection_dim``."""
    archs = config.get("architectures") or []
    if "model_type" not in config or not archs or any("Classification" in a for a in archs):
        return
    if any("WithProjection" in a or a == "CLIPModel" for a in archs):  # the image projection is the head
        dim = config.get("projection_dim") or (config.get("vision_config") or {}).get("projection_dim")
        if dim:
            overrides["num_classes"] = int(dim)
        return
    overrides["num_classes"] = 0
    fields = {f for f in getattr(entry.config_cls, "__dataclass_fields__", {})}
    if "representation_size" in fields and weights is not None:
        pooler = _has_pooler(weights)
        overrides["representation_size"] = (config.get("pooler_output_size") or config.get("hidden_size")) if pooler \
            else None


def resolve_pretrained(name: str, tag: str | None, pretrained: Any) -> PretrainedSource:
    """Where ``create_model(name[.tag], pretrained=...)`` gets its weights, config overrides and data config.

    ``name``: a registered name (aliases resolved); ``pretrained``: ``None`` / ``False`` (build only;
    a ``tag`` still sets the classes and data config), ``True`` (the tag's or the default tag's
    weights from the hub), ``"hf-hub:ORG/REPO"`` (any repository, timm or transformers layout;
    ``@REVISION`` may follow), a local file / folder, or a state dict.
    """
    entry = get_model_entry(name)
    base_cfg = pretrained_cfg_for(entry.name, tag)
    overrides: dict[str, Any] = {}
    if tag is not None and base_cfg.get("num_classes") is not None:
        overrides["num_classes"] = base_cfg["num_classes"]
    if pretrained is None or pretrained is False:
        return PretrainedSource(None, base_cfg, overrides)
    if pretrained is True:
        if not base_cfg.get("hf_hub_id"):
            tags = list_pretrained_tags(entry.name)
            raise PretrainedNotAvailableError(
                f"pretrained=True: no published weights for {entry.name}"
                + (f" tag {tag!r}" if tag else "") + (f"; tags with weights: {', '.join(tags)}" if tags else "")
                + "; give pretrained=PATH (a checkpoint file or folder) or pretrained='hf-hub:ORG/REPO'")
        overrides.setdefault("num_classes", base_cfg["num_classes"])
        repo = str(base_cfg["hf_hub_id"])
        if repo.startswith("timm/"):
            return PretrainedSource(_download_weights(repo, base_cfg.get("hf_hub_filename"), None), base_cfg,
                                    overrides)
        return _from_repo(entry, repo, None, base_cfg, overrides, filename=base_cfg.get("hf_hub_filename"))
    if isinstance(pretrained, str) and pretrained.startswith(HF_HUB_PREFIX):
        spec = pretrained[len(HF_HUB_PREFIX):]
        repo, _, revision = spec.partition("@")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise ValueError(f"pretrained={pretrained!r}: expected 'hf-hub:ORG/REPO' (optionally '@REVISION')")
        base_cfg = dict(base_cfg, hf_hub_id=repo)
        return _from_repo(entry, repo, revision or None, base_cfg, overrides)
    if isinstance(pretrained, (str, Path)):
        path = Path(pretrained)
        if path.is_dir() and (path / "config.json").is_file():
            config = _read_json(path / "config.json")
            more, pcfg = _from_config_json(config, entry, base_cfg, str(path))
            _hf_pooler_overrides(config, _weights_file(path), more, entry)
            if "model_type" in config:  # a transformers config.json states the structure: against the weights first
                check_folder_config(entry, more, path, str(path))
            return PretrainedSource(path, pcfg, {**overrides, **more})
        features = features_metadata(read_metadata(path), path) if path.is_file() else None
        return PretrainedSource(path, base_cfg, overrides, features)
    if isinstance(pretrained, Mapping):
        return PretrainedSource(pretrained, base_cfg, overrides)
    raise TypeError(f"pretrained must be True/False, a path, 'hf-hub:ORG/REPO' or a state dict, got "
                    f"{type(pretrained).__name__}")


def _from_repo(entry: Any, repo: str, revision: str | None, base_cfg: dict[str, Any], overrides: dict[str, Any],
               *, filename: str | None = None) -> PretrainedSource:
    """Weights and ``config.json`` (when the repository has one) of hub repository ``repo``."""
    config_path = _cached_or_missing(repo, "config.json", revision)
    weights = _download_weights(repo, filename, revision)
    if config_path is None:
        return PretrainedSource(weights, base_cfg, overrides)
    config = _read_json(config_path)
    more, pcfg = _from_config_json(config, entry, base_cfg, f"hf-hub:{repo}")
    _hf_pooler_overrides(config, weights, more, entry)
    if "model_type" in config:  # a transformers config.json states the structure: against the weights first
        check_folder_config(entry, more, weights, f"hf-hub:{repo}")
    return PretrainedSource(weights, pcfg, {**overrides, **more})
