"""Local attention at growing map sizes: ours vs a dense masked oracle vs natten (time, peak memory).

    python -m vit_attention.bench.local [--sizes 56 112 224] [--dim 64] [--heads 2] [--kernel 7]
                                        [--dilations 1 4] [--batch 1] [--threads N] [--rounds 5] [--json PATH]

For each map side ``S`` and dilation ``d`` it times one inference call of neighbourhood attention
on the same ``q, k, v`` (``[B, S, S, nh, hd]``), interleaved (ABBA) over rounds, and reports the
median time and the peak of live tensor bytes (:func:`~vit_attention.bench.memory.measure_peak_memory`):

* ``ours``: :func:`vit_attention.functional.neighborhood.neighborhood_attention` (tiles through the fused kernel);
* ``dense``: the library's attention function over all ``N = S²`` tokens with the neighbourhood as an
  ``N x N`` boolean mask (skipped when the mask alone would exceed ``--dense-limit`` GB);
* ``natten``: natten's ``na2d`` (its CPU path, flex attention without compile, which builds the full
  score matrix: skipped above ``--dense-limit`` as the dense oracle) when natten imports.

Outputs agree (max abs difference printed per row). No relative-position bias (natten's ``na2d`` has none).
natten's peak memory is not measured (its flex-attention op is opaque to the tensor tracker; without
``torch.compile`` it builds the full score matrix, as its own warning says).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..functional.attention import scaled_dot_product_attention
from ..functional.neighborhood import neighborhood_attention, window_start
from ..weights.io import atomic_write_text
from .memory import measure_peak_memory

__all__ = ["dense_neighborhood_mask", "run", "main"]


def dense_neighborhood_mask(H: int, W: int, kernel_size: int, dilation: int) -> Tensor:
    """``[N, N]`` bool: query ``r·W + c`` may attend to key ``r'·W + c'`` (NATTEN's clamped, dilated window)."""
    def axis(length: int) -> Tensor:  # [L, L]
        p = torch.arange(length)
        g, s = p % dilation, p // dilation
        group_len = (length - g + dilation - 1) // dilation
        start = window_start(s, group_len, kernel_size)  # per query, group units
        same = g[:, None] == g[None, :]
        u = s[None, :]
        return same & (u >= start[:, None]) & (u < start[:, None] + kernel_size)

    return (axis(H)[:, None, :, None] & axis(W)[None, :, None, :]).reshape(H * W, H * W)


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _peak_mb(fn: Callable[[], Any]) -> float:
    """Peak live tensor MB of one call (natten's flex-attention op cannot run under the tracker: not measured)."""
    return measure_peak_memory(fn, "cpu")["peak_bytes"] / 1e6


def _implementations(S: int, d: int, *, dim: int, heads: int, kernel: int, batch: int, dense_limit_gb: float,
                     na2d: Callable[..., Tensor] | None) -> dict[str, Callable[[], Tensor]]:
    """The calls to compare on one seeded ``q, k, v`` of an ``S x S`` map (each returns ``[B, ..., C]``-shaped data)."""
    hd, N = dim // heads, S * S
    g = torch.Generator().manual_seed(S * 100 + d)
    q, k, v = (torch.randn(batch, S, S, heads, hd, generator=g) for _ in range(3))
    qkv = torch.cat([t.reshape(batch, S, S, dim) for t in (q, k, v)], dim=-1)  # [B, S, S, 3C]
    impls: dict[str, Callable[[], Tensor]] = {
        "ours": lambda: neighborhood_attention(qkv, heads, kernel, d, scale=hd ** -0.5)}
    if N * N / 1e9 <= dense_limit_gb:
        mask = dense_neighborhood_mask(S, S, kernel, d)  # [N, N]
        qd, kd, vd = (t.reshape(batch, N, heads, hd).transpose(1, 2) for t in (q, k, v))  # [B, nh, N, hd]
        impls["dense"] = lambda: scaled_dot_product_attention(qd, kd, vd, mask=mask).transpose(1, 2)
    if na2d is not None and N * N / 1e9 <= dense_limit_gb:  # natten's CPU path builds the N x N scores too
        def natten() -> Tensor:  # grad mode on (inputs need no grad): under no_grad its CPU flex path fails to trace
            with torch.enable_grad():
                return na2d(q, k, v, kernel_size=kernel, dilation=d, scale=hd ** -0.5)

        impls["natten"] = natten
    return impls


def run(sizes: Sequence[int], *, dim: int = 64, heads: int = 2, kernel: int = 7, dilations: Sequence[int] = (1, 4),
        batch: int = 1, rounds: int = 5, dense_limit_gb: float = 0.2) -> list[dict[str, Any]]:
    """One row per (size, dilation, implementation): median seconds, peak MB, max |diff| vs ours."""
    try:
        from natten.functional import na2d  # a dev extra
    except Exception:  # noqa: BLE001 - any import failure: natten is optional here
        na2d = None
    rows: list[dict[str, Any]] = []
    for S in sizes:
        for d in dilations:
            if S < kernel * d:
                continue
            N = S * S
            impls = _implementations(S, d, dim=dim, heads=heads, kernel=kernel, batch=batch,
                                     dense_limit_gb=dense_limit_gb, na2d=na2d)
            with torch.no_grad():  # not inference_mode: natten's flex path would try to compile there
                ref = impls["ours"]().reshape(batch, N, dim)
                diffs = {n: (f().reshape(batch, N, dim) - ref).abs().max().item() for n, f in impls.items()}
                times: dict[str, list[float]] = {n: [] for n in impls}
                for r in range(rounds):
                    for n in (list(impls) if r % 2 == 0 else list(reversed(impls))):
                        times[n].append(_time(impls[n]))
                peaks = {n: None if n == "natten" else _peak_mb(f) for n, f in impls.items()}
            for n in impls:
                rows.append(dict(size=S, dilation=d, impl=n, tokens=N, seconds=statistics.median(times[n]),
                                 peak_mb=peaks[n], max_abs_diff=diffs[n]))
            for skipped in ("dense", "natten") if na2d is not None else ("dense",):
                if skipped not in impls:
                    rows.append(dict(size=S, dilation=d, impl=skipped, tokens=N, seconds=None, peak_mb=None,
                                     max_abs_diff=None, note=f"N² = {N * N / 1e9:.1f}e9 scores > --dense-limit"))
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table with ours' speed-up over each other implementation."""
    ours = {(r["size"], r["dilation"]): r for r in rows if r["impl"] == "ours"}
    out = ["| map | dilation | impl | ms | peak MB | ours faster by | max abs diff |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        o = ours[(r["size"], r["dilation"])]
        if r["seconds"] is None:
            out.append(f"| {r['size']}² | {r['dilation']} | {r['impl']} | – | – | – | {r.get('note', '')} |")
            continue
        ratio = "" if r["impl"] == "ours" else f"{r['seconds'] / o['seconds']:.1f}x"
        peak = "n/a" if r["peak_mb"] is None else f"{r['peak_mb']:.1f}"
        out.append(f"| {r['size']}² | {r['dilation']} | {r['impl']} | {r['seconds'] * 1e3:.1f} | {peak} | "
                   f"{ratio} | {r['max_abs_diff']:.1e} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[56, 112, 224], help="map sides S (S x S tokens)")
    ap.add_argument("--dim", type=int, default=64, help="channels C")
    ap.add_argument("--heads", type=int, default=2, help="heads nh")
    ap.add_argument("--kernel", type=int, default=7, help="kernel size K (odd)")
    ap.add_argument("--dilations", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dense-limit", type=float, default=0.2,
                    help="skip the dense oracle and natten above this many N² scores (billions)")
    ap.add_argument("--json", default=None, help="write the rows as JSON to this path")
    args = ap.parse_args(argv)
    if args.dim % args.heads:
        ap.error(f"--dim {args.dim} must be divisible by --heads {args.heads}")
    if args.kernel % 2 == 0:
        ap.error(f"--kernel must be odd, got {args.kernel}")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args.sizes, dim=args.dim, heads=args.heads, kernel=args.kernel, dilations=args.dilations,
               batch=args.batch, rounds=args.rounds, dense_limit_gb=args.dense_limit)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, C={args.dim}, nh={args.heads}, "
          f"K={args.kernel}, batch {args.batch}, median of {args.rounds} rounds (ABBA)")
    print(format_rows(rows))
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
