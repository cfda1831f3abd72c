"""Training checkpoints in a safe format: one safetensors file, written atomically, nothing pickled.

``checkpoint.safetensors`` holds every tensor of the run under a prefix (``model.``, ``ema.``,
``optim.``, ``rng.``); its metadata ``state`` entry is the JSON state: epoch, step, position in the
epoch, running sums of the epoch, optimizer hyper-parameters and scalars, Python / NumPy RNG
states, the training config, the model name and config, and the metrics so far. Because all of
it is one file moved into place with ``os.replace``, a run killed at any moment leaves either the
previous checkpoint or the new one. A readable copy of the JSON goes to ``checkpoint.json``.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from ..weights.io import atomic_write, atomic_write_text

__all__ = ["CHECKPOINT_NAME", "TrainingState", "optimizer_state_to_safe", "optimizer_state_from_safe",
           "capture_rng_state", "restore_rng_state", "save_training_state", "load_training_state",
           "check_resume_compatible", "read_saved_config", "check_training_state"]

CHECKPOINT_NAME = "checkpoint.safetensors"
FORMAT = "vit_attention.train_state"


@dataclass
class TrainingState:
    """What a checkpoint holds: tensors grouped by prefix and the JSON ``state``."""

    model: dict[str, Tensor]
    ema: dict[str, Tensor]
    optim: dict[str, Tensor]
    rng: dict[str, Tensor]
    state: dict[str, Any]


def optimizer_state_to_safe(sd: Mapping[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (``state/<param>/<name>``) and JSON-able scalars."""
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    key_types: dict[str, str] = {}
    for pid, pstate in sd["state"].items():
        key = str(pid)
        key_types[key] = type(pid).__name__
        for name, v in pstate.items():
            if isinstance(v, Tensor):
                tensors[f"state/{key}/{name}"] = v.detach().to("cpu").contiguous().clone()  # keys may hold dots
            else:
                scalars.setdefault(key, {})[name] = v
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    tuple_keys = sorted({k for g in sd["param_groups"] for k, v in g.items() if isinstance(v, tuple)})
    return tensors, {"param_groups": groups, "scalars": scalars, "key_types": key_types, "tuple_keys": tuple_keys}


