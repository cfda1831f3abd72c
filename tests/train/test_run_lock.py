"""Run folders keep one run's work: one writer at a time (an OS lock a killed process does not leave
stuck), no overwriting of files that are not this run's, metrics that follow the checkpoint, no
temporary files left behind, checkpoint states and options checked by name, and one-line errors
(unsafe pickles, a full disk, too little memory) that say what to do."""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from vit_attention import cli
from vit_attention.cli import main
from vit_attention.train import checkpoint, engine, metrics, run_folder
from vit_attention.train.config import TrainConfig
from vit_attention.train.run_folder import LOCK_NAME, RUN_FILES, RunFolderBusy, RunLock

from ._utils import TINY, cli_env

QUICK = [*TINY, "--epochs", "1", "--batch-size", "128", "--warmup-epochs", "0", "--no-progress", "--no-plot"]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _one_line_error(err: str) -> str:
    """The error line of a failed command; asserts there is no traceback."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("vit-attention ")]
    assert lines, err
    return lines[-1]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-epoch run (copied by the tests that change it)."""
    out = tmp_path_factory.mktemp("lock") / "run"
    assert main(["train", *QUICK, "--output", str(out)]) == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


# ---------------------------------------------------------------------------- the lock
def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    lock = RunLock(folder).acquire()
    assert lock.held and (folder / LOCK_NAME).read_text().split()[0] == str(os.getpid())
    with pytest.raises(RunFolderBusy, match=rf"--output {folder} is in use: process {os.getpid()}"):
        RunLock(folder).acquire()  # a second open file: flock refuses it, even in the same process
    (folder / "note.txt").write_text("kept")
    lock.release()
    assert not (folder / LOCK_NAME).exists() and (folder / "note.txt").exists()  # a folder with files stays
    with RunLock(folder) as again:  # free again
        assert again.held
    empty = tmp_path / "empty"
    RunLock(empty).acquire().release()
    assert not empty.exists()  # made by the lock, nothing written: removed


