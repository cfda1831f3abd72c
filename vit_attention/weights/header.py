"""A file's config checked against its tensor header before a model is allocated.

A safetensors header gives every tensor's name and shape without reading any data. A config that
contradicts them (``embed_dim=30000`` beside 192-wide tensors, ``depth=1000000`` beside 40 tensors)
would otherwise build a model of gigabytes, or grow one for minutes, before the shape check ran.
Here the depth-like fields are bounded by the number of tensors first (building even on the meta
device costs time per layer), then the model is built on the meta device (no memory) and its
state-dict keys and shapes are compared with the header; a contradiction raises ``ValueError``
naming the config field where one can be told.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

__all__ = ["header_shapes", "check_config_against_header", "check_saved_model", "check_folder_config"]


def header_shapes(path: str | Path, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in safetensors file ``path`` whose name starts with ``prefix`` (removed),
    read from the header alone (no tensor data is read)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k[len(prefix):]: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith(prefix)}
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(f"cannot read {path}: {e}; it may be truncated") from None


def _ints(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _ints(v)]
    return []


def _depth_fields(config: Mapping[str, Any]) -> Iterable[str]:
    """Fields that count layers: ``depth``, ``depths``, ``transformer_depths`` ..., HaloNet's ``block_types``."""
    return [k for k in config if "depth" in k or k in ("num_layers", "num_blocks", "block_types")]


def _layers(value: Any) -> int:
    """Layers a depth-like value asks for: its integers summed, a string's letters (one block each)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_layers(v) for v in value)
    return sum(_ints(value))


def check_config_against_header(entry: Any, config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                                where: str, *, partial: bool = False, foreign: bool = False,
                                only: Collection[str] | None = None) -> None:
    """Raise ``ValueError`` naming the field when ``config`` (a registry ``entry``'s fields) contradicts ``shapes``.

    ``shapes``: the file's tensors (:func:`header_shapes`), in the model's own layout unless ``foreign``
    (another library's: converted on the meta device as ``load_weights`` would convert them, then only
    the tensors both have compared). ``partial``: the file may lack some of the model's tensors (a
    features model's head and pruned layers), so only tensors the file has are compared. Cost: the
    model built once on the meta device. ``only``: the fields the file itself states (others may come from the
    caller's options, which the real load checks); a contradiction is refused only when one of them is named.
    """
    n = len(shapes)
    for name in [f for f in _depth_fields(config) if only is None or f in only]:
        layers = _layers(config[name])
        if layers > n:
            raise ValueError(f"{where}: its config field {name}={config[name]!r} asks for {layers} layers, which "
                             f"contradicts the {n} tensors it holds; refusing to build the model")
    try:
        cfg = entry.config_cls.from_dict(dict(config))
        with torch.device("meta"):
            model = entry.build(cfg)
    except (TypeError, ValueError):
        return  # a config that does not build alone (options create_model adds) is reported by the real build
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if foreign:
        from .load import convert_state_dict

        try:
            with torch.device("meta"), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a dropped head is warned about by the real load
                converted = convert_state_dict({k: torch.empty(v) for k, v in shapes.items()}, model)
        except Exception:  # noqa: BLE001 - a layout the converters cannot take is reported by the real load
            return
        shapes = {k: tuple(v.shape) for k, v in converted.items()}
        partial = True
    unexpected = [] if foreign else sorted(set(shapes) - set(own))
    missing = [] if partial else sorted(set(own) - set(shapes))
    mismatched = [(k, shapes[k], own[k]) for k in shapes if k in own and shapes[k] != own[k]]
    if not (unexpected or missing or mismatched):
        return
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    named: list[str] = []
    for _, theirs, ours in mismatched:
        for field, value in fields.items():
            if any(v in ours and v not in theirs for v in _ints(value) if v > 1) and field not in named:
                named.append(field)
    if any("pos" in k and a[:-1] != b[:-1] for k, a, b in mismatched) and "img_size" in fields \
            and "img_size" not in named:
        named.append("img_size")  # a position table's rows are the image's grid
    if unexpected or missing:  # tensors of blocks one side lacks: a depth (which may also move a width change)
        named += [f for f in _depth_fields(fields) if f not in named]
    detail = "; ".join(
        [f"{k}: file {list(a)} vs config {list(b)}" for k, a, b in mismatched[:3]]
        + ([f"{len(missing)} tensor(s) the config needs are not in the file ({', '.join(missing[:3])} ...)"]
           if missing else [])
        + ([f"{len(unexpected)} tensor(s) in the file the config has no place for ({', '.join(unexpected[:3])} ...)"]
           if unexpected else []))
    if only is not None and not set(named) & set(only):
        return  # not the file's own statement: the real load reports what does not fit
    what = ("its config field(s) " + ", ".join(f"{f}={fields[f]!r}" for f in named)) if named else "its config"
    raise ValueError(f"{where}: {what} contradict(s) the tensors it holds ({detail}); refusing to build the model")


def check_saved_model(saved: Any, entry: Any) -> None:
    """:func:`check_config_against_header` for a file of ours (a :class:`~vit_attention.weights.saved.SavedModel`
    of registry ``entry``'s model): the config it records against its own tensors, before ``load_model`` builds
    anything."""
    shapes = header_shapes(saved.path, "model." if saved.kind == "train_state" else "")
    check_config_against_header(entry, saved.config, shapes, str(saved.path),
                                partial="features" in saved.metadata)


def check_folder_config(entry: Any, overrides: Mapping[str, Any], weights: str | Path | None, where: str) -> None:
    """A Hugging Face folder's (or hub repository's) ``config.json``, as the config ``overrides`` it gives
    registry ``entry``'s preset, against its weights' header: a contradiction raises ``ValueError`` naming
    the field before ``create_model`` allocates anything. ``weights``: its ``.safetensors`` file, or the
    folder (its shard index read); ``.bin`` files have no header to read without unpickling and are
    checked by the load itself."""
    from .io import shard_files

    if weights is None:
        return
    weights = Path(weights)
    if weights.is_dir():
        shards = shard_files(weights)
        files = [f for f in shards if f.suffix == ".safetensors"] if shards is not None else (
            [weights / "model.safetensors"] if (weights / "model.safetensors").is_file() else [])
    else:
        files = [weights] if weights.suffix == ".safetensors" else []
    if not files:
        return
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update(header_shapes(file))
    config = {**json.loads(entry.config().to_json()), **overrides}
    check_config_against_header(entry, config, shapes, where, foreign=True, only=set(overrides))
