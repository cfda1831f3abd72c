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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

__all__ = ["header_shapes", "check_config_against_header"]


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
                                where: str, *, partial: bool = False) -> None:
    """Raise ``ValueError`` naming the field when ``config`` (a registry ``entry``'s fields) contradicts ``shapes``.

    ``shapes``: the file's tensors in the model's own layout (:func:`header_shapes`). ``partial``: the
    file may lack some of the model's tensors (a features model's head and pruned layers), so only
    tensors the file has are compared. Cost: the model built once on the meta device.
    """
    n = len(shapes)
    for name in _depth_fields(config):
        layers = _layers(config[name])
        if layers > n:
            raise ValueError(f"{where}: its config says {name}={config[name]!r} ({layers} layers), but the file "
                             f"holds only {n} tensors: the config contradicts the weights; refusing to build it")
    try:
        cfg = entry.config_cls.from_dict(dict(config))
    except (TypeError, ValueError):
        return  # the real build reports a config that does not build, naming the file
    with torch.device("meta"):
        model = entry.model_cls(cfg)
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    unexpected = sorted(set(shapes) - set(own))
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
    if (unexpected or missing) and not mismatched:
        named += [f for f in _depth_fields(fields) if f not in named]
    detail = "; ".join(
        [f"{k}: file {list(a)} vs config {list(b)}" for k, a, b in mismatched[:3]]
        + ([f"{len(missing)} tensor(s) the config needs are not in the file ({', '.join(missing[:3])} ...)"]
           if missing else [])
        + ([f"{len(unexpected)} tensor(s) in the file the config has no place for ({', '.join(unexpected[:3])} ...)"]
           if unexpected else []))
    what = ("its config field(s) " + ", ".join(f"{f}={fields[f]!r}" for f in named)) if named else "its config"
    raise ValueError(f"{where}: {what} contradict(s) the tensors it holds ({detail}); refusing to build the model")


def check_saved_model(saved: Any) -> None:
    """:func:`check_config_against_header` for a file of ours (a :class:`~vit_attention.weights.saved.SavedModel`):
    the config it records against its own tensors, before ``load_model`` builds anything."""
    from ..models.registry import get_model_entry

    try:
        entry = get_model_entry(saved.model_name)
    except KeyError:
        return  # load_model names the unregistered model
    shapes = header_shapes(saved.path, "model." if saved.kind == "train_state" else "")
    check_config_against_header(entry, saved.config, shapes, str(saved.path),
                                partial="features" in saved.metadata)