def test_train_refuses_a_folder_another_run_holds(tmp_path: Path, finished_run: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    fresh, resumed = tmp_path / "fresh", _copy(finished_run, tmp_path / "resumed")
    before = _files(resumed)
    for args, out in ((["--output", str(fresh)], fresh), (["--resume", "--epochs", "2", "--output", str(resumed)],
                                                         resumed)):
        with RunLock(out):  # another process training in it
            assert main(["train", *QUICK, *args]) == 2
            line = _one_line_error(capsys.readouterr().err)
            assert f"--output {out} is in use: process {os.getpid()} is training in it" in line
            assert "nothing was changed" in line
    assert not fresh.exists() and _files(resumed) == before


_HOLD = """
import sys, time
from vit_attention.train.run_folder import RunLock
RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_killed_owner_does_not_leave_the_folder_stuck(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder)], stdout=subprocess.PIPE, text=True,
                            env=cli_env())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match=f"process {proc.pid}"):
            RunLock(folder).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert (folder / LOCK_NAME).exists()  # left behind by the kill, but not held
    with RunLock(folder) as lock:
        assert lock.held


@pytest.mark.slow  # two training processes (~20 s)
def test_two_training_processes_one_folder(tmp_path: Path) -> None:
    """A second ``train`` on a folder in use is refused; after ``kill -9`` of the first, a resume takes it."""
    out = tmp_path / "conc"
    first = subprocess.Popen([sys.executable, "-m", "vit_attention.cli", "train", *TINY, "--epochs", "50",
                              "--batch-size", "32", "--ckpt-every", "1", "--no-plot", "--no-progress", "--output",
                              str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None and not (out / "checkpoint.json").exists():
            time.sleep(0.05)
        assert first.poll() is None
        for extra in ([], ["--resume"]):
            second = subprocess.run([sys.executable, "-m", "vit_attention.cli", "train", *QUICK, *extra, "--output",
                                     str(out)], capture_output=True, text=True, timeout=120, env=cli_env())
            assert second.returncode == 2, second.stderr
            line = _one_line_error(second.stderr)
            assert f"--output {out} is in use: process {first.pid} is training in it" in line
        assert first.poll() is None  # the first run goes on, its files untouched by the refused ones
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    state = checkpoint.load_training_state(out).state
    step, epoch = state["global_step"], state["epoch"]  # the killed run's last checkpoint
    third = subprocess.run([sys.executable, "-m", "vit_attention.cli", "train", "--resume", "--epochs",
                            str(epoch + 1 if state["step_in_epoch"] else epoch + 2), "--output", str(out)],
                           capture_output=True, text=True, timeout=300, env=cli_env())
    assert third.returncode == 0, third.stderr
    assert checkpoint.load_training_state(out).state["global_step"] > step  # it trained on from the checkpoint
    assert (out / "model.safetensors").exists() and not (out / LOCK_NAME).exists()
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow  # two torchrun processes (~10 s)
@pytest.mark.xdist_group("torchrun")
def test_refusal_under_torchrun_ends_every_rank(tmp_path: Path) -> None:
    """Rank 0 decides and tells every rank: a folder in use ends both processes with the message, no hang."""
    out = tmp_path / "ddp"
    with RunLock(out):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               "-m", "vit_attention.cli", "train", *QUICK, "--device", "cpu", "--output", str(out)],
                              capture_output=True, text=True, timeout=240, env=cli_env())
    assert proc.returncode != 0
    assert proc.stderr.count(f"--output {out} is in use") == 2, proc.stderr  # each rank's one line


_FULL_DISK_ON_RANK0 = """
import os, sys
from safetensors import SafetensorError
from vit_attention.cli import main
from vit_attention.train import checkpoint
real, calls = checkpoint.save_file, []
def full_on_second(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2 and os.environ["RANK"] == "0":
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
    return real(*args, **kwargs)
checkpoint.save_file = full_on_second
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # two torchrun processes (~15 s)
@pytest.mark.xdist_group("torchrun")
def test_full_disk_on_rank0_under_torchrun_ends_every_rank(tmp_path: Path) -> None:
    """Only rank 0 writes: its failed write is shared, so the other rank stops too instead of waiting."""
    script, out = tmp_path / "full_disk.py", tmp_path / "ddp"
    script.write_text(_FULL_DISK_ON_RANK0)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), "train", *QUICK, "--epochs", "3", "--device", "cpu", "--output", str(out)],
                          capture_output=True, text=True, timeout=240, env=cli_env())
    assert proc.returncode != 0
    assert proc.stderr.count("the disk is full; free some space") == 2, proc.stderr  # each rank's one line
    assert f"vit-attention train --resume --output {out}" in proc.stderr


