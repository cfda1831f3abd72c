"""One image reader for every Pillow mode: each mode a user meets, saved as Pillow writes it, read by every route.

The routes: :func:`read_image`, ``create_transform(...)(path)``, train's ``load_image`` and
``ImageFolderDataset``, and ``attn``'s ``load_image``. Images are 4x4 and read at 4x4 with
``crop_pct=1`` (no resampling), so each route must give the reader's pixels exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_attention.analysis.commands import load_image as attn_load_image
from vit_attention.data import DataConfig, UnsupportedImageError, create_transform, read_image
from vit_attention.train.data import ImageFolderDataset, load_image, scan_image_folder

S = 4  # image side
WHITE = 255


def _u8(values: list[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.uint8).reshape(S, S)


def _grey(levels: np.ndarray) -> np.ndarray:
    """Grey levels [S, S] -> the RGB reading [S, S, 3]."""
    return np.repeat(np.asarray(levels, dtype=np.uint8)[..., None], 3, axis=-1)


def _sixteen(path: Path, ext: str) -> tuple[Path, np.ndarray]:
    """A 16-bit grey image (scanners, microscopes) and its reading v * 255 / 65535 (rounded)."""
    v = np.array([0, 1, 128, 257, 1000, 4096, 16384, 30000, 32767, 32768, 40000, 50000, 60000, 65000, 65534, 65535],
                 dtype=np.uint16).reshape(S, S)
    Image.fromarray(v).save(path.with_suffix(ext))
    return path.with_suffix(ext), _grey(np.rint(v * 255.0 / 65535.0))


# name -> writer(path stem) -> (file, expected RGB [S, S, 3] uint8, tolerance)
def _one(p: Path) -> tuple[Path, np.ndarray, int]:
    bits = np.indices((S, S)).sum(0) % 2 * 255
    Image.fromarray(bits.astype(np.uint8)).convert("1").save(p.with_suffix(".png"))
    assert Image.open(p.with_suffix(".png")).mode == "1"
    return p.with_suffix(".png"), _grey(bits), 0


def _l(p: Path) -> tuple[Path, np.ndarray, int]:
    v = _u8(np.arange(16) * 17)
    Image.fromarray(v, mode="L").save(p.with_suffix(".png"))
    return p.with_suffix(".png"), _grey(v), 0


PALETTE = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (10, 20, 30)]
INDICES = np.arange(16).reshape(S, S) % 4


def _palette(transparent: bool) -> Callable[[Path], tuple[Path, np.ndarray, int]]:
    def write(p: Path) -> tuple[Path, np.ndarray, int]:
        im = Image.fromarray(INDICES.astype(np.uint8), mode="P")
        im.putpalette([c for rgb in PALETTE for c in rgb] + [0] * (768 - 12))
        path = p.with_suffix(".png")
        im.save(path, **({"transparency": 3} if transparent else {}))
        expected = np.array(PALETTE, dtype=np.uint8)[INDICES]
        if transparent:  # index 3 is transparent: white shows, not its hidden colour (10, 20, 30)
            expected[INDICES == 3] = WHITE
        return path, expected, 0
    return write


ALPHA = _u8([255, 0] * 8)  # opaque / fully transparent, alternating


def _la(p: Path) -> tuple[Path, np.ndarray, int]:
    v = _u8(np.arange(16) * 7)
    Image.fromarray(np.stack([v, ALPHA], -1), mode="LA").save(p.with_suffix(".png"))
    return p.with_suffix(".png"), _grey(np.where(ALPHA == 255, v, WHITE)), 0


RGB = np.random.default_rng(0).integers(0, 256, (S, S, 3), dtype=np.uint8)


def _rgb(p: Path) -> tuple[Path, np.ndarray, int]:
    Image.fromarray(RGB, mode="RGB").save(p.with_suffix(".png"))
    return p.with_suffix(".png"), RGB, 0


def _rgba(p: Path) -> tuple[Path, np.ndarray, int]:
    Image.fromarray(np.concatenate([RGB, ALPHA[..., None]], -1), mode="RGBA").save(p.with_suffix(".png"))
    return p.with_suffix(".png"), np.where(ALPHA[..., None] == 255, RGB, WHITE).astype(np.uint8), 0


JPEG = {"quality": 100, "subsampling": 0}  # (ignored by the TIFF writer)
CMYK = [((255, 0, 0, 0), (0, 255, 255)), ((0, 255, 0, 0), (255, 0, 255)), ((0, 0, 255, 0), (255, 255, 0)),
        ((0, 0, 0, 255), (0, 0, 0)), ((0, 0, 0, 0), (255, 255, 255))]


def _cmyk(ext: str, tol: int) -> Callable[[Path], tuple[Path, np.ndarray, int]]:
    def write(p: Path) -> tuple[Path, np.ndarray, int]:
        # 4 rows of one colour each (JPEG blocks of one colour decode nearly exactly)
        rows = [CMYK[i] for i in (0, 1, 3, 4)]
        inks = np.array([[r[0]] * S for r in rows], dtype=np.uint8)
        Image.fromarray(inks, mode="CMYK").save(p.with_suffix(ext), **JPEG)
        assert Image.open(p.with_suffix(ext)).mode == "CMYK"
        return p.with_suffix(ext), np.array([[r[1]] * S for r in rows], dtype=np.uint8), tol
    return write


def _ycbcr(ext: str, tol: int) -> Callable[[Path], tuple[Path, np.ndarray, int]]:
    def write(p: Path) -> tuple[Path, np.ndarray, int]:
        # grey (Y=128, neutral chroma) and pure red (ITU-R 601: Y 76, Cb 85, Cr 255)
        ycc = np.array([[(128, 128, 128)] * S] * 2 + [[(76, 85, 255)] * S] * 2, dtype=np.uint8)
        Image.fromarray(ycc, mode="YCbCr").save(p.with_suffix(ext), **JPEG)
        expected = np.array([[(128, 128, 128)] * S] * 2 + [[(254, 0, 0)] * S] * 2, dtype=np.uint8)
        assert Image.open(p.with_suffix(ext)).mode == ("YCbCr" if ext == ".tif" else "RGB")  # JPEG: decoded to RGB
        return p.with_suffix(ext), expected, tol
    return write


def _i16_png(p: Path) -> tuple[Path, np.ndarray, int]:
    path, expected = _sixteen(p, ".png")
    assert Image.open(path).mode == "I;16"
    return path, expected, 0


def _i16_pgm(p: Path) -> tuple[Path, np.ndarray, int]:
    path, expected = _sixteen(p, ".pgm")
    assert Image.open(path).mode == "I"  # Pillow reads a 16-bit PGM as 32-bit integers
    return path, expected, 0


def _i32_tif(p: Path) -> tuple[Path, np.ndarray, int]:
    v = (np.arange(16) * 17).astype(np.int32).reshape(S, S)
    Image.fromarray(v, mode="I").save(p.with_suffix(".tif"))
    assert Image.open(p.with_suffix(".tif")).mode == "I"
    return p.with_suffix(".tif"), _grey(v), 0


def _float(scale: float) -> Callable[[Path], tuple[Path, np.ndarray, int]]:
    def write(p: Path) -> tuple[Path, np.ndarray, int]:
        v = (np.arange(16, dtype=np.float32) / 15 * scale).reshape(S, S)
        Image.fromarray(v, mode="F").save(p.with_suffix(".tif"))
        assert Image.open(p.with_suffix(".tif")).mode == "F"
        return p.with_suffix(".tif"), _grey(np.rint(v * (255.0 / scale if scale == 1 else 1.0))), 0
    return write


MODES: dict[str, Callable[[Path], tuple[Path, np.ndarray, int]]] = {
    "1": _one, "L": _l, "P": _palette(False), "P-transparency": _palette(True), "LA": _la, "RGB": _rgb,
    "RGBA": _rgba, "CMYK-tiff": _cmyk(".tif", 0), "CMYK-jpeg": _cmyk(".jpg", 3), "YCbCr-tiff": _ycbcr(".tif", 1),
    "YCbCr-jpeg": _ycbcr(".jpg", 3), "I;16-png": _i16_png, "I-pgm16": _i16_pgm, "I-tiff32": _i32_tif,
    "F-0..1": _float(1.0), "F-0..255": _float(255.0),
}


def _config(channels: int) -> DataConfig:
    """Read at the image's own size, whole (no resampling), unnormalised: the pixels / 255."""
    return DataConfig(input_size=(channels, S, S), crop_pct=1.0, mean=(0.0,) * channels, std=(1.0,) * channels)


