"""``--layer-decay``: the AdamW groups carry each layer's learning-rate scale, and the engine applies it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vit_attention as va
from vit_attention.cli import main
from vit_attention.models.layer_groups import layer_ids
from vit_attention.train.checkpoint import load_training_state
from vit_attention.train.optim import param_groups

from ._utils import TINY, TINY_KWARGS


def test_groups_scale_each_layer() -> None:
    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, **{**TINY_KWARGS, "depth": 3})
    ids, depth = layer_ids(model)
    groups = param_groups(model, 0.05, layer_decay=0.5)
    name_of = {id(p): n for n, p in model.named_parameters()}
    seen = set()
    for g in groups:
        for p in g["params"]:
            n = name_of[id(p)]
            seen.add(n)
            assert g["lr_scale"] == 0.5 ** (depth + 1 - ids[n]), n
            assert g["weight_decay"] == (0.0 if p.ndim <= 1 or n in model.no_weight_decay() else 0.05), n
    assert seen == set(name_of.values())
    assert {g["lr_scale"] for g in groups} == {0.5 ** k for k in range(depth + 2)}  # head 1 ... stem 0.5^(L+1)
    plain = param_groups(model, 0.05)
    assert len(plain) == 2 and all("lr_scale" not in g for g in plain)
    assert sum(len(g["params"]) for g in plain) == len(seen)


def test_training_applies_the_scales(tmp_path: Path) -> None:
    args = [*TINY, "--epochs", "1", "--batch-size", "128", "--no-progress", "--no-plot", "--warmup-epochs", "0"]
    assert main(["train", *args, "--layer-decay", "0.5", "--output", str(tmp_path / "run")]) == 0
    ckpt = load_training_state(tmp_path / "run" / "checkpoint.safetensors")
    groups = ckpt.state["optimizer"]["param_groups"] if "optimizer" in ckpt.state else None
    assert groups, "the checkpoint records the optimizer's groups"
    top = max(g["lr"] for g in groups)
    for g in groups:  # every group's rate is the scheduled one times its scale
        assert g["lr"] == pytest.approx(top * g["lr_scale"], rel=1e-9)
    assert len({g["lr_scale"] for g in groups}) == 3  # stem, one block, head


def test_bad_layer_decay_is_refused(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *TINY, "--layer-decay", "1.5", "--epochs", "1"]) != 0
    assert "layer_decay must be in (0, 1] (e.g. 0.75), got 1.5" in capsys.readouterr().err


def test_unwrapped_and_ddp_style_names_group_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    from vit_attention.train import optim

    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, **TINY_KWARGS)
    wrapped = torch.nn.Module()
    wrapped.module = model  # a DDP wrapper's names ("module." prefix), its model found by unwrap_model
    monkeypatch.setattr(optim, "unwrap_model", lambda m: m.module if hasattr(m, "module") else m)
    a, b = param_groups(wrapped, 0.05, layer_decay=0.7), param_groups(model, 0.05, layer_decay=0.7)
    assert [(g["lr_scale"], g["weight_decay"], len(g["params"])) for g in a] == \
        [(g["lr_scale"], g["weight_decay"], len(g["params"])) for g in b]
