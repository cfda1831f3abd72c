"""Every registered model takes an empty batch ``[0, Cin, H, W]``, in eval and in train mode.

A data loader's last batch, a filtered batch or a sharded one may hold no image; every output then
has batch 0 and otherwise the shape a batch of one gets. The bug this guards against is a reshape
that leaves one size to infer beside the batch (``x.reshape(B, -1, C)``): with ``B = 0`` there is
nothing to infer it from and torch refuses. Each distinct reduced configuration of
``tests/model_outputs.py`` is run (the presets that reduce to the same model run once), so every
family and every code path the presets select (PVTv2's linear SRA, Twins' PCPVT / SVT, ViL with
and without globals, ...) is covered at a fraction of a second each.
"""

from __future__ import annotations

import pytest
import torch
from model_outputs import build, distinct_reduced_presets, small_overrides
from torch import Tensor

from vit_attention.models import get_model_entry, list_models

NAMES = distinct_reduced_presets()


def _batch_dims(out: object) -> list[tuple[int, ...]]:
    """Every tensor's shape in a (nested) output of tensors, tuples, lists and dicts."""
    if isinstance(out, Tensor):
        return [tuple(out.shape)]
    if isinstance(out, dict):
        out = list(out.values())
    return [s for o in out for s in _batch_dims(o)]  # type: ignore[union-attr]


def test_every_family_is_covered() -> None:
    assert {get_model_entry(n).family for n in NAMES} == {get_model_entry(n).family for n in list_models()}


@pytest.mark.registry
@pytest.mark.parametrize("name", NAMES)
def test_empty_batch(name: str) -> None:
    model, x = build(name, small_overrides(name))
    x1, x0 = x[:1], x[:0]  # [1, Cin, H, W], [0, Cin, H, W]
    with torch.no_grad():
        want = {"forward_features": _batch_dims(model.forward_features(x1)),
                "forward_intermediates": _batch_dims(model.forward_intermediates(x1))}
        if hasattr(model, "forward_pyramid"):  # detection backbones: every level
            want["forward_pyramid"] = _batch_dims(model.forward_pyramid(x1))
    for mode in ("eval", "train"):
        model.train(mode == "train")
        with torch.no_grad():
            for method, shapes in want.items():
                got = _batch_dims(getattr(model, method)(x0))
                assert got == [(0, *s[1:]) for s in shapes], f"{name} {mode} {method}"
        y = model(x0)  # train mode: distilled models give (class, distillation) logits
        ys = y if isinstance(y, tuple) else (y,)
        assert all(t.shape == (0, model.num_classes) for t in ys), f"{name} {mode}: {[t.shape for t in ys]}"
        if mode == "train":
            sum(t.sum() for t in ys).backward()  # type: ignore[union-attr]
            assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
            assert all(torch.isfinite(b).all() for b in model.buffers() if b.is_floating_point()), \
                f"{name}: an empty training batch left non-finite running statistics"
