"""Generate ``docs/attention/<name>.md`` (one page per mechanism) and ``docs/models.md`` from the library.

    python -m vit_attention.analysis.docs            # or: vit-attention docs
    python -m vit_attention.analysis.docs --check    # exit 1 if a generated page is stale

Every number and shape on these pages comes from the library itself: the shape flow from
:func:`trace`, the costs from :func:`flops`, the pictures from :func:`record_attention`, the model
table from the model registry. A test regenerates the text and compares, so the pages cannot go
stale; the PNG pictures are regenerated too but not compared byte for byte (matplotlib versions
differ in their output).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..attention import create_attention, get_attention_spec, list_attention
from ..models import create_model, list_models
from ..models.registry import aliases_of, get_model_entry
from .flops import attention_complexity, complexity_table, flops
from .published import PUBLISHED_GMACS
from .trace import trace

__all__ = ["generate_docs", "check_docs", "mechanism_page", "models_page", "FORMULAS"]

# The formula of each mechanism, in Markdown (LaTeX-free so it reads in any viewer).
FORMULAS: dict[str, str] = {
    "mhsa": (
        "Global multi-head self-attention over all `N` tokens (Vaswani et al. 2017; ViT, Dosovitskiy et al. 2021):\n\n"
        "    q, k, v = split_heads(x W_qkv)                 # each [B, nh, N, hd]\n"
        "    A = softmax(q kᵀ · hd^-1/2)                    # [B, nh, N, N]\n"
        "    out = merge_heads(A v) W_proj                  # [B, N, C]\n\n"
        "Every token attends to every token: cost grows with `N²`. Optional QK-norm (ViT-22B) "
        "normalises q and k per head before the product."),
    "mha": (
        "Multi-head attention with separate query / key / value inputs (Vaswani et al. 2017), the batch-first "
        "counterpart of `torch.nn.MultiheadAttention` (loads its state dict):\n\n"
        "    q = split_heads(query W_q); k = split_heads(key W_k); v = split_heads(value W_v)\n"
        "    out = merge_heads(softmax(q kᵀ · hd^-1/2 + mask) v) W_o     # [B, N, E]\n\n"
        "Called with one tensor it is self-attention (the plug-and-play contract); with three it is "
        "cross-attention (e.g. the MAP pooling head of ViT-22B)."),
    "window": (
        "Swin window attention (Liu et al. 2021). The map `[B, H, W, C]` is cut into non-overlapping "
        "`M x M` windows; each window attends to itself with a learned relative-position bias. With "
        "`shift_size > 0` (SW-MSA) the map is first rolled by `-shift`, and a region mask keeps tokens "
        "that were not neighbours before the roll from attending to each other:\n\n"
        "    windows = window_partition(roll(x, -s))        # [B·nW, M², C]\n"
        "    A = softmax(q kᵀ · hd^-1/2 + B_rel + mask)     # [B·nW, nh, M², M²]\n"
        "    out = roll(window_reverse(A v W_proj), +s)     # [B, H, W, C]\n\n"
        "`B_rel[i, j] = table[index(Δrow, Δcol)]` with a table of `(2M-1)²` entries per head."),
    "cosine_window": (
        "SwinV2 scaled cosine window attention (Liu et al. 2022): Swin's (shifted) windows, but the logits "
        "are cosine similarities times a learned, clamped per-head temperature, and the position bias "
        "comes from a small MLP over log-spaced relative coordinates (continuous position bias), so a "
        "model transfers across window sizes:\n\n"
        "    A = softmax(cos(q, k) · exp(min(τ, log 100)) + 16·sigmoid(CPB_MLP(Δ)) + mask)\n"
        "    out = window_reverse(A v W_proj)               # [B, H, W, C]"),
}

# A representative configuration per mechanism for the generated shape flow and cost table.
DOC_EXAMPLES: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "window": (dict(window_size=7, shift_size=3), (1, 14, 14, 96)),
    "cosine_window": (dict(window_size=8, shift_size=4), (1, 16, 16, 96)),
}
_COST_MAPS = ((56, 56, 96, 3), (28, 28, 192, 6), (14, 14, 384, 12), (7, 7, 768, 24))  # Swin-T stages: h, w, C, nh


def _example(name: str) -> tuple[nn.Module, tuple[int, ...], dict[str, Any]]:
    spec = get_attention_spec(name)
    if name in DOC_EXAMPLES:
        kwargs, shape = DOC_EXAMPLES[name]
    else:
        kwargs = dict(spec.example_kwargs)
        shape = (1, 14, 14, 96) if spec.layout == "spatial" else (1, 197, 96)
    torch.manual_seed(0)
    return create_attention(name, shape[-1], 3, **kwargs).eval(), shape, kwargs


def _cost_rows(name: str) -> list[str]:
    spec = get_attention_spec(name)
    kwargs = DOC_EXAMPLES.get(name, (dict(spec.example_kwargs), ()))[0]
    rows = []
    for h, w, c, nh in _COST_MAPS:
        with torch.device("meta"):
            attn = create_attention(name, c, nh, **kwargs)
        shape = (1, h, w, c) if spec.layout == "spatial" else (1, h * w, c)
        macs = flops(attn, shape).total
        ref = attention_complexity(h, w, c, 7)
        rows.append(f"| {h}×{w}×{c} | {nh} | {macs / 1e6:,.1f} | {ref['msa'] / 1e6:,.1f} | {ref['w_msa'] / 1e6:,.1f} |")
    return rows


def mechanism_page(name: str, image: str | None = None) -> str:
    """The Markdown page of mechanism ``name`` (``image``: relative path of its picture, if any)."""
    spec = get_attention_spec(name)
    attn, shape, kwargs = _example(name)
    kw = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    flow = trace(attn, shape).format()
    doc = (type(attn).flops.__doc__ or "").strip().split("\n")[0] if hasattr(attn, "flops") else ""
    lines = [f"# `{name}`: {spec.description}", "",
             "<!-- generated by `vit-attention docs` (vit_attention/analysis/docs.py); do not edit -->", "",
             f"Class `{spec.cls.__module__}.{spec.cls.__name__}`, layout **{spec.layout}** "
             f"({'tokens `[B, N, C]`' if spec.layout == 'tokens' else 'channels-last map `[B, H, W, C]`'} in "
             "and out)." + (f" Paper: <{spec.paper}>." if spec.paper else ""), "",
             "## Formula", "", FORMULAS.get(name, (spec.cls.__doc__ or "").strip()), "",
             "## Shape flow", "",
             f"`create_attention({name!r}, {shape[-1]}, 3{', ' + kw if kw else ''})` on an input of shape "
             f"`{list(shape)}`, from `vit_attention.analysis.trace`:", "", "```", flow, "```", "",
             "## Complexity", "",
             f"Declared by `{spec.cls.__name__}.flops`: {doc}" if doc else "", "",
             "Multiply-adds of one layer (MMACs, batch 1) on the feature maps of Swin-T's four stages, from "
             "`vit_attention.analysis.flops`, next to the Swin paper's Ω formulas for global (MSA) and 7×7 "
             "window (W-MSA) attention. The analytic count equals `torch.utils.flop_counter` (tested).", "",
             "| feature map h×w×C | heads | this mechanism | Ω(MSA) | Ω(W-MSA), M=7 |",
             "|---|---:|---:|---:|---:|", *_cost_rows(name), ""]
    if image:
        lines += ["## Attention pattern", "",
                  f"![attention pattern of {name}]({image})", "",
                  f"Where three query tokens (red crosses) look on a {_picture_size(name)[0]}×{_picture_size(name)[1]} "
                  "map (random weights, random input, "
                  "seed 0, mean over heads), recorded with `vit_attention.analysis.record_attention`. A "
                  "trained model's maps: `vit-attention attn MODEL IMAGE --checkpoint ckpt.safetensors`.", ""]
    return "\n".join(lines)


def mechanism_picture(name: str, path: Path) -> Path:
    """Write the attention-pattern PNG of ``name`` (query maps of three tokens) to ``path``."""
    from .attention_maps import record_attention
    from .render import save_grid

    spec = get_attention_spec(name)
    kwargs, shape = DOC_EXAMPLES.get(name, (dict(spec.example_kwargs), (1, 14, 14, 96)))
    H, W = _picture_size(name)
    torch.manual_seed(0)
    attn = create_attention(name, 48, 3, **kwargs).eval()
    x = torch.randn(1, H, W, 48)
    with record_attention(attn, grid=(H, W)) as rec, torch.no_grad():
        attn(x if spec.layout == "spatial" else x.reshape(1, H * W, 48))
    r = rec.records[0]
    queries = [(2, 2), (H // 2, W // 2 - 1), (H - 2, W - 2)]
    maps = [r.query_map(q)[0] for q in queries]
    return save_grid(maps, [f"query {q}" for q in queries], path, marks=queries,
                     suptitle=f"{name}: attention of three query tokens over a {H}×{W} map")


def _picture_size(name: str) -> tuple[int, int]:
    """The map of the picture: the documented example's for spatial mechanisms (a window multiple), else 14x14."""
    shape = DOC_EXAMPLES.get(name, ({}, (1, 14, 14, 96)))[1]
    return (shape[1], shape[2]) if len(shape) == 4 else (14, 14)


