"""``eval`` / ``predict`` load what training wrote through ``load_model`` and refuse bad options clearly.

The run folders here are written directly (``save_weights`` / ``save_training_state`` with the
metadata the engine records), so no training is needed: a 1-block digits ViT, 8x8 grayscale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import vit_attention as va
from vit_attention.cli import main

from ._utils import make_image_folder

DIGIT_CLASSES = [str(i) for i in range(10)]


def _digits_run(root: Path, *, classes: list[str] | None = None, data: str = "digits", in_chans: int = 1,
                img_size: int = 8) -> Path:
    """A run folder as `vit-attention train` leaves it: model.safetensors with the data metadata."""
    classes = classes or DIGIT_CLASSES
    torch.manual_seed(0)
    model = va.create_model("vit_digits_patch2_8", num_classes=len(classes), in_chans=in_chans, depth=1,
                            img_size=img_size).eval()
    va.save_weights(model, root / "model.safetensors",
                    metadata={"classes": classes, "mean": [0.3] * in_chans, "std": [0.2] * in_chans, "data": data,
                              "crop_pct": 1.0, "val_fraction": 0.25, "split_seed": 0})
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _digits_run(tmp_path_factory.mktemp("inference") / "run")


@pytest.fixture(scope="module")
def digit_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from PIL import Image

    path = tmp_path_factory.mktemp("img") / "digit.png"
    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8), mode="L").save(path)
    return path


def _err(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_predict_crop_pct_zero_names_the_option(run: Path, digit_png: Path, capsys: pytest.CaptureFixture) -> None:
    for bad in ("0", "-0.5", "nan", "inf"):
        assert main(["predict", str(digit_png), "--checkpoint", str(run), "--crop-pct", bad]) == 2
        err = _err(capsys)
        assert "--crop-pct must be a positive number" in err and "cannot read image" not in err


def test_predict_takes_a_crop_pct_above_one(run: Path, digit_png: Path, capsys: pytest.CaptureFixture) -> None:
    """timm's meaning: crop_pct 1.6 resizes the 8x8 digit to 5x5 and pads it to 8x8 (no longer refused)."""
    assert main(["predict", str(digit_png), "--checkpoint", str(run), "--crop-pct", "1.6", "--topk", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(str(digit_png))


def test_predict_with_the_model_name_as_an_image_says_to_use_model(digit_png: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """``predict MODEL IMAGE`` (the model given where images go): the error says to pass ``--model MODEL``."""
    assert main(["predict", "deit_tiny_patch16_224", str(digit_png), "--pretrained"]) == 2
    err = _err(capsys)
    assert "image(s) not found: deit_tiny_patch16_224" in err and "--model deit_tiny_patch16_224" in err
    assert main(["predict", "no_such_file.png"]) == 2
    assert "--model" not in _err(capsys)


def test_eval_takes_the_run_as_its_argument_and_says_what_is_missing(run: Path, capsys: pytest.CaptureFixture,
                                                                     tmp_path: Path) -> None:
    """``eval RUN`` is ``eval --checkpoint RUN``; both at once, or neither (nor --pretrained), is a clear error."""
    assert main(["eval", "--checkpoint", str(run), "--confusion", str(tmp_path / "a.png")]) == 0
    by_option = capsys.readouterr().out
    assert main(["eval", str(run), "--confusion", str(tmp_path / "b.png")]) == 0
    assert capsys.readouterr().out == by_option.replace("a.png", "b.png") and "accuracy" in by_option
    assert main(["eval", str(run), "--checkpoint", str(run)]) == 2
    assert "give one" in _err(capsys)
    assert main(["eval"]) == 2
    err = _err(capsys)
    assert "give --checkpoint" in err and "NoneType" not in err


def test_predict_topk_zero_and_too_large(run: Path, digit_png: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["predict", str(digit_png), "--checkpoint", str(run), "--topk", "0"]) == 2
    assert "--topk must be an int >= 1" in _err(capsys)
    assert main(["predict", str(digit_png), "--checkpoint", str(run), "--topk", "50"]) == 0
    captured = capsys.readouterr()
    assert "showing all 10" in captured.err
    (line,) = captured.out.strip().splitlines()
    assert line.count("(") == 10 and all(f"{c} (" in line for c in DIGIT_CLASSES)


def test_predict_with_another_models_checkpoint(run: Path, digit_png: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["predict", str(digit_png), "--checkpoint", str(run), "--model", "vit_tiny_patch16_224"]) == 2
    err = _err(capsys)
    assert "--model 'vit_tiny_patch16_224' contradicts the checkpoint" in err
    assert "describes model 'vit_digits_patch2_8'" in err
    # the same name (or repeating the saved config) is fine; contradicting the config is not
    assert main(["predict", str(digit_png), "--checkpoint", str(run), "--model", "vit_digits_patch2_8",
                 "--num-classes", "10"]) == 0
    capsys.readouterr()
    assert main(["predict", str(digit_png), "--checkpoint", str(run), "--num-classes", "5"]) == 2
    assert "--num-classes 5 contradicts the checkpoint" in _err(capsys)


def test_predict_uses_the_saved_config_and_training_checkpoint(tmp_path: Path, digit_png: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    """A 1-channel 10-class model (not the preset's 3 / 1000) and a run folder with only checkpoint.safetensors."""
    from vit_attention.train.checkpoint import save_training_state

    model = va.load_model(_digits_run(tmp_path / "a"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_training_state(tmp_path / "b" / "checkpoint.safetensors", model_state=model.state_dict(),
                        optimizer_state=opt.state_dict(),
                        state={"model_name": "vit_digits_patch2_8", "model_config": model.cfg.to_dict(),
                               "classes": DIGIT_CLASSES, "mean": [0.3], "std": [0.2], "config": {"data": None}})
    outs = []
    for source in (tmp_path / "a", tmp_path / "b", tmp_path / "b" / "checkpoint.safetensors"):
        assert main(["predict", str(digit_png), "--checkpoint", str(source), "--topk", "3"]) == 0
        outs.append(capsys.readouterr().out.split(": ", 1)[1])
    assert outs[0] == outs[1] == outs[2]


def test_eval_refuses_data_with_other_class_names(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = make_image_folder(tmp_path / "pets", {"cat": 4, "dog": 4, "fox": 4}, size=8)
    run = _digits_run(tmp_path / "run", classes=["ant", "cat", "dog"], data=str(folder), in_chans=3)
    assert main(["eval", "--checkpoint", str(run), "--data", str(folder)]) == 2
    err = _err(capsys)
    assert "other classes than the model was trained on" in err
    assert "only in --data: fox" in err and "only in training: ant" in err
    # same names in another order would also score class i as training class i
    run2 = _digits_run(tmp_path / "run2", classes=["cat", "fox", "dog"], data=str(folder), in_chans=3)
    assert main(["eval", "--checkpoint", str(run2), "--data", str(folder)]) == 2
    assert "same names in another order" in _err(capsys)
    # matching names evaluate
    run3 = _digits_run(tmp_path / "run3", classes=["cat", "dog", "fox"], data=str(folder), in_chans=3)
    assert main(["eval", "--checkpoint", str(run3), "--data", str(folder), "--val-fraction", "0.5",
                 "--confusion", str(tmp_path / "c.png")]) == 0
    assert "top-1 accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["under_a_file", "read_only", "folder", "not_png"])
def test_eval_confusion_path_errors_name_the_option(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                    where: str) -> None:
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "dir.png").mkdir()
    target = {"under_a_file": tmp_path / "file.txt" / "conf.png",
              "read_only": Path("/sys/vit_attention_confusion.png"),  # sysfs refuses new files, even to root
              "folder": tmp_path / "dir.png", "not_png": tmp_path / "conf.txt"}[where]
    assert main(["eval", "--checkpoint", str(run), "--confusion", str(target)]) == 2
    err = _err(capsys)
    assert f"--confusion {target}" in err


def test_eval_and_predict_on_a_foreign_checkpoint_need_model(tmp_path: Path, digit_png: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=1)
    torch.save(model.state_dict(), tmp_path / "foreign.pth")
    assert main(["predict", str(digit_png), "--checkpoint", str(tmp_path / "foreign.pth")]) == 2
    assert "give --model NAME" in _err(capsys)
    assert main(["predict", str(digit_png), "--checkpoint", str(tmp_path / "foreign.pth"), "--model",
                 "vit_digits_patch2_8", "--num-classes", "10", "--model-arg", "in_chans=1",
                 "--model-arg", "depth=1"]) == 0
    assert capsys.readouterr().out.startswith(str(digit_png))
    assert main(["predict", str(digit_png), "--checkpoint", str(tmp_path / "foreign.pth"), "--model",
                 "vit_digits_patch2_8", "--num-classes", "10", "--model-arg", "in_chans=1"]) == 2
    assert "does not fit --model vit_digits_patch2_8" in _err(capsys)
    (tmp_path / "notes.pth").write_text("not a checkpoint")
    assert main(["predict", str(digit_png), "--checkpoint", str(tmp_path / "notes.pth")]) == 2
    assert "notes.pth is not a torch checkpoint" in _err(capsys)
    assert main(["predict", str(digit_png), "--checkpoint", str(tmp_path / "notes.pth"), "--model",
                 "vit_digits_patch2_8"]) == 2
    assert "notes.pth is not a torch checkpoint" in _err(capsys)


@pytest.mark.compile
def test_predict_on_every_attention_backend(run: Path, digit_png: Path, capsys: pytest.CaptureFixture) -> None:
    """``--model-arg attn_backend=...`` goes with a file of ours (how it runs, not what it is): same answer."""
    outs = []
    for backend in ("auto", "explicit", "flex"):
        assert main(["predict", str(digit_png), "--checkpoint", str(run), "--topk", "3",
                     "--model-arg", f"attn_backend={backend}"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2]
    assert main(["predict", str(digit_png), "--checkpoint", str(run), "--model-arg", "attn_backend=flash"]) == 2
    assert "--model-arg attn_backend must be one of ['auto', 'sdpa', 'explicit', 'flex'], got 'flash'" in _err(capsys)


def test_train_options_check_the_backend() -> None:
    from vit_attention.train.config import check_model_kwargs

    check_model_kwargs("vit_digits_patch2_8", {"attn_backend": "flex", "depth": 1})
    with pytest.raises(ValueError, match="--model-arg attn_backend must be one of"):
        check_model_kwargs("vit_digits_patch2_8", {"attn_backend": "fused"})


def test_predict_with_token_merging(run: Path, tmp_path: Path, digit_png: Path, capsys: pytest.CaptureFixture) -> None:
    """``--tome R`` merges R tokens per block of a token model; a windowed model and a bad R are refused by name."""
    assert main(["predict", str(digit_png), "--checkpoint", str(run), "--tome", "3"]) == 0
    assert "(" in capsys.readouterr().out
    assert main(["predict", str(digit_png), "--checkpoint", str(run), "--tome", "-1"]) == 2
    assert "--tome must be an int >= 0" in _err(capsys)
    swin = va.create_model("swin_digits_patch2_window2_8", num_classes=10, in_chans=1).eval()
    va.save_weights(swin, tmp_path / "swin" / "model.safetensors",
                    metadata={"classes": DIGIT_CLASSES, "mean": [0.3], "std": [0.2], "data": "digits",
                              "crop_pct": 1.0, "val_fraction": 0.25, "split_seed": 0})
    assert main(["predict", str(digit_png), "--checkpoint", str(tmp_path / "swin"), "--tome", "2"]) == 2
    assert "--tome 2: token merging is not available for SwinTransformer" in _err(capsys)