def _routes(path: Path, channels: int) -> dict[str, torch.Tensor]:
    """Every way the package reads an image file -> ``[C, S, S]`` in [0, 1]."""
    x, shown = attn_load_image(path, _config(channels))
    assert torch.equal(x[0], shown)  # mean 0, std 1
    return {
        "read_image": torch.from_numpy(np.asarray(read_image(path, channels=channels), dtype=np.float32)
                                       .reshape(S, S, channels).copy()).permute(2, 0, 1) / 255,
        "create_transform": create_transform(_config(channels))(path),
        "create_transform(**)": create_transform(**_config(channels))(path),
        "train.load_image": load_image(path, S, in_chans=channels, crop_pct=1.0),
        "ImageFolderDataset": ImageFolderDataset([(path, 0)], (S, S), in_chans=channels, crop_pct=1.0)[0][0],
        "attn.load_image": shown,
    }


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_reads_the_same_pixels_on_every_route(mode: str, tmp_path: Path) -> None:
    path, rgb, tol = MODES[mode](tmp_path / "image")
    im = read_image(path)
    assert im.mode == "RGB" and im.size == (S, S)
    got = np.asarray(im).astype(int)
    assert np.abs(got - rgb.astype(int)).max() <= tol, (mode, got.tolist(), rgb.tolist())
    grey = np.asarray(read_image(path, channels=1))
    assert read_image(path, channels=1).mode == "L"
    assert np.array_equal(grey, np.asarray(Image.fromarray(got.astype(np.uint8)).convert("L")))  # luma of the RGB
    for channels, want in ((3, got), (1, grey)):
        expected = torch.from_numpy(want.reshape(S, S, channels).astype(np.float32)).permute(2, 0, 1) / 255
        for route, t in _routes(path, channels).items():
            assert t.shape == (channels, S, S), (mode, route)
            torch.testing.assert_close(t, expected, atol=1e-6, rtol=0, msg=f"{mode} via {route}")


