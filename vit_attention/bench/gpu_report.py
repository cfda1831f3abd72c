"""The GPU benchmark table from what ``scripts/gpu_bench.sh`` wrote: ready to paste into docs/benchmarks.md.

    python -m vit_attention.bench.gpu_report OUT_DIR [--markdown PATH]
    python -m vit_attention.bench.gpu_report --env PATH     # versions, GPU, driver, natten as JSON (the first step)

Reads, anywhere under ``OUT_DIR``: ``vit-attention bench --json`` reports, ``bench.mechanisms`` JSON, the
``bench.local`` JSON (neighbourhood attention vs natten), the iGPT ``generate --bench`` logs, ``env.json`` and
each phase's ``steps.tsv``; prints (and writes) Markdown:

* the device, versions and the commands that ran (with their status: ok / failed / timed out / skipped);
* end to end, one line per (model, precision, mode): images/s of ours per backend (``auto`` is the default),
  of timm eager / compiled, HF, ours compiled, and ours' per-round speed ratios (median) to each reference;
* the performance targets, measured or "not measured" with the reason;
* per mechanism, per backend (the ``bench.mechanisms`` table), natten, iGPT sampling, and every failure note.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..weights.io import atomic_write_text

__all__ = ["collect", "render", "environment", "main"]

SHORT = {
    "swin_tiny_patch4_window7_224": "Swin-T", "swinv2_tiny_window8_256": "SwinV2-T", "nat_tiny": "NAT-T",
    "dinat_tiny": "DiNAT-T", "halonet26t": "HaloNet-26t", "vil_small": "ViL-S",
    "vitdet_base_patch16_1024": "ViTDet-B 1024", "deit_tiny_patch16_224": "DeiT-Ti",
}
_RUN_LABEL = {"compiled": " (compiled run)", "plain": " (default backend run)"}
_IGPT = re.compile(r"bench: ([\d,.]+) tokens/s with the key/value cache, ([\d,.]+) tokens/s without \(([\d.]+)x\)")
_IGPT_STATIC = re.compile(r"bench: ([\d,.]+) tokens/s with the static cache, eager")
_IGPT_COMPILED = re.compile(r"bench: ([\d,.]+) tokens/s compiled \(([^)]+)\) with the static cache")


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(out: str | Path) -> dict[str, Any]:
    """Everything the runbook wrote under ``out``: ``{"bench", "mechanisms", "local", "igpt", "env", "steps"}``."""
    root = Path(out)
    found: dict[str, Any] = {"bench": [], "mechanisms": [], "local": [], "igpt": [], "env": None, "steps": []}
    for p in sorted(root.rglob("*.json")):
        data = _load(p)
        if isinstance(data, dict) and {"machine", "config", "results"} <= set(data):
            found["bench"].append((p, data))
        elif isinstance(data, dict) and "rows" in data and "device" in data:
            found["mechanisms"].append((p, data))
        elif isinstance(data, list) and data and isinstance(data[0], dict) and "dilation" in data[0]:
            found["local"].append((p, data))
        elif p.name == "env.json" and isinstance(data, dict):
            found["env"] = data
    for p in sorted(root.rglob("igpt_sampling*.log")):
        text = p.read_text(errors="replace")
        m, st, co = _IGPT.search(text), _IGPT_STATIC.search(text), _IGPT_COMPILED.search(text)

        def num(match: re.Match[str] | None, i: int = 1) -> float | None:
            return float(match[i].replace(",", "")) if match else None

        found["igpt"].append({"step": p.stem, "cached": num(m), "uncached": num(m, 2), "ratio": num(m, 3),
                              "static": num(st), "compiled": num(co), "compile_mode": co[2] if co else None,
                              "tail": "" if m else text.strip().splitlines()[-1][:200] if text.strip() else "(empty)"})
    for p in sorted(root.rglob("steps.tsv")):
        for line in p.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 5:
                found["steps"].append({"phase": p.parent.name, "step": parts[0], "status": parts[1],
                                       "seconds": parts[3], "command": parts[4].strip()})
    return found


def _med(stat: dict[str, float] | None, spec: str = ".0f") -> str:
    return "-" if not stat else format(stat["median"], spec)


def _ratio(row: dict[str, Any] | None, ref: str) -> str:
    r = (row or {}).get("ratios", {}).get(ref)
    return "-" if not r else f"{r['median']:.2f}x"


def _e2e(reports: list[tuple[Path, dict[str, Any]]]) -> tuple[list[str], dict[tuple[str, str, str, str], Any]]:
    """The end-to-end table, and ``{(model, precision, mode, run): {impl: row}}`` for the targets."""
    groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for _path, rep in reports:
        prec = rep["config"].get("amp") or "fp32"
        # a run with several backends, a --compile run, or a plain one (ours on its default backend)
        run = ("compiled" if rep["config"].get("compile") else
               "backends" if "," in (rep["config"].get("attn_backend") or "") else "plain")
        for r in rep["results"]:
            groups.setdefault((r["model"], prec, r["mode"], run), {})[r["impl"]] = r
    lines = ["| model | precision | mode | batch | ours auto img/s | flex | sdpa | explicit | timm | timm compiled "
             "| HF | ours compiled | ours/timm | ours/timm compiled | ours/HF | ours compiled/timm compiled "
             "| flex/auto | max parity |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (model, prec, mode, run), rows in groups.items():
        base = rows.get("ours[auto]") or rows.get("ours")
        comp = rows.get("ours[auto]+compile") or rows.get("ours+compile")

        def ips(impl: str, rows: dict[str, Any] = rows) -> str:
            return _med(rows[impl]["images_per_s"]) if impl in rows else "-"

        pars = [r["parity"] for r in rows.values() if r.get("parity") is not None]
        par = f"{max(pars):.1e}" if pars else "-"
        batch = next(iter(rows.values()))["batch_size"]
        label = SHORT.get(model, model) + _RUN_LABEL.get(run, "")
        lines.append(
            f"| {label} | {prec} | {mode} | {batch} | {_med(base['images_per_s']) if base else '-'} "
            f"| {ips('ours[flex]')} | {ips('ours[sdpa]')} | {ips('ours[explicit]')} | {ips('timm')} "
            f"| {ips('timm-compiled')} | {ips('hf')} | {_med(comp['images_per_s']) if comp else '-'} "
            f"| {_ratio(base, 'timm')} | {_ratio(base, 'timm-compiled')} | {_ratio(base, 'hf')} "
            f"| {_ratio(comp, 'timm-compiled')} | {_ratio(rows.get('ours[flex]'), 'ours[auto]')} | {par} |")
    return lines, groups


def _median_ratio(groups: dict[tuple[str, str, str, str], Any], model: str, impl: str, ref: str,
                  run: str = "backends", prec: str = "bf16", mode: str = "infer") -> float | None:
    rows = groups.get((model, prec, mode, run)) or {}
    r = (rows.get(impl) or {}).get("ratios", {}).get(ref)
    return None if not r else float(r["median"])


def _best_backend(groups: dict[tuple[str, str, str, str], Any], model: str, ref: str) -> str:
    rows = groups.get((model, "bf16", "infer", "backends")) or {}
    best = [(r["ratios"][ref]["median"], k) for k, r in rows.items() if k.startswith("ours[") and ref in r["ratios"]]
    if not best:
        return ""
    v, k = max(best)
    return f"; best backend {k[5:-1]} {v:.2f}x"


def _targets(groups: dict[tuple[str, str, str, str], Any], found: dict[str, Any]) -> list[str]:
    def line(target: str, value: float | None, goal: float, extra: str = "", missing: str = "not measured") -> str:
        if value is None:
            return f"| {target} | {missing} | - |"
        return f"| {target} | {value:.2f}x{extra} | {'yes' if value >= goal else 'no'} |"

    swin, deit, vitdet = "swin_tiny_patch4_window7_224", "deit_tiny_patch16_224", "vitdet_base_patch16_1024"
    base = "ours[auto]"
    out = ["| target (bf16, inference, batch 64 unless said) | measured (median of per-round ratios) | met |",
           "|---|---|---|",
           line("Swin-T >= 1.3x timm eager", _median_ratio(groups, swin, base, "timm"), 1.3,
                _best_backend(groups, swin, "timm")),
           line("Swin-T >= 1.0x timm compiled (ours eager)", _median_ratio(groups, swin, base, "timm-compiled"), 1.0,
                _best_backend(groups, swin, "timm-compiled")),
           line("Swin-T compiled >= 1.0x timm compiled",
                _median_ratio(groups, swin, "ours+compile", "timm-compiled", run="compiled"), 1.0),
           line("ViTDet-B 1024 >= 1.5x HF (batch 16)", _median_ratio(groups, vitdet, base, "hf"), 1.5,
                _best_backend(groups, vitdet, "hf")),
           line("DeiT-Ti >= 1.0x timm (ours eager)", _median_ratio(groups, deit, base, "timm"), 1.0),
           line("DeiT-Ti compiled (reduce-overhead) >= 1.0x timm",
                _median_ratio(groups, deit, "ours+compile", "timm", run="compiled"), 1.0,
                (lambda v: "" if v is None else f"; vs timm compiled alike {v:.2f}x")(
                    _median_ratio(groups, deit, "ours+compile", "timm-compiled", run="compiled")))]
    natten = (found.get("env") or {}).get("natten", "unknown")
    nat_note = ("NATTEN not installed on the device" if str(natten).startswith("not installed") else
                f"natten {natten}: see the neighbourhood table")
    bias = _nat_bias_ratio(found)
    out.append(f"| NAT-T with bias within 1.5x of NATTEN without bias | {nat_note}{bias} | - |")
    ig = [(i[k] / i["uncached"], k, i) for i in found["igpt"] if i["uncached"]
          for k in ("cached", "static", "compiled") if i.get(k)]
    best = max(ig, key=lambda t: t[0]) if ig else None
    how = "" if not best else (f" ({best[1]}{' ' + best[2]['compile_mode'] if best[1] == 'compiled' else ''}: "
                               f"{best[2][best[1]]:,.0f} vs {best[2]['uncached']:,.0f} tokens/s, {best[2]['step']})")
    out.append(line("iGPT-S cached sampling >= 3x uncached", best and best[0], 3.0, how))
    return out


def _nat_bias_ratio(found: dict[str, Any]) -> str:
    """Our neighbourhood attention with bias over without (mechanism bench, bf16 inference, flex or best)."""
    for _, data in found["mechanisms"]:
        rows = [r for r in data["rows"] if r.get("amp") == "bf16" and r.get("mode") == "infer" and r.get("ms")]
        with_b = {r["backend"]: r["ms"] for r in rows if r["case"] == "nat_t_s1"}
        without = {r["backend"]: r["ms"] for r in rows if r["case"] == "nat_t_s1_nobias"}
        if with_b and without:
            best_with, best_without = min(with_b.values()), min(without.values())
            return (f"; ours with bias / ours without: {best_with / best_without:.2f}x time "
                    f"(best backends: {min(with_b, key=with_b.get)} / {min(without, key=without.get)})")
    return ""


def render(found: dict[str, Any]) -> str:
    """The Markdown of :func:`collect`'s findings."""
    out: list[str] = []
    env = found["env"] or {}
    machine = found["bench"][0][1]["machine"] if found["bench"] else {}
    out.append(f"Device: {env.get('gpu') or machine.get('gpu') or machine.get('device', '?')} "
               f"({env.get('driver', '-')}); torch {env.get('torch') or machine.get('torch')}, CUDA {env.get('cuda')}, "
               f"timm {env.get('timm') or machine.get('timm')}, torchvision {env.get('torchvision')}, "
               f"transformers {env.get('transformers') or machine.get('transformers')}, triton {env.get('triton')}, "
               f"natten {env.get('natten')}; {env.get('cpu_count', '?')} CPUs.")
    if found["bench"]:
        c = found["bench"][0][1]["config"]
        out.append(f"Bench settings: rounds {c['rounds']} x iters {c['iters']} (ABBA), warmup {c['warmup']}, "
                   f"recompile limit {c.get('recompile_limit')}; ratios are medians of per-round ratios "
                   "(> 1: ours faster); parity: max relative difference of the outputs with the same weights.")
    lines, groups = _e2e(found["bench"])
    out += ["", "### End to end", "", *lines, "", "### Targets", "", *_targets(groups, found)]
    for path, data in found["mechanisms"]:
        from .mechanisms import format_rows

        out += ["", f"### Per mechanism ({path.stem}: {data.get('gpu') or data['device']})", "",
                format_rows(data["rows"])]
    for path, rows in found["local"]:
        from .local import format_rows as local_rows

        out += ["", f"### Neighbourhood attention, ours vs dense vs natten (CPU, {path.stem})", "",
                local_rows(rows) if any(r["impl"] == "ours" for r in rows) else "(no rows)"]
    if found["igpt"]:
        out += ["", "### iGPT sampling (tokens/s)", "",
                "| step | cached | uncached | cached/uncached | static cache, eager | compiled, static cache "
                "| compiled/uncached |", "|---|---|---|---|---|---|---|"]
        for i in found["igpt"]:
            if i["ratio"] is None:
                out.append(f"| {i['step']} | - | - | {i['tail']} | - | - | - |")
                continue
            st = "-" if i["static"] is None else f"{i['static']:,.0f}"
            co = "-" if i["compiled"] is None else f"{i['compiled']:,.0f} ({i['compile_mode']})"
            cr = "-" if i["compiled"] is None else f"{i['compiled'] / i['uncached']:.1f}x"
            out.append(f"| {i['step']} | {i['cached']:,.0f} | {i['uncached']:,.0f} | {i['ratio']:.1f}x | {st} | {co} "
                       f"| {cr} |")
    notes = sorted({n for _, rep in found["bench"] for n in rep["notes"]
                    if "failed" in n or "left out" in n or "skipped" in n})
    if notes:
        out += ["", "### Failures and omissions (bench notes)", "", *[f"- {n}" for n in notes]]
    if found["steps"]:
        out += ["", "### Commands", "", "| phase | step | status | s | command |", "|---|---|---|---|---|"]
        for s in found["steps"]:
            out.append(f"| {s['phase']} | {s['step']} | {s['status']} | {s['seconds']} | `{s['command']}` |")
    return "\n".join(out) + "\n"


