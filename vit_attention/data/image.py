"""Read an image file (or a Pillow image of any mode) as 8-bit RGB or grey: the one reader of the package.

Every command that reads images (``train --data``, ``eval``, ``predict``, ``attn``) and
:func:`~vit_attention.data.create_transform` go through :func:`read_image`, so a file gives the
same pixels everywhere. Pillow's ``convert`` clips wide-range modes to ``0..255`` (a 16-bit scan
comes out black and white); here each mode has a rule that keeps its values:

* ``1``, ``L``, ``P``, ``RGB``, ``RGBX``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``: Pillow's colour
  conversion (``CMYK`` without its ICC profile, as every common loader does).
* Transparency (``LA``, ``La``, ``PA``, ``RGBA``, ``RGBa``, and ``P`` / ``L`` / ``RGB`` with a
  ``transparency`` entry): composited over ``background`` (white by default, as viewers show
  it), so hidden colours under transparent pixels never leak in.
* 16-bit (``I;16``, ``I;16L``, ``I;16B``, ``I;16N``): ``v * 255 / 65535``, rounded: the full
  range maps to ``0..255``, order kept (the extra precision is dropped, as in every 8-bit pipeline).
* ``I`` (32-bit integers): from a PGM / PPM file (Pillow's mode for 16-bit ones, scaled to
  ``0..65535``) as 16-bit; otherwise values must lie in ``0..255`` (taken as they are).
* ``F`` (32-bit float): values in ``[0, 1]`` are scaled by 255 (the float-image convention);
  other values in ``[0, 255]`` are taken as 8-bit levels.

Anything else (``I`` / ``F`` values outside those ranges, NaN, an unknown mode) raises
:class:`UnsupportedImageError` (a ``ValueError``) naming the file, the mode and the value range.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["read_image", "UnsupportedImageError", "WHITE", "WIDE_MODES", "printable_name"]

WHITE = (255, 255, 255)
_COLOUR = ("RGB", "RGBX", "CMYK", "YCbCr", "LAB", "HSV")
_GREY = ("1", "L")
_ALPHA = {"LA": "LA", "La": "LA", "PA": "RGBA", "RGBA": "RGBA", "RGBa": "RGBA"}
_SIXTEEN = ("I;16", "I;16L", "I;16B", "I;16N")
# Modes read by value rules rather than Pillow's conversion (16-bit scaled; I / F range-checked, maybe refused).
WIDE_MODES = (*_SIXTEEN, "I", "F")


class UnsupportedImageError(ValueError):
    """An image whose mode or values have no safe 8-bit reading (the message names the file, mode and range)."""


def _name(source: Any, image: Any) -> str:
    """The file name of ``source`` (a path) or ``image`` (a Pillow image) for messages."""
    if isinstance(source, (str, Path)):
        return str(source)
    return str(getattr(image, "filename", "") or f"a Pillow image ({image.size[0]}x{image.size[1]})")


def _open(path: Path) -> Any:
    """A fully decoded Pillow image of ``path``.

    A missing file raises ``FileNotFoundError``, a non-image ``ValueError``, both naming it.
    """
    from PIL import Image

    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        with Image.open(path) as im:
            im.load()  # full decode: truncated files fail here, not later
            out = im.copy()
            out.format = im.format  # copy() forgets where the pixels came from; the PGM rule needs it
            return out
    except Image.DecompressionBombError as e:  # an image, but larger than Pillow's safety limit
        raise ValueError(f"{path} is too large to read safely ({e}); Pillow refuses images over twice "
                         f"PIL.Image.MAX_IMAGE_PIXELS ({Image.MAX_IMAGE_PIXELS:,} pixels) as possible "
                         "decompression bombs: downscale it first") from None
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for bad files
        raise ValueError(f"{path} is not an image file Pillow can read (PNG, JPEG, BMP, TIFF, ...): "
                         f"{type(e).__name__}: {e}") from None


def _grey_from_array(arr: np.ndarray) -> Any:
    """A 2-D array of 8-bit levels (any dtype) -> a mode ``L`` Pillow image, rounded and clipped to ``0..255``."""
    from PIL import Image

    return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), mode="L")


def _wide_to_grey(image: Any, name: str) -> Any:
    """An ``I;16*``, ``I`` or ``F`` image -> mode ``L`` by the rules of the module docstring."""
    arr = np.asarray(image)
    mode = image.mode
    if mode in _SIXTEEN:
        return _grey_from_array(arr.astype(np.float64) * (255.0 / 65535.0))
    arr = arr.astype(np.float64)
    if arr.size and not np.isfinite(arr).all():
        raise UnsupportedImageError(f"{name}: mode {mode} image holds NaN or infinite values; it has no pixel "
                                    "reading. Clean it (e.g. numpy.nan_to_num) before training or prediction")
    lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 0.0)
    if mode == "I" and getattr(image, "format", None) == "PPM" and lo >= 0 and hi <= 65535:
        return _grey_from_array(arr * (255.0 / 65535.0))  # 16-bit PGM / PPM (Pillow scales maxval to 65535)
    if mode == "F" and lo >= 0 and hi <= 1:
        return _grey_from_array(arr * 255.0)
    if lo >= 0 and hi <= 255:
        return _grey_from_array(arr)
    kind = "32-bit integer" if mode == "I" else "32-bit float"
    raise UnsupportedImageError(
        f"{name}: mode {mode} ({kind}) image with values in [{lo:g}, {hi:g}]: no 8-bit reading is safe (accepted: "
        f"{'0..1 floats or ' if mode == 'F' else ''}0..255); save it as 8-bit (L / RGB) or 16-bit (I;16) PNG / "
        "TIFF, or scale it to 0..255 yourself and pass the Pillow image")


def read_image(image: str | Path | Any, *, channels: int = 3, background: tuple[int, int, int] = WHITE) -> Any:
    """An image file or Pillow image of any mode -> a Pillow image of mode ``RGB`` (``channels=3``) or ``L`` (1).

    ``image``: a path or a ``PIL.Image.Image``. ``channels``: 3 (RGB) or 1 (grey, Pillow's ITU-R
    601-2 luma of the RGB reading). ``background``: the RGB colour transparent pixels are
    composited over. Mode rules: see the module docstring. Raises ``FileNotFoundError`` (missing
    file), ``ValueError`` (not an image; both name the file) and :class:`UnsupportedImageError`
    (no safe reading: names the file, the mode and the values).
    """
    from PIL import Image

    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (grey) or 3 (RGB) for images, got {channels!r}")
    source = image
    if isinstance(image, (str, Path)):
        image = _open(Path(image))
    elif not isinstance(image, Image.Image):
        raise TypeError(f"image must be a path or a Pillow image, got {type(image).__name__}")
    name = _name(source, image)
    target = "RGB" if channels == 3 else "L"
    mode = image.mode
    if mode in WIDE_MODES:
        grey = _wide_to_grey(image, name)
        return grey if target == "L" else grey.convert("RGB")
    if mode in ("P", "L", "RGB", "1") and "transparency" in image.info:
        image = image.convert("RGBA" if mode in ("P", "RGB") else "LA")
        mode = image.mode
    if mode in _ALPHA:
        rgba = image.convert(_ALPHA[mode]).convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        rgb = Image.alpha_composite(canvas, rgba).convert("RGB")
        return rgb if target == "RGB" else rgb.convert("L")
    if mode in _GREY or mode == "P":
        return image.convert(target) if mode != "P" else image.convert("RGB").convert(target)
    if mode in _COLOUR:
        rgb = image if mode == "RGB" else image.convert("RGB")
        return rgb if target == "RGB" else rgb.convert("L")
    raise UnsupportedImageError(f"{name}: Pillow mode {mode!r} is not one this reader knows how to turn into RGB; "
                                "convert it to RGB (or L) first")


# C0 / C1 controls, DEL, the Unicode line and paragraph separators, and lone surrogates (undecodable bytes of a
# file name): what could end a line, move the cursor or fail to print
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable_name(text: str | Path) -> str:
    """``text`` (a file name, a class name) with control characters escaped as Python writes them (``\\n``,
    ``\\x1b``, ``\\udcff``), for one line of a command's output: a name holding a newline cannot forge
    another output line, nor an escape sequence rewrite the terminal. Printable text is unchanged."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