# ---------------------------------------------------------------------------- what a folder may hold
@pytest.mark.parametrize("name", RUN_FILES)
def test_new_run_refuses_a_folder_holding_a_file_it_writes(tmp_path: Path, name: str,
                                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / name).write_bytes(b"someone else's file")
    (out / "README.md").write_text("a downloaded model")
    before = _files(out)
    assert main(["train", *QUICK, "--output", str(out)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert str(out) in line and "nothing was overwritten" in line
    if name not in ("checkpoint.safetensors", "metrics.json"):
        assert f"already holds {name}, which a training run would overwrite" in line
    assert _files(out) == before


def test_downloaded_model_folder_is_not_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text('{"architectures": ["ViTModel"]}')
    save_file({"w": torch.ones(2)}, str(out / "model.safetensors"))
    before = _files(out)
    assert main(["train", *QUICK, "--output", str(out)]) == 2
    assert "already holds model.safetensors, config.json" in _one_line_error(capsys.readouterr().err)
    assert _files(out) == before


# ---------------------------------------------------------------------------- metrics and temporary files
def test_metrics_lost_between_checkpoint_and_metrics_come_back_on_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    write = engine._write_metrics
    calls = []

    def killed_at_second(folder: Path, history: list) -> None:
        calls.append(len(history))
        if len(calls) == 2:
            raise KeyboardInterrupt  # a kill after the last epoch's checkpoint, before its metrics
        write(folder, history)

    monkeypatch.setattr(engine, "_write_metrics", killed_at_second)
    assert main(["train", *QUICK, "--epochs", "2", "--output", str(out)]) == 130
    assert len(json.loads((out / "metrics.json").read_text())) == 1  # one row short
    monkeypatch.setattr(engine, "_write_metrics", write)
    capsys.readouterr()
    assert main(["train", "--resume", "--output", str(out)]) == 0  # already at the last epoch: straight to the end
    history = checkpoint.load_training_state(out).state["history"]
    assert len(history) == 2 and json.loads((out / "metrics.json").read_text()) == history
    assert len((out / "metrics.csv").read_text().strip().splitlines()) == 3  # header + 2 rows


def test_resume_removes_temporary_files_a_killed_write_left(tmp_path: Path, finished_run: Path) -> None:
    out = _copy(finished_run, tmp_path / "run")
    stale = [out / ".checkpoint.safetensors.0123456789ab.tmp", out / ".metrics.json.a1b2c3d4e5f6.tmp"]
    for p in stale:
        p.write_bytes(b"partial")
    (out / "notes.tmp").write_text("the user's")  # not a temporary file of ours
    assert main(["train", "--resume", "--epochs", "2", "--output", str(out)]) == 0
    assert not any(p.exists() for p in stale) and (out / "notes.tmp").exists()
    assert not (out / LOCK_NAME).exists()


# ---------------------------------------------------------------------------- checked input
def _tampered(src: Path, dst: Path, change: dict, drop_tensor: str | None = None) -> Path:
    """A copy of run ``src`` whose checkpoint state has ``change`` applied (a value of ``...`` drops the field)."""
    out = _copy(src, dst)
    path = out / checkpoint.CHECKPOINT_NAME
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != drop_tensor}
    state = json.loads(meta["state"])
    for k, v in change.items():
        if v is ...:
            del state[k]
        else:
            state[k] = v
    meta["state"] = json.dumps(state)
    save_file(tensors, str(path), metadata=meta)
    return out


_BAD_VALUES = {"epoch": -1, "step_in_epoch": -3, "global_step": -1, "epoch_sums": [1.0], "epoch_train_time": -1.0,
               "history": "rows", "config": "options", "model_name": "", "model_config": [],
               "optimizer": {}, "rng": {}}


def test_bad_values_cover_every_state_field() -> None:
    assert set(_BAD_VALUES) == {name for name, _, _ in checkpoint._STATE_FIELDS}


@pytest.mark.parametrize("field", sorted(_BAD_VALUES))
def test_tampered_checkpoint_state_is_refused_naming_field_and_file(
        tmp_path: Path, finished_run: Path, field: str, capsys: pytest.CaptureFixture) -> None:
    for i, value in enumerate((..., _BAD_VALUES[field])):
        out = _tampered(finished_run, tmp_path / f"r{i}", {field: value})
        before = _files(out)
        assert main(["train", "--resume", "--epochs", "2", "--output", str(out)]) == 2
        line = _one_line_error(capsys.readouterr().err)
        assert f"checkpoint {out / checkpoint.CHECKPOINT_NAME} is damaged or was edited" in line, line
        assert f"'{field}'" in line and ("has no" in line if value is ... else "must be" in line), line
        assert _files(out) == before


def test_checkpoint_without_rng_tensor_is_refused(tmp_path: Path, finished_run: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    out = _tampered(finished_run, tmp_path / "r", {}, drop_tensor="rng.torch")
    assert main(["train", "--resume", "--epochs", "2", "--output", str(out)]) == 2
    assert "the tensor 'rng.torch'" in _one_line_error(capsys.readouterr().err)


_FLOAT_OPTIONS = ("lr", "min_lr", "warmup_epochs", "weight_decay", "layer_decay", "clip_grad", "label_smoothing",
                  "mixup", "cutmix", "hflip", "affine", "drop_rate", "drop_path_rate", "attn_drop_rate", "ema_decay",
                  "val_fraction", "crop_pct", "distill_alpha", "distill_tau")


def test_float_options_cover_the_config() -> None:
    floats = {name for name, tp in TrainConfig.__annotations__.items() if "float" in str(tp) and "tuple" not in str(tp)}
    assert floats == set(_FLOAT_OPTIONS)


@pytest.mark.parametrize("name", _FLOAT_OPTIONS)
def test_non_finite_float_options_are_refused(name: str) -> None:
    option = "--" + name.replace("_", "-")
    for value in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(ValueError, match=f"{option} must be a finite number, got {value}"):
            TrainConfig(**{name: value}).validate()


def test_lr_inf_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *QUICK, "--lr", "inf", "--output", str(tmp_path / "x")]) == 2
    assert "--lr must be a finite number, got inf" in _one_line_error(capsys.readouterr().err)
    assert main(["train", *QUICK, "--distill-tau", "-1", "--output", str(tmp_path / "x")]) == 2
    assert "--distill-tau must be positive" in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------- one-line errors
