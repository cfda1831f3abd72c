"""Kill a training run with SIGKILL in the middle of an epoch, resume it, and finish where an uninterrupted run does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from ._utils import TINY, cli_env, run_cli

ARGS = ["train", *TINY, "--epochs", "8", "--batch-size", "32", "--warmup-epochs", "0.5", "--ckpt-every", "4",
        "--no-progress", "--no-plot", "--drop", "0.1", "--mixup", "0.5"]  # dropout + mixup: RNG must resume too


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in h.items() if k != "train_img_s"} for h in json.loads((run / "metrics.json").read_text())]


@pytest.mark.slow  # three training subprocesses (~20 s)
def test_sigkill_mid_epoch_then_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    ref = run_cli([*ARGS, "--output", str(tmp_path / "ref")])
    assert ref.returncode == 0, ref.stderr

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "vit_attention.cli", *ARGS, "--output", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env())
    state = None
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                state = json.loads((killed / "checkpoint.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                state = None
            if state and state["epoch"] >= 1 and state["step_in_epoch"] > 0:  # mid-epoch, after a full epoch
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        if proc.poll() is None and not (state and state["step_in_epoch"] > 0):
            proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL, "the run finished before it could be killed mid-epoch"
    assert not (killed / "model.safetensors").exists()  # really interrupted
    saved = json.loads((killed / "checkpoint.json").read_text())
    assert saved["step_in_epoch"] > 0

    res = run_cli([*ARGS, "--output", str(killed), "--resume"])
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stdout
    assert res.stdout.strip().splitlines()[-1] == ref.stdout.strip().splitlines()[-1]
    got, want = _metrics(killed), _metrics(tmp_path / "ref")
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        for k in w:
            assert g[k] == pytest.approx(w[k], rel=1e-6, abs=1e-7), (g["epoch"], k)
    a, b = load_file(str(killed / "model.safetensors")), load_file(str(tmp_path / "ref" / "model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_resume_keeps_the_metrics_csv_column_order(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The checkpoint stores the history as sorted JSON; a resumed run must still write the first run's header."""
    import csv

    from vit_attention.cli import main

    args = ["train", *TINY, "--batch-size", "128", "--warmup-epochs", "0.5", "--no-progress", "--no-plot",
            "--ema", "0.9", "--output", str(tmp_path / "run")]
    assert main([*args, "--epochs", "1"]) == 0
    first = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = first[0].split(",")
    assert header[:4] == ["epoch", "step", "lr", "train_loss"] and header[-1] == "test_acc_ema"
    assert main([*args, "--epochs", "2", "--resume"]) == 0
    assert "resuming" in capsys.readouterr().out
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == header  # the same columns in the same order
    assert rows[1] == first[1].split(",")  # the first epoch's row unchanged, aligned with the header
    assert [r[0] for r in rows[1:]] == ["1", "2"] and all(len(r) == len(header) for r in rows)
    assert list(json.loads((tmp_path / "run" / "metrics.json").read_text())[1]) == header


def test_resuming_a_finished_run_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from vit_attention.cli import main

    quick = ["train", *TINY, "--epochs", "1", "--batch-size", "128", "--no-progress", "--no-plot",
             "--output", str(tmp_path / "run")]
    assert main(quick) == 0
    capsys.readouterr()
    assert main([*quick, "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"the run in {tmp_path / 'run'} has finished its 1 epoch(s)" in out and "nothing to train" in out
    assert "with --resume to train it further" in out and "resuming " not in out
