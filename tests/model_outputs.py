"""Outputs of every registered model, saved once, so a refactor can prove it changed no number.

Each registered preset is built in a reduced form that keeps its code paths (its pooling, tokens,
norms, QK-norm, LayerScale, conv stem, block style, attention mechanism, padding mode ...) but
is small: 2 heads, width 32 (Swin: 16 doubling per stage), depth 2 per stage, windows of 2, a
few tokens. Every parameter is filled from a generator seeded by its state-dict key (never by
creation order, which a refactor may change); buffers stay as the model computes them. The
input is a seeded ``[2, C, H, W]`` tensor. ``tests/fixtures/model_outputs/<family>.safetensors``
holds, per model of the family, ``<name>.logits`` and ``<name>.features`` (``forward_features``),
and the overrides used in its metadata. How a family is reduced is its own rule, declared in its
family file (``register_family(..., reduced=reduced_config)``; the export, ONNX and features tests
build their small models with it too).

Add the models registered since (existing entries are kept as they are; ``--family`` limits it to
one family's file, so parallel work on two families never rewrites the other's)::

    .venv/bin/python tests/model_outputs.py [--family NAME]

Rewrite every entry (only when numbers are meant to change; say why in the commit)::

    .venv/bin/python tests/model_outputs.py --all
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import zlib
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from vit_attention import create_model
from vit_attention.models import get_model_entry, list_models, model_config

FOLDER = Path(__file__).resolve().parent / "fixtures" / "model_outputs"


def small_overrides(name: str) -> dict[str, Any]:
    """Config overrides that shrink preset ``name`` while keeping its code paths."""
    entry = get_model_entry(name)
    cfg = model_config(name)
    if entry.reduced is None:
        raise KeyError(f"family {entry.family!r} declares no reduced config: pass reduced= to register_family")
    over: dict[str, Any] = {"num_classes": 10, "drop_path_rate": 0.0, **entry.reduced_overrides()}
    fields = {f for f in type(cfg).__dataclass_fields__}
    return {k: v for k, v in over.items() if k in fields}


@functools.cache
def first_preset_per_family() -> dict[str, str]:
    """``{family: its first registered preset in sorted order}``: the preset a per-family test runs
    (and the one ``pytest --fast`` keeps of a registry sweep, tests/conftest.py)."""
    first: dict[str, str] = {}
    for name in list_models():
        first.setdefault(get_model_entry(name).family, name)
    return first


@functools.cache
def distinct_reduced_presets() -> tuple[str, ...]:
    """The first preset (sorted) of every distinct reduced model: family, class and reduced config.

    Many presets reduce to the same small model (``vit_base_patch16_224`` and ``vit_large_patch16_224``
    differ only in the widths the reducer replaces); a registry sweep that builds models runs each
    distinct one once (about a third of the 175 presets), and still covers every family and every
    code path the presets select. Computed once per test session.
    """
    import dataclasses

    seen: dict[tuple[str, str, str], str] = {}
    for name in list_models():
        entry = get_model_entry(name)
        cfg = dataclasses.replace(model_config(name), **small_overrides(name))
        seen.setdefault((entry.family, entry.model_cls.__qualname__, repr(cfg)), name)
    return tuple(sorted(seen.values()))


@torch.no_grad()
def fill_by_key(model: nn.Module) -> None:
    """Seed every parameter from its state-dict key: weights ~N(0, 1/fan_in), norms ~1, biases small."""
    for key, p in model.named_parameters():
        g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        noise = torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype)
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "logit_scale":
            p.copy_(math.log(10.0) + 0.1 * noise)
        elif p.dim() >= 2 and leaf.endswith("weight"):
            p.copy_(noise / math.sqrt(max(p[0].numel(), 1)))
        elif leaf == "weight" and ("norm" in key or p.dim() == 1):
            p.copy_(1.0 + 0.1 * noise)
        else:
            p.copy_(0.1 * noise)


def build(name: str, overrides: dict[str, Any]) -> tuple[nn.Module, torch.Tensor]:
    """The reduced model (eval mode, filled by key) and its seeded input ``[2, C, H, W]``."""
    model = create_model(name, **overrides).eval()
    fill_by_key(model)
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return model, torch.randn(2, cfg.in_chans, *size, generator=g)


def compute(name: str, overrides: dict[str, Any]) -> dict[str, torch.Tensor]:
    """``{"logits", "features"}`` of the reduced ``name``."""
    model, x = build(name, overrides)
    with torch.no_grad():
        out = {"logits": model(x), "features": model.forward_features(x)}
        if hasattr(model, "forward_pyramid"):  # detection backbones (ViTDet): every pyramid level too
            out.update({f"pyramid.{k}": v for k, v in model.forward_pyramid(x).items()})
        return out


def _load_file(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["overrides"])


def load() -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """The saved outputs of every family and the overrides each model was built with."""
    tensors: dict[str, torch.Tensor] = {}
    overrides: dict[str, dict[str, Any]] = {}
    for path in sorted(FOLDER.glob("*.safetensors")):
        t, o = _load_file(path)
        tensors.update(t)
        overrides.update(o)
    return tensors, overrides


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true", help="recompute every model, not only the missing ones")
    ap.add_argument("--family", help="only this family's file (default: every family)")
    args = ap.parse_args(argv)
    families = sorted({get_model_entry(n).family for n in list_models()})
    if args.family is not None and args.family not in families:
        ap.error(f"--family: expected one of {families}, got {args.family!r}")
    FOLDER.mkdir(exist_ok=True)
    for family in [args.family] if args.family else families:
        path = FOLDER / f"{family}.safetensors"
        tensors, overrides = _load_file(path) if path.exists() and not args.all else ({}, {})
        names = list_models(family=family)
        if set(names) <= set(overrides) and path.exists():
            continue
        for name in names:
            if name in overrides:
                continue
            over = small_overrides(name)
            out = compute(name, over)
            overrides[name] = over
            for k, v in out.items():
                tensors[f"{name}.{k}"] = v.contiguous()
            print(f"{name:48s} logits {tuple(out['logits'].shape)} features {tuple(out['features'].shape)}")
        save_file(tensors, str(path), metadata={"overrides": json.dumps(overrides), "torch": torch.__version__})
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB, {len(overrides)} models)")


if __name__ == "__main__":
    main()
