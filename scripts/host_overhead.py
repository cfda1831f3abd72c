"""Host (Python + dispatch) time per forward, ours vs timm, on a model shrunk to a tiny width.

A launch-bound GPU run (DeiT-Ti at batch 64 on an H100: about 2 ms of GPU work per forward) is paced by
the host: the Python of every module call and the dispatch of every op. Shrinking the width to 12
channels (3 heads) and the input to 32 px keeps every block, module and op of the model but makes the
arithmetic negligible, so the CPU time per forward is that host time. Rounds alternate ours and timm
(ABBA); the ratio is timm's time over ours (> 1: ours is faster).

    /tmp/ref/bin/python scripts/host_overhead.py deit_tiny_patch16_224 [--rounds 15]

Needs timm (a side environment with a CUDA build of torch: docs/benchmarks.md). With
``VIT_ATTENTION_FAST_PATHS=0`` our model takes the public ops a GPU takes (``F.linear`` for the projections,
no batch chunking, no parameter caches: the CPU fast paths cost more per call at this tiny width than at
real ones).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _per_forward_us(model: torch.nn.Module, x: torch.Tensor, n: int = 100) -> float:
    """Mean microseconds of one ``model(x)`` over ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        model(x)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    """Print ours / timm host time per forward and the median ratio over ABBA rounds."""
    import timm

    import vit_attention as va

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default="deit_tiny_patch16_224", help="a name both libraries register")
    p.add_argument("--rounds", type=int, default=15, help="ABBA rounds")
    args = p.parse_args()
    torch.set_num_threads(1)
    kw = dict(img_size=32, embed_dim=12, num_heads=3)
    ours = va.create_model(args.model, **kw).eval()
    theirs = timm.create_model(args.model, **kw).eval()
    x = torch.randn(1, 3, 32, 32)
    a_times, b_times, ratios = [], [], []
    with torch.inference_mode():
        for _ in range(30):
            ours(x)
            theirs(x)
        for _ in range(args.rounds):
            a, b = _per_forward_us(ours, x), _per_forward_us(theirs, x)
            b2, a2 = _per_forward_us(theirs, x), _per_forward_us(ours, x)
            a_times.append(min(a, a2))
            b_times.append(min(b, b2))
            ratios.append((b + b2) / (a + a2))
    print(f"{args.model}, width 12, 32 px, batch 1, 1 thread: ours {statistics.median(a_times):.0f} us, "
          f"timm {statistics.median(b_times):.0f} us per forward; timm/ours {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {args.rounds} ABBA rounds)")


if __name__ == "__main__":
    main()