def test_sixteen_bit_is_scaled_not_clipped(tmp_path: Path) -> None:
    """Pillow's own convert("L") clips 16-bit values at 255 (a scan comes out black and white); ours scales."""
    path, expected = _sixteen(tmp_path / "scan", ".png")
    ours = np.asarray(read_image(path, channels=1))
    assert np.array_equal(ours, expected[..., 0])
    assert ours[0, 3] == 1 and ours[1, 0] == 4 and ours[2, 1] == 128 and ours[3, 3] == 255  # 257, 1000, 32768, 65535
    clipped = np.asarray(Image.open(path).convert("L"))
    assert not np.array_equal(ours, clipped)  # the naive reading differs: the test sees a regression to it


@pytest.mark.parametrize(("mode", "values", "shown"), [
    ("I", np.array([[0, 70000]], dtype=np.int32), "[0, 70000]"),
    ("I", np.array([[-3, 10]], dtype=np.int32), "[-3, 10]"),
    ("F", np.array([[-1.0, 0.5]], dtype=np.float32), "[-1, 0.5]"),
    ("F", np.array([[0.0, 300.0]], dtype=np.float32), "[0, 300]"),
    ("F", np.array([[0.0, np.nan]], dtype=np.float32), "NaN"),
])
def test_out_of_range_wide_images_are_refused_naming_file_and_mode(mode: str, values: np.ndarray, shown: str,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "cls").mkdir()
    path = tmp_path / "cls" / "bad.tif"
    Image.fromarray(values, mode=mode).save(path)
    config = _config(3)
    for read in (lambda: read_image(path), lambda: create_transform(config)(path),
                 lambda: load_image(path, 2, crop_pct=1.0), lambda: attn_load_image(path, config),
                 lambda: scan_image_folder(tmp_path)):
        with pytest.raises(UnsupportedImageError) as e:
            read()
        msg = str(e.value)
        assert str(path) in msg and f"mode {mode}" in msg and shown in msg, msg
    assert isinstance(e.value, ValueError)  # the CLI reports it as a one-line error


def test_pillow_images_in_memory_follow_the_same_rules() -> None:
    sixteen = Image.fromarray(np.array([[0, 32768, 65535, 1000]], dtype=np.uint16))
    assert np.asarray(read_image(sixteen, channels=1)).tolist() == [[0, 128, 255, 4]]
    rgba = Image.new("RGBA", (2, 1), (0, 0, 0, 0))
    assert np.asarray(read_image(rgba, background=(0, 10, 20))).tolist() == [[[0, 10, 20]] * 2]
    with pytest.raises(UnsupportedImageError, match=r"a Pillow image \(1x1\): mode F"):
        read_image(Image.fromarray(np.array([[5e3]], dtype=np.float32)))
    with pytest.raises(TypeError, match="path or a Pillow image"):
        read_image(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="channels must be 1"):
        read_image(rgba, channels=4)
