"""Runs that never lose work: divergence, interrupts, run folders, resume from saved options, bad data and options."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vit_attention.cli import main
from vit_attention.train import config as train_config
from vit_attention.train import engine, errors, plots, run_folder
from vit_attention.train.checkpoint import load_training_state
from vit_attention.weights.io import read_metadata

from ._utils import TINY, cli_env, make_image_folder

QUICK = [*TINY, "--epochs", "1", "--batch-size", "128", "--warmup-epochs", "0", "--no-progress", "--no-plot"]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_divergence_stops_before_saving_and_the_last_checkpoint_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fresh = tmp_path / "fresh"
    assert main(["train", *QUICK, "--lr", "1e6", "--clip-grad", "0", "--output", str(fresh)]) == 1
    err = capsys.readouterr().err
    assert "diverged" in err and re.search(r"loss is nan at step \d+", err) and "lower --lr" in err
    assert "Traceback" not in err and "test accuracy" not in capsys.readouterr().out
    assert not (fresh / "model.safetensors").exists() and not (fresh / "checkpoint.safetensors").exists()

    run = tmp_path / "run"
    assert main(["train", *QUICK, "--output", str(run)]) == 0
    good = _files(run)
    capsys.readouterr()
    # a diverging continuation: non-zero exit, every file as it was (the checkpoint stays resumable)
    assert main(["train", "--resume", "--output", str(run), "--epochs", "2", "--lr", "1e6", "--clip-grad", "0"]) == 1
    err = capsys.readouterr().err
    assert "diverged" in err and f"--resume --output {run}" in err and "step 10" in err
    assert _files(run) == good
    assert main(["train", "--resume", "--output", str(run), "--epochs", "2"]) == 0
    weights = load_file(str(run / "model.safetensors"))
    assert all(bool(torch.isfinite(v).all()) for v in weights.values())
    assert len(json.loads((run / "metrics.json").read_text())) == 2


def test_non_finite_weights_are_never_written(tmp_path: Path) -> None:
    cfg = train_config.TrainConfig(model_kwargs={"depth": 1, "embed_dim": 32, "num_heads": 2, "conv_stem": None},
                             epochs=1, batch_size=128, output=str(tmp_path / "w"), progress=False, plot=False)
    state = {"a": torch.ones(2), "b": torch.tensor([1.0, float("inf")])}
    progress = engine._Progress()
    with pytest.raises(errors.TrainingDiverged, match=r"weights \(b\) are not finite.*lower --lr"):
        engine._check_finite_state(state, progress, cfg)
    engine._check_finite_state({"a": torch.ones(2), "n": torch.tensor([3])}, progress, cfg)


def test_resume_takes_the_saved_options_and_warns_on_a_longer_schedule(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = make_image_folder(tmp_path / "images", {"cat": 8, "dog": 8, "fox": 8})
    run = tmp_path / "run"
    assert main(["train", *QUICK, "--model-arg", "patch_size=4", "--img-size", "16", "--batch-size", "6",
                 "--data", str(folder), "--val-fraction", "0.25", "--lr", "1e-3", "--output", str(run)]) == 0
    # the training class names are in the weights' and the checkpoint's metadata (eval --data compares them)
    assert json.loads(read_metadata(run / "model.safetensors")["classes"]) == ["cat", "dog", "fox"]
    assert load_training_state(run).state["classes"] == ["cat", "dog", "fox"]
    capsys.readouterr()
    # no --data, --model-arg, --img-size, --batch-size or --lr: all come from the run
    assert main(["train", "--resume", "--output", str(run), "--epochs", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "data images: 18 train / 6 test images, 3 classes" in out
    assert "epochs 1 -> 2" in out and "schedule" in out
    assert "changed option" not in out
    saved = json.loads((run / "config.json").read_text())["train"]
    assert saved["data"] == str(folder) and saved["lr"] == 1e-3 and saved["batch_size"] == 6
    # an option given again overrides the saved one, with the existing warning
    assert main(["train", "--resume", "--output", str(run), "--epochs", "3", "--lr", "2e-3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "changed option(s) lr: 0.001 -> 0.002" in out
    assert len(json.loads((run / "metrics.json").read_text())) == 3
    assert main(["train", "--resume", "--output", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err


def test_run_folders_are_created_exclusively(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.time, "strftime", lambda fmt: "20260101-120000")
    made: list[Path] = []
    barrier = threading.Barrier(6)

    def start() -> None:
        barrier.wait()
        made.append(run_folder.create_run_folder("vit", root=tmp_path / "runs"))

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 6 and all(p.is_dir() for p in made)
    assert {p.name for p in made} == {"vit-20260101-120000"} | {f"vit-20260101-120000-{i}" for i in range(1, 6)}


def test_default_output_of_two_runs_in_one_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(engine.time, "strftime", lambda fmt: "20260101-120000")
    (tmp_path / "runs" / "vit_digits_patch2_8-20260101-120000").mkdir(parents=True)  # another run just made it
    assert main(["train", *QUICK]) == 0
    assert "output runs/vit_digits_patch2_8-20260101-120000-1" in capsys.readouterr().out
    assert (tmp_path / "runs" / "vit_digits_patch2_8-20260101-120000-1" / "model.safetensors").exists()
    assert not any((tmp_path / "runs" / "vit_digits_patch2_8-20260101-120000").iterdir())


@pytest.mark.slow  # a training subprocess per signal (~10 s)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_prints_how_to_resume_and_leaves_no_temporary_files(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "run"
    # SIGINT at its default disposition in the child, as in an interactive shell: a suite started in the
    # background of a non-interactive shell inherits SIGINT ignored, and Python then installs no handler
    proc = subprocess.Popen([sys.executable, "-m", "vit_attention.cli", "train", *TINY, "--epochs", "50",
                             "--batch-size", "32", "--ckpt-every", "1", "--no-plot", "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not (out / "checkpoint.json").exists():
        time.sleep(0.05)
    time.sleep(0.3)  # in the middle of the steps (and their checkpoint writes)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("vit-attention train: stopped: interrupted by ")
    assert f"vit-attention train --resume --output {out}" in last
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    state = load_training_state(out).state  # the checkpoint on disk is whole
    assert state["global_step"] >= 1 and not (out / "model.safetensors").exists()


def test_single_class_is_refused_and_small_splits_warn(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    one = make_image_folder(tmp_path / "one", {"cat": 10})
    assert main(["train", *QUICK, "--data", str(one), "--batch-size", "4", "--output", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "only the class 'cat'" in err and "at least two classes" in err
    assert not (tmp_path / "a").exists()
    few = make_image_folder(tmp_path / "few", {"cat": 10, "dog": 1, "fox": 1})  # 1 validation image, 3 classes
    assert main(["train", *QUICK, "--model-arg", "patch_size=4", "--img-size", "16", "--data", str(few),
                 "--batch-size", "4", "--output", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "warning: the validation split of few has 1 image(s) for 3 classes" in out and "--val-fraction" in out


def test_model_arg_of_the_wrong_type_names_the_option(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--model-arg", "depth=two", "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "depth" in err and "int" in err and "'str' object" not in err
    assert not (tmp_path / "x").exists()
    with pytest.raises((ValueError, TypeError), match="conv_stem"):
        train_config.check_model_kwargs("vit_digits_patch2_8", {"conv_stem": "wide"})
    with pytest.raises(ValueError, match=r"num_heads=2\.5: num_heads expects an integer"):
        train_config.check_model_kwargs("vit_digits_patch2_8", {"num_heads": 2.5})
    train_config.check_model_kwargs("vit_digits_patch2_8", {"depth": 2, "mlp_ratio": 2, "conv_stem": [8, 16]})


def test_unwritable_or_invalid_output_is_named(tmp_path: Path, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for bad in (afile, afile / "run", Path("/proc/vit-attention-test/run")):
        assert main(["train", *QUICK, "--output", str(bad)]) == 2, bad
        err = capsys.readouterr().err
        assert f"--output {bad}" in err and "Traceback" not in err
    assert main(["train", *QUICK, "--output", str(tmp_path / ("x" * 300))]) == 2  # a name too long
    assert "--output" in capsys.readouterr().err
    ro = tmp_path / "readonly"
    ro.mkdir()
    real_access = run_folder.os.access
    monkeypatch.setattr(run_folder.os, "access", lambda p, mode: False if Path(p) == ro else real_access(p, mode))
    with pytest.raises(ValueError, match=r"--output .*readonly/run: .*readonly is not writable"):
        run_folder.check_output_folder(ro / "run")
    assert main(["train", *QUICK, "--output", str(ro / "run")]) == 2
    assert "is not writable" in capsys.readouterr().err and not (ro / "run").exists()


@pytest.mark.slow  # training subprocesses on a pseudo-terminal (~5 s)
def test_progress_bars_only_on_a_terminal(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "vit_attention.cli", "train", *TINY, "--epochs", "2",
                           "--batch-size", "128", "--no-plot", "--output", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and len(proc.stderr) < 2000
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("epoch ")][1].startswith("epoch 2/2: train loss")


def test_every_train_and_compare_option_says_its_default() -> None:
    from vit_attention.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command in ("train", "compare"):
        parser = sub[command]
        formatter = parser.formatter_class(prog=command)
        for action in parser._actions:
            if action.dest != "help":
                assert action.help and "default" in formatter._get_help_string(action), (command, action.dest)
    text = " ".join(sub["train"].format_help().split())
    assert "peak learning rate (AdamW) (default: 0.002)" in text and "(default: 60)" in text


def test_one_epoch_curves_show_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or real_close(fig))
    plots.plot_curves([{"epoch": 1, "train_loss": 2.0, "test_loss": 1.9, "train_acc": 0.3, "test_acc": 0.35}],
                       tmp_path / "curves.png")
    lines = [ln for ax in figures[0].axes for ln in ax.get_lines()]
    assert len(lines) == 4 and all(ln.get_marker() not in (None, "None", "", " ") for ln in lines)
    assert all(list(ax.get_xticks()) == [1] for ax in figures[0].axes)


def test_compare_plot_labels_do_not_overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    from vit_attention.train.plots import plot_accuracy_vs_flops

    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))  # closed below, once measured
    rows = [{"name": n, "macs": m, "test_acc": a} for n, m, a in (
        ("vit+mhsa", 2.31e6, 0.9867), ("vit+window", 2.21e6, 0.9867), ("vit+neighborhood", 2.25e6, 0.9867),
        ("swin (shifted windows)", 1.31e6, 0.9867), ("same as mhsa", 2.31e6, 0.9867))]
    plot_accuracy_vs_flops(rows, tmp_path / "acc.png")
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert len(boxes) == len(rows)
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (fig.axes[0].texts[i].get_text(), fig.axes[0].texts[j].get_text())
    real_close(fig)


def test_compare_checks_names_first_resumes_and_times_with_the_training_threads(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from vit_attention.train import compare

    out = tmp_path / "cmp"
    args = ["compare", *TINY, "--quick", "--batch-size", "128", "--no-progress", "--no-plot", "--output", str(out)]
    assert main([*args[:1], "--models", "vit_digits_patch2_8,vit_digts_typo", *args[1:]]) == 2
    assert "vit_digts_typo" in capsys.readouterr().err
    assert not out.exists() or not any(p.is_dir() for p in out.iterdir())  # nothing trained

    seen: list[int] = []

    def fake_throughput(model: torch.nn.Module, shape: tuple[int, ...], **kw: object) -> float:
        seen.append(torch.get_num_threads())
        return 1.0

    monkeypatch.setattr(compare, "inference_throughput", fake_throughput)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main([*args[:1], "--models", "vit_digits_patch2_8", *args[1:]]) == 0
        assert seen == [1] and torch.get_num_threads() == 2  # the tiny model trained at 1 thread
    finally:
        torch.set_num_threads(before)
    rows = json.loads((out / "compare.json").read_text())
    assert rows[0]["threads"] == 1 and "1 CPU thread(s)" in capsys.readouterr().out
    # --resume continues the comparison with its saved options (no --models, no model args)
    assert main(["compare", "--resume", "--output", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "has finished its 1 epoch(s)" in text and "nothing to train" in text and "vit_digits_patch2_8" in text
    assert json.loads((out / "compare.json").read_text())[0]["test_acc"] == pytest.approx(rows[0]["test_acc"])
    assert math.isfinite(rows[0]["test_acc"])
