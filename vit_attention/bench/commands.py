"""``vit-attention bench``: the side-by-side benchmark from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from ..factory import add_model_arg_option, positive_int
from ..models import list_models
from ..weights.io import atomic_write_text
from .harness import (
    ATTN_BACKENDS,
    COMPILE_MODES,
    RUNTIMES,
    BenchConfig,
    format_table,
    graph_break_report,
    run_benchmark,
)


def _expand(patterns: list[str]) -> list[str]:
    names: list[str] = []
    for pat in patterns:
        if any(c in pat for c in "*?["):
            found = list_models(pat)
            if not found:
                raise ValueError(f"no registered model matches {pat!r}")
            names += found
        else:
            names.append(pat)
    return names


def _graph_breaks(args: argparse.Namespace) -> int:
    rows = graph_break_report(_expand(args.models))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| model | graphs | graph breaks | reasons |\n|---|---|---|---|")
    for r in rows:
        why = "; ".join(r.get("break_reasons", [])) or r.get("error", "") or "-"
        print(f"| {r['model']} | {r['graphs']} | {r['graph_breaks']} | {why} |")
    return 0 if all(r["graph_breaks"] == 0 for r in rows) else 1


def _bench(args: argparse.Namespace) -> int:
    args.models = _expand(args.models)
    if args.graph_breaks:
        return _graph_breaks(args)
    compare = [c.strip() for c in (args.compare or "").split(",") if c.strip()]
    cfg = BenchConfig(models=args.models, batch_size=args.batch_size, img_size=args.img_size, mode=args.mode,
                      compare=compare, compile=args.compile, compile_backend=args.compile_backend,
                      compile_mode=args.compile_mode, compile_freeze=args.compile_freeze,
                      attn_backend=args.attn_backend, tome=args.tome,
                      channels_last=args.channels_last, amp=args.amp, device=args.device, threads=args.threads,
                      rounds=args.rounds, iters=args.iters, warmup=args.warmup, peak_size=args.peak_size,
                      clock=args.clock, runtimes=tuple(args.runtime or ()), keep_going=args.keep_going,
                      recompile_limit=args.recompile_limit, reduced=args.reduced,
                      model_kwargs=dict(args.model_arg or ()))
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if not args.quiet else None

    def partial(report: dict) -> None:  # the report so far, after each model: a later crash keeps these rows
        if args.json and args.json != "-":
            atomic_write_text(args.json, json.dumps(report, indent=2) + "\n")

    report = run_benchmark(cfg, log=log, progress=partial)
    if args.quiet:
        for note in report["notes"]:
            print(f"vit-attention bench: {note}", file=sys.stderr)
    if args.json:
        text = json.dumps(report, indent=2)
        if args.json == "-":
            print(text)
        else:
            atomic_write_text(args.json, text + "\n")
            print(format_table(report))
    else:
        print(format_table(report))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``bench``."""
    p = sub.add_parser("bench", help="benchmark models (images/s, latency, memory, %% of matmul peak), "
                       "optionally side by side with timm / torchvision")
    p.add_argument("models", nargs="+", metavar="MODEL", help="registered model names, aliases or globs")
    p.add_argument("--batch-size", type=int, default=8, help="images per step (default: 8)")
    p.add_argument("--img-size", type=positive_int, default=None, help="input size (default: each preset's)")
    p.add_argument("--mode", choices=("infer", "train", "both"), default="infer",
                   help="inference forward, or forward + backward + AdamW step")
    p.add_argument("--compare", default="", help="comma-separated references: timm, torchvision, hf (transformers: "
                   "ViTDet's VitDetModel, compared with our forward_features), each also as NAME-compiled (e.g. "
                   "timm-compiled: torch.compile of it with the --compile-backend / --compile-mode / --compile-freeze "
                   "settings, its own participant) (same architecture, our weights loaded into each through our "
                   "converters; one that is missing here is reported unavailable and the run goes on)")
    p.add_argument("--compile", action="store_true", help="also time torch.compile(ours) (static shapes), "
                   "interleaved with eager ours (ratio 'vs ours'); report graph breaks")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend for --compile "
                   "(default: inductor; 'eager' traces without code generation, a cheap check)")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default="default",
                   help="torch.compile mode for --compile (inductor): reduce-overhead records CUDA graphs on a GPU "
                   "(launch-bound small models), max-autotune* tune GEMM templates (default: default)")
    p.add_argument("--compile-freeze", action="store_true",
                   help="inductor freezing for --compile (inference): parameters folded as constants, GEMM weights "
                   "prepacked; ignored in training")
    p.add_argument("--attn-backend", default=None, metavar="BACKEND[,BACKEND...]",
                   help=f"build ours with create_model(attn_backend=...): one of {', '.join(ATTN_BACKENDS)} "
                   "(flex: FlexAttention; with --compile it is compiled with the model), or a comma-separated list "
                   "(e.g. flex,sdpa,explicit): one participant of ours per backend, ours[flex], ours[sdpa], ..., "
                   "copies of one model (same weights), each timed in the same rounds with its ratio to the first "
                   "and its parity with it; with --compile each gets its compiled twin (ours[flex]+compile, ...: "
                   "one compilation per backend) (default: the models' own, auto)")
    p.add_argument("--tome", type=int, default=0, metavar="R",
                   help="also time ours with token merging (ToMe), R tokens merged per block ('ours+tome': its "
                        "speed-up over ours per round and its FLOPs); token models only (default 0: not)")
    p.add_argument("--runtime", action="append", choices=RUNTIMES, default=None,
                   help="also time ours exported to this runtime (onnxruntime: ONNX, dynamic batch, CPU, fp32, "
                   "as many threads as torch), interleaved with eager; repeatable (default: none)")
    p.add_argument("--graph-breaks", action="store_true", help="only trace each model with dynamo (meta device, "
                   "one block per stage) and list graph breaks; MODEL may be a glob like 'swin*'")
    p.add_argument("--channels-last", action="store_true", help="channels_last inputs and weights")
    p.add_argument("--amp", choices=("bf16",), default=None, help="torch.autocast in bf16 (default fp32)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds; each times every participant twice, ABBA order")
    p.add_argument("--iters", type=int, default=1, help="steps per participant per round")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per participant")
    p.add_argument("--clock", choices=("wall", "process"), default="wall",
                   help="wall clock, or this process's CPU seconds (robust to other processes with --threads 1)")
    p.add_argument("--peak-size", type=int, default=None, help="matrix size of the peak GEMM (default 2048 CPU)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write the full report as JSON to PATH (or stdout with no PATH)")
    p.add_argument("--keep-going", action="store_true", help="a model (or mode) that fails is recorded in the "
                   "notes and the run goes on with the next (with --json PATH, the file is rewritten after each model)")
    p.add_argument("--recompile-limit", type=int, default=None, metavar="N",
                   help="torch._dynamo's recompile limit during the run (default: torch's, 8); past it a compiled "
                   "function runs eagerly, FlexAttention's CUDA kernel included (one compilation per attention "
                   "shape and pattern): raise it for models with many (e.g. 64)")
    add_model_arg_option(p, help="model config override for every MODEL, repeatable, JSON values: "
                                 "--model-arg depth=2 (default: the presets')")
    p.add_argument("--reduced", action="store_true", help="each model in its family's reduced form (every code "
                   "path, a few tokens: a smoke run; references whose weights no longer fit are reported unavailable)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=_bench)
