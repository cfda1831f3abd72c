"""Safe checkpoint I/O: never unpickles arbitrary objects; writes are atomic.

Reading: ``.safetensors`` (preferred), ``.pth`` / ``.pt`` / ``.bin`` / ``.ckpt`` through
``torch.load(weights_only=True)``, or a Hugging Face model folder (single or sharded files).
A training ``checkpoint.safetensors`` (format ``vit_attention.train_state``) reads as its model
tensors only. Damaged, truncated or foreign files raise ``ValueError`` naming the file; only regular
files are read (no FIFO, no device), a sharded folder's shards must lie inside it, and a compressed
``.pth`` is size-checked from its zip directory before anything is inflated (docs/safe_loading.md).
Writing: safetensors to a temporary file in the same folder, fsync, then ``os.replace``; only to
a ``.safetensors`` path (a ``.pth`` name holding safetensors bytes would mislead every reader).
Every other file the library writes goes through the same :func:`atomic_write` (text:
:func:`atomic_write_text`): a symlink at the target is replaced, never written through.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import secrets
import stat
import tarfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

__all__ = ["UnsafeCheckpointError", "read_checkpoint", "unwrap_state_dict", "save_weights", "atomic_write",
           "atomic_write_text",
           "regular_file", "shard_files",
           "read_metadata", "model_metadata", "features_metadata", "TRAIN_STATE_FORMAT"]

# The ``format`` metadata of a training checkpoint (vit_attention.train.checkpoint writes it); its model
# tensors are stored under the ``model.`` prefix, next to ``ema.``, ``optim.`` and ``rng.``.
TRAIN_STATE_FORMAT = "vit_attention.train_state"
_TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".tar")

_WRAPPER_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model", "module", "params", "model_state")


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A pickle checkpoint holds objects other than tensors and plain containers."""