_DISK_FULL = {
    "safetensors": lambda: SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                           'message: "No space left on device" })'),
    "oserror": lambda: OSError(errno.ENOSPC, "No space left on device"),
}


@pytest.mark.parametrize("kind", sorted(_DISK_FULL))
@pytest.mark.parametrize("where", ["checkpoint", "metrics"])
def test_full_disk_during_training_says_how_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture, kind: str, where: str) -> None:
    out = tmp_path / "run"
    module, name = (checkpoint, "save_file") if where == "checkpoint" else (metrics, "atomic_write")
    real, calls = getattr(module, name), []

    def full_on_second(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise _DISK_FULL[kind]()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, full_on_second)
    assert main(["train", *QUICK, "--epochs", "2", "--output", str(out)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "the disk is full; free some space" in line and f"vit-attention train --resume --output {out}" in line
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(module, name, real)
    assert main(["train", "--resume", "--output", str(out)]) == 0  # the last good checkpoint resumes
    assert len(json.loads((out / "metrics.json").read_text())) == 2


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError(
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "400000000000 bytes. Error code 12 (Cannot allocate memory)"), torch.OutOfMemoryError("CUDA out of memory.")])
def test_out_of_memory_during_training_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture, error: BaseException) -> None:
    def no_memory(*args: object) -> float:
        raise error

    monkeypatch.setattr(engine, "_train_step", no_memory)
    assert main(["train", *QUICK, "--output", str(tmp_path / "run")]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "out of memory at step 0" in line and "--batch-size (now 128)" in line and "--accum-steps" in line
    assert "enforce fail" not in line


def test_user_errors_outside_training_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    evil = tmp_path / "evil.pth"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "args": argparse.Namespace(lr=1)}, evil)
    assert main(["eval", "--model", "vit_digits_patch2_8", "--checkpoint", str(evil)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"refusing to load {evil}" in line and "argparse.Namespace" in line
    assert "safetensors.torch.save_file" in line and "weights_only" not in line and "likely succeed" not in line
    messages = {
        "memory": cli.user_error_message(MemoryError()),
        "safetensors": cli.user_error_message(SafetensorError("Error while deserializing header: HeaderTooLarge")),
        "disk": cli.user_error_message(OSError(errno.ENOSPC, "No space left on device", "out/x.png")),
    }
    assert messages["memory"].startswith("out of memory: use a smaller --batch-size")
    assert messages["safetensors"].startswith("cannot read or write a safetensors file: Error while deserializing")
    assert messages["disk"] == "out/x.png: the disk is full (No space left on device); free some space and run again"
    assert cli.user_error_message(AssertionError("a bug")) is None  # a bug keeps its traceback


def test_resume_interrupted_during_start_up_says_the_run_is_intact(
        tmp_path: Path, finished_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    out = _copy(finished_run, tmp_path / "run")
    before = _files(out)

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "_load_data", interrupted)
    assert main(["train", "--resume", "--epochs", "2", "--output", str(out)]) == 130
    line = _one_line_error(capsys.readouterr().err)
    assert "nothing was written" not in line and "had not started" not in line
    assert f"the run in {out} was not changed and can be resumed again with: vit-attention train --resume " \
           f"--output {out}" in line
    assert _files(out) == before
    run_folder.RunLock(out).acquire().release()  # not left locked
