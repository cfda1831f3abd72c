"""Sub-commands ``trace``, ``info``, ``attn`` and ``docs`` (thin wrappers over ``vit_attention.analysis``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..models import create_model
from ..models.registry import get_model_entry

__all__ = ["add_commands", "build_model", "load_image", "attention_heatmap"]

_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def build_model(name: str, *, checkpoint: str | Path | None = None, img_size: int | None = None,
                num_classes: int | None = None, device: str | torch.device = "cpu") -> nn.Module:
    """Model ``name``, or the model a checkpoint of ours describes (its saved config wins), with weights.

    A checkpoint written by :func:`vit_attention.save_weights` carries the model name and config,
    so a model trained at any size / class count is rebuilt as it was trained. Other checkpoints
    (timm, torchvision, Hugging Face ...) are loaded into ``name`` built with the given options.
    """
    from ..weights import load_weights
    from ..weights.io import read_checkpoint

    meta: dict[str, str] = {}
    state: Any = None
    if checkpoint is not None:
        state, meta = read_checkpoint(checkpoint)
    if "config" in meta:
        entry = get_model_entry(meta.get("model", name))
        cfg = entry.config_cls.from_dict(json.loads(meta["config"]))
        with torch.device(device):
            model = entry.model_cls(cfg)
        model.registry_name = entry.name  # type: ignore[assignment]
    else:
        with torch.device(device):
            model = create_model(name, img_size=img_size, num_classes=num_classes)
    if state is not None:
        load_weights(model, state)
    model.normalization = _normalization(meta, model.cfg.in_chans)  # type: ignore[assignment]
    return model.eval()


def _normalization(meta: dict[str, str], in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    for key in ("normalize", "normalization"):
        if key in meta:
            value = json.loads(meta[key])
            if isinstance(value, dict):
                return tuple(value["mean"]), tuple(value["std"])
            return tuple(value[0]), tuple(value[1])
    if "mean" in meta and "std" in meta:
        return tuple(json.loads(meta["mean"])), tuple(json.loads(meta["std"]))
    if in_chans == 3:
        return _IMAGENET
    return (0.5,) * in_chans, (0.5,) * in_chans


def load_image(path: str | Path, in_chans: int, size: tuple[int, int],
               normalization: tuple[tuple[float, ...], tuple[float, ...]]) -> tuple[Tensor, Tensor]:
    """Read an image file -> ``(normalised input [1, Cin, H, W], display image [Cin, H, W] in [0, 1])``."""
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    with Image.open(path) as im:
        im = im.convert("L" if in_chans == 1 else "RGB").resize((size[1], size[0]), Image.BILINEAR)
        arr = np.asarray(im, dtype=np.float32) / 255.0
    img = torch.from_numpy(arr)
    img = img[None] if img.dim() == 2 else img.permute(2, 0, 1)  # [Cin, H, W]
    if img.shape[0] != in_chans:
        raise ValueError(f"the model takes {in_chans} channels; cannot convert {path.name}")
    mean = torch.tensor(normalization[0]).view(-1, 1, 1)
    std = torch.tensor(normalization[1]).view(-1, 1, 1)
    return ((img - mean) / std)[None], img


def attention_heatmap(model: nn.Module, x: Tensor, *, layer: int | None = None, head: int | None = None,
                      method: str = "auto") -> tuple[Tensor, str, str]:
    """One image's attention map on the token grid ``[h, w]``, a description, and the method used.

    ``method``: ``rollout`` (global attention with a class token), ``mean`` (every layer's map,
    averaged; any layout) or ``layer`` (one layer, ``layer``); ``auto`` = ``layer`` when ``layer``
    is given, else rollout where possible, else mean.
    """
    from .attention_maps import record_attention

    with record_attention(model) as rec, torch.no_grad():
        model(x)
    global_with_cls = any(r.layout == "global" and r.num_prefix_tokens > 0 for r in rec.self_attention())
    if method == "auto":
        method = "layer" if layer is not None else ("rollout" if global_with_cls else "mean")
    if method == "rollout":
        return rec.rollout(head)[0], "attention rollout (class token -> patches)" + _head(head), method
    if method == "mean":
        return rec.mean_map(head)[0], "mean attention over all layers" + _head(head), method
    if method == "layer":
        idx = -1 if layer is None else layer
        r = rec.layer(idx)
        what = "class token attention" if r.layout == "global" and r.num_prefix_tokens else "attention received"
        return rec.image_map(idx, head)[0], f"{r.module}: {what}" + _head(head), f"layer{idx}"
    raise ValueError(f"method must be 'auto', 'rollout', 'mean' or 'layer', got {method!r}")


def _head(head: int | None) -> str:
    return "" if head is None else f", head {head}"


# ----------------------------------------------------------------------------- commands
def _meta_model(args: argparse.Namespace) -> tuple[nn.Module, tuple[int, ...]]:
    entry = get_model_entry(args.model)
    with torch.device("meta"):
        model = create_model(entry.name, img_size=args.img_size).eval()
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    return model, (args.batch_size, cfg.in_chans, *size)


def _trace(args: argparse.Namespace) -> int:
    from .trace import trace

    model, shape = _meta_model(args)
    t = trace(model, shape, max_depth=args.depth, show_all=args.all)
    print(t.flow(max_depth=args.depth or 1) if args.flow else t.format())
    return 0


def _info(args: argparse.Namespace) -> int:
    from .info import model_info

    print(model_info(args.model, img_size=args.img_size, batch_size=args.batch_size).format())
    return 0


def _attn(args: argparse.Namespace) -> int:
    from .render import save_heatmap

    model = build_model(args.model, checkpoint=args.checkpoint, img_size=args.img_size)
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    x, img = load_image(args.image, cfg.in_chans, tuple(size), model.normalization)  # type: ignore[arg-type]
    heat, what, tag = attention_heatmap(model, x, layer=args.layer, head=args.head, method=args.method)
    stem = Path(args.image).stem
    name = f"{stem}_{getattr(model, 'registry_name', args.model)}_{tag}" + ("" if args.head is None else
                                                                           f"_head{args.head}")
    out = save_heatmap(img, heat, Path(args.out) / f"{name}.png", title=what)
    if args.save_map:
        np.save(out.with_suffix(".npy"), heat.numpy())
    print(f"{out}  ({what}; token grid {tuple(heat.shape)})")
    return 0


def _docs(args: argparse.Namespace) -> int:
    from .docs import check_docs, generate_docs

    if args.check:
        stale = check_docs(Path(args.out))
        for path in stale:
            print(f"stale: {path}")
        print("docs are up to date" if not stale else f"{len(stale)} generated file(s) are stale; "
              "run `vit-attention docs` to regenerate")
        return 1 if stale else 0
    for path in generate_docs(Path(args.out), images=not args.no_images):
        print(path)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``trace``, ``info``, ``attn`` and ``docs``."""
    p = sub.add_parser("trace", help="print the shape at every module (meta device, instant)")
    p.add_argument("model", help="registered model name or alias")
    p.add_argument("--img-size", type=int, default=None, help="input size (default: the preset's)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--depth", type=int, default=None, help="show modules nested at most this deep")
    p.add_argument("--all", action="store_true", help="also list shape-preserving Identity / Dropout")
    p.add_argument("--flow", action="store_true", help="one-line arrow summary instead of the table")
    p.set_defaults(func=_trace)

    p = sub.add_parser("info", help="params and GMACs per stage, shapes, activation memory, aliases, layouts")
    p.add_argument("model", help="registered model name or alias")
    p.add_argument("--img-size", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=1, help="batch for FLOPs and activation memory")
    p.set_defaults(func=_info)

    p = sub.add_parser("attn", help="write attention heat maps over an image as PNG")
    p.add_argument("model", help="registered model name or alias (a checkpoint of ours carries its config)")
    p.add_argument("image", help="image file (PNG, JPEG, ...)")
    p.add_argument("--checkpoint", default=None, help="weights: ours, timm, torchvision or Hugging Face layout")
    p.add_argument("--layer", type=int, default=None, help="one attention layer (negative from the end)")
    p.add_argument("--head", type=int, default=None, help="one head (default: mean over heads)")
    p.add_argument("--method", default="auto", choices=["auto", "rollout", "mean", "layer"])
    p.add_argument("--img-size", type=int, default=None)
    p.add_argument("--out", default="attention_maps", help="output folder")
    p.add_argument("--save-map", action="store_true", help="also save the raw token-grid map as .npy")
    p.set_defaults(func=_attn)

    p = sub.add_parser("docs", help="regenerate docs/attention/*.md and docs/models.md from the library")
    p.add_argument("--out", default="docs", help="docs folder")
    p.add_argument("--check", action="store_true", help="only check the generated text is up to date")
    p.add_argument("--no-images", action="store_true", help="skip the PNG pictures")
    p.set_defaults(func=_docs)
