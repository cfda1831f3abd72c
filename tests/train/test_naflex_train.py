"""``train --naflex``: a NaFlex model trained on a folder of mixed-aspect images, each kept at its aspect,
resized to the patch budget and packed (NaFlexCollate); the error for a non-NaFlex model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from vit_attention.cli import main
from vit_attention.train.data import BatchTransform, build_data, iterate_batches
from vit_attention.weights import load_model

# a reduced naflexvit_base_patch16_gap: width 32, 2 heads, 1 block, 8 px patches, a 4x4 position table
TINY_NAFLEX = ["--model", "naflexvit_base_patch16_gap", "--model-arg", "embed_dim=32", "--model-arg", "num_heads=2",
               "--model-arg", "depth=1", "--model-arg", "patch_size=8", "--model-arg", "pos_embed_grid_size=[4,4]"]
SIZES = [(24, 40), (48, 16), (32, 32), (20, 60), (40, 24), (16, 16)]  # (H, W): wide, tall, square, ...


def _mixed_folder(root: Path) -> Path:
    """Two classes of six PNGs each, every one a different size and aspect."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for ci, name in enumerate(("red", "blue")):
        (root / name).mkdir(parents=True)
        for i, (h, w) in enumerate(SIZES):
            img = rng.integers(0, 60, size=(h, w, 3), dtype=np.uint8)
            img[:, :, 2 * ci] += 150
            Image.fromarray(img).save(root / name / f"{i}.png")
    return root


def test_naflex_data_keeps_aspect_and_packs(tmp_path: Path) -> None:
    data = build_data(_mixed_folder(tmp_path / "imgs"), val_fraction=0.34, naflex_patch=8, max_seq_len=16)
    x, y = data.train[0]
    assert x.shape[0] == 3 and x.shape[1] % 8 == 0 and x.shape[2] % 8 == 0
    assert (x.shape[1] // 8) * (x.shape[2] // 8) <= 16
    (packed, labels), = iterate_batches(data.train, [[0, 1, 2, 3]])
    assert packed["patches"].shape == (4, 16, 8 * 8 * 3) and packed["patch_coord"].shape == (4, 16, 2)
    assert labels.shape == (4,)
    t = BatchTransform(data.mean, data.std, img_size=data.img_size)
    out = t(packed)
    assert torch.equal(out["patches"][~packed["patch_valid"]], torch.zeros_like(out["patches"][~packed["patch_valid"]]))
    first = packed["patches"][0, 0].reshape(-1, 3)  # channel fastest
    want = (first - torch.tensor(data.mean)) / torch.tensor(data.std)
    assert torch.allclose(out["patches"][0, 0].reshape(-1, 3), want)


def test_train_naflex_tiny_run_and_checkpoint_loads(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = _mixed_folder(tmp_path / "imgs")
    out = tmp_path / "run"
    assert main(["train", *TINY_NAFLEX, "--data", str(folder), "--naflex", "--max-seq-len", "16",
                 "--val-fraction", "0.34", "--epochs", "1", "--batch-size", "4", "--warmup-epochs", "0",
                 "--no-progress", "--no-plot", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "NaFlex: each image at its own aspect, at most 16 patches" in text
    hist = json.loads((out / "metrics.json").read_text())
    assert hist[-1]["step"] == 2  # 8 training images, batches of 4
    assert math.isfinite(hist[-1]["train_loss"]) and math.isfinite(hist[-1]["test_loss"])
    model = load_model(out).eval()  # the final weights rebuild and load
    imgs = [torch.randn(3, 24, 40), torch.randn(3, 48, 16)]
    with torch.no_grad():
        logits = model(imgs)
    assert logits.shape == (2, 2) and torch.isfinite(logits).all()
    assert load_model(out / "checkpoint.safetensors") is not None  # the training checkpoint too


def test_naflex_option_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = _mixed_folder(tmp_path / "imgs")
    cases = [
        (["--model", "vit_tiny_patch16_224", "--data", str(folder), "--naflex"],
         "--naflex needs a NaFlex model (family naflexvit, e.g. naflexvit_base_patch16_gap); vit_tiny_patch16_224 "
         "is a vit model"),
        ([*TINY_NAFLEX, "--data", str(folder), "--max-seq-len", "16"], "--max-seq-len 16 applies with --naflex only"),
        ([*TINY_NAFLEX, "--data", str(folder), "--naflex", "--mixup", "0.2"], "--mixup do not apply"),
        ([*TINY_NAFLEX, "--naflex"], "pass --data ROOT"),
    ]
    for i, (args, message) in enumerate(cases):
        assert main(["train", *args, "--output", str(tmp_path / f"r{i}")]) == 2
        err = capsys.readouterr().err
        assert "error:" in err and message in err, err
        assert not (tmp_path / f"r{i}").exists()  # refused before anything was written
