"""What is safe to load (docs/safe_loading.md): regular files only, shards inside their folder, sizes checked
before inflating, dtypes and finiteness checked, malformed position tables reported, not crashed on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from model_outputs import distinct_reduced_presets, small_overrides
from safetensors.torch import save_file

import vit_attention as va
from vit_attention.weights import CheckpointMismatchError, load_weights, read_checkpoint


def _tiny(**kw: object) -> torch.nn.Module:
    return va.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=4, **kw).eval()


# ------------------------------------------------------------------------------ regular files only
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


@pytest.mark.parametrize("name", distinct_reduced_presets())
def test_malformed_tensors_are_refused_for_every_model(name: str) -> None:
    """Every distinct reduced model: bool weights and a NaN are refused naming the tensor; each position table
    (any key naming a position embedding) made 1-D or empty is a shape mismatch, not an IndexError."""
    torch.manual_seed(0)
    model = va.create_model(name, **small_overrides(name)).eval()
    state = model.state_dict()
    floats = [k for k, v in state.items() if v.is_floating_point() and v.numel()]
    first = floats[0]
    with pytest.raises(ValueError, match="dtype"):
        load_weights(model, {**state, first: state[first].bool()})
    with pytest.raises(ValueError, match=f"NaN or infinite values: {first}"):
        load_weights(model, {**state, first: torch.full_like(state[first], float("nan"))})
    for key in [k for k in floats if "pos" in k and "embed" in k]:
        for broken in (state[key].flatten(), state[key].flatten()[:0], state[key][..., :0]):
            with pytest.raises(CheckpointMismatchError, match=key.replace(".", r"\.")):
                load_weights(model, {**state, key: broken})
    assert load_weights(model, state).ok
