"""What is safe to load (docs/safe_loading.md): regular files only, shards inside their folder, sizes checked
before inflating, dtypes and finiteness checked, malformed position tables reported, not crashed on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from model_outputs import distinct_reduced_presets, small_overrides
from safetensors.torch import save_file
from weights.test_hf_folders import CASES as HF_CASES  # the transformers folder cases, one per model type

import vit_attention as va
from vit_attention.weights import CheckpointMismatchError, load_weights, read_checkpoint
from vit_attention.weights.hub import hf_config_overrides


def _tiny(**kw: object) -> torch.nn.Module:
    return va.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=4, **kw).eval()


# ------------------------------------------------------------------------------ regular files only
@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_fifo_and_device_named_as_checkpoints_are_refused_at_once(tmp_path: Path, suffix: str) -> None:
    """A FIFO would block the reader forever, /dev/zero would be read without end: both are refused, naming
    the path, before anything is opened (a subprocess, so a regression times out instead of hanging the run)."""
    fifo, zero = tmp_path / f"fifo{suffix}", tmp_path / f"zero{suffix}"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    code = ("import sys, vit_attention as va\n"
            "from vit_attention.weights import load_weights, read_checkpoint\n"
            "m = va.create_model('vit_tiny_patch16_224', img_size=32, depth=1, num_classes=4)\n"
            "for p in sys.argv[1:]:\n"
            "    for call in (lambda: load_weights(m, p), lambda: read_checkpoint(p), lambda: va.load_model(p)):\n"
            "        try:\n"
            "            call()\n"
            "        except ValueError as e:\n"
            "            assert 'not a regular file' in str(e) and p in str(e), e\n"
            "        else:\n"
            "            raise SystemExit(f'{p} was read')\n"
            "print('refused')\n")
    out = subprocess.run([sys.executable, "-c", code, str(fifo), str(zero)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "refused", out.stderr[-2000:]


@pytest.mark.slow
def test_fifo_config_json_in_a_folder_is_refused_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in _tiny().state_dict().items()}, str(folder / "model.safetensors"))
    os.mkfifo(folder / "config.json")
    code = ("import sys, vit_attention as va\n"
            "from vit_attention.weights import load_weights\n"
            "m = va.create_model('vit_tiny_patch16_224', img_size=32, depth=1, num_classes=4)\n"
            "try:\n"
            "    load_weights(m, sys.argv[1])\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=120)
    assert f"{folder / 'config.json'} is a FIFO, not a regular file" in out.stdout, out.stderr[-2000:]


# ------------------------------------------------------------------------------ shards inside their folder
def _sharded_folder(tmp_path: Path, weight_map: object) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_shards_outside_the_folder_are_refused(tmp_path: Path, where: str) -> None:
    secret = tmp_path / "secret" / "x.safetensors"
    secret.parent.mkdir()
    save_file({"w": torch.ones(2)}, str(secret))
    name = {"parent": "../secret/x.safetensors", "absolute": str(secret), "symlink": "link.safetensors"}[where]
    folder = _sharded_folder(tmp_path, {"w": name})
    if where == "symlink":
        (folder / name).symlink_to(secret)
    with pytest.raises(ValueError, match="inside"):
        read_checkpoint(folder)
    with pytest.raises(ValueError, match=r"weight_map names shard"):
        load_weights(_tiny(), folder)


@pytest.mark.parametrize("weight_map", [["model-00001.safetensors"], {"w": "."}, {"w": ""}, {"w": 3}, {},
                                        {"w": "sub/.."}, "model.safetensors"])
def test_malformed_shard_index_is_a_clear_error(tmp_path: Path, weight_map: object) -> None:
    """A list, a number, the folder itself or nothing: ``ValueError`` naming the index, no IndexError,
    AttributeError or RecursionError."""
    folder = _sharded_folder(tmp_path, weight_map)
    with pytest.raises(ValueError, match="model.safetensors.index.json"):
        read_checkpoint(folder)


def test_shards_inside_the_folder_still_load(tmp_path: Path) -> None:
    model = _tiny()
    sd = model.state_dict()
    keys = sorted(sd)
    half = len(keys) // 2
    folder = _sharded_folder(tmp_path, {k: ("a.safetensors" if i < half else "sub/b.safetensors")
                                        for i, k in enumerate(keys)})
    (folder / "sub").mkdir()
    save_file({k: sd[k].contiguous() for k in keys[:half]}, str(folder / "a.safetensors"))
    save_file({k: sd[k].contiguous() for k in keys[half:]}, str(folder / "sub" / "b.safetensors"))
    assert load_weights(_tiny(), folder).ok


# ------------------------------------------------------------------------------ sizes before inflating
def test_compressed_pth_declaring_too_much_is_refused_before_inflating(tmp_path: Path) -> None:
    """torch.save stores zip entries uncompressed; one deflated entry declaring 256 MiB (a few hundred KB on
    disk) for a model of under 1 MB is refused from the zip directory, naming the entry."""
    model = _tiny()
    plain = tmp_path / "plain.pth"
    torch.save({**model.state_dict(), "pos_embed": torch.zeros(64 * 2**20)}, plain)
    bomb = tmp_path / "bomb.pth"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED,
                                                         compresslevel=1) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    assert bomb.stat().st_size < 4 * 2**20
    with pytest.raises(ValueError, match=r"inflate to .* bytes .*data/"):
        load_weights(model, bomb)
    torch.save(model.state_dict(), plain)  # a plain torch.save of the model's own weights loads
    assert load_weights(_tiny(), plain).ok


# ------------------------------------------------------------------------------ dtypes, finiteness, pos_embed
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.uint8, torch.complex64])
def test_integer_bool_or_complex_tensors_for_float_parameters_are_refused(tmp_path: Path, dtype: torch.dtype
                                                                          ) -> None:
    model = _tiny()
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    for strict in (True, False):
        with pytest.raises(ValueError, match=r"dtype .*patch_embed\.proj\.weight"):
            load_weights(_tiny(), state, strict=strict)
    path = tmp_path / "w.pth"
    torch.save(state, path)
    with pytest.raises(ValueError, match=str(path)):
        load_weights(_tiny(), path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_reported_by_name(tmp_path: Path, bad: float) -> None:
    model = _tiny()
    state = model.state_dict()
    state["blocks.0.mlp.fc1.weight"][3, 5] = bad
    path = va.save_weights(state, tmp_path / "w.safetensors")
    for source in (state, path):
        with pytest.raises(ValueError, match=r"NaN or infinite.*blocks\.0\.mlp\.fc1\.weight"):
            load_weights(_tiny(), source, strict=False)


@pytest.mark.registry
@pytest.mark.parametrize("name", distinct_reduced_presets())
def test_malformed_tensors_are_refused_for_every_model(name: str) -> None:
    """Every distinct reduced model: bool weights and a NaN are refused naming the tensor; each position table
    (any key naming a position embedding or relative-position table) made 1-D, 2-D, one rank higher or empty
    is a shape mismatch, not an IndexError."""
    torch.manual_seed(0)
    model = va.create_model(name, **small_overrides(name)).eval()
    state = model.state_dict()
    floats = [k for k, v in state.items() if v.is_floating_point() and v.numel()]
    first = floats[0]
    with pytest.raises(ValueError, match="dtype"):
        load_weights(model, {**state, first: state[first].bool()})
    with pytest.raises(ValueError, match=f"NaN or infinite values: {first}"):
        load_weights(model, {**state, first: torch.full_like(state[first], float("nan"))})
    for key in [k for k in floats if ("pos" in k and "embed" in k) or "relative_position" in k]:
        width = state[key].shape[-1]
        for broken in (state[key].flatten(), state[key].flatten()[:0], state[key][..., :0],
                       state[key].flatten()[:width], state[key].reshape(-1, width), state[key][None]):
            if broken.shape == state[key].shape:  # a table that is 1-D / 2-D already
                continue
            with pytest.raises(CheckpointMismatchError, match=key.replace(".", r"\.")):
                load_weights(model, {**state, key: broken})
    assert load_weights(model, state).ok


# ------------------------------------------------------------------------------ config against the header
def _with_config(path: Path, out: Path, **changes: object) -> Path:
    """``path`` (save_weights) rewritten to ``out`` with its recorded config changed, tensors as they were."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    meta["config"] = json.dumps({**json.loads(meta["config"]), **changes})
    save_file(tensors, str(out), metadata=meta)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("changes", [{"embed_dim": 30000}, {"depth": 1000000}])
