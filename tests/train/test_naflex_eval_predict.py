"""``eval`` / ``predict`` / ``attn`` on a NaFlex run: each image at its own aspect (the run's ``--max-seq-len``),
as training read it; the errors name the option."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from vit_attention.cli import main
from vit_attention.data.naflex import resize_to_seq_len
from vit_attention.train.data import BatchTransform, build_data, iterate_batches, load_naflex_image
from vit_attention.weights import load_model

from .test_naflex_train import TINY_NAFLEX, _mixed_folder


@pytest.fixture(scope="module")
def naflex_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("naflex_eval")
    folder = _mixed_folder(root / "imgs")
    out = root / "run"
    assert main(["train", *TINY_NAFLEX, "--data", str(folder), "--naflex", "--max-seq-len", "16",
                 "--val-fraction", "0.34", "--epochs", "1", "--batch-size", "4", "--warmup-epochs", "0",
                 "--no-progress", "--no-plot", "--output", str(out)]) == 0
    return folder, out


def _packed_top1(model: torch.nn.Module, folder: Path, max_seq_len: int, split: str = "test") -> tuple[float, int]:
    """Top-1 of ``model`` over the packed batches of the folder's split, computed directly."""
    data = build_data(folder, val_fraction=0.34, naflex_patch=8, max_seq_len=max_seq_len)
    ds = data.test if split == "test" else data.train
    tf = BatchTransform(data.mean, data.std, img_size=data.img_size).eval()
    correct = n = 0
    with torch.no_grad():
        for packed, y in iterate_batches(ds, [list(range(len(ds)))]):
            correct += int((model(tf(packed)).argmax(-1) == y).sum())
            n += len(y)
    return correct / n, n


def _top1_line(text: str) -> tuple[float, int]:
    return (float(re.search(r"top-1 accuracy: ([0-9.]+)", text).group(1)),  # type: ignore[union-attr]
            int(re.search(r"images: (\d+)", text).group(1)))  # type: ignore[union-attr]