def _num(value: float, decimals: int) -> str:
    """``1,234.5`` style, or three significant digits below 1 (tiny digits models)."""
    return f"{value:,.{decimals}f}" if value >= 1 else f"{value:.3g}"


def models_page() -> str:
    """``docs/models.md``: every registered model with params and GMACs at its input size."""
    lines = ["# Models", "", "<!-- generated by `vit-attention docs` (vit_attention/analysis/docs.py); do not edit -->",
             "", "Parameters and multiply-adds (GMACs, batch 1, at the preset's input size) of every registered "
             "model, computed by `vit_attention.analysis.flops` on the meta device; the analytic count is "
             "checked against `torch.utils.flop_counter` in the tests. *Published* gives the paper / timm "
             "figure where the tests check ours against it (within 2 % or the published rounding).", "",
             "| model | family | input | params (M) | GMACs | published | aliases |",
             "|---|---|---|---:|---:|---:|---|"]
    for name in list_models():
        entry = get_model_entry(name)
        cfg = entry.config()
        size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
        with torch.device("meta"):
            model = create_model(name).eval()
        report = flops(model, (1, cfg.in_chans, *size))
        pub = PUBLISHED_GMACS.get(name)
        lines.append(f"| `{name}` | {entry.family} | {size[0]}×{size[1]} | {_num(report.params / 1e6, 1)} | "
                     f"{_num(report.gmacs, 2)} | {pub if pub is not None else ''} | "
                     f"{', '.join(f'`{a}`' for a in aliases_of(name))} |")
    return "\n".join(lines) + "\n"