def optimizer_state_from_safe(tensors: Mapping[str, Tensor], meta: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`optimizer_state_to_safe`: an ``optimizer.load_state_dict`` input."""
    def typed(key: str) -> int | str:
        return int(key) if meta["key_types"].get(key) == "int" else key

    state: dict[Any, dict[str, Any]] = {}
    for name, t in tensors.items():
        pid, field = name.removeprefix("state/").rsplit("/", 1)
        state.setdefault(typed(pid), {})[field] = t
    for pid, scal in meta["scalars"].items():
        state.setdefault(typed(pid), {}).update(scal)
    tuple_keys = set(meta.get("tuple_keys", ()))
    groups = [{k: (tuple(v) if k in tuple_keys and isinstance(v, list) else v) for k, v in g.items()}
              for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def capture_rng_state() -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Torch (CPU and CUDA), NumPy and Python RNG states as tensors + JSON."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    tensors["numpy"] = torch.from_numpy(np.asarray(np_keys, dtype=np.int64))
    py = random.getstate()
    meta = {"numpy": [np_name, int(np_pos), int(np_has_gauss), float(np_gauss)],
            "python": [py[0], list(py[1]), py[2]]}
    return tensors, meta


def restore_rng_state(tensors: Mapping[str, Tensor], meta: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(tensors["torch"].to(torch.uint8))
    cuda = [tensors[k] for k in sorted((k for k in tensors if k.startswith("cuda.")), key=lambda k: int(k[5:]))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([c.to(torch.uint8) for c in cuda[:torch.cuda.device_count()]])
    name, pos, has_gauss, gauss = meta["numpy"]
    np.random.set_state((name, tensors["numpy"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = meta["python"]
    random.setstate((version, tuple(internal), gauss_next))


def save_training_state(path: str | Path, *, model_state: Mapping[str, Tensor], optimizer_state: Mapping[str, Any],
                        state: Mapping[str, Any], ema_state: Mapping[str, Tensor] | None = None) -> Path:
    """Write the whole training state to ``path`` atomically (plus a readable ``.json`` copy beside it).

    ``model_state`` / ``ema_state``: state dicts; ``optimizer_state``: ``optimizer.state_dict()``;
    ``state``: JSON-able run state (epoch, step, config, metrics, ...). RNG states are captured here.
    """
    path = Path(path)
    optim_t, optim_meta = optimizer_state_to_safe(optimizer_state)
    rng_t, rng_meta = capture_rng_state()
    tensors: dict[str, Tensor] = {}
    for prefix, group in (("model", model_state), ("ema", ema_state or {}), ("optim", optim_t), ("rng", rng_t)):
        for k, v in group.items():
            tensors[f"{prefix}.{k}"] = v.detach().to("cpu").contiguous().clone()
    full_state = dict(state, optimizer=optim_meta, rng=rng_meta)
    text = json.dumps(full_state, sort_keys=True)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT, "state": text}))
    readable = {k: v for k, v in full_state.items() if k != "rng"}
    atomic_write_text(path.with_suffix(".json"), json.dumps(readable, indent=1))
    return path


def load_training_state(path: str | Path) -> TrainingState:
    """Read a checkpoint written by :func:`save_training_state` (``FileNotFoundError`` / ``ValueError`` if not one)."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint to resume from: {path} does not exist")
    groups: dict[str, dict[str, Tensor]] = {"model": {}, "ema": {}, "optim": {}, "rng": {}}
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"{path} is not a vit-attention training checkpoint (format "
                                 f"{meta.get('format')!r}); resume needs the {CHECKPOINT_NAME} a training run wrote")
            for key in f.keys():
                prefix, _, name = key.partition(".")
                if prefix not in groups or not name:
                    raise _damaged(path, f"the tensor {key!r} is not under model., ema., optim. or rng.")
                groups[prefix][name] = f.get_tensor(key)
    except (OSError, RuntimeError, SafetensorError) as e:  # damaged or foreign files
        raise ValueError(f"cannot read checkpoint {path}: {e}") from None
    state = _parse_state(meta, path)
    return TrainingState(groups["model"], groups["ema"], groups["optim"], groups["rng"], state)


def _damaged(path: Path, problem: str) -> ValueError:
    return ValueError(f"checkpoint {path} is damaged or was edited: {problem}; resume from an intact checkpoint, "
                      "or start a new run in another --output")


def _parse_state(meta: Mapping[str, str], path: Path) -> dict[str, Any]:
    """The JSON ``state`` of a checkpoint's metadata (``ValueError`` naming the file when absent or not an object)."""
    try:
        state = json.loads(meta["state"])
    except KeyError:
        raise _damaged(path, "its metadata has no 'state' entry") from None
    except json.JSONDecodeError as e:
        raise _damaged(path, f"its 'state' metadata is not valid JSON ({e})") from None
    if not isinstance(state, dict):
        raise _damaged(path, f"its 'state' metadata must be a JSON object, got {type(state).__name__}")
    return state


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