def test_eval_naflex_run_matches_packed_batches(naflex_run: tuple[Path, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    folder, run = naflex_run
    model = load_model(run).eval()
    capsys.readouterr()
    for split in ("test", "train"):
        assert main(["eval", "--checkpoint", str(run), "--split", split, "--device", "cpu",
                     "--confusion", str(tmp_path / f"c_{split}.png")]) == 0
        text = capsys.readouterr().out
        assert "NaFlex: each image at its own aspect, at most 16 patches" in text
        got, n = _top1_line(text)
        want, n_want = _packed_top1(model, folder, 16, split)
        assert n == n_want and got == pytest.approx(want, abs=1e-4), (split, got, want)
    # --max-seq-len overrides the run's budget; the training checkpoint records --naflex too
    assert main(["eval", "--checkpoint", str(run / "checkpoint.safetensors"), "--max-seq-len", "24",
                 "--device", "cpu", "--confusion", str(tmp_path / "c24.png")]) == 0
    text = capsys.readouterr().out
    assert "at most 24 patches" in text
    got, _ = _top1_line(text)
    assert got == pytest.approx(_packed_top1(load_model(run / "checkpoint.safetensors").eval(), folder, 24)[0],
                                abs=1e-4)
    # a NaFlex model given by name + a weights file: --naflex asks for it explicitly
    assert main(["eval", "--checkpoint", str(run / "model.safetensors"), "--model", "naflexvit_base_patch16_gap",
                 "--naflex", "--max-seq-len", "16", "--data", str(folder), "--val-fraction", "0.34",
                 "--device", "cpu", "--confusion", str(tmp_path / "c_name.png")]) == 0
    assert _top1_line(capsys.readouterr().out)[0] == pytest.approx(_packed_top1(model, folder, 16)[0], abs=1e-4)


def test_predict_naflex_each_image_at_its_aspect(naflex_run: tuple[Path, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    from PIL import Image

    _, run = naflex_run
    rng = np.random.default_rng(1)
    paths = []
    for i, (h, w) in enumerate([(24, 72), (64, 16)]):  # wide, tall
        a = rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)
        paths.append(tmp_path / f"img{i}.png")
        Image.fromarray(a).save(paths[-1])
    capsys.readouterr()
    assert main(["predict", *map(str, paths), "--checkpoint", str(run), "--topk", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"{p}: ") for line, p in zip(lines, paths))
    model = load_model(run).eval()
    classes = ["blue", "red"]
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    # what predict reads: each image as training read it, in one list forward
    read = [(load_naflex_image(p, 8, 16) - mean) / std for p in paths]
    assert [tuple(x.shape[1:]) for x in read] == [(16, 48), (64, 16)]  # aspect kept, <= 16 patches of 8 px
    # the same images resized by resize_to_seq_len (torch bicubic) give the same top-1
    raw = [torch.from_numpy(np.asarray(Image.open(p), dtype=np.float32) / 255).permute(2, 0, 1) for p in paths]
    resized = [(resize_to_seq_len(x, 8, 16) - mean) / std for x in raw]
    with torch.no_grad():
        logits, logits_t = model(read), model(resized)
    for line, row, row_t in zip(lines, logits.softmax(-1), logits_t):
        first = line.split(": ", 1)[1].split(", ")[0]
        assert first == f"{classes[int(row.argmax())]} ({float(row.max()):.3f})"
        assert classes[int(row_t.argmax())] == first.split(" ")[0]


def test_naflex_eval_predict_errors(naflex_run: tuple[Path, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    folder, run = naflex_run
    vit = tmp_path / "vit"
    assert main(["train", "--model", "vit_tiny_patch16_224", "--model-arg", "depth=1", "--model-arg", "embed_dim=32",
                 "--model-arg", "num_heads=2", "--img-size", "16", "--data", str(folder), "--val-fraction", "0.34",
                 "--epochs", "1", "--batch-size", "4", "--warmup-epochs", "0", "--no-progress", "--no-plot",
                 "--output", str(vit)]) == 0
    img = next(folder.glob("red/*.png"))
    capsys.readouterr()
    cases = [
        (["eval", "--checkpoint", str(vit), "--naflex"], "--naflex needs a NaFlex model (family naflexvit"),
        (["predict", str(img), "--checkpoint", str(vit), "--naflex"], "--naflex needs a NaFlex model"),
        (["eval", "--checkpoint", str(vit), "--max-seq-len", "16"], "--max-seq-len 16 applies with --naflex only"),
        (["predict", str(img), "--checkpoint", str(vit), "--max-seq-len", "16"], "applies with --naflex only"),
        (["predict", str(img), "--checkpoint", str(run), "--crop-pct", "0.9"], "--crop-pct 0.9 does not apply"),
        (["eval", "--checkpoint", str(run), "--max-seq-len", "0"], "--max-seq-len must be >= 1"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert "error:" in err and message in err, err


def test_attn_naflex_run_on_the_images_own_grid(naflex_run: tuple[Path, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    folder, run = naflex_run
    img = folder / "red" / "3.png"  # 20x60 -> 16x48 px at 16 patches of 8 px: a 2x6 grid
    capsys.readouterr()
    assert main(["attn", str(run), str(img), "--output", str(tmp_path / "maps"), "--save-map"]) == 0
    text = capsys.readouterr().out
    assert "token grid (2, 6)" in text, text
    assert np.load(next((tmp_path / "maps").glob("*.npy"))).shape == (2, 6)
    assert main(["attn", str(run), str(img), "--max-seq-len", "64", "--output", str(tmp_path / "m64")]) == 0
    assert "token grid (4, 12)" in capsys.readouterr().out
    assert main(["attn", "vit_tiny_patch16_224", str(img), "--naflex", "--output", str(tmp_path / "e")]) == 2
    assert "--naflex needs a NaFlex model" in capsys.readouterr().err
    assert main(["attn", str(run), str(img), "--img-size", "32", "--output", str(tmp_path / "e")]) == 2
    assert "--img-size 32 does not apply with --naflex" in capsys.readouterr().err