def _index_page(names: Sequence[str]) -> str:
    lines = ["# Attention mechanisms", "",
             "<!-- generated by `vit-attention docs` (vit_attention/analysis/docs.py); do not edit -->", "",
             "| mechanism | layout | what | paper |", "|---|---|---|---|"]
    for n in names:
        spec = get_attention_spec(n)
        lines.append(f"| [`{n}`]({n}.md) | {spec.layout} | {spec.description} | {spec.paper} |")
    lines += ["", "## Global vs window attention", "",
              "The Swin paper's costs of one attention layer, Ω(MSA) = 4hwC² + 2(hw)²C and "
              "Ω(W-MSA) = 4hwC² + 2M²hwC (`vit_attention.analysis.attention_complexity`):", "",
              complexity_table(window_size=7), ""]
    return "\n".join(lines)


def _pages(models: bool = True) -> dict[str, str]:
    names = list_attention()
    pages = {f"attention/{n}.md": mechanism_page(n, f"img/{n}.png") for n in names}
    pages["attention/README.md"] = _index_page(names)
    if models:
        pages["models.md"] = models_page()
    return pages


def generate_docs(out: str | Path = "docs", *, images: bool = True, models: bool = True) -> list[Path]:
    """Write every generated page under ``out`` (``images``: the PNG pictures too; ``models``: the
    model table, the slow part); returns the paths written."""
    out = Path(out)
    written = []
    for rel, text in _pages(models).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    if images:
        for n in list_attention():
            written.append(mechanism_picture(n, out / "attention" / "img" / f"{n}.png"))
    return written


def check_docs(out: str | Path = "docs") -> list[Path]:
    """Generated pages under ``out`` whose text differs from what the library generates now (or missing)."""
    out = Path(out)
    stale = []
    for rel, text in _pages().items():
        path = out / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
    for n in list_attention():
        if not (out / "attention" / "img" / f"{n}.png").is_file():
            stale.append(out / "attention" / "img" / f"{n}.png")
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vit_attention.analysis.docs [--out docs] [--check] [--no-images]``."""
    p = argparse.ArgumentParser(prog="python -m vit_attention.analysis.docs", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="docs")
    p.add_argument("--check", action="store_true")
    p.add_argument("--no-images", action="store_true")
    args = p.parse_args(argv)
    if args.check:
        stale = check_docs(args.out)
        for s in stale:
            print(f"stale: {s}")
        return 1 if stale else 0
    for path in generate_docs(args.out, images=not args.no_images):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