# The state fields a resume reads: (field, check, what is expected).
_STATE_FIELDS: tuple[tuple[str, Any, str], ...] = (
    ("epoch", _is_count, "a non-negative integer (full epochs done)"),
    ("step_in_epoch", _is_count, "a non-negative integer (steps done in the current epoch)"),
    ("global_step", _is_count, "a non-negative integer (optimizer steps done)"),
    ("epoch_sums", lambda v: isinstance(v, list) and len(v) == 3 and all(map(_is_number, v)),
     "a list of 3 finite non-negative numbers (the epoch's loss sum, correct and count)"),
    ("epoch_train_time", _is_number, "a finite non-negative number of seconds"),
    ("history", lambda v: isinstance(v, list) and all(isinstance(h, dict) for h in v),
     "a list of metrics rows (objects)"),
    ("config", lambda v: isinstance(v, dict), "an object (the training options)"),
    ("model_name", lambda v: isinstance(v, str) and bool(v), "a registered model name"),
    ("model_config", lambda v: isinstance(v, dict), "an object (the model's config)"),
    ("optimizer", lambda v: isinstance(v, dict) and isinstance(v.get("param_groups"), list)
     and isinstance(v.get("scalars"), dict) and isinstance(v.get("key_types"), dict),
     "an object with param_groups, scalars and key_types"),
    ("rng", lambda v: isinstance(v, dict) and isinstance(v.get("numpy"), list) and len(v["numpy"]) == 4
     and isinstance(v.get("python"), list) and len(v["python"]) == 3, "an object with the numpy and python states"),
)


def check_training_state(state: Mapping[str, Any], rng: Mapping[str, Tensor], path: str | Path) -> None:
    """Raise ``ValueError`` naming the field and ``path`` when a checkpoint's state cannot be resumed from.

    Every field a resume reads must be present with its type and range (:data:`_STATE_FIELDS`), e.g.
    ``epoch`` a non-negative integer; the RNG tensors ``rng.torch`` / ``rng.numpy`` must be there.
    """
    path = Path(path)
    for name, ok, expected in _STATE_FIELDS:
        if name not in state:
            raise _damaged(path, f"its state has no {name!r} field (expected {expected})")
        if not ok(state[name]):
            raise _damaged(path, f"its state field {name!r} must be {expected}, got {state[name]!r}"[:400])
    for name in ("torch", "numpy"):
        if name not in rng:
            raise _damaged(path, f"the tensor 'rng.{name}' (a random generator's state) is missing")


def read_saved_config(output: str | Path) -> dict[str, Any]:
    """The training options (``TrainConfig`` fields) saved in the checkpoint of the run folder ``output``.

    Reads only the file's metadata. Raises ``FileNotFoundError`` / ``ValueError`` naming ``--output``
    when the folder holds no readable training checkpoint.
    """
    path = Path(output) / CHECKPOINT_NAME
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint to resume from: {path} does not exist (--resume continues the run "
                                "in --output, which must be a run folder)")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (OSError, RuntimeError, SafetensorError) as e:
        raise ValueError(f"cannot read checkpoint {path} (--output): {e}") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a vit-attention training checkpoint (format {meta.get('format')!r}); "
                         f"--resume needs the {CHECKPOINT_NAME} a training run wrote")
    config = _parse_state(meta, path).get("config", {})
    if not isinstance(config, dict):
        raise _damaged(path, f"its state field 'config' must be an object (the training options), got {config!r}")
    return dict(config)


def check_resume_compatible(ckpt: TrainingState, model_name: str, model_config: Mapping[str, Any],
                            path: str | Path) -> None:
    """Raise ``ValueError`` when the checkpoint was written for another model or model config."""
    saved_name = ckpt.state.get("model_name")
    if saved_name != model_name:
        raise ValueError(f"checkpoint {path} belongs to model {saved_name!r}, but this run builds {model_name!r}; "
                         "resume with the same --model (or start a new run in another --output folder)")
    saved_cfg = ckpt.state.get("model_config", {})
    diff = sorted(k for k in set(saved_cfg) | set(model_config)
                  if json.dumps(saved_cfg.get(k), sort_keys=True) != json.dumps(model_config.get(k), sort_keys=True))
    if diff:
        detail = ", ".join(f"{k}: checkpoint {saved_cfg.get(k)!r} vs run {model_config.get(k)!r}" for k in diff[:6])
        raise ValueError(f"checkpoint {path} was written for a different {model_name} configuration ({detail})")