def test_huge_config_beside_small_tensors_is_refused_before_allocating(tmp_path: Path, changes: dict) -> None:
    """Under a second and under 500 MB (a fresh process's peak RSS): the config is read against the header, the
    model is never built for real (built, ``embed_dim=30000`` asks for 10.8 GB; ``depth=1e6`` grows for minutes)."""
    torch.manual_seed(0)
    small = va.create_model("vit_tiny_patch16_224", depth=2, num_classes=10).eval()
    path = _with_config(va.save_weights(small, tmp_path / "m.safetensors"), tmp_path / "bad.safetensors", **changes)
    assert path.stat().st_size < 25 * 2**20
    field = next(iter(changes))
    code = ("import resource, sys, time, vit_attention as va\n"
            "va.load_model(sys.argv[2])\n"  # imports and first-call costs paid on the good file
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "t = time.perf_counter()\n"
            "try:\n"
            "    va.load_model(sys.argv[1])\n"
            "except ValueError as e:\n"
            "    msg = str(e)\n"
            "else:\n"
            "    raise SystemExit('loaded')\n"
            "took = time.perf_counter() - t\n"
            "grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024\n"
            "print(took, grew, msg)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "m.safetensors")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    took, grew, msg = out.stdout.split(" ", 2)
    assert float(took) < 1.0 and float(grew) < 500 * 2**20, out.stdout
    assert f"{field}={changes[field]}" in msg and str(path) in msg


def test_pos_embed_contradicting_the_recorded_config_is_refused_not_resampled(tmp_path: Path) -> None:
    """The file's config says 32 px (a 2x2 grid); its pos_embed is a 4x4 grid's: "rebuilt exactly" would be a
    lie after resampling, so the contradiction is refused naming img_size."""
    torch.manual_seed(0)
    big = va.create_model("vit_tiny_patch16_224", img_size=64, depth=1, num_classes=4).eval()
    path = _with_config(va.save_weights(big, tmp_path / "m.safetensors"), tmp_path / "bad.safetensors", img_size=32)
    with pytest.raises(ValueError, match=r"img_size=32.*pos_embed: file \[1, 17, 192\] vs config \[1, 5, 192\]"):
        va.load_model(path)
    assert va.load_model(va.save_weights(big, tmp_path / "ok.safetensors")).cfg.img_size == 64


WIDTH_AND_DEPTH = ("depth", "depths", "transformer_depths", "block_types", "embed_dim", "embed_dims", "channels",
                   "transformer_dims")


@pytest.mark.registry
@pytest.mark.parametrize("name", distinct_reduced_presets())
def test_contradicting_depth_or_width_is_refused_for_every_model(name: str, tmp_path: Path) -> None:
    """Every distinct reduced model: its recorded depth(s) or width(s) changed while its tensors stay is refused
    by load_model naming the field, before the model is built."""
    torch.manual_seed(0)
    model = va.create_model(name, **small_overrides(name)).eval()
    path = va.save_weights(model, tmp_path / "m.safetensors")
    config = json.loads(va.weights.io.read_metadata(path)["config"])
    fields = [k for k in WIDTH_AND_DEPTH if isinstance(config.get(k), (int, list))]
    assert fields, f"{name} records none of {WIDTH_AND_DEPTH}"
    for field in fields:
        value = config[field]
        changed = value * 2 if isinstance(value, int) else [v * 2 for v in value]  # "bb" -> "bbbb" (HaloNet)
        bad = _with_config(path, tmp_path / f"{field}.safetensors", **{field: changed})
        with pytest.raises(ValueError, match=f"{field}=") as err:
            va.load_model(bad)
        assert "contradict" in str(err.value)


# transformers config.json keys that state a width or a depth, and the contradicting values written over them
def _wider(v: object) -> object:
    return [x * 2 for x in v] if isinstance(v, list) else v * 2  # type: ignore[operator]


def _deeper(v: object) -> object:
    return [1000000] * len(v) if isinstance(v, list) else 1000000  # type: ignore[arg-type]


_HF_STRUCTURE = {"hidden_size": _wider, "embed_dim": _wider, "hidden_sizes": _wider, "width_multiplier": _wider,
                 "num_hidden_layers": _deeper, "depth": _deeper, "depths": _deeper}


@pytest.mark.parity
@pytest.mark.parametrize("model_type", sorted(HF_CASES))
def test_transformers_folder_config_contradicting_its_weights_is_refused(model_type: str, tmp_path: Path) -> None:
    """Every transformers model type with a folder case: its ``config.json`` with a width doubled or a depth of a
    million (the weights as saved) is refused by ``create_model(preset, pretrained=folder)`` naming the field,
    before anything is built (not a warning and a multi-gigabyte model)."""
    case = HF_CASES[model_type]
    torch.manual_seed(0)
    case.hf().save_pretrained(tmp_path / "ok")
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    read = hf_config_overrides(config)
    keys = [k for k in _HF_STRUCTURE if k in config  # the keys our reader takes (swin's hidden_size is derived)
            and hf_config_overrides({**config, k: _HF_STRUCTURE[k](config[k])}) != read]
    assert keys, f"{model_type}: config.json states none of {sorted(_HF_STRUCTURE)} that we read"
    for key in keys:
        folder = tmp_path / key
        folder.mkdir()
        (folder / "model.safetensors").symlink_to(tmp_path / "ok" / "model.safetensors")
        (folder / "config.json").write_text(json.dumps({**config, key: _HF_STRUCTURE[key](config[key])}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ValueError, match=r"contradict.*refusing to build") as err:
                va.create_model(case.preset, pretrained=folder, **case.options)
        assert str(folder) in str(err.value) and "its config field" in str(err.value)
