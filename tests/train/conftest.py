"""Fixtures of the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._utils import make_image_folder


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """Three classes of 12 PNGs each under ``tmp_path/images``."""
    return make_image_folder(tmp_path / "images", {"cat": 12, "dog": 12, "fox": 12})
