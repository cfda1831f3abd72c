"""The main job: ``vit-attention`` with no arguments trains the digits ViT to >= 97 % test accuracy."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from ._utils import cli_env

pytestmark = pytest.mark.slow


def test_default_train_reaches_97_percent(tmp_path: Path) -> None:
    import subprocess
    import sys

    t0 = time.perf_counter()
    # no sub-command and no arguments: exactly what the README's main-job command runs
    proc = subprocess.run([sys.executable, "-m", "vit_attention.cli"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=cli_env())
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"test accuracy: (\d\.\d{4})", last)
    assert m, last
    assert float(m.group(1)) >= 0.97, f"{last} after {elapsed:.0f} s"
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "curves.png").exists() and (runs[0] / "model.safetensors").exists()
    # token merging at the docs' recommended r for this model (docs/token_merging.md): within 3 points. The trained
    # model depends on the CPU's kernels (their summation order): r = 3 cost 0.2 points on an AMD EPYC (AVX2) and
    # 1.8 on an Intel Xeon with AVX-512 / AMX (8 of 450 images); a broken merge costs far more
    accs = {}
    for r in ("0", "3"):
        ev = subprocess.run([sys.executable, "-m", "vit_attention.cli", "eval", "--checkpoint", str(runs[0]),
                             "--tome", r], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env())
        assert ev.returncode == 0, ev.stderr[-2000:]
        found = re.search(r"top-1 accuracy: (\d\.\d{4})", ev.stdout + ev.stderr)
        assert found, ev.stdout[-500:]
        accs[r] = float(found.group(1))
    assert accs["0"] == float(m.group(1)) and accs["0"] - accs["3"] <= 0.03, accs
