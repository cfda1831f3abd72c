"""Outputs of every registered model, saved once, so a refactor can prove it changed no number.

Each registered preset is built in a reduced form that keeps its code paths (its pooling, tokens,
norms, QK-norm, LayerScale, conv stem, block style, attention mechanism, padding mode ...) but
is small: 2 heads, width 32 (Swin: 16 doubling per stage), depth 2 per stage, windows of 2, a
few tokens. Every parameter is filled from a generator seeded by its state-dict key (never by
creation order, which a refactor may change); buffers stay as the model computes them. The
input is a seeded ``[2, C, H, W]`` tensor. ``tests/fixtures/model_outputs/<family>.safetensors``
holds, per model of the family, ``<name>.logits`` and ``<name>.features`` (``forward_features``),
and the overrides used in its metadata. How a family is reduced is its entry of :data:`REDUCERS`
(a new family adds one; the export, ONNX and features tests build their small models with it too).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from vit_attention.models import create_model, get_model_entry, list_models, model_config

FOLDER = Path(__file__).resolve().parent / "fixtures" / "model_outputs"
WIDTH = 32


def _reduce_vit(cfg: Any) -> dict[str, Any]:
    p = cfg.patch_size if isinstance(cfg.patch_size, int) else cfg.patch_size[0]
    over: dict[str, Any] = dict(embed_dim=WIDTH, num_heads=2, depth=2,
                                img_size=min(p * 3, 48) if p < 16 else p * 2, mlp_dim=None)
    if cfg.in_chans != 3:
        over.pop("img_size")
    return over


def _reduce_swin(cfg: Any) -> dict[str, Any]:
    """Swin, SwinV2: 4x4 grid per window at stage 1 down to a 2x2 map."""
    stages = len(cfg.depths)
    over: dict[str, Any] = dict(embed_dim=16, depths=(2,) * stages, num_heads=(2,) * stages, window_size=2,
                                img_size=cfg.patch_size * 2 ** stages * (1 if stages > 2 else 2))
    if getattr(cfg, "pretrained_window_sizes", None) and any(cfg.pretrained_window_sizes):
        over["pretrained_window_sizes"] = tuple(2 if w else 0 for w in cfg.pretrained_window_sizes)
    return over


def _reduce_digits(cfg: Any) -> dict[str, Any]:
    return _reduce_vit(cfg) if hasattr(cfg, "depth") else _reduce_swin(cfg)


def _reduce_cait(cfg: Any) -> dict[str, Any]:
    """CaiT: 2 talking-heads blocks, both class-attention blocks, a 3x3 patch grid."""
    return dict(embed_dim=WIDTH, num_heads=2, depth=2, depth_token_only=2, img_size=cfg.patch_size * 3)


def _reduce_igpt(cfg: Any) -> dict[str, Any]:
    """iGPT: 2 causal blocks on a 4x4 image (16 pixel tokens); the palette and vocabulary stay the preset's."""
    return dict(embed_dim=WIDTH, num_heads=2, depth=2, img_size=4)


def _reduce_vitdet(cfg: Any) -> dict[str, Any]:
    """ViTDet: 3 blocks (windows of 3 on a 4x4 map, padded to 6x6; block 1 global), a 3x3 pre-training
    position grid resized to 4x4, a 16-channel pyramid (64 px: every level a whole stride, p6 1x1)."""
    return dict(embed_dim=WIDTH, num_heads=2, depth=3, global_block_indices=(1,), window_size=3,
                img_size=cfg.patch_size * 4, pretrain_img_size=cfg.patch_size * 3, pyramid_channels=16)


def _reduce_cvt(cfg: Any) -> dict[str, Any]:
    """CvT: three stages of 16/32/32 channels (1, 1, 2 blocks; class token in the last) on 64 px (224 presets:
    grids 16, 8, 4) or 80 px (384 presets: grids 20, 10, 5, the last with an odd stride-2 key grid 3x3)."""
    size = cfg.img_size if isinstance(cfg.img_size, int) else cfg.img_size[0]
    return dict(embed_dims=(16, 32, 32), num_heads=(1, 2, 2), depths=(1, 1, 2), img_size=64 if size < 384 else 80)


def _reduce_davit(cfg: Any) -> dict[str, Any]:
    """DaViT: 2 stages of 16/32 channels, one spatial + channel pair each, window 3 on 40 px (10x10 and
    5x5 maps: both padded to windows); the preset's downsample kernel and channel form are kept."""
    return dict(embed_dims=(16, 32), num_heads=(2, 2), depths=(1, 1), window_size=3, img_size=40)


def _reduce_pvt(cfg: Any) -> dict[str, Any]:
    """PVT v1 / PVTv2: 4 stages of width 16-32, 2 blocks each, 2 heads; 64 px (maps 16 -> 2: every sr_ratio reduces)."""
    n = len(cfg.depths)
    return dict(embed_dims=(16,) + (WIDTH,) * (n - 1), depths=(2,) * n, num_heads=(2,) * n, img_size=64)


