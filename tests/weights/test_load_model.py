"""``load_model``: every registered model round-trips through ``save_weights``; damaged files name themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_outputs import distinct_reduced_presets, small_overrides
from safetensors.torch import save_file

import vit_attention as va
from vit_attention.models.registry import get_model_entry
from vit_attention.weights import describe_checkpoint, load_weights, read_checkpoint
from vit_attention.weights.io import TRAIN_STATE_FORMAT, model_metadata

ALL_MODELS = va.list_models()


def _input(model: torch.nn.Module) -> torch.Tensor:
    size = model.cfg.img_size
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(2, model.cfg.in_chans, h, w, generator=torch.Generator().manual_seed(0))


def test_registry_covers_more_than_one_family() -> None:
    assert len(ALL_MODELS) > 50 and "vit_digits_patch2_8" in ALL_MODELS


@pytest.mark.registry
@pytest.mark.parametrize("name", distinct_reduced_presets())
def test_save_load_round_trip_is_exact(name: str, tmp_path: Path) -> None:
    """Each distinct reduced model (tests/model_outputs.py: the preset's own structure at toy width, depth and
    size), with in_chans and num_classes changed too; every preset's full config round-trips on meta below."""
    torch.manual_seed(0)
    model = va.create_model(name, **{**small_overrides(name), "in_chans": 1, "num_classes": 7}).eval()
    path = va.save_weights(model, tmp_path / "m.safetensors")
    loaded = va.load_model(path)
    assert not loaded.training and type(loaded) is type(model)
    assert loaded.cfg == model.cfg and loaded.num_classes == 7 and loaded.registry_name == name
    sd, sd2 = model.state_dict(), loaded.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    x = _input(model)
    with torch.no_grad():
        y, y2 = model(x), loaded(x)
    assert torch.equal(y, y2)


@pytest.mark.registry
@pytest.mark.parametrize("name", ALL_MODELS)
def test_full_size_config_round_trips_on_meta(name: str, tmp_path: Path) -> None:
    """The preset at full size (meta device): the recorded name and config rebuild the same config."""
    with torch.device("meta"):
        model = va.create_model(name, num_classes=3)
    path = tmp_path / "meta.safetensors"
    save_file({"dummy": torch.zeros(1)}, str(path), metadata=model_metadata(model))
    saved = describe_checkpoint(path)
    assert saved is not None and saved.model_name == name and saved.kind == "weights"
    assert get_model_entry(name).config_cls.from_dict(saved.config) == model.cfg


def test_bf16_weights_come_back_in_bf16(tmp_path: Path) -> None:
    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1).to(torch.bfloat16).eval()
    loaded = va.load_model(va.save_weights(model, tmp_path / "m.safetensors"))
    x = torch.randn(1, 1, 8, 8, dtype=torch.bfloat16)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))


def _training_checkpoint(tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    """A run folder holding only a training checkpoint (as `vit-attention train` writes it mid-run)."""
    from vit_attention.train.checkpoint import save_training_state

    torch.manual_seed(1)
    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=1).eval()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 1, 8, 8)).sum().backward()
    opt.step()
    run = tmp_path / "run"
    save_training_state(run / "checkpoint.safetensors", model_state=model.state_dict(),
                        optimizer_state=opt.state_dict(), ema_state=model.state_dict(),
                        state={"epoch": 0, "model_name": "vit_digits_patch2_8",
                               "model_config": model.cfg.to_dict(), "classes": [str(i) for i in range(10)]})
    return model, run


def test_training_checkpoint_and_run_folder(tmp_path: Path) -> None:
    model, run = _training_checkpoint(tmp_path)
    x = torch.randn(3, 1, 8, 8)
    for source in (run, run / "checkpoint.safetensors"):
        loaded = va.load_model(source)
        assert loaded.cfg.in_chans == 1 and loaded.num_classes == 10
        with torch.no_grad():
            assert torch.equal(loaded(x), model(x))
    # load_weights / create_model(pretrained=...) read only the model tensors of a training checkpoint
    fresh = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=1)
    assert load_weights(fresh, run / "checkpoint.safetensors").ok
    state, meta = read_checkpoint(run / "checkpoint.safetensors")
    assert meta["format"] == TRAIN_STATE_FORMAT and state.keys() == model.state_dict().keys()
    # a run folder with model.safetensors prefers it
    va.save_weights(model, run / "model.safetensors")
    assert describe_checkpoint(run).kind == "weights"


def test_train_state_format_matches_the_training_code() -> None:
    from vit_attention.train.checkpoint import FORMAT

    assert FORMAT == TRAIN_STATE_FORMAT


def test_load_model_refuses_another_models_name(tmp_path: Path) -> None:
    path = va.save_weights(va.create_model("vit_digits_patch2_8", depth=1), tmp_path / "m.safetensors")
    assert va.load_model(path, model="vit_digits_patch2_8").registry_name == "vit_digits_patch2_8"
    with pytest.raises(ValueError, match="describes model 'vit_digits_patch2_8'"):
        va.load_model(path, model="vit_tiny_patch16_224")


