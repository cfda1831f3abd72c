"""Engine: schedule, parameter groups, reproducibility, accumulation, checkpointing options, error handling."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from vit_attention import create_model
from vit_attention.train import TrainConfig, train
from vit_attention.train.optim import lr_at, param_groups

from ._utils import TINY_KWARGS


def _cfg(tmp_path: Path, name: str = "run", **kw: object) -> TrainConfig:
    # no random augmentation: accumulation splits batches, and kornia's draws depend on the batch size
    base = dict(model_kwargs=dict(TINY_KWARGS), epochs=1, batch_size=128, warmup_epochs=0.5, lr=3e-3, affine=0.0,
                output=str(tmp_path / name), progress=False, plot=False)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _history(res: dict) -> list[dict]:
    return [{k: v for k, v in h.items() if k != "train_img_s"} for h in res["history"]]


def test_lr_warmup_then_cosine() -> None:
    kw = dict(total_steps=110, warmup_steps=10, lr=1.0, min_lr=0.01)
    lrs = [lr_at(s, **kw) for s in range(110)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # non-increasing after warm-up
    assert lr_at(60, **kw) == pytest.approx(0.01 + 0.99 * 0.5)  # half-way through the cosine
    assert lr_at(110, **kw) == pytest.approx(0.01)


def test_no_weight_decay_on_biases_norms_and_tokens() -> None:
    model = create_model("vit_digits_patch2_8")
    decay, no_decay = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert {"pos_embed", "cls_token", "norm.weight", "blocks.0.attn.qkv.bias"} <= skipped
    assert "blocks.0.attn.qkv.weight" in {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0


def test_same_seed_same_metrics_and_accumulation_matches(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = train(_cfg(tmp_path, "a", epochs=2))
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"test accuracy: {a['test_acc']:.4f}"
    b = train(_cfg(tmp_path, "b", epochs=2))
    assert _history(a) == _history(b)  # same seed, same machine: identical
    c = train(_cfg(tmp_path, "c", epochs=2, accum_steps=2))  # same global batch in two micro-steps
    for ha, hc in zip(_history(a), _history(c)):
        for k in ha:
            assert hc[k] == pytest.approx(ha[k], rel=1e-4, abs=1e-5), k
    assert a["history"][-1]["train_loss"] < a["history"][0]["train_loss"]
    threads = torch.get_num_threads()
    d = train(_cfg(tmp_path, "d", epochs=2, seed=1, threads=2))
    assert torch.get_num_threads() == threads  # restored after the run
    assert _history(d) != _history(a)
    out = Path(a["output"])
    assert {"checkpoint.safetensors", "checkpoint.json", "metrics.csv", "metrics.json", "model.safetensors",
            "config.json"} <= {p.name for p in out.iterdir()}
    assert len(json.loads((out / "metrics.json").read_text())) == 2
    assert (out / "metrics.csv").read_text().splitlines()[0].startswith("epoch,step,lr,train_loss,train_acc")


def test_grad_checkpointing_gives_the_same_run(tmp_path: Path) -> None:
    a = train(_cfg(tmp_path, "a"))
    b = train(_cfg(tmp_path, "b", grad_checkpointing=True))
    for ha, hb in zip(_history(a), _history(b)):
        for k in ha:
            assert hb[k] == pytest.approx(ha[k], rel=1e-5, abs=1e-6), k


def test_ema_regularisation_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    res = train(_cfg(tmp_path, ema_decay=0.9, drop_path_rate=0.1, drop_rate=0.1, mixup=0.8, cutmix=1.0,
                     epochs=2, plot=True))
    out = Path(res["output"])
    assert (out / "model_ema.safetensors").exists() and (out / "curves.png").stat().st_size > 1000
    assert "test_acc_ema" in res["history"][-1] and 0 <= res["test_acc_ema"] <= 1
    assert "test accuracy (EMA weights)" in capsys.readouterr().out
    assert res["model"].cfg.drop_path_rate == 0.1


def test_image_folder_run_with_augreg_options(tmp_path: Path, image_folder: Path) -> None:
    res = train(_cfg(tmp_path, data=str(image_folder), img_size=16, batch_size=8, epochs=2,
                     model_kwargs=dict(TINY_KWARGS, patch_size=4), randaugment=(2, 9), mixup=0.2, cutmix=1.0,
                     label_smoothing=0.1, val_fraction=0.25))
    assert res["history"][-1]["test_top5"] == 1.0  # 3 classes: top-5 always hits
    meta = json.loads((Path(res["output"]) / "config.json").read_text())
    assert meta["classes"] == ["cat", "dog", "fox"] and meta["model_config"]["in_chans"] == 3


def test_errors_are_clear_and_nothing_is_overwritten(tmp_path: Path) -> None:
    res = train(_cfg(tmp_path))
    out = Path(res["output"])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        train(_cfg(tmp_path))
    with pytest.raises(ValueError, match="belongs to model 'vit_digits_patch2_8'"):
        train(_cfg(tmp_path, model="vit_digits_patch2_8_gap", resume=True))
    with pytest.raises(ValueError, match="different vit_digits_patch2_8 configuration.*depth"):
        train(_cfg(tmp_path, model_kwargs=dict(TINY_KWARGS, depth=2), resume=True))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(KeyError, match="unknown model 'vit_digts"):
        train(_cfg(tmp_path, "x", model="vit_digts_patch2_8"))
    with pytest.raises(FileNotFoundError, match="data folder not found"):
        train(_cfg(tmp_path, "y", data=str(tmp_path / "missing")))
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from"):
        train(_cfg(tmp_path, "z", resume=True))
    with pytest.raises(ValueError, match="accum_steps must be positive"):
        train(_cfg(tmp_path, "w", accum_steps=0))
    assert not any((tmp_path / n).exists() for n in "xyzw")


def test_resume_after_finish_extends_training(tmp_path: Path) -> None:
    one = train(_cfg(tmp_path, "a", epochs=2))
    two = train(dataclasses.replace(_cfg(tmp_path, "a", epochs=3), resume=True))
    assert len(two["history"]) == 3 and _history(two)[:2] == _history(one)
