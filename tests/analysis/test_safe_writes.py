"""Every file the library writes goes through the atomic writer: a symlink planted at the output path is
replaced by the new file, and the file it pointed to is left untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit_attention as va
from vit_attention.analysis.generate import save_image_grid
from vit_attention.analysis.render import save_heatmap
from vit_attention.cli import main
from vit_attention.weights.io import atomic_write_text

SECRET = b"do not overwrite\n"


def _plant(link: Path, tmp_path: Path) -> Path:
    """A symlink at ``link`` pointing at a file outside the output folder; returns the target."""
    target = tmp_path / "elsewhere" / "secret.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(SECRET)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return target


def _replaced(link: Path, target: Path) -> bool:
    return not link.is_symlink() and link.is_file() and target.read_bytes() == SECRET


def test_attn_replaces_a_planted_symlink_and_leaves_its_target(tmp_path: Path, capsys: pytest.CaptureFixture
                                                               ) -> None:
    run = tmp_path / "run"
    torch.manual_seed(0)
    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=1).eval()
    va.save_weights(model, run / "model.safetensors", metadata={"mean": [0.3], "std": [0.3]})
    image = tmp_path / "digit.png"
    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8), mode="L").save(image)
    png = run / "attention_maps" / "digit_vit_digits_patch2_8_layer-1_head0.png"
    npy = png.with_suffix(".npy")
    png_target, npy_target = _plant(png, tmp_path / "a"), _plant(npy, tmp_path / "b")
    assert main(["attn", str(run), str(image), "--layer", "-1", "--head", "0", "--save-map"]) == 0
    capsys.readouterr()
    assert _replaced(png, png_target) and png.read_bytes()[:4] == b"\x89PNG"
    assert _replaced(npy, npy_target) and np.load(npy).shape == (4, 4)


def test_render_and_generate_replace_a_planted_symlink(tmp_path: Path) -> None:
    heat_png, grid_png = tmp_path / "out" / "heat.png", tmp_path / "out" / "grid.png"
    heat_target, grid_target = _plant(heat_png, tmp_path / "a"), _plant(grid_png, tmp_path / "b")
    save_heatmap(torch.rand(3, 8, 8), torch.rand(4, 4), heat_png, title="t")
    save_image_grid(torch.rand(4, 3, 8, 8) * 2 - 1, grid_png)
    assert _replaced(heat_png, heat_target) and Image.open(heat_png).format == "PNG"
    assert _replaced(grid_png, grid_target) and Image.open(grid_png).format == "PNG"


def test_text_reports_replace_a_planted_symlink(tmp_path: Path) -> None:
    """The writer behind bench's ``--json`` / ``--markdown`` and the generated docs pages."""
    path = tmp_path / "out" / "report.json"
    target = _plant(path, tmp_path)
    atomic_write_text(path, json.dumps({"rows": []}))
    assert _replaced(path, target) and json.loads(path.read_text()) == {"rows": []}
