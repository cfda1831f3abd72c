"""Data configs travel with models: create_model -> save_weights -> load_model, training metadata, the CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from fixture_utils import FIXTURES

from vit_attention import create_model, load_model, save_weights
from vit_attention.cli import main
from vit_attention.data import resolve_data_config

SMALL = dict(depth=1, embed_dim=32, num_heads=2, img_size=32)


def place(cache: Path, repo_id: str, files: dict[str, Path], rev: str = "0123abcd") -> None:
    """Put ``files`` into ``cache`` laid out as the Hugging Face cache holds repository ``repo_id``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "snapshots" / rev).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    for name, path in files.items():
        shutil.copyfile(path, repo / "snapshots" / rev / name)


def test_save_weights_and_load_model_keep_the_data_config(tmp_path):
    model = create_model("vit_base_patch16_224.augreg_in1k", **SMALL)
    path = save_weights(model, tmp_path / "m.safetensors")
    back = load_model(path)
    assert back.pretrained_cfg["hf_hub_id"] == "timm/vit_base_patch16_224.augreg_in1k"
    assert resolve_data_config(back) == resolve_data_config(model)
    assert resolve_data_config(back).input_size == (3, 32, 32) and resolve_data_config(back).tag == "augreg_in1k"


def test_training_metadata_becomes_the_data_config(tmp_path):
    model = create_model("vit_digits_patch2_8", in_chans=1, num_classes=3)
    path = save_weights(model.state_dict(), tmp_path / "m.safetensors",
                        metadata={"model": "vit_digits_patch2_8", "config": model.cfg.to_json(), "mean": [0.3],
                                  "std": [0.2], "crop_pct": 1.0, "classes": ["a", "b", "c"]})
    cfg = resolve_data_config(load_model(path))
    assert cfg.mean == (0.3,) and cfg.std == (0.2,) and cfg.crop_pct == 1.0 and cfg.input_size == (1, 8, 8)
    assert cfg.label_names == ("a", "b", "c") and cfg.interpolation == "bicubic"


def test_predict_pretrained_prints_imagenet_names(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = create_model("deit_tiny_patch16_224", depth=1)
    with torch.no_grad():
        src.head.bias.zero_()
        src.head.bias[1] = 50.0  # class 1 (goldfish) wins whatever the image
    place(cache, "timm/deit_tiny_patch16_224.fb_in1k",
          {"model.safetensors": save_weights(src.state_dict(), tmp_path / "w.safetensors")})
    image = str(FIXTURES / "transform_image.png")
    assert main(["predict", image, "--model", "deit_tiny_patch16_224", "--pretrained", "--model-arg", "depth=1",
                 "--topk", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(image) and "goldfish (1.000)" in out
    # without the file in the cache: a one-line error naming the repository
    assert main(["predict", image, "--model", "deit_small_patch16_224", "--pretrained"]) == 2
    assert "timm/deit_small_patch16_224.fb_in1k" in capsys.readouterr().err
    assert main(["predict", image]) == 2
    assert "--pretrained" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["predict"])
def test_pretrained_and_checkpoint_are_exclusive(command, tmp_path, capsys):
    image = str(FIXTURES / "transform_image.png")
    assert main([command, image, "--model", "deit_tiny_patch16_224", "--pretrained", "--checkpoint",
                 str(tmp_path)]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_data_config_is_a_read_only_mapping_of_timms_keys():
    """``create_transform(**resolve_data_config(model))`` (timm's habit) is the transform of the config itself."""
    import dataclasses

    import numpy as np
    from PIL import Image

    from vit_attention.data import TRANSFORM_KEYS, create_transform

    model = create_model("vit_tiny_patch16_224", **SMALL)
    # every transform key away from the generic ImageNet default, so a key lost on the way shows
    cfg = resolve_data_config(model, interpolation="bilinear", crop_mode="squash")
    assert dict(cfg) == {"input_size": (3, 32, 32), "interpolation": "bilinear", "mean": (0.5, 0.5, 0.5),
                         "std": (0.5, 0.5, 0.5), "crop_pct": 0.9, "crop_mode": "squash"}
    assert tuple(cfg) == TRANSFORM_KEYS and len(cfg) == 6 and cfg["crop_pct"] == cfg.crop_pct
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (37, 50, 3), dtype=np.uint8))  # not square
    want = create_transform(cfg)(image)
    assert want.shape == (3, 32, 32)
    assert torch.equal(create_transform(**cfg)(image), want)
    for key in TRANSFORM_KEYS:  # each key is honoured: without it the generic default gives another tensor
        other = create_transform(**{k: v for k, v in cfg.items() if k != key})(image)
        assert other.shape != want.shape or not torch.equal(other, want), key
    assert create_transform(**cfg, is_training=True).training
    with pytest.raises(TypeError):
        cfg["crop_pct"] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.crop_pct = 1.0  # type: ignore[misc]
    with pytest.raises(KeyError, match="num_classes is an attribute"):
        cfg["num_classes"]
    assert resolve_data_config(cfg) == cfg  # a DataConfig resolves to itself (every field, not only the keys)
