"""``load_model(path)``: the model a file of ours describes, rebuilt from its metadata, weights loaded.

Files that describe their model:

* ``model.safetensors`` written by :func:`vit_attention.save_weights` (metadata ``model`` = the
  registered name, ``config`` = the config as JSON, ``features`` for a features model; training
  runs add ``classes``, ``mean``, ``std``, ``data``, ``crop_pct`` ...);
* a training ``checkpoint.safetensors`` (format ``vit_attention.train_state``: the JSON ``state``
  names ``model_name`` and ``model_config``; the model tensors are stored under ``model.``);
* a run folder ``runs/<run>/`` holding either (``model.safetensors`` preferred).

Nothing is unpickled: both formats are safetensors with JSON metadata.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from ..models.registry import ModelEntry, get_model_entry, resolve_model_name
from .header import check_saved_model
from .io import TRAIN_STATE_FORMAT, features_metadata, read_checkpoint, read_metadata, regular_file
from .load import CheckpointMismatchError, load_weights

__all__ = ["SavedModel", "resolve_model_file", "describe_checkpoint", "load_model", "check_model_name",
           "saved_data_config", "is_checkpoint_path", "RUN_FILES"]

# What a run folder holds, in the order load_model prefers them.
RUN_FILES = ("model.safetensors", "checkpoint.safetensors")
_CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")


def is_checkpoint_path(text: str | Path | None) -> bool:
    """``text`` names an existing run folder or checkpoint file (so a command's MODEL argument is a run, not a
    registered model name: ``attn RUN IMAGE``, ``export RUN``, ``generate RUN``)."""
    if text is None:
        return False
    p = Path(text)
    return p.exists() and (p.is_dir() or p.suffix in _CHECKPOINT_SUFFIXES)


@dataclass(frozen=True)
class SavedModel:
    """What a file of ours says about its model.

    ``kind``: ``"weights"`` (``save_weights``) or ``"train_state"`` (a training checkpoint);
    ``metadata``: the JSON-decoded metadata (weights files) or training state without the
    optimizer and RNG entries (training checkpoints): ``classes``, ``mean``, ``std``, ...
    """

    path: Path
    kind: str
    model_name: str
    config: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


def resolve_model_file(path: str | Path) -> Path:
    """A run folder -> its ``model.safetensors`` (else ``checkpoint.safetensors``); a file -> itself.

    Raises ``FileNotFoundError`` naming the path when it does not exist or a folder holds neither,
    ``ValueError`` when it is not a regular file (a FIFO, a device).
    """
    path = Path(path)
    if path.is_dir():
        for name in RUN_FILES:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"{path} is a folder without {' or '.join(RUN_FILES)}; expected a run folder "
                                "written by `vit-attention train` or a file written by save_weights")
    return regular_file(path)  # missing -> FileNotFoundError; a FIFO or device -> ValueError, nothing opened


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def describe_checkpoint(path: str | Path) -> SavedModel | None:
    """What the file (or run folder) at ``path`` says about its model, or ``None`` when it does not say.

    ``None``: a readable checkpoint without our model metadata (timm, torchvision, a bare state
    dict); it loads with ``create_model(name, pretrained=path)``. Damaged files raise ``ValueError``.
    """
    file = resolve_model_file(path)
    if file.is_dir() or file.suffix != ".safetensors":
        return None
    raw = read_metadata(file)
    if raw.get("format") == TRAIN_STATE_FORMAT:
        state = _json(raw.get("state", "{}"))
        if not isinstance(state, dict) or "model_name" not in state or "model_config" not in state:
            raise ValueError(f"{file} is a training checkpoint without model_name / model_config in its state; "
                             "it cannot say which model it holds")
        meta = {k: v for k, v in state.items() if k not in ("optimizer", "rng")}
        return _check_recorded_data(SavedModel(file, "train_state", str(state["model_name"]),
                                               dict(state["model_config"]), meta))
    if "model" in raw and "config" in raw:
        meta = {k: _json(v) for k, v in raw.items() if k not in ("model", "config")}
        config = _json(raw["config"])
        if not isinstance(config, dict):
            raise ValueError(f"{file}: its 'config' metadata is not a JSON object: {raw['config'][:80]!r}")
        return _check_recorded_data(SavedModel(file, "weights", raw["model"], config, meta))
    return None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_recorded_data(saved: SavedModel) -> SavedModel:
    """``saved`` when the data fields its file records are what training writes; else ``ValueError`` naming the
    file and the field, at once (not "new(): invalid data type 'str'" once the first image is read).

    ``mean`` / ``std``: lists of finite numbers, one per input channel (or one for all), ``std`` positive
    (those of a recorded ``data_config`` too: a pretrained model's RGB values, fitted to the channels later);
    ``crop_pct``: a positive number; ``classes``: a list (of names).
    """
    md = saved.metadata
    channels = saved.config.get("in_chans")
    data_config = md.get("data_config")
    if data_config is not None and not isinstance(data_config, dict):
        raise ValueError(f"{saved.path}: its recorded 'data_config' must be a JSON object; got "
                         f"{str(data_config)[:80]!r}")
    for key, v in [(k, md[k]) for k in ("mean", "std") if k in md] + [
            (f"data_config.{k}", data_config[k]) for k in ("mean", "std") if data_config and k in data_config]:
        ok = isinstance(v, list) and v and all(_is_number(x) for x in v) \
            and (key.startswith("data_config") or not isinstance(channels, int) or len(v) in (1, channels)) \
            and (not key.endswith("std") or all(x > 0 for x in v))
        if not ok:
            raise ValueError(f"{saved.path}: its recorded {key!r} must be a list of finite numbers, one per input "
                             f"channel ({channels}){', positive' if key.endswith('std') else ''}; got {str(v)[:80]!r}")
    crop = md.get("crop_pct")
    if crop is not None and not (_is_number(crop) and crop > 0):
        raise ValueError(f"{saved.path}: its recorded 'crop_pct' must be a positive number; got {str(crop)[:80]!r}")
    if "classes" in md and not isinstance(md["classes"], list):
        raise ValueError(f"{saved.path}: its recorded 'classes' must be a list of class names; got "
                         f"{str(md['classes'])[:80]!r}")
    return saved


def check_model_name(saved: SavedModel, name: str | None, *, option: str = "model", hint: str | None = None) -> None:
    """Raise ``ValueError`` when ``name`` (aliases resolved) is not the model ``saved`` describes.

    ``option`` names the argument in the message; ``hint`` replaces the default advice.
    """
    if name is None:
        return
    if resolve_model_name(name) != resolve_model_name(saved.model_name):
        advice = hint or f"leave {option} out (the file says what it is) or give {saved.model_name!r}"
        raise ValueError(f"{option} {name!r} contradicts the checkpoint: {saved.path} describes model "
                         f"{saved.model_name!r}; {advice}")


def check_options_agree(saved: SavedModel, options: Mapping[str, Any], names: Mapping[str, str] | None = None
                        ) -> None:
    """Config ``options`` given beside a file of ours may repeat what it records, never contradict it: a value
    other than the saved one, or an option its model does not have, raises ``ValueError`` naming it as the
    command line does (``names``: key -> option, default ``--model-arg KEY``)."""
    names = names or {}
    for key, value in options.items():
        option = names.get(key, f"--model-arg {key}")
        if key not in saved.config:
            raise ValueError(f"{option}: {saved.model_name} has no config option {key!r}")
        if json.dumps(saved.config[key]) != json.dumps(value):
            raise ValueError(f"{option} {value!r} contradicts the checkpoint: {saved.path} holds a "
                             f"{saved.model_name} with {key}={saved.config[key]!r}; leave the option out")


def _registry_entry(saved: SavedModel) -> ModelEntry:
    """The registry entry of the model ``saved`` describes (its name resolved once, here); ``ValueError`` when it
    is not registered."""
    try:
        return get_model_entry(saved.model_name)
    except KeyError as e:
        raise ValueError(f"{saved.path} describes model {saved.model_name!r}, which is not registered here: "
                         f"{e.args[0] if e.args else e}") from None


def _build(saved: SavedModel, entry: ModelEntry, overrides: Mapping[str, Any], device: str | torch.device | None
           ) -> nn.Module:
    """The model ``saved`` records (its config with ``overrides``; a features model as it was saved, its head
    left out), built by :meth:`~vit_attention.models.registry.ModelEntry.build` on ``device``, no weights."""
    fields = {f.name for f in dataclasses.fields(entry.config_cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"load_model: {saved.model_name} has no config option(s) {unknown}; valid: {sorted(fields)}")
    try:
        cfg = entry.config_cls.from_dict({**saved.config, **overrides})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{saved.path}: its {saved.model_name} config does not build with this version of "
                         f"vit_attention: {e}") from None
    features = features_metadata(saved.metadata, saved.path)
    with torch.device(device or "cpu"):
        if features is None:
            return entry.build(cfg)
        try:  # saved with features_only=True: the same features model
            return entry.build(cfg, features=features)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{saved.path} holds a features model of {saved.model_name} that does not build: {e}"
                             ) from None


def _model_tensors(saved: SavedModel) -> dict[str, Tensor]:
    if saved.kind != "train_state":
        return read_checkpoint(saved.path)[0]
    try:
        with safe_open(str(saved.path), framework="pt") as f:
            return {k[len("model."):]: f.get_tensor(k) for k in f.keys() if k.startswith("model.")}
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(f"cannot read {saved.path}: {e}; it may be truncated") from None


def load_model(path: str | Path, *, device: str | torch.device | None = None, model: str | None = None,
               **overrides: Any) -> nn.Module:
    """The model a file of ours describes, with its weights, in eval mode.

    ``path``: a ``.safetensors`` file written by :func:`vit_attention.save_weights`, a training
    ``checkpoint.safetensors``, or a run folder holding one. The registered name and the config
    (``num_classes``, ``in_chans``, ``img_size``, depth ...) come from the file, so
    ``load_model(save_weights(m, p))`` gives back ``m`` exactly (same outputs, bit for bit, same
    dtype), a features model (``create_model(..., features_only=True)``) as a features model with
    its ``out_indices``, ``output_fmt`` and ``norm``, token merging (``set_token_merging``) as it was set.
    ``model``: a name the file must describe
    (aliases allowed; a different one raises ``ValueError`` saying which model the file holds).
    ``overrides``: config fields to change
    (e.g. ``img_size`` resamples position embeddings; ``num_classes`` re-makes the head with a
    warning). The data config the file records (``save_weights`` of a pretrained model, or a
    training run's mean / std / crop / classes) becomes ``model.pretrained_cfg``, which
    :func:`vit_attention.data.resolve_data_config` reads. A recorded config that contradicts the file's
    tensors (their names and shapes, read from the header) raises ``ValueError`` naming the field before
    anything is allocated (:mod:`vit_attention.weights.header`). Returns the model (images
    ``[B, Cin, H, W]`` -> logits ``[B, num_classes]``; a features model -> its list of maps).
    """
    saved = describe_checkpoint(path)
    if saved is None:
        raise ValueError(f"{resolve_model_file(path)} does not record which model it holds (no 'model' / "
                         "'config' metadata: not written by save_weights or a training run); build the model "
                         "first: create_model(NAME, pretrained=path)")
    check_model_name(saved, model)
    entry = _registry_entry(saved)
    check_saved_model(saved, entry)  # the recorded config against the file's tensor header, before allocating anything
    net = _build(saved, entry, overrides, device)
    state = _model_tensors(saved)
    dtypes = {v.dtype for k, v in state.items() if v.is_floating_point()}
    if len(dtypes) == 1:
        (dtype,) = dtypes
        if dtype != torch.float32:
            net.to(dtype)  # saved in bf16 / fp16: come back in that dtype
    try:
        load_weights(net, state, format="vit_attention", strict=True)
    except CheckpointMismatchError as e:
        raise ValueError(f"{saved.path} does not fit the {saved.model_name} it describes: {e}") from None
    merging = saved.metadata.get("token_merging")
    if merging is not None:  # save_weights of a model with set_token_merging: merging as it was
        if not isinstance(merging, dict) or not isinstance(merging.get("schedule"), list):
            raise ValueError(f"{saved.path}: its 'token_merging' metadata is not a record of schedule and prop_attn: "
                             f"{str(merging)[:80]!r}")
        net.set_token_merging(merging["schedule"], prop_attn=bool(merging.get("prop_attn", True)))  # type: ignore
    pcfg = saved_data_config(saved)
    if pcfg is not None:
        net.pretrained_cfg = pcfg  # type: ignore[assignment]
    return net.eval()


def saved_data_config(saved: SavedModel) -> dict[str, Any] | None:
    """The data config a file records (``pretrained_cfg`` dict), or ``None`` when it records none.

    ``save_weights`` of a model built by ``create_model`` records its ``data_config``; a training
    run records its normalisation (``mean``, ``std``), ``crop_pct`` and ``classes``, which
    become a config with its bicubic centre crop (how training read image folders).
    """
    md = saved.metadata
    cfg = dict(md["data_config"]) if isinstance(md.get("data_config"), dict) else None
    trained = {k: md[k] for k in ("mean", "std", "crop_pct") if k in md}
    if "crop_pct" not in trained and isinstance(md.get("config"), dict) and "crop_pct" in md["config"]:
        trained["crop_pct"] = md["config"]["crop_pct"]
    if trained:
        cfg = {**(cfg or {"interpolation": "bicubic", "crop_mode": "center"}), **trained}
        classes = md.get("classes")
        if isinstance(classes, list):
            cfg["label_names"], cfg["num_classes"] = [str(c) for c in classes], len(classes)
    return cfg