# family -> (preset config -> overrides that shrink it while keeping its code paths). Keys a config
# does not have are dropped, so one reducer may serve configs of several classes.
def _reduce_nat(cfg: Any) -> dict[str, Any]:
    """NAT / DiNAT: 4 levels of width 16-128, 2 blocks each, kernel 3 (DiNAT: dilations 1, 2) on 64 px
    (maps 16 -> 2: levels 2-3 are smaller than K·d and get padded)."""
    over: dict[str, Any] = dict(embed_dim=16, depths=(2, 2, 2, 2), num_heads=(2, 2, 2, 2), kernel_size=3, img_size=64)
    if cfg.dilations is not None:
        over["dilations"] = ((1, 2),) * 4  # alternating 1, 2 in every level
    return over


def _reduce_cpvt(cfg: Any) -> dict[str, Any]:
    """CPVT: the ViT reduction on a 3x3 patch grid (the PEG after block 0 sees borders and a centre)."""
    return dict(_reduce_vit(cfg), img_size=cfg.patch_size * 3)


def _reduce_twins(cfg: Any) -> dict[str, Any]:
    """Twins: 4 stages of width 16-32, 2 blocks each (SVT: one LSA + one GSA), 64 px (maps 16, 8, 4, 2:
    every sr_ratio reduces to 2x2; SVT's groups of 3 pad in every stage)."""
    over: dict[str, Any] = dict(embed_dims=(16, WIDTH, WIDTH, WIDTH), num_heads=(2,) * 4, depths=(2,) * 4,
                                img_size=64)
    if cfg.wss is not None:
        over["wss"] = (3,) * 4
    return over


def _reduce_mobilevit(cfg: Any) -> dict[str, Any]:
    """MobileViT v1 / v2: 5 stages of 8 ... 24 channels, MobileViT blocks of 2 / 1 / 1 transformer blocks; v1 on a
    96 px image (the stride-32 map is 3x3: v1's resize up and back), v2 on 64 px (v2 resizes without coming back,
    which changes the strides: its resize is covered by the timm fixture)."""
    return dict(stem_chs=8, channels=(8, 16, 16, 24, 24), depths=(1, 2, 1, 1, 1), transformer_dims=(0, 0, 16, 24, 24),
                transformer_depths=(0, 0, 2, 1, 1), num_features=32 if cfg.num_features else 0,
                img_size=96 if cfg.block_type in ("v1", "v3_v1") else 64)


def _reduce_halonet(cfg: Any) -> dict[str, Any]:
    """HaloNet: each stage's block pattern cut to one block of each kind it has ("b", "a", "ba"), widths
    16-32, 2 heads, 64 px; halo blocks of 2 (odd presets: 3, the strided-pool path) with a halo of 1, so the
    stride-16 / 32 maps (4, 2) are padded to block multiples and the strided queries are covered."""
    odd = cfg.attn_kwargs.get("block_size", 8) % 2
    n = len(cfg.block_types)
    return dict(stem_chs=16, block_types=tuple("".join(k for k in "ba" if k in t) for t in cfg.block_types),
                channels=(16,) + (WIDTH,) * (n - 1), num_heads=(2,) * n,
                group_sizes=tuple(min(g, 8) for g in cfg.group_sizes), num_features=WIDTH if cfg.num_features else 0,
                attn_kwargs=dict(cfg.attn_kwargs, block_size=3 if odd else 2, halo_size=1), img_size=64)


def _reduce_vil(cfg: Any) -> dict[str, Any]:
    """ViL: 4 stages of width 16-32, depths 1-2, 2 heads, 64 px (maps 16 -> 2); windows 3 so the Longformer
    stages (16x16, 8x8) have chunks beyond the 3x3 block and bottom / right padding; globals kept per stage."""
    n = len(cfg.depths)
    return dict(embed_dims=(16,) + (WIDTH,) * (n - 1), depths=(1, 2) + (1,) * (n - 2), num_heads=(2,) * n,
                window_sizes=(3,) * n, img_size=64)


REDUCERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "vil": _reduce_vil,
    "halonet": _reduce_halonet,
    "mobilevit": _reduce_mobilevit,
    "cpvt": _reduce_cpvt,
    "twins": _reduce_twins,
    "nat": _reduce_nat,
    "vit": _reduce_vit,
    "digits": _reduce_digits,
    "cvt": _reduce_cvt,
    "cait": _reduce_cait,
    "igpt": _reduce_igpt,
    "vitdet": _reduce_vitdet,
    "davit": _reduce_davit,
    "pvt": _reduce_pvt,
    "pvt_v2": _reduce_pvt,
}


def small_overrides(name: str) -> dict[str, Any]:
    """Config overrides that shrink preset ``name`` while keeping its code paths."""
    entry = get_model_entry(name)
    cfg = model_config(name)
    if entry.reduced is not None:  # the family's own rule (register_family(..., reduced=))
        reduced = entry.reduced_overrides()
    elif entry.family in REDUCERS:
        reduced = REDUCERS[entry.family](cfg)
    else:
        raise KeyError(f"family {entry.family!r} declares no reduced config: pass reduced= to register_family")
    over: dict[str, Any] = {"num_classes": 10, "drop_path_rate": 0.0, **reduced}
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
