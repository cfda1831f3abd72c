"""Helpers for the training tests: tiny configs, generated image folders, subprocess runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

# A tiny ViT that trains in about a second per epoch on the digits (no BatchNorm, so data-parallel
# runs can match single-process ones exactly).
TINY = ["--model-arg", "depth=1", "--model-arg", "embed_dim=32", "--model-arg", "num_heads=2",
        "--model-arg", "conv_stem=null", "--model-arg", "drop_path_rate=0"]
TINY_KWARGS = {"depth": 1, "embed_dim": 32, "num_heads": 2, "conv_stem": None, "drop_path_rate": 0.0}


def cli_env() -> dict[str, str]:
    """Environment for CLI subprocesses: one thread each (no oversubscription on small CI machines)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def run_cli(args: list[str], *, timeout: float = 300, module: str = "vit_attention.cli",
            launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m vit_attention.cli ARGS`` (or under ``launcher``) and return the completed process."""
    cmd = [sys.executable, *(launcher or []), "-m", module, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=cli_env())


def make_image_folder(root: Path, classes: dict[str, int], *, size: int = 12, seed: int = 0) -> Path:
    """Write ``classes[name]`` small PNGs per class: each class a distinct colour and stripe so it is learnable."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for ci, (name, count) in enumerate(classes.items()):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            img = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
            img[:, :, ci % 3] += 150
            img[ci * 2 % size: ci * 2 % size + 3] = 255
            Image.fromarray(img).save(d / f"{i}.png")
    return root

