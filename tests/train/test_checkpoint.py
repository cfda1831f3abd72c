"""Checkpoints: safe (no pickle) optimizer / RNG round-trips, atomic files, clear errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from vit_attention import create_model
from vit_attention.train.checkpoint import (
    capture_rng_state,
    check_resume_compatible,
    load_training_state,
    optimizer_state_from_safe,
    optimizer_state_to_safe,
    restore_rng_state,
    save_training_state,
)


def _trained_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "weight_decay": 0.1},
                             {"params": list(model[1].parameters()) + list(model[2].parameters()),
                              "weight_decay": 0.0}], lr=1e-2, betas=(0.8, 0.95))
    for _ in range(3):
        model(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_optimizer_state_round_trip_is_exact_and_safe() -> None:
    model, opt = _trained_optimizer()
    tensors, meta = optimizer_state_to_safe(opt.state_dict())
    json.dumps(meta)  # scalars and hyper-parameters are plain JSON
    back = optimizer_state_from_safe(tensors, json.loads(json.dumps(meta)))
    fresh = torch.optim.AdamW([{"params": model[0].parameters()},
                               {"params": list(model[1].parameters()) + list(model[2].parameters())}], lr=1.0)
    fresh.load_state_dict(back)
    ref = opt.state_dict()
    got = fresh.state_dict()
    assert got["param_groups"] == ref["param_groups"] and isinstance(got["param_groups"][0]["betas"], tuple)
    for pid, st in ref["state"].items():
        for k, v in st.items():
            assert torch.equal(got["state"][pid][k], v), (pid, k)
    # the next step is identical
    model(torch.randn(5, 4)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    after_ref = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, b in zip(model.parameters(), before):
            p.copy_(b)
    fresh.step()
    assert all(torch.equal(p, a) for p, a in zip(model.parameters(), after_ref))


def test_optimizer_state_keyed_by_parameter_name() -> None:
    w = torch.randn(3)
    sd = {"state": {"blocks.0.attn.qkv.weight": {"step": torch.tensor(2.0), "exp_avg": w}},
          "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["blocks.0.attn.qkv.weight"]}]}
    tensors, meta = optimizer_state_to_safe(sd)
    back = optimizer_state_from_safe(tensors, json.loads(json.dumps(meta)))
    assert list(back["state"]) == ["blocks.0.attn.qkv.weight"]
    assert torch.equal(back["state"]["blocks.0.attn.qkv.weight"]["exp_avg"], w)
    assert back["param_groups"][0]["betas"] == (0.9, 0.99)


def test_rng_state_round_trip() -> None:
    tensors, meta = capture_rng_state()
    a = (torch.rand(3), np.random.rand(2), random.random())
    restore_rng_state(tensors, json.loads(json.dumps(meta)))
    b = (torch.rand(3), np.random.rand(2), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_save_and_load_training_state(tmp_path: Path) -> None:
    model, opt = _trained_optimizer()
    path = save_training_state(tmp_path / "run" / "checkpoint.safetensors", model_state=model.state_dict(),
                               optimizer_state=opt.state_dict(), ema_state=model.state_dict(),
                               state={"epoch": 2, "step_in_epoch": 5, "model_name": "m", "model_config": {"a": 1}})
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.json", "checkpoint.safetensors"]
    with safe_open(str(path), framework="pt") as f:  # one plain safetensors file
        assert any(k.startswith("optim.state/") for k in f.keys())
    st = load_training_state(path.parent)
    assert st.state["epoch"] == 2 and st.state["step_in_epoch"] == 5
    assert set(st.model) == set(model.state_dict()) and set(st.ema) == set(model.state_dict())
    assert "torch" in st.rng and json.loads((path.parent / "checkpoint.json").read_text())["epoch"] == 2


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from"):
        load_training_state(tmp_path / "missing")
    from vit_attention import save_weights

    w = save_weights(torch.nn.Linear(2, 2), tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="not a vit-attention training checkpoint"):
        load_training_state(w)
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(ValueError, match="cannot read checkpoint"):
        load_training_state(tmp_path / "junk.safetensors")


def test_resume_compatibility_names_the_difference(tmp_path: Path) -> None:
    model, opt = _trained_optimizer()
    cfg = create_model("vit_digits_patch2_8").cfg.to_dict()
    save_training_state(tmp_path / "c.safetensors", model_state=model.state_dict(), optimizer_state=opt.state_dict(),
                        state={"model_name": "vit_digits_patch2_8", "model_config": cfg})
    st = load_training_state(tmp_path / "c.safetensors")
    check_resume_compatible(st, "vit_digits_patch2_8", cfg, "c")  # same: fine
    with pytest.raises(ValueError, match="belongs to model 'vit_digits_patch2_8'.*builds 'deit_tiny"):
        check_resume_compatible(st, "deit_tiny_patch16_224", cfg, "c")
    with pytest.raises(ValueError, match="depth: checkpoint 4 vs run 2"):
        check_resume_compatible(st, "vit_digits_patch2_8", dict(cfg, depth=2), "c")
