"""Each patterned attention mechanism on every backend (auto / flex / sdpa / explicit), at the shapes of stages of
Swin-T, SwinV2-T, NAT-T, DiNAT-T, HaloNet-26t, ViL-S, ViTDet-B and iGPT-S, or any registered mechanism at its
spec's documented example, interleaved: time, peak memory, parity.

    python -m vit_attention.bench.mechanisms [--device cuda] [--amp bf16] [--mode infer|train|both]
        [--batch 64] [--cases swin_t_s1,nat_t_s1,...] [--backends auto,flex,sdpa,explicit]
        [--rounds 5] [--iters 10] [--warmup 3] [--compile] [--smoke] [--recompile-limit 64] [--json PATH]
        [--markdown PATH]

For each case (a mechanism built by ``create_attention`` with the keywords of one stage of a model, on that
stage's map; or ``NAME_example``: the keywords and map of the mechanism's spec, ``--cases examples`` for every
registered mechanism) one module is built with seeded weights and copied per backend
(:func:`~vit_attention.attention.set_attention_backend`): the same weights on every backend. Each round times
every backend twice in ABBA order (``iters`` calls each, synchronised on CUDA); per backend the median time,
its per-round ratio to the first backend (``t_first / t_backend``: > 1 means faster than the first), the peak
memory of one step (CUDA allocator peak above what was live; not measured on CPU) and the parity with the first
backend (max relative difference of the fp32 outputs, inference). A step is one forward (``infer``, under
``torch.inference_mode``) or forward + backward of the output's mean square (``train``). A backend that fails
(out of memory, no CPU backward for flex) gets its error in the row and the others go on.

``--compile``: every backend's module runs under ``torch.compile(fullgraph=True)`` (inductor; the rows' mode
reads ``infer+compile``): on CPU the figures of docs/flex.md's compiled table, e.g.
``--compile --backends auto,flex --batch 1``.
``--smoke``: the same cases at a tiny map and batch (CPU, seconds), to prove the command runs.
On CPU, FlexAttention has no backward: ``train`` rows for flex say so.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import AttentionCall, create_attention, get_attention_spec, list_attention, set_attention_backend
from ..weights.io import atomic_write_text
from .device import autocast, synchronize
from .harness import ATTN_BACKENDS, parse_backends, recompile_limit

__all__ = ["Case", "CASES", "example_case", "get_case", "expand_cases", "run_case", "run", "format_rows", "main"]


@dataclass(frozen=True)
class Case:
    """One stage of one model: mechanism ``name`` at width ``dim`` with ``heads`` heads on an ``H x W`` map.

    ``kwargs`` go to ``create_attention``; ``prefix``: global / class tokens before the map's tokens (token
    mechanisms); ``batch``: a batch that fits where the default (64) does not (ViTDet's global blocks).
    """

    model: str
    name: str
    dim: int
    heads: int
    grid: tuple[int, int]
    kwargs: dict[str, Any] = field(default_factory=dict)
    prefix: int = 0
    batch: int | None = None
    smoke_grid: tuple[int, int] = (8, 8)
    smoke_kwargs: dict[str, Any] = field(default_factory=dict)


CASES: dict[str, Case] = {c.model: c for c in (
    Case("swin_t_s1", "window", 96, 3, (56, 56), dict(window_size=7, shift_size=3),
         smoke_kwargs=dict(window_size=4, shift_size=2)),
    Case("swinv2_t_s1", "cosine_window", 96, 3, (64, 64), dict(window_size=8, shift_size=4),
         smoke_kwargs=dict(window_size=4, shift_size=2)),
    Case("nat_t_s1", "neighborhood", 64, 2, (56, 56), dict(kernel_size=7), smoke_kwargs=dict(kernel_size=3)),
    Case("nat_t_s1_nobias", "neighborhood", 64, 2, (56, 56), dict(kernel_size=7, rel_pos_bias=False),
         smoke_kwargs=dict(kernel_size=3, rel_pos_bias=False)),
    Case("dinat_t_s1_d8", "neighborhood", 64, 2, (56, 56), dict(kernel_size=7, dilation=8),
         smoke_kwargs=dict(kernel_size=3, dilation=2)),
    Case("halonet26t_s3", "halo", 256, 8, (32, 32), dict(block_size=8, halo_size=2),
         smoke_kwargs=dict(block_size=4, halo_size=1)),
    Case("vil_s_s1", "longformer2d", 96, 3, (56, 56), dict(window_size=15, num_global_tokens=1), prefix=1,
         smoke_kwargs=dict(window_size=3, num_global_tokens=1)),
    Case("vitdet_b_window", "rel_pos", 768, 12, (64, 64), dict(window_size=14, input_size=14, rel_pos_zero_init=False),
         batch=8, smoke_kwargs=dict(window_size=4, input_size=4)),
    Case("vitdet_b_global", "rel_pos", 768, 12, (64, 64), dict(window_size=0, input_size=64, rel_pos_zero_init=False),
         batch=8, smoke_kwargs=dict(window_size=0, input_size=8)),
    Case("igpt_s_causal", "causal", 512, 8, (32, 32), {}, batch=16),
)}


def _build(case: Case, smoke: bool, seed: int = 0) -> tuple[nn.Module, dict[str, Any]]:
    """The seeded module (tables that start at zero filled too, so bias paths do work) and its keywords."""
    torch.manual_seed(seed)
    kwargs = {**case.kwargs, **(case.smoke_kwargs if smoke else {})}
    m = create_attention(case.name, case.dim if not smoke else case.heads * 8, case.heads, **kwargs)
    with torch.no_grad():
        for p in m.parameters():  # tables initialised at zero would make bias paths trivial
            if p.dim() >= 1 and not p.abs().sum():
                p.normal_(0, 0.02)
    return m, kwargs


def _input(case: Case, batch: int, smoke: bool) -> tuple[Tensor, AttentionCall]:
    """Input ``[B, H, W, C]`` (spatial mechanisms) or ``[B, P + H·W, C]`` (token ones) and its
    :class:`AttentionCall` (``feat_size`` for a token mechanism that needs the grid, ``num_prefix_tokens``),
    read from the spec."""
    spec = get_attention_spec(case.name)
    H, W = case.smoke_grid if smoke else case.grid
    C = case.dim if not smoke else case.heads * 8
    g = torch.Generator().manual_seed(1)
    if spec.layout == "tokens":
        x = torch.randn(batch, case.prefix + H * W, C, generator=g)
        return x, AttentionCall((H, W) if spec.needs_feat_size else None, case.prefix)
    return torch.randn(batch, H, W, C, generator=g), AttentionCall()


EXAMPLE_SUFFIX = "_example"


def example_case(name: str) -> Case:
    """Mechanism ``name``'s case from its registry spec: the documented example (``doc_example``: its keywords at
    width 96 with 3 heads on a 14 x 14 map or its own map), and the spec's small example under ``--smoke``. Any
    registered mechanism has one, a mechanism registered from outside the package too: ``--cases NAME_example``."""
    spec = get_attention_spec(name)
    kwargs, shape = spec.doc_example if spec.doc_example is not None else (spec.example_kwargs, (1, 14, 14, 96))
    grid = (shape[1], shape[2]) if len(shape) == 4 else (14, 14)
    small = spec.example_shape
    return Case(f"{name}{EXAMPLE_SUFFIX}", name, shape[-1], 3, grid, dict(kwargs),
                smoke_grid=(small[1], small[2]) if len(small) == 4 else (4, 4),
                smoke_kwargs=dict(spec.example_kwargs))


def get_case(key: str) -> Case:
    """The case ``key``: a model stage of :data:`CASES`, or ``NAME_example`` (:func:`example_case`)."""
    if key in CASES:
        return CASES[key]
    if key.endswith(EXAMPLE_SUFFIX) and key[:-len(EXAMPLE_SUFFIX)] in list_attention():
        return example_case(key[:-len(EXAMPLE_SUFFIX)])
    raise _unknown([key])


def _unknown(keys: Sequence[str]) -> ValueError:
    return ValueError(f"--cases: unknown {list(keys)}; expected some of {', '.join(CASES)}, 'examples' (every "
                      f"registered mechanism's example) or NAME{EXAMPLE_SUFFIX} for a registered mechanism NAME")


def expand_cases(keys: Sequence[str]) -> list[str]:
    """``keys`` with ``"examples"`` replaced by every registered mechanism's ``NAME_example``."""
    out: list[str] = []
    for k in keys:
        out += [f"{n}{EXAMPLE_SUFFIX}" for n in list_attention()] if k == "examples" else [k]
    return out


