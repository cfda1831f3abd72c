"""Two processes under torchrun (Gloo, CPU) train the same model as one process with the same global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from ._utils import TINY, run_cli

ARGS = ["train", *TINY, "--epochs", "2", "--batch-size", "32", "--warmup-epochs", "0.5", "--no-progress",
        "--no-plot", "--device", "cpu", "--affine", "0"]  # no random augmentation: each rank draws its own


@pytest.mark.slow  # two torchrun processes (~12 s)
@pytest.mark.xdist_group("torchrun")
def test_two_process_gloo_matches_single_process(tmp_path: Path) -> None:
    one = run_cli([*ARGS, "--output", str(tmp_path / "one")])
    assert one.returncode == 0, one.stderr
    two = run_cli([*ARGS, "--output", str(tmp_path / "two")],
                  launcher=["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"])
    assert two.returncode == 0, two.stderr
    assert "2 process(es) on cpu" in two.stdout
    assert two.stdout.count("test accuracy:") == 1  # only rank 0 prints and writes
    a = json.loads((tmp_path / "one" / "metrics.json").read_text())
    b = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert len(a) == len(b) == 2
    for ha, hb in zip(a, b):
        for k in ("step", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "test_top5"):
            assert hb[k] == pytest.approx(ha[k], rel=1e-4, abs=1e-6), k
    assert a[-1]["train_loss"] < a[0]["train_loss"]  # it did learn something
    wa, wb = (load_file(str(tmp_path / run / "model.safetensors")) for run in ("one", "two"))
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 5e-3


@pytest.mark.slow  # two torchrun processes, twice (~25 s)
@pytest.mark.xdist_group("torchrun")
def test_two_process_fsdp_with_resume_matches_single_process(tmp_path: Path) -> None:
    args = [*ARGS, "--accum-steps", "2"]
    ref = run_cli([*args, "--output", str(tmp_path / "ref")])
    assert ref.returncode == 0, ref.stderr
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    first = run_cli([*args, "--fsdp", "--stop-after", "30", "--output", str(tmp_path / "fsdp")], launcher=launcher)
    assert first.returncode == 0, first.stderr
    assert "stopped at step 30" in first.stdout and "test accuracy" not in first.stdout
    # resume the sharded run mid-epoch 1 (optimizer state gathered by parameter name) and finish it
    second = run_cli([*args, "--fsdp", "--resume", "--output", str(tmp_path / "fsdp")], launcher=launcher)
    assert second.returncode == 0, second.stderr
    a = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    b = json.loads((tmp_path / "fsdp" / "metrics.json").read_text())
    assert len(b) == 2
    for ha, hb in zip(a, b):
        for k in ("step", "train_loss", "test_loss", "test_acc"):
            assert hb[k] == pytest.approx(ha[k], rel=1e-4, abs=1e-6), k