def test_load_model_without_our_metadata_says_how_to_load_it(tmp_path: Path) -> None:
    path = va.save_weights(va.create_model("vit_digits_patch2_8", depth=1).state_dict(), tmp_path / "sd.safetensors")
    with pytest.raises(ValueError, match=r"sd\.safetensors does not record which model.*create_model"):
        va.load_model(path)
    with pytest.raises(FileNotFoundError, match="without model.safetensors or checkpoint.safetensors"):
        va.load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        va.load_model(tmp_path / "nope.safetensors")


# ----------------------------------------------------------------------------------------- errors
def test_text_file_named_pth_is_not_a_torch_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "notes.pth"
    path.write_text("hello, these are my notes\n")
    with pytest.raises(ValueError, match=r"notes\.pth is not a torch checkpoint"):
        read_checkpoint(path)
    with pytest.raises(ValueError, match=r"notes\.pth is not a torch checkpoint"):
        va.create_model("vit_digits_patch2_8", pretrained=path)


def test_truncated_torch_checkpoint_names_the_file(tmp_path: Path) -> None:
    good = tmp_path / "good.pth"
    torch.save({"w": torch.randn(64, 64)}, good)
    bad = tmp_path / "cut.pth"
    bad.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"cut\.pth"):
        read_checkpoint(bad)


@pytest.mark.parametrize("keep", [0, 5, 100, -50])
def test_truncated_or_tiny_safetensors_name_the_file(tmp_path: Path, keep: int) -> None:
    model = va.create_model("vit_digits_patch2_8", depth=1)
    data = va.save_weights(model, tmp_path / "full.safetensors").read_bytes()
    path = tmp_path / "broken.safetensors"
    path.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    for call in (lambda: read_checkpoint(path), lambda: va.load_model(path),
                 lambda: load_weights(va.create_model("vit_digits_patch2_8", depth=1), path)):
        with pytest.raises(ValueError, match=r"broken\.safetensors.*(truncated|not a complete safetensors)"):
            call()


def test_save_weights_refuses_a_non_safetensors_name(tmp_path: Path) -> None:
    model = va.create_model("vit_digits_patch2_8", depth=1)
    for name in ("x.pth", "x.bin", "x"):
        with pytest.raises(ValueError, match=rf"{name}.*must end in '\.safetensors'"):
            va.save_weights(model, tmp_path / name)
        assert not (tmp_path / name).exists()


# ------------------------------------------------------------------------------ registry completeness
@pytest.mark.slow
@pytest.mark.parametrize("first_import", ["from vit_attention.models import registry as m",
                                          "import vit_attention.weights as m"])
def test_digits_presets_known_whatever_was_imported_first(first_import: str) -> None:
    code = (f"{first_import}\nimport sys\nfrom vit_attention import create_model\n"
            "from vit_attention.models.registry import list_models\n"
            "model = create_model('vit_digits_patch2_8')\n"
            "assert 'vit_attention.train' not in sys.modules, 'the registry imported train/'\n"
            "print(len(list_models()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(ALL_MODELS)


@pytest.mark.slow
def test_model_trained_by_the_cli_loads_by_documented_means(tmp_path: Path) -> None:
    """What `train` writes (1-channel, 10-class digits model with data metadata) -> load_model, in a fresh process."""
    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=1).eval()
    va.save_weights(model, tmp_path / "run" / "model.safetensors",
                    metadata={"classes": [str(i) for i in range(10)], "mean": [0.3], "std": [0.4]})
    code = ("import sys, torch, vit_attention as va\n"
            f"m = va.load_model({str(tmp_path / 'run')!r})\n"
            "assert 'vit_attention.train' not in sys.modules\n"
            "print(m.cfg.in_chans, m.num_classes, m.training)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "10", "False"]
    saved = describe_checkpoint(tmp_path / "run")
    assert saved.metadata["classes"] == [str(i) for i in range(10)] and saved.metadata["mean"] == [0.3]
    assert json.dumps(saved.config, sort_keys=True) == model.cfg.to_json()


def test_load_model_overrides(tmp_path: Path) -> None:
    """``img_size`` resamples the position embedding; unknown options raise naming them."""
    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=1).eval()
    path = va.save_weights(model, tmp_path / "m.safetensors")
    bigger = va.load_model(path, img_size=16)
    assert bigger.cfg.img_size in (16, (16, 16)) and bigger.num_classes == 10
    assert bigger(torch.randn(1, 1, 16, 16)).shape == (1, 10)
    with pytest.raises(TypeError, match=r"no config option\(s\) \['depht'\]"):
        va.load_model(path, depht=2)


def test_create_model_with_our_file_of_another_config_points_to_load_model(tmp_path: Path) -> None:
    """A 1-channel 10-class digits model does not fit the 3-channel 1000-class preset: the error says what does."""
    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1)
    path = va.save_weights(model, tmp_path / "model.safetensors")
    with pytest.warns(UserWarning, match="classifier"), \
            pytest.raises(va.weights.CheckpointMismatchError, match=r"load_model\(path\) rebuilds it"):
        va.create_model("vit_digits_patch2_8", pretrained=path)
    assert va.load_model(path).cfg.in_chans == 1