def run_case(case: Case, *, backends: Sequence[str], device: torch.device, amp: str | None, mode: str,
             batch: int, rounds: int, iters: int, warmup: int, smoke: bool = False, compile: bool = False,
             log: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """One row per backend: ``{"case", "mechanism", "backend", "mode", "amp", "batch", "grid", "ms", "ratio",
    "parity", "peak_mb", "error"}`` (``ms`` median over rounds; ``ratio`` to the first backend that ran).
    ``compile``: each backend's module is called through ``torch.compile(module, fullgraph=True)``."""
    module, kwargs = _build(case, smoke)
    b = case.batch if case.batch is not None and not smoke else batch
    x, call = _input(case, b, smoke)
    x = x.to(device)
    module.to(device)
    mods: dict[str, nn.Module] = {}
    calls: dict[str, Callable[..., Any]] = {}  # the module, or its compiled form
    errors: dict[str, str] = {}
    for be in backends:
        try:
            mods[be] = set_attention_backend(copy.deepcopy(module), be)
            calls[be] = torch.compile(mods[be], fullgraph=True, dynamic=False) if compile else mods[be]
        except ValueError as e:
            errors[be] = f"ValueError: {e}"

    def make(be: str) -> Callable[[], Any]:
        m, fn = mods[be], calls[be]
        if mode == "infer":
            m.eval()

            def infer() -> Any:
                with torch.inference_mode(), autocast(device, amp):
                    return fn(x, call)
            return infer
        m.train()
        xg = x.detach().clone().requires_grad_(True)

        def train() -> Any:
            m.zero_grad(set_to_none=True)
            xg.grad = None
            with autocast(device, amp):
                out = fn(xg, call)
            out.float().square().mean().backward()
            return out
        return train

    steps: dict[str, Callable[[], Any]] = {}
    for be in mods:
        st = make(be)
        try:
            for _ in range(max(warmup, 1)):  # compiles flex's kernel on CUDA
                st()
            synchronize(device)
            steps[be] = st
        except Exception as e:  # OOM, no CPU backward for flex, a compile failure: recorded, the others go on
            errors[be] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
            if device.type == "cuda":
                torch.cuda.empty_cache()
    parity: dict[str, float] = {}
    first = next(iter(steps), None)
    if first is not None:
        with torch.inference_mode():
            mods[first].eval()
            ref = calls[first](x, call).float()
            for be in steps:
                if be != first:
                    mods[be].eval()
                    out = calls[be](x, call).float()
                    parity[be] = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
        if mode == "train":
            for be in steps:
                mods[be].train()
    peak: dict[str, float | None] = {}
    for be, st in steps.items():
        if device.type == "cuda":
            synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            st()
            synchronize(device)
            peak[be] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        else:
            peak[be] = None
    times: dict[str, list[float]] = {be: [] for be in steps}
    order = list(steps)
    for r in range(rounds):
        k = r % max(len(order), 1)
        rot = order[k:] + order[:k]
        spent = dict.fromkeys(order, 0.0)
        for be in rot + rot[::-1]:
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                steps[be]()
            synchronize(device)
            spent[be] += time.perf_counter() - t0
        for be in order:
            times[be].append(spent[be] / (2 * iters))
    H, W = case.smoke_grid if smoke else case.grid
    rows = []
    for be in backends:
        row: dict[str, Any] = dict(case=case.model, mechanism=case.name, backend=be,
                                   mode=f"{mode}+compile" if compile else mode, amp=amp or "fp32",
                                   batch=b, grid=[H, W], dim=x.shape[-1], heads=case.heads, kwargs=kwargs,
                                   ms=None, ratio=None, parity=parity.get(be), peak_mb=peak.get(be),
                                   error=errors.get(be))
        if be in times and times[be]:
            row["ms"] = statistics.median(times[be]) * 1e3
            row["ms_per_round"] = [t * 1e3 for t in times[be]]
            if first is not None and be != first:
                per = [a / t for a, t in zip(times[first], times[be])]
                row["ratio"] = {"vs": first, "median": statistics.median(per), "min": min(per), "max": max(per)}
        rows.append(row)
        log(f"{case.model} [{mode}, {amp or 'fp32'}] {be}: "
            + (f"{row['ms']:.3f} ms" if row["ms"] is not None else f"failed ({row['error']})"))
    return rows


def run(cases: Sequence[str], *, backends: Sequence[str], device: str = "cpu", amp: str | None = None,
        modes: Sequence[str] = ("infer",), batch: int = 64, rounds: int = 5, iters: int = 10, warmup: int = 3,
        smoke: bool = False, compile: bool = False, log: Callable[[str], None] = lambda s: None,
        progress: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """:func:`run_case` over ``cases`` (names of :data:`CASES`, ``NAME_example`` or ``examples``: see
    :func:`get_case`) and ``modes``; a case that fails as a whole gives one row with its error."""
    cases = expand_cases(cases)
    unknown = [c for c in cases if c not in CASES and not (c.endswith(EXAMPLE_SUFFIX)
                                                         and c[:-len(EXAMPLE_SUFFIX)] in list_attention())]
    if unknown:  # every name checked before anything runs
        raise _unknown(unknown)
    resolved = {c: get_case(c) for c in cases}
    dev = torch.device(device)
    rows: list[dict[str, Any]] = []
    for name in cases:
        for mode in modes:
            try:
                rows += run_case(resolved[name], backends=backends, device=dev, amp=amp, mode=mode, batch=batch,
                                 rounds=rounds, iters=iters, warmup=warmup, smoke=smoke, compile=compile,
                                 log=log)
            except Exception as e:
                rows.append(dict(case=name, mechanism=resolved[name].name, backend=None, mode=mode, amp=amp or "fp32",
                                 ms=None, error=f"{type(e).__name__}: {str(e).strip()[:300]}"))
                log(f"{name} [{mode}] failed: {rows[-1]['error']}")
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            if progress is not None:
                progress(rows)
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one line per (case, mode, precision), one column per backend (ms, and the ratio to the first)."""
    backends: list[str] = []
    for r in rows:
        if r.get("backend") and r["backend"] not in backends:
            backends.append(r["backend"])
    head = "| case | mechanism | mode | precision | batch | map | " + " | ".join(f"{b} ms" for b in backends)
    head += " | " + " | ".join(f"{b} vs {backends[0]}" for b in backends[1:]) + " | max parity | peak MB |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["case"], r["mode"], r["amp"]), []).append(r)
    for (case, mode, amp), rs in groups.items():
        by = {r["backend"]: r for r in rs}
        whole = by.get(None)
        mech = rs[0]["mechanism"]
        if whole is not None:
            out.append(f"| {case} | {mech} | {mode} | {amp} | - | - | failed: {whole['error']} |")
            continue
        any_r = rs[0]
        cells = []
        for b in backends:
            r = by.get(b)
            cells.append("-" if r is None else f"{r['ms']:.3f}" if r["ms"] is not None else
                         f"failed ({(r['error'] or '')[:60]})")
        ratios = []
        for b in backends[1:]:
            r = by.get(b)
            ratio = r.get("ratio") if r else None
            ratios.append(f"{ratio['median']:.2f}x" if ratio else "-")
        pars = [r["parity"] for r in rs if r.get("parity") is not None]
        peaks = "/".join("-" if by.get(b) is None or by[b].get("peak_mb") is None else f"{by[b]['peak_mb']:.0f}"
                         for b in backends)
        par = f"{max(pars):.1e}" if pars else "-"
        out.append(f"| {case} | {mech} | {mode} | {amp} | {any_r['batch']} | {any_r['grid'][0]}x{any_r['grid'][1]} | "
                   + " | ".join(cells + ratios) + f" | {par} | {peaks} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vit_attention.bench.mechanisms``: run the cases, print (and write) the table; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    ap.add_argument("--amp", choices=("bf16",), default=None, help="torch.autocast in bf16 (default fp32)")
    ap.add_argument("--mode", choices=("infer", "train", "both"), default="infer",
                    help="forward (inference mode), or forward + backward")
    ap.add_argument("--batch", type=int, default=64, help="batch (cases with their own batch keep it; default 64)")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, from {', '.join(CASES)} (default: these model stages), 'examples' (every "
                         "registered mechanism's documented example) or NAME_example (one registered mechanism's)")
    ap.add_argument("--backends", default="auto,flex,sdpa,explicit",
                    help=f"comma-separated, from {', '.join(ATTN_BACKENDS)}; ratios are to the first")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10, help="calls per backend per round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per backend (at least 1: flex compiles)")
    ap.add_argument("--compile", action="store_true",
                    help="call every backend's module through torch.compile(fullgraph=True) (inductor)")
    ap.add_argument("--smoke", action="store_true", help="tiny maps and batch: proves the command runs (CPU)")
    ap.add_argument("--recompile-limit", type=int, default=64,
                    help="torch._dynamo's recompile limit (flex's CUDA kernel compiles per shape; default 64)")
    ap.add_argument("--json", default=None, help="write the rows as JSON here (rewritten after each case)")
    ap.add_argument("--markdown", default=None, help="write the table here too")
    args = ap.parse_args(argv)
    try:
        backends = [b for b in parse_backends(args.backends) if b is not None]
    except ValueError as e:
        ap.error(str(e).replace("--attn-backend", "--backends"))
    for name, v in (("--batch", args.batch), ("--rounds", args.rounds), ("--iters", args.iters)):
        if v < 1:
            ap.error(f"{name} must be >= 1, got {v}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    modes = ["infer", "train"] if args.mode == "both" else [args.mode]

    def save(rows: list[dict[str, Any]]) -> None:
        if args.json:
            atomic_write_text(args.json, json.dumps({
                "torch": torch.__version__, "device": args.device,
                "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None, "rows": rows},
                indent=1))

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        with recompile_limit(args.recompile_limit):
            rows = run(cases, backends=backends, device=args.device, amp=args.amp, modes=modes, batch=args.batch,
                       rounds=args.rounds, iters=args.iters, warmup=args.warmup, smoke=args.smoke,
                       compile=args.compile, log=log, progress=save)
    except ValueError as e:
        ap.error(str(e))
    save(rows)
    table = format_rows(rows)
    head = (f"torch {torch.__version__}, device {args.device}"
            f"{' ' + torch.cuda.get_device_name() if args.device.startswith('cuda') else ''}, "
            f"{args.amp or 'fp32'}{', torch.compile' if args.compile else ''}, "
            f"median of {args.rounds} rounds x {args.iters} calls (ABBA); 'B vs A' = "
            "A's time / B's per round, median (> 1: B faster); parity: max relative difference to the first backend")
    print(head + "\n\n" + table)
    if args.markdown:
        atomic_write_text(args.markdown, head + "\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
