"""Outputs of every registered model, saved once, so a refactor can prove it changed no number.

Each registered preset is built in a reduced form that keeps its code paths (its pooling, tokens,
norms, QK-norm, LayerScale, conv stem, block style, attention mechanism, padding mode ...) but
is small: 2 heads, width 32 (Swin: 16 doubling per stage), depth 2 per stage, windows of 2, a
few tokens. Every parameter is filled from a generator seeded by its state-dict key (never by
creation order, which a refactor may change); buffers stay as the model computes them. The
input is a seeded ``[2, C, H, W]`` tensor. ``tests/fixtures/model_outputs.safetensors`` holds,
per model, ``<name>.logits`` and ``<name>.features`` (``forward_features``), and the overrides
used in its metadata.

Add the models registered since (existing entries are kept as they are)::

    .venv/bin/python tests/model_outputs.py

Rewrite every entry (only when numbers are meant to change; say why in the commit)::

    .venv/bin/python tests/model_outputs.py --all
"""

from __future__ import annotations

import argparse
import json
import math
import zlib
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from vit_attention.models import create_model, get_model_entry, list_models, model_config

PATH = Path(__file__).resolve().parent / "fixtures" / "model_outputs.safetensors"
WIDTH = 32


def small_overrides(name: str) -> dict[str, Any]:
    """Config overrides that shrink preset ``name`` while keeping its code paths."""
    entry = get_model_entry(name)
    cfg = model_config(name)
    over: dict[str, Any] = {"num_classes": 10, "drop_path_rate": 0.0}
    if entry.family == "vit":
        p = cfg.patch_size if isinstance(cfg.patch_size, int) else cfg.patch_size[0]
        over.update(embed_dim=WIDTH, num_heads=2, depth=2, img_size=min(p * 3, 48) if p < 16 else p * 2,
                    mlp_dim=None)
        if cfg.in_chans != 3:
            over.pop("img_size")
    else:  # swin, swinv2: 4x4 grid per window at stage 1 down to a 2x2 map
        stages = len(cfg.depths)
        over.update(embed_dim=16, depths=(2,) * stages, num_heads=(2,) * stages, window_size=2,
                    img_size=cfg.patch_size * 2 ** stages * (1 if stages > 2 else 2))
        if getattr(cfg, "pretrained_window_sizes", None) and any(cfg.pretrained_window_sizes):
            over["pretrained_window_sizes"] = tuple(2 if w else 0 for w in cfg.pretrained_window_sizes)
    fields = {f for f in type(cfg).__dataclass_fields__}
    return {k: v for k, v in over.items() if k in fields}


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
        return {"logits": model(x), "features": model.forward_features(x)}


def load() -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """The saved outputs and the overrides each model was built with."""
    with safe_open(str(PATH), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        overrides = json.loads(f.metadata()["overrides"])
    return tensors, overrides


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true", help="recompute every model, not only the missing ones")
    args = ap.parse_args(argv)
    tensors: dict[str, torch.Tensor] = {}
    overrides: dict[str, dict[str, Any]] = {}
    if PATH.exists() and not args.all:
        tensors, overrides = load()
    for name in list_models():
        if name in overrides:
            continue
        over = small_overrides(name)
        out = compute(name, over)
        overrides[name] = over
        for k, v in out.items():
            tensors[f"{name}.{k}"] = v.contiguous()
        print(f"{name:48s} logits {tuple(out['logits'].shape)} features {tuple(out['features'].shape)}")
    save_file(tensors, str(PATH), metadata={"overrides": json.dumps(overrides), "torch": torch.__version__})
    print(f"wrote {PATH} ({PATH.stat().st_size / 1e3:.0f} kB, {len(overrides)} models)")


if __name__ == "__main__":
    main()
