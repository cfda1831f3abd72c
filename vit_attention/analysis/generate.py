"""``vit-attention generate``: sample images from a generative model (Image GPT) into a grid PNG.

    vit-attention generate igpt_digits --checkpoint runs/igpt_digits --num 16 --output grid.png
    vit-attention generate runs/igpt_digits --num 16 --bench     # also tokens/s with and without the cache
    vit-attention generate igpt_small --device cuda --num 8 --compile reduce-overhead --bench   # CUDA graphs

The model must have ``generate(num_images, *, temperature, top_k, seed, use_cache, static_cache,
compile_mode) -> tokens`` and
``dequantize(tokens) -> images [B, Cin, H, W]`` in ``[-1, 1]`` (:class:`vit_attention.models.igpt.ImageGPT`).
:func:`generation_speed` measures tokens per second (what ``--bench`` prints).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..functional.runtime import COMPILE_MODES
from ..weights.io import atomic_write

__all__ = ["add_commands", "generation_speed", "save_image_grid"]


def save_image_grid(images: Tensor, path: str | Path, *, scale: int | None = None) -> Path:
    """Images ``[B, Cin, H, W]`` in ``[-1, 1]`` (Cin 1 or 3) -> one PNG, ``⌈√B⌉`` per row, 2-pixel gaps.

    ``scale``: nearest-neighbour enlargement (default: about 64 pixels per image side).
    """
    from PIL import Image

    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"expected images [B, 1 or 3, H, W], got {tuple(images.shape)}")
    B, C, H, W = images.shape
    scale = scale or max(1, 64 // max(H, W))
    cols = math.ceil(math.sqrt(B))
    rows = math.ceil(B / cols)
    gap = 2
    grid = torch.ones(C, rows * (H * scale + gap) + gap, cols * (W * scale + gap) + gap)
    big = images.float().clamp(-1, 1).add(1).div(2).repeat_interleave(scale, 2).repeat_interleave(scale, 3)
    for i in range(B):
        r, c = divmod(i, cols)
        y, x = gap + r * (H * scale + gap), gap + c * (W * scale + gap)
        grid[:, y:y + H * scale, x:x + W * scale] = big[i]
    array = (grid * 255).round().to(torch.uint8).permute(1, 2, 0).squeeze(-1).numpy()
    # atomically, through a temporary file: a symlink planted at ``path`` is replaced, its target untouched
    return atomic_write(path, lambda tmp: Image.fromarray(array).save(tmp, format="PNG"))


@torch.no_grad()
def generation_speed(model: nn.Module, num_images: int = 4, *, use_cache: bool = True, seed: int = 0,
                     repeats: int = 1, **generate_kwargs: Any) -> float:
    """Generated tokens per second of ``model.generate(num_images, use_cache=..., **generate_kwargs)``
    (best of ``repeats``; a compiled sampler's first call, which compiles, is not timed)."""
    if generate_kwargs.get("compile_mode"):
        model.generate(num_images, seed=seed, use_cache=use_cache, **generate_kwargs)  # type: ignore[operator]
    best = math.inf
    for _ in range(max(1, repeats)):
        _sync(model)
        start = time.perf_counter()
        tokens = model.generate(num_images, seed=seed, use_cache=use_cache, **generate_kwargs)  # type: ignore[operator]
        _sync(model)
        best = min(best, time.perf_counter() - start)
    return tokens.numel() / best


def _sync(model: nn.Module) -> None:
    """Wait for the model's device (CUDA work is asynchronous)."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run(args: argparse.Namespace) -> int:
    from ..weights.io import probe_writable
    from ..weights.saved import is_checkpoint_path
    from .commands import build_model

    name: str | None = args.model
    checkpoint: str | None = args.checkpoint
    if is_checkpoint_path(args.model):
        if checkpoint is not None:
            raise ValueError(f"model {args.model!r} is a path and --checkpoint {checkpoint} is given too")
        name, checkpoint = None, args.model
    if args.num < 1:
        raise ValueError(f"--num must be >= 1, got {args.num}")
    if args.temperature <= 0:
        raise ValueError(f"--temperature must be > 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    output = Path(args.output)
    probe_writable(output.parent if str(output.parent) else Path("."))
    if checkpoint is None:
        print(f"vit-attention generate: warning: no --checkpoint: {name} samples from its initial (random) weights, "
              f"so the images are noise; give --checkpoint (a run folder of `vit-attention train --model {name}`, "
              "or Hugging Face ImageGPT weights) for a trained model's samples", file=sys.stderr)
    model: Any = build_model(name, checkpoint=checkpoint, device=args.device)
    if not callable(getattr(model, "generate", None)) or not callable(getattr(model, "dequantize", None)):
        raise ValueError(f"{getattr(model, 'registry_name', type(model).__name__)} is not a generative model "
                         "(it has no generate / dequantize): use an Image GPT model such as igpt_digits")
    if args.palette is not None:
        model.set_palette(args.palette)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if args.no_cache and (args.static_cache or args.compile):
        raise ValueError("--no-cache cannot go with --static-cache / --compile: they need the key/value cache")
    sampler = dict(static_cache=args.static_cache, compile_mode=args.compile)
    tokens = model.generate(args.num, temperature=args.temperature, top_k=args.top_k, seed=args.seed,
                            use_cache=not args.no_cache, **sampler)
    seconds = time.perf_counter() - start
    save_image_grid(model.dequantize(tokens), output)
    how = ", no cache" if args.no_cache else (f", compiled ({args.compile}), static cache" if args.compile
                                              else ", static cache" if args.static_cache else "")
    print(f"wrote {output} ({args.num} images, {tokens.shape[1]} tokens each, {seconds:.2f} s"
          f"{', compilation included' if args.compile else ''}, {tokens.numel() / seconds:,.0f} tokens/s{how})")
    if args.bench:
        cached = generation_speed(model, args.num, use_cache=True, repeats=2)
        plain = generation_speed(model, args.num, use_cache=False, repeats=2)
        print(f"bench: {cached:,.0f} tokens/s with the key/value cache, {plain:,.0f} tokens/s without "
              f"({cached / plain:.1f}x), batch {args.num}, {tokens.shape[1]} tokens per image")
        static = generation_speed(model, args.num, repeats=2, static_cache=True)
        print(f"bench: {static:,.0f} tokens/s with the static cache, eager ({static / plain:.1f}x uncached)")
        if args.compile:
            compiled = generation_speed(model, args.num, repeats=2, compile_mode=args.compile)
            print(f"bench: {compiled:,.0f} tokens/s compiled ({args.compile}) with the static cache "
                  f"({compiled / plain:.1f}x uncached, {compiled / cached:.1f}x the eager cache)")
    return 0


def add_commands(sub: Any) -> None:
    """Register ``generate`` on the ``vit-attention`` sub-command parser."""
    p = sub.add_parser("generate", help="sample images from a generative model (Image GPT) into a grid PNG",
                       description="Sample images from a generative model (Image GPT: igpt_digits trained here, "
                                   "or Hugging Face ImageGPT / openai image-gpt weights) into one grid PNG.",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", help="registered model name (e.g. igpt_digits), or a run folder / checkpoint of ours")
    p.add_argument("--checkpoint", default=None, help="weights: ours, Hugging Face ImageGPT or openai/image-gpt")
    p.add_argument("--palette", default=None,
                   help="colour clusters file (.npy kmeans_centers, HF preprocessor_config.json, ...)")
    p.add_argument("--num", type=int, default=16, help="how many images")
    p.add_argument("--temperature", type=float, default=1.0, help="divides the logits")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely colours")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same images)")
    p.add_argument("--no-cache", action="store_true", help="rerun the whole prefix each step (O(N^2))")
    p.add_argument("--static-cache", action="store_true",
                   help="a fixed-shape key/value cache (every step attends over all N slots, masked)")
    p.add_argument("--compile", default=None, choices=COMPILE_MODES, metavar="MODE",
                   help="compile the one-token step with torch.compile(mode=MODE) over the static cache: "
                        f"{', '.join(COMPILE_MODES)} (reduce-overhead = CUDA graphs on a GPU); the first "
                        "call compiles (tens of seconds)")
    p.add_argument("--output", default="grid.png", help="PNG to write")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--bench", action="store_true",
                   help="also print tokens/s with and without the cache, with the static cache, and compiled "
                        "(with --compile)")
    p.set_defaults(func=_run)
