"""The Markdown rendering of a benchmark report (:func:`~vit_attention.bench.harness.run_benchmark`)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_table"]


def _fmt_stat(s: dict[str, float] | None, spec: str = ".1f", scale: float = 1.0) -> str:
    if not s:
        return "-"
    return f"{s['median'] * scale:{spec}} ({s['min'] * scale:{spec}}-{s['max'] * scale:{spec}})"


def format_table(report: dict[str, Any]) -> str:
    """Markdown table of a :func:`run_benchmark` report, plus machine, peak and notes lines."""
    m, cfg, pk = report["machine"], report["config"], report["peak"]
    lines = [
        f"machine: {m['cpu']} ({m['cpu_count']} CPUs), device {m['device']}{' ' + m['gpu'] if m.get('gpu') else ''}, "
        f"{m['torch_threads']} threads; load average {m.get('loadavg_start')} -> {m.get('loadavg_end')}",
        f"versions: python {m['python']}, torch {m['torch']}, vit_attention {m['vit_attention']}, "
        f"timm {m['timm']}, torchvision {m['torchvision']}"
        f"{', transformers ' + m['transformers'] if m.get('transformers') else ''}",
        f"settings: batch {cfg['batch_size']}, amp {cfg['amp'] or 'fp32'}, channels_last {cfg['channels_last']}, "
        f"rounds {cfg['rounds']} x iters {cfg['iters']} (ABBA), warmup {cfg['warmup']}, "
        f"clock {cfg.get('clock', 'wall')}, attention backend {cfg.get('attn_backend') or 'default'}",
        f"matmul peak ({pk['dtype']}, {pk['n']}^3, {pk['kernel']}): {_fmt_stat(pk['gflops'])} GFLOP/s "
        "(median (min-max) over rounds)",
        "",
        "| model | mode | impl | img/s | latency ms | GFLOP/s | % of peak (best/best) | peak mem MB "
        "| speed ratio ours/ref | parity |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        ratios = "; ".join(f"vs {k}: {_fmt_stat(v, '.2f')}x" for k, v in r["ratios"].items()) or "-"
        par = f"{r['parity']:.1e}" if r["parity"] is not None else "-"
        lines.append(
            f"| {r['model']} | {r['mode']} | {r['impl']} | {r['images_per_s']['median']:.1f} | "
            f"{_fmt_stat(r['latency_ms'], '.0f')} | {_fmt_stat(r['gflops'], '.1f')} | "
            f"{'-' if r['fraction_of_peak'] is None else format(100 * r['fraction_of_peak'], '.0f')} |"
            f" {'-' if r['peak_memory_mb'] is None else format(r['peak_memory_mb'], '.1f')} | {ratios} | {par} |")
    for r in report["results"]:
        c = r.get("compile", {}).get("compile")
        if c:
            st = r["compile"].get("settings") or {}
            how = f" ({st['backend']}, mode {st['mode']}{', freezing' if st.get('freeze') else ''})" if st else ""
            who = "" if r["impl"] == "ours+compile" else f" {r['impl']}"
            lines.append(f"compile {r['model']} [{r['mode']}]{who}{how}: graphs {c.get('graphs')}, graph breaks "
                         f"{c.get('graph_breaks')}{' ' + str(c.get('break_reasons')) if c.get('break_reasons') else ''}"
                         f"{' error ' + c['error'] if c.get('error') else ''}")
    for r in report["results"]:
        t = r.get("tome")
        if t and t.get("flops_ratio"):
            lines.append(f"tome {r['model']} [{r['mode']}]: r = {t['r']} per block, FLOPs "
                         f"{r['flops_per_step'] / 1e9:.2f} G vs {t['flops_unmerged'] / 1e9:.2f} G unmerged "
                         f"({t['flops_ratio']:.2f}x fewer)")
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