def _umask() -> int:
    """The process umask (read by setting and restoring it: the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _create_temp(folder: Path, prefix: str, suffix: str, made: list[str]) -> str:
    """Create a new empty file ``folder/<prefix><random><suffix>`` (mode ``0o600``) and return its path.

    Each name is appended to ``made`` *before* the file is created, so a caller's cleanup sees it
    whatever instant an exception arrives.
    """
    for _ in range(100):
        name = str(folder / f"{prefix}{secrets.token_hex(6)}{suffix}")
        made.append(name)
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return name
        except FileExistsError:
            made.pop()
    raise FileExistsError(f"could not create a temporary file in {folder} (100 names taken)")


def atomic_write(path: str | Path, write: Any) -> Path:
    """Call ``write(tmp_path)`` then atomically move the file to ``path``; returns ``path``.

    A crash at any point leaves either the old file or the new one, never a partial file. The file
    gets the permissions a plain ``open(path, "w")`` would give (``0o666`` less the umask), not
    ``mkstemp``'s private ``0o600``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The name is recorded before the file exists and the file is created inside ``try``: an interrupt
    # (Ctrl-C, or SIGTERM turned into an exception by training) that lands just after the file is made,
    # where ``mkstemp`` would not yet have returned its name, still finds the name to remove.
    made: list[str] = []
    try:
        tmp = _create_temp(path.parent, f".{path.name}.", ".tmp", made)
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        for name in made:
            if os.path.exists(name):
                os.unlink(name)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_write`; returns ``path``.

    Every text file the library writes (JSON reports, Markdown, generated docs) goes through here: a
    symlink planted at ``path`` is replaced by the new file, never written through.
    """
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def probe_writable(folder: str | Path) -> None:
    """Create ``folder`` (and parents) and prove a file can be written in it; ``OSError`` otherwise.

    Commands call it before long work, so a bad output path fails in a second, not after training.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made: list[str] = []
    try:
        _create_temp(folder, ".write-test.", "", made)
    finally:
        for name in made:
            if os.path.exists(name):
                os.unlink(name)


def model_metadata(model: nn.Module) -> dict[str, str]:
    """What :func:`save_weights` records about ``model``: format, registered name, config and data config (JSON).

    A features model (``create_model(..., features_only=True)``) also records ``features``: its
    ``out_indices``, ``output_fmt``, ``norm`` and ``prune`` (see :func:`features_metadata`); a model with
    token merging on records ``token_merging``: its per-block schedule and ``prop_attn``.
    """
    from ..models.features import FeaturesMixin  # weights sits above models

    meta: dict[str, str] = {"format": "vit_attention"}
    cfg = getattr(model, "cfg", None)
    if cfg is not None and hasattr(cfg, "to_json"):
        meta["config"] = cfg.to_json()
    if getattr(model, "registry_name", None):
        meta["model"] = str(model.registry_name)
    pcfg = getattr(model, "pretrained_cfg", None)
    if isinstance(pcfg, Mapping):  # the data config and provenance of its weights (vit_attention.data reads it)
        meta["data_config"] = json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in pcfg.items()},
                                         sort_keys=True)
    if isinstance(model, FeaturesMixin):
        meta["features"] = json.dumps({"out_indices": list(model.out_indices), "output_fmt": model.output_fmt,
                                       "norm": bool(model.feature_norm), "prune": bool(model.feature_prune)})
    merging = getattr(model, "token_merging", None)
    if merging is not None:  # set_token_merging's per-block schedule and prop_attn (load_model sets them again)
        meta["token_merging"] = json.dumps({"schedule": [int(r) for r in merging[0]], "prop_attn": bool(merging[1])})
    return meta


def features_metadata(meta: Mapping[str, Any], where: str | Path = "checkpoint") -> dict[str, Any] | None:
    """The features-model settings a file's metadata records (``out_indices``, ``output_fmt``, ``norm``, ``prune``),
    or ``None``.

    ``meta``: the raw string metadata (:func:`read_metadata`) or JSON-decoded values. A record that
    is not what :func:`model_metadata` writes raises ``ValueError`` naming ``where``.
    """
    raw = meta.get("features")
    if raw is None:
        return None
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        value = None
    ok = isinstance(value, Mapping) and isinstance(value.get("out_indices"), list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value["out_indices"]) and value["out_indices"] \
        and isinstance(value.get("output_fmt"), str) and isinstance(value.get("norm", False), bool) \
        and isinstance(value.get("prune", False), bool)
    if not ok:
        raise ValueError(f"{where}: its 'features' metadata is not a features-model record "
                         f"(out_indices, output_fmt, norm, prune): {str(raw)[:80]!r}")
    return {"out_indices": tuple(value["out_indices"]), "output_fmt": value["output_fmt"],
            "norm": bool(value.get("norm", False)),
            "prune": bool(value.get("prune", False))}  # files from before pruning kept every layer


def save_weights(model_or_state: nn.Module | Mapping[str, Tensor], path: str | Path,
                 metadata: Mapping[str, Any] | None = None) -> Path:
    """Write a state dict (or a module's) as safetensors, atomically, in our own format; returns ``path``.

    ``path`` must end in ``.safetensors``. ``metadata`` values are JSON-encoded unless already
    strings; a model's ``cfg``, registered name and data config (``pretrained_cfg``: input size,
    mean / std, crop, interpolation, the weights' hub id and license) are recorded so the file says
    what it is and :func:`vit_attention.load_model` can rebuild it as it was (a features model as a
    features model: its ``out_indices``, ``output_fmt`` and ``norm`` are recorded too).
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"save_weights writes safetensors: path {str(path)!r} must end in '.safetensors' "
                         f"(got {path.suffix or 'no suffix'!r}); another name would make other tools read the "
                         "file as something it is not")
    if isinstance(model_or_state, nn.Module):
        state = model_or_state.state_dict()
        meta = model_metadata(model_or_state)
    else:
        state, meta = dict(model_or_state), {"format": "vit_attention"}
    for k, v in (metadata or {}).items():
        meta[k] = v if isinstance(v, str) else json.dumps(v)
    # safetensors refuses shared / non-contiguous storage: store independent contiguous copies.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items() if isinstance(v, Tensor)}
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def regular_file(path: str | Path) -> Path:
    """``path`` when it is (or links to) a regular file; otherwise an error naming it, before anything is opened.

    A FIFO would block the reader forever and a device such as ``/dev/zero`` would be read without
    end: only regular files are read. A missing path raises ``FileNotFoundError``, anything else
    that is not a regular file (FIFO, device, socket, folder) ``ValueError``.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode  # follows symlinks: the file that would be read
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint not found: {path}") from None
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a folder" if stat.S_ISDIR(mode) else "not a file")
        raise ValueError(f"{path} is {kind}, not a regular file: only regular files are read as checkpoints")
    return path


def _unreadable_safetensors(path: Path, err: BaseException) -> ValueError:
    size = path.stat().st_size if path.exists() else 0
    return ValueError(f"cannot read {path}: not a complete safetensors file ({size} bytes; {err}). It may be "
                      "truncated (an interrupted download, copy or save) or not a safetensors file at all; "
                      "re-download or re-save it")


def read_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a safetensors file (empty dict for other formats); damaged files raise ``ValueError``."""
    path = Path(path)
    if path.suffix != ".safetensors":
        return {}
    regular_file(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, RuntimeError) as e:
        raise _unreadable_safetensors(path, e) from None


def _read_safetensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; a training checkpoint gives its ``model.`` tensors only."""
    meta = read_metadata(path)
    try:
        if meta.get("format") == TRAIN_STATE_FORMAT:
            with safe_open(str(path), framework="pt") as f:
                state = {k[len("model."):]: f.get_tensor(k) for k in f.keys() if k.startswith("model.")}
        else:
            state = load_file(str(path))
    except (SafetensorError, OSError, RuntimeError) as e:
        raise _unreadable_safetensors(path, e) from None
    return state, meta


def _check_inflated_sizes(path: Path, max_bytes: int | None) -> None:
    """Refuse a zip-format torch checkpoint whose compressed entries would inflate past ``max_bytes`` in all.

    torch.save stores entries uncompressed (their size is the file's own); a compressed entry is
    inflated in full by ``torch.load`` before any shape can be checked, so its declared size (the zip
    directory, read without inflating anything) is checked first.
    """
    if max_bytes is None:
        return
    with zipfile.ZipFile(path) as z:
        inflated = [(i.filename, i.file_size) for i in z.infolist() if i.compress_type != zipfile.ZIP_STORED]
    total = sum(size for _, size in inflated)
    if total > max_bytes:
        name, size = max(inflated, key=lambda item: item[1])
        raise ValueError(f"refusing to load {path}: its compressed entries inflate to {total:,} bytes (the "
                         f"largest, {name!r}, {size:,}), more than the {max_bytes:,} bytes this model's weights "
                         "could need; the file is damaged or not a checkpoint for this model")


def _torch_load_safe(path: Path, max_bytes: int | None = None) -> Any:
    with open(path, "rb") as f:
        head = f.read(4)
    is_zip = zipfile.is_zipfile(path)
    if is_zip:
        try:
            _check_inflated_sizes(path, max_bytes)
        except zipfile.BadZipFile as e:
            raise ValueError(f"{path} is not a readable torch checkpoint (truncated or damaged?): {e}") from None
    # torch.save writes a zip archive (PK..); the legacy format and plain pickles start with PROTO (0x80).
    if not (is_zip or head[:1] == b"\x80" or tarfile.is_tarfile(path)):
        raise ValueError(f"{path} is not a torch checkpoint: torch.save writes a zip archive or a pickle, and this "
                         f"file is neither (it starts with {head!r}). Check the path; a safetensors file must "
                         "be named *.safetensors")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(_unsafe_pickle_message(path, e)) from None
    except (EOFError, LookupError, RuntimeError, ValueError, zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path} is not a readable torch checkpoint (truncated or damaged?): "
                         f"{type(e).__name__}: {e}") from None


def _unsafe_pickle_message(path: Path, e: pickle.UnpicklingError) -> str:
    """Why ``path`` is refused and how to convert it safely (rather than torch's hint to load it unrestricted)."""
    found = re.search(r"Unsupported (?:global|operand)[^\n]*?(?= was not an allowed|\. Please|\n|$)", str(e))
    what = f" ({found.group(0)})" if found else ""
    return (f"refusing to load {path}: it is a pickle holding objects other than tensors and plain containers{what}, "
            "and unpickling those can run arbitrary code. Convert it once, in a throwaway sandbox (a container or VM "
            "without your files or credentials): load it there, keep only its tensors (the state dict) and write them "
            "with safetensors.torch.save_file(state_dict, 'model.safetensors'); then load that .safetensors file")


_SHARD_SUFFIXES = (".safetensors", ".bin")


def shard_files(folder: str | Path) -> list[Path] | None:
    """The shard files a Hugging Face folder's index names (sorted, each once), or ``None`` without an index.

    The index (``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``) must hold a
    ``weight_map`` object of tensor name -> file name; each file must be a ``.safetensors`` /
    ``.bin`` file inside ``folder`` (no absolute paths, no ``..``, no symlink leading out, not the
    folder itself). Anything else raises ``ValueError`` naming the index and the entry.
    """
    folder = Path(folder)
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if not index.exists():
            continue
        try:
            data = json.loads(regular_file(index).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read shard index {index}: {e}") from None
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: 'weight_map' must be a non-empty object of tensor name -> shard file, got "
                             f"{type(weight_map).__name__}")
        root = folder.resolve()
        names: set[str] = set()
        for name in weight_map.values():
            ok = isinstance(name, str) and name and not Path(name).is_absolute() \
                and Path(name).suffix in _SHARD_SUFFIXES
            target = (folder / name).resolve() if ok else root
            if target == root or not target.is_relative_to(root):
                raise ValueError(f"{index}: weight_map names shard {name!r}; a shard must be a .safetensors or "
                                 f".bin file inside {folder} (no absolute path, no '..')")
            names.add(name)
        return [folder / name for name in sorted(names)]
    return None


def _read_hf_folder(path: Path, max_bytes: int | None = None) -> dict[str, Tensor]:
    shards = shard_files(path)
    if shards is not None:
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(_read_file(shard, max_bytes)[0])
        return state
    for name in ("model.safetensors", "pytorch_model.bin", "model.pth"):
        if (path / name).exists():
            return _read_file(path / name, max_bytes)[0]
    raise FileNotFoundError(f"{path} is a folder without model.safetensors, pytorch_model.bin or a shard index")


def read_checkpoint(path: str | Path, *, max_bytes: int | None = None) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Read tensors and metadata from a file or Hugging Face folder, safely.

    Returns ``(state_dict, metadata)``; wrappers such as ``{'model': ...}`` are not removed here
    (see :func:`unwrap_state_dict`). A training checkpoint gives its model tensors (no optimizer,
    EMA or RNG state). Files that are not what their name says raise ``ValueError`` naming them;
    only regular files are read (:func:`regular_file`); a folder's shards must lie inside it
    (:func:`shard_files`). ``max_bytes``: the most a zip-format torch file's compressed entries may
    inflate to, checked from the zip directory before inflating anything (``None``: no bound).
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.is_dir():
        config = path / "config.json"
        meta = {"hf_config": regular_file(config).read_text()} if config.exists() else {}
        return _read_hf_folder(path, max_bytes), meta
    return _read_file(path, max_bytes)


def _read_file(path: Path, max_bytes: int | None) -> tuple[dict[str, Tensor], dict[str, str]]:
    """:func:`read_checkpoint` of one file."""
    if path.suffix not in (".safetensors", *_TORCH_SUFFIXES):
        raise ValueError(f"unsupported checkpoint {path.name!r}: expected .safetensors, .pth, .pt, .bin, .ckpt "
                         "or a Hugging Face model folder")
    regular_file(path)
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    obj = _torch_load_safe(path, max_bytes)
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path} holds a {type(obj).__name__}, expected a state dict (mapping of tensors)")
    return dict(obj), {}


def unwrap_state_dict(obj: Mapping[str, Any]) -> dict[str, Tensor]:
    """Strip training wrappers (``{'model': sd}``, ``{'state_dict': sd}``, facebookresearch/hiera's
    ``{'model_state': sd}``, ...) and ``module.`` prefixes."""
    state: Mapping[str, Any] = obj
    for _ in range(3):
        if any(isinstance(v, Tensor) for v in state.values()):
            break
        for key in _WRAPPER_KEYS:
            if isinstance(state.get(key), Mapping) and state[key]:
                state = state[key]
                break
        else:
            break
    tensors = {k: v for k, v in state.items() if isinstance(v, Tensor)}
    if not tensors:
        raise ValueError(f"no tensors found in checkpoint (top-level keys: {sorted(obj)[:10]})")
    for prefix in ("module.", "_orig_mod.", "model."):
        if all(k.startswith(prefix) for k in tensors):
            tensors = {k[len(prefix):]: v for k, v in tensors.items()}
    return tensors
