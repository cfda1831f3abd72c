"""Names read from outside (file names, class names a checkpoint records) print as one line; a checkpoint's
recorded normalisation is checked when the file is described, not when the first image is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit_attention as va
from vit_attention.cli import main
from vit_attention.data.image import printable_name


@pytest.mark.parametrize("raw, shown", [("a\nb.png", "a\\nb.png"), ("x\r\x1b[2Jy", "x\\r\\x1b[2Jy"),
                                        ("tab\there", "tab\\there"), ("line\u2028sep", "line\\u2028sep"),
                                        ("bad\udcffbyte", "bad\\udcffbyte"), ("c1\x85", "c1\\x85"),
                                        ("plain é 日本.png", "plain é 日本.png")])
def test_printable_name_escapes_controls_only(raw: str, shown: str) -> None:
    assert printable_name(raw) == shown
    assert printable_name(raw).isprintable()


def _run(root: Path, **metadata: object) -> Path:
    torch.manual_seed(0)
    model = va.create_model("vit_digits_patch2_8", num_classes=3, in_chans=1, depth=1).eval()
    va.save_weights(model, root / "model.safetensors", metadata=metadata)
    return root


def _image(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8), mode="L").save(path, format="PNG")
    return path


def test_predict_prints_one_line_per_image_whatever_the_names(tmp_path: Path, capsys: pytest.CaptureFixture
                                                              ) -> None:
    """A file name holding a newline, and class names holding one, cannot forge another output line."""
    run = _run(tmp_path / "run", classes=["zero\nforged.png: one (1.000)", "one", "two"], mean=[0.3], std=[0.3])
    img = _image(tmp_path / "img" / "a\nforged.png: zero (1.000).png")
    assert main(["predict", "--checkpoint", str(run), "--topk", "3", str(img)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(str(img.parent) + "/a\\nforged.png") and "zero\\nforged" in out[0]


@pytest.mark.parametrize("key, value", [("mean", "abc"), ("mean", [0.3, "x"]), ("std", [0.0]), ("mean", [0.1] * 3),
                                        ("std", [float("nan")]), ("crop_pct", 0), ("crop_pct", "x"),
                                        ("classes", "cat")])
def test_a_bad_recorded_normalisation_is_named_at_once(tmp_path: Path, key: str, value: object,
                                                       capsys: pytest.CaptureFixture) -> None:
    run = _run(tmp_path / "run", **{"mean": [0.3], "std": [0.3], key: value})
    with pytest.raises(ValueError, match=f"its recorded '{key}'"):
        va.weights.describe_checkpoint(run)
    assert main(["predict", "--checkpoint", str(run), str(_image(tmp_path / "x.png"))]) == 2
    err = capsys.readouterr().err
    assert f"'{key}'" in err and "invalid data type" not in err and "Traceback" not in err


@pytest.mark.parametrize("data_config", ["abc", {"mean": "abc"}, {"std": [0.2, -1.0, 0.2]}])
def test_a_bad_recorded_data_config_is_named_at_once(tmp_path: Path, data_config: object) -> None:
    run = _run(tmp_path / "run", data_config=data_config)
    with pytest.raises(ValueError, match=r"its recorded 'data_config"):
        va.load_model(run)