def environment() -> dict[str, Any]:
    """Python, torch, CUDA, the GPU and its driver (``nvidia-smi``), CPU count, and the version of each reference
    library (or ``"not installed (...)"``): timm, torchvision, transformers, triton, natten."""
    import importlib
    import os
    import platform
    import subprocess

    import torch

    v: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                         "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                         "cpu_count": os.cpu_count()}
    for m in ("timm", "torchvision", "transformers", "triton", "natten"):
        try:
            v[m] = str(importlib.import_module(m).__version__)
        except Exception as e:  # noqa: BLE001 - any import failure: the library is not usable here
            v[m] = f"not installed ({type(e).__name__}: {str(e)[:80]})"
    try:
        v["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                      "--format=csv,noheader"], capture_output=True, text=True,
                                     timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        v["driver"] = f"nvidia-smi: {type(e).__name__}"
    return v


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vit_attention.bench.gpu_report``: the table of an output folder (or ``--env``); returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", help="the runbook's output folder ($OUT, or one phase's folder)")
    ap.add_argument("--markdown", default=None, help="also write the Markdown here")
    ap.add_argument("--env", default=None, metavar="PATH", help="only write the environment (versions, GPU) as JSON")
    args = ap.parse_args(argv)
    if args.env:
        env = environment()
        atomic_write_text(args.env, json.dumps(env, indent=1) + "\n")
        print(json.dumps(env, indent=1))
        return 0
    if args.out is None:
        ap.error("give OUT_DIR (or --env PATH)")
    if not Path(args.out).is_dir():
        ap.error(f"OUT_DIR {args.out!r} is not a folder")
    text = render(collect(args.out))
    print(text, end="")
    if args.markdown:
        atomic_write_text(args.markdown, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
