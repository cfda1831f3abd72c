"""The ``train`` / ``eval`` / ``predict`` / ``compare`` commands through the CLI entry point."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from vit_attention.cli import main

from ._utils import TINY

QUICK = [*TINY, "--epochs", "1", "--batch-size", "128", "--no-progress", "--no-plot"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cmd") / "run"
    assert main(["train", *QUICK, "--output", str(out)]) == 0
    return out


def test_train_prints_accuracy_last(trained_run: Path, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["train", *QUICK, "--output", str(tmp_path / "again")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "input 8x8 px (the digits' default; --img-size to change)"  # where the size comes from
    last = lines[-1]
    assert re.fullmatch(r"test accuracy: \d\.\d{4}", last)
    want = json.loads((trained_run / "metrics.json").read_text())[-1]["test_acc"]
    assert last == f"test accuracy: {want:.4f}"


def test_eval_top1_top5_and_confusion_png(trained_run: Path, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    png = tmp_path / "conf.png"
    assert main(["eval", "--checkpoint", str(trained_run), "--confusion", str(png)]) == 0
    out = capsys.readouterr().out
    want = json.loads((trained_run / "metrics.json").read_text())[-1]
    assert f"top-1 accuracy: {want['test_acc']:.4f}" in out and f"top-5 accuracy: {want['test_top5']:.4f}" in out
    assert "images: 450" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the training checkpoint file works too, and gives the same numbers
    assert main(["eval", "--checkpoint", str(trained_run / "checkpoint.safetensors"),
                 "--confusion", str(tmp_path / "c2.png")]) == 0
    assert f"top-1 accuracy: {want['test_acc']:.4f}" in capsys.readouterr().out


def test_predict_topk(trained_run: Path, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    paths = []
    for i in (0, 1):
        p = tmp_path / f"digit{i}.png"
        Image.fromarray((d.images[i] * 255 / 16).astype(np.uint8)).save(p)
        paths.append(str(p))
    assert main(["predict", *paths, "--checkpoint", str(trained_run / "model.safetensors"), "--topk", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(paths[0])
    ranked = re.findall(r"(\d) \((0\.\d{3}|1\.000)\)", lines[0])
    assert len(ranked) == 3 and [float(p) for _, p in ranked] == sorted((float(p) for _, p in ranked), reverse=True)


def test_cli_errors_are_one_clear_line(trained_run: Path, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["predict", str(tmp_path / "nope.png"), "--checkpoint", str(trained_run)]) == 2
    assert "image(s) not found" in capsys.readouterr().err
    (tmp_path / "bad.png").write_bytes(b"garbage")
    assert main(["predict", str(tmp_path / "bad.png"), "--checkpoint", str(trained_run)]) == 2
    assert "cannot read image" in capsys.readouterr().err
    assert main(["train", "--model", "vit_tiny_patchy", "--output", str(tmp_path / "x")]) == 2
    assert "unknown model 'vit_tiny_patchy'" in capsys.readouterr().err
    assert main(["train", "--data", str(tmp_path / "missing"), "--output", str(tmp_path / "y")]) == 2
    assert "data folder not found" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path / "none.safetensors")]) == 2
    assert "not found" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_compare_attention_table_and_plot(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    assert main(["compare", "--attention", "mhsa,window", "--quick", "--batch-size", "128", "--no-progress",
                 "--no-plot", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "test acc" in text and "MMACs" in text and "infer img/s" in text
    rows = json.loads((out / "compare.json").read_text())
    assert [r["name"] for r in rows] == ["vit+mhsa", "vit+window"]
    assert rows[1]["model_kwargs"] == {"attn_layer": "window", "attn_kwargs": {"window_size": 2}}
    assert rows[1]["params"] > rows[0]["params"]  # + relative position bias tables
    assert rows[1]["macs"] < rows[0]["macs"]  # 2x2 windows: fewer attention products than global attention
    assert all(r["train_img_s"] > 0 and r["infer_img_s"] > 0 and 0 <= r["test_acc"] <= 1 for r in rows)
    assert (out / "accuracy_vs_flops.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_model_args_reach_every_entry(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """``compare --attention A,B --model-arg depth=1``: every entry gets the option (the entry's mechanism wins);
    an option training takes from the data is refused before anything trains, naming what to give instead."""
    out = tmp_path / "cmp"
    assert main(["compare", "--attention", "mhsa,window", "--model-arg", "depth=1", "--epochs", "1",
                 "--batch-size", "256", "--no-progress", "--no-plot", "--output", str(out)]) == 0
    capsys.readouterr()
    rows = json.loads((out / "compare.json").read_text())
    assert [r["model_kwargs"]["depth"] for r in rows] == [1, 1]
    assert rows[1]["model_kwargs"]["attn_layer"] == "window"
    assert main(["compare", "--attention", "mhsa", "--model-arg", "num_classes=3", "--output",
                 str(tmp_path / "bad")]) == 2
    assert "--model-arg num_classes: training sets it from the data" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert main(["train", "--model-arg", "img_size=16", "--output", str(tmp_path / "bad2")]) == 2
    assert "give --img-size" in capsys.readouterr().err


def test_default_compare_entries_cover_mhsa_and_windows() -> None:
    from vit_attention.train.compare import default_entries

    entries = default_entries()
    kinds = [e.model_kwargs.get("attn_layer") for e in entries]
    assert "mhsa" in kinds and "window" in kinds
    assert any(e.model.startswith("swin") for e in entries)


def test_image_folder_train_eval_predict(image_folder: Path, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    out = tmp_path / "folder_run"
    assert main(["train", *QUICK, "--model-arg", "patch_size=4", "--img-size", "16", "--batch-size", "9",
                 "--data", str(image_folder), "--val-fraction", "0.25", "--seed", "3", "--output", str(out)]) == 0
    want = json.loads((out / "metrics.json").read_text())[-1]["test_acc"]
    text = capsys.readouterr().out
    assert text.startswith("input 16x16 px (--img-size)\n") and "much larger" not in text  # 12 px images
    # eval finds the folder, the split (fraction and seed) and the preprocessing in the model's metadata
    assert main(["eval", "--checkpoint", str(out), "--confusion", str(tmp_path / "c.png")]) == 0
    text = capsys.readouterr().out
    assert "images: 9" in text and f"top-1 accuracy: {want:.4f}" in text
    assert main(["predict", str(image_folder / "dog" / "0.png"), "--checkpoint", str(out), "--topk", "2"]) == 0
    line = capsys.readouterr().out.strip()
    assert len(re.findall(r"(cat|dog|fox) \(\d\.\d{3}\)", line)) == 2


def test_folder_of_large_images_says_the_input_size_and_warns(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`train --data DIR` without --img-size: the default model's 8x8 input is named, 48 px images warned of."""
    from ._utils import make_image_folder

    data = make_image_folder(tmp_path / "photos", {"a": 6, "b": 6}, size=48)
    assert main(["train", *QUICK, "--batch-size", "8", "--data", str(data), "--val-fraction", "0.25",
                 "--output", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "input 8x8 px (the model's default, vit_digits_patch2_8; --img-size to change)"
    assert lines[1].startswith("warning: the images are much larger than the model's input: their median shorter "
                               "side is 48 px, the input 8x8 px") and lines[1].endswith("(e.g. --img-size 32)")


def test_a_folder_smaller_than_the_batch_trains_on_one_partial_batch(image_folder: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """36 images at the default --batch-size 64: one batch of every training image per epoch, with a note."""
    out = tmp_path / "small"
    assert main(["train", *TINY, "--epochs", "2", "--warmup-epochs", "0.5", "--no-progress", "--no-plot",
                 "--model-arg", "patch_size=4", "--img-size", "16", "--data", str(image_folder),
                 "--val-fraction", "0.25", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "note: the 27 training images are fewer than --batch-size 64: each epoch is one batch of all 27" in text
    assert [r["step"] for r in json.loads((out / "metrics.json").read_text())] == [1, 2]
    assert "never decays" not in text


def test_warm_up_as_long_as_the_run_is_warned(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *QUICK, "--warmup-epochs", "1", "--output", str(tmp_path / "run")]) == 0
    assert ("warning: --warmup-epochs 1 >= --epochs 1: the learning rate warms up for the whole run and never "
            "decays") in capsys.readouterr().out


def test_predict_scores_every_readable_image_and_names_the_bad_ones(trained_run: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """`predict a.png bad.png c.png`: a and c are scored, bad.png reported, the exit code says not all were read."""
    from PIL import Image

    for name in ("a", "c"):
        Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8), mode="L").save(tmp_path / f"{name}.png")
    (tmp_path / "bad.png").write_bytes(b"garbage")
    paths = [str(tmp_path / n) for n in ("a.png", "bad.png", "missing.png", "c.png")]
    assert main(["predict", *paths, "--checkpoint", str(trained_run)]) == 2
    out, err = capsys.readouterr()
    scored = [line.split(":")[0] for line in out.strip().splitlines()]
    assert scored == [paths[0], paths[3]]
    assert f"cannot read image {paths[1]}" in err and f"cannot read image {paths[2]}" in err
    assert err.strip().splitlines()[-1] == (f"vit-attention predict: error: 2 of 4 image(s) could not be read: "
                                            f"{paths[1]}, {paths[2]}")


def test_eval_prints_its_scores_when_the_run_folder_is_read_only(trained_run: Path, capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only run folder: the scores are printed, the confusion matrix is a warning that never names
    --confusion as given; an explicit --confusion that fails is an error after the scores."""
    import errno

    import vit_attention.train.plots as plots

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(plots, "plot_confusion", read_only)
    assert main(["eval", str(trained_run)]) == 0
    out, err = capsys.readouterr()
    want = json.loads((trained_run / "metrics.json").read_text())[-1]["test_acc"]
    assert out.strip().splitlines()[-1] == f"top-1 accuracy: {want:.4f}" and "top-5 accuracy" in out
    assert "cannot write the confusion matrix" in err and "Read-only file system" in err
    assert "--confusion PNG" in err and "error" not in err
    assert main(["eval", str(trained_run), "--confusion", str(trained_run / "c.png")]) == 2
    out, err = capsys.readouterr()
    assert f"top-1 accuracy: {want:.4f}" in out
    assert "error: --confusion" in err and "Read-only file system" in err


def test_corrupt_images_are_one_plain_line_each(image_folder: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    """Skipped corrupt files: `warning: skipping corrupt image PATH`, one line per file, no Python source line."""
    (image_folder / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    (image_folder / "cat" / "truncated.png").write_bytes((image_folder / "cat" / "0.png").read_bytes()[:60])
    assert main(["train", *QUICK, "--batch-size", "9", "--model-arg", "patch_size=4", "--img-size", "16",
                 "--data", str(image_folder), "--output", str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if "corrupt" in line]
    assert sorted(lines) == sorted(f"warning: skipping corrupt image {image_folder / d / f}"
                                   for d, f in (("dog", "broken.png"), ("cat", "truncated.png")))
    assert "warnings.warn" not in err and ".py:" not in err and "skipped" not in out


def test_a_terminal_run_keeps_every_epoch_line_and_ends_with_a_summary(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """With progress bars (a terminal): one line per epoch stays (written above the bars), and the run ends
    with its best epoch, best accuracy, wall time and where the weights are, before `test accuracy: X`."""
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "2", "--batch-size", "128", "--warmup-epochs", "0.5", "--progress",
                 "--no-plot", "--output", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("epoch ")] == ["epoch 1/2", "epoch 2/2"]
    history = json.loads((out / "metrics.json").read_text())
    best = max(history, key=lambda r: r["test_acc"])
    summary = next(line for line in lines if line.startswith("best epoch "))
    assert summary.startswith(f"best epoch {best['epoch']}/2: test accuracy {best['test_acc']:.4f}; wall time ")
    assert f"weights: {out}/model.safetensors (the last epoch's" in summary
    assert lines.index(summary) < len(lines) - 1 and lines[-1].startswith("test accuracy: ")
