"""The study command: train several models, or several attention mechanisms in one backbone, under one budget.

Each entry is trained with the same data, epochs, batch size, optimiser and seed; the table
reports test accuracy, parameters, multiply-adds per image (``analysis.flops``, the papers'
"FLOPs"), training throughput (images/s over the training steps) and inference throughput
(images/s of batched forwards), and a PNG plots accuracy against FLOPs.

Inference is timed with the CPU thread count its model trained with (``train`` picks one thread
for tiny models), so the two throughput columns are comparable. Every model name and option is
checked before the first entry trains. ``compare_options.json`` keeps the comparison's options:
``resume=True`` continues each entry from its checkpoint (finished ones are only re-scored) with
the saved options.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..analysis.flops import flops
from ..attention import get_attention_spec
from ..functional.window import to_pair
from ..models import model_config
from ..models.digits import DEFAULT_MODEL
from ..weights.io import atomic_write_text
from .checkpoint import CHECKPOINT_NAME
from .config import TrainConfig, check_model_kwargs
from .engine import train
from .errors import TrainingDiverged, TrainingInterrupted
from .plots import plot_accuracy_vs_flops
from .run_folder import check_output_folder, create_run_folder

__all__ = ["CompareEntry", "default_entries", "run_compare", "inference_throughput", "format_table",
           "read_compare_options", "OPTIONS_NAME"]

OPTIONS_NAME = "compare_options.json"

@dataclasses.dataclass
class CompareEntry:
    """One contender: a display ``name``, the registered ``model`` and its config overrides."""

    name: str
    model: str
    model_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def _mechanism_entry(mech: str, backbone: str) -> CompareEntry:
    spec = get_attention_spec(mech)  # unknown names raise with suggestions
    cfg = model_config(backbone)
    img, patch = to_pair(cfg.img_size), to_pair(cfg.patch_size)
    grid = (img[0] // patch[0], img[1] // patch[1])  # the backbone's token grid
    # the mechanism fits itself to the grid (its spec says how); every ViT block gets the same keywords
    kw = dict(spec.grid_kwargs(grid)) if spec.grid_kwargs is not None else {}
    model_kwargs: dict[str, Any] = {"attn_layer": mech}
    if kw:
        model_kwargs["attn_kwargs"] = kw
    return CompareEntry(f"{backbone.split('_')[0]}+{mech}", backbone, model_kwargs)


def default_entries() -> list[CompareEntry]:
    """Global MHSA vs window attention in the same digits ViT, and a small Swin (shifted windows)."""
    backbone = "vit_digits_patch2_8_gap"
    return [_mechanism_entry("mhsa", backbone), _mechanism_entry("window", backbone),
            CompareEntry("swin (shifted windows)", "swin_digits_patch2_window2_8")]


@torch.no_grad()
def inference_throughput(model: nn.Module, input_shape: tuple[int, ...], *, device: torch.device | str = "cpu",
                         min_time: float = 0.5) -> float:
    """Images per second of ``model`` forwards on a batch of ``input_shape`` ``[B, C, H, W]`` (eval, no grad)."""
    model.eval().to(device)
    x = torch.randn(*input_shape, device=device)
    model(x)  # warm-up
    n, t0 = 0, time.perf_counter()
    while True:
        model(x)
        n += 1
        if torch.cuda.is_available() and torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if dt >= min_time and n >= 3:
            return n * input_shape[0] / dt


def read_compare_options(output: str | Path) -> dict[str, Any] | None:
    """The options a comparison in ``output`` was started with (``None`` when it saved none)."""
    path = Path(output) / OPTIONS_NAME
    if not path.exists():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path} (--output): {e}") from None


def format_table(rows: list[dict[str, Any]]) -> str:
    """Plain-text table of the compare results."""
    head = f"{'model':34s} {'test acc':>8s} {'params':>9s} {'MMACs':>8s} {'train img/s':>11s} {'infer img/s':>11s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['name'][:34]:34s} {r['test_acc']:8.4f} {r['params']:9,d} {r['macs'] / 1e6:8.2f} "
                     f"{r['train_img_s']:11.0f} {r['infer_img_s']:11.0f}")
    return "\n".join(lines)


def run_compare(cfg: TrainConfig, *, models: list[str] | None = None, attention: list[str] | None = None,
                output: str | None = None, fast: bool = False, resume: bool = False) -> list[dict[str, Any]]:
    """Train every entry with ``cfg``'s budget; print the table, write ``compare.json`` / ``.txt`` and a PNG.

    ``models``: registered names; ``attention``: mechanisms inside ``cfg.model`` (the digits ViT
    with mean pooling by default: no class token's global read beside a local mechanism); neither:
    :func:`default_entries`. ``resume``: continue the comparison in ``output`` (each entry from its
    checkpoint; entries without one start). Every name is checked before training starts. Returns
    one row per entry.
    """
    if models and attention:
        raise ValueError("give either --models or --attention, not both")
    if models:
        entries = [CompareEntry(m, m, dict(cfg.model_kwargs)) for m in models]
    elif attention:
        backbone = "vit_digits_patch2_8_gap" if cfg.model == DEFAULT_MODEL else cfg.model
        entries = [_mechanism_entry(m, backbone) for m in attention]
    else:
        entries = default_entries()
    if not models and cfg.model_kwargs:  # --model-arg applies to every entry (the entry's mechanism wins)
        entries = [dataclasses.replace(e, model_kwargs={**cfg.model_kwargs, **e.model_kwargs}) for e in entries]
    for e in entries:  # every name and option before the first entry trains
        check_model_kwargs(e.model, e.model_kwargs)
    if resume and not output:
        raise ValueError("resume needs output (--output): the folder of the comparison to continue")
    if output:
        check_output_folder(output)
    out = Path(output) if output else create_run_folder("compare")
    if not resume and (out / "compare.json").exists():
        raise ValueError(f"{out} already holds a comparison; continue it with --resume, or choose another --output "
                         "(nothing was overwritten)")
    options = {"train": dataclasses.replace(cfg, output=None, resume=False).to_dict(), "models": models or [],
               "attention": attention or [], "quick": fast}
    atomic_write_text(out / OPTIONS_NAME, json.dumps(options, indent=1))
    rows: list[dict[str, Any]] = []
    for i, e in enumerate(entries):
        sub_out = out / f"{i}-{e.model}"
        sub = dataclasses.replace(cfg, model=e.model, model_kwargs=dict(e.model_kwargs),
                                  output=str(sub_out), epochs=1 if fast else cfg.epochs,
                                  resume=resume and (sub_out / CHECKPOINT_NAME).exists(), progress=cfg.progress)
        print(f"== [{i + 1}/{len(entries)}] {e.name}: {e.model} {json.dumps(e.model_kwargs) if e.model_kwargs else ''}",
              flush=True)
        try:
            res = train(sub)
        except TrainingInterrupted as err:
            raise TrainingInterrupted(f"{err}; to continue the whole comparison: vit-attention compare --resume "
                                      f"--output {out}", err.exit_code) from None
        except TrainingDiverged as err:
            raise TrainingDiverged(f"{err} [compare entry {i + 1}/{len(entries)}: {e.name}; continue the "
                                   f"comparison with: vit-attention compare --resume --output {out} --lr LOWER]"
                                   ) from None
        model = res["model"]
        c, h, w = model.cfg.in_chans, *res["input_size"]
        macs = flops(model, (1, c, h, w)).total
        train_speed = [r["train_img_s"] for r in res["history"]]
        threads = int(res.get("threads") or torch.get_num_threads())
        before = torch.get_num_threads()
        torch.set_num_threads(threads)  # time inference as training ran, not with the caller's threads
        try:
            infer = inference_throughput(model, (256, c, h, w), device=res["device"])
        finally:
            torch.set_num_threads(before)
        rows.append({"name": e.name, "model": e.model, "model_kwargs": e.model_kwargs, "test_acc": res["test_acc"],
                     "params": res["params"], "macs": int(macs),
                     "train_img_s": sorted(train_speed)[len(train_speed) // 2],
                     "infer_img_s": infer, "threads": threads})
    table = format_table(rows)
    if res["device"].type == "cpu":
        table += (f"\n(train and inference img/s with {', '.join(sorted({str(r['threads']) for r in rows}))} "
                  "CPU thread(s))")
    atomic_write_text(out / "compare.json", json.dumps(rows, indent=1))
    atomic_write_text(out / "compare.txt", table + "\n")
    plot_accuracy_vs_flops(rows, out / "accuracy_vs_flops.png",
                           title=f"{cfg.data or 'digits'}, {sub.epochs} epoch{'s' if sub.epochs != 1 else ''} each")
    print(f"\nwrote {out}/compare.json, compare.txt, accuracy_vs_flops.png")
    print(table)
    return rows
