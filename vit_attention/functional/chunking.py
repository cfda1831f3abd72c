"""Inference in batch chunks: a stack of per-image modules run on cache-sized pieces of the batch.

At inference on CPU, a Swin stage-1 block at batch 8 makes temporaries of 30-50 MB (the qkv
projection ``[B·H·W, 3C]``, the MLP hidden ``[B·H·W, 4C]``). Two things make those slow:

* glibc's ``malloc`` serves every allocation above its mmap threshold (32 MB at most) with a fresh
  ``mmap``, so each such tensor is page-faulted in and zeroed by the kernel on first touch, every
  call (measured: ~10 ms for a 38 MB fc1 output on this machine, as long as the GEMM itself);
* a temporary larger than the last-level cache is written to DRAM and read back by the next op.

Every op of these blocks acts on each image alone (LayerNorm per token, attention inside a
window, linear maps per token), so running the blocks on a few images at a time gives the same
numbers with temporaries a fraction of the size. :func:`batch_chunk_size` decides how many images
per chunk; :func:`run_in_batch_chunks` does it. Chunking steps aside wherever the batch must stay
whole for someone to see it: autograd, forward hooks, attention hooks, ``torch.compile``, other
devices. ``VIT_ATTENTION_CHUNK_ELEMENTS=0`` (or :func:`set_chunk_elements`) switches it off, and so does
the fast paths' switch (:data:`.runtime.FAST_PATHS`, :mod:`.fast_paths`).
The chunk size (:data:`.runtime.CHUNK_ELEMENTS`) is process-wide, read per call: it is a property
of the machine (cache, allocator), not of a model (:mod:`.runtime`); ``CHUNK_ELEMENTS.override(n)``
changes it for this thread's calls inside a block.

Shapes: ``x [B, ...] -> fn(x) [B, ...]`` (the leading batch dimension is split, nothing else).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from .linear import hookless
from .observers import attention_observed
from .runtime import CHUNK_ELEMENTS, FAST_PATHS, capturing

__all__ = ["batch_chunk_size", "run_in_batch_chunks", "chunk_elements", "set_chunk_elements"]

def chunk_elements() -> int:
    """Elements per chunk here (0 = chunking off; :data:`.runtime.CHUNK_ELEMENTS`: this thread's open
    override, else the process default)."""
    return CHUNK_ELEMENTS.get()


set_chunk_elements = CHUNK_ELEMENTS.set  # (n) the process default, every thread; 0 switches chunking off


def batch_chunk_size(x: Tensor, modules: Iterable[nn.Module], max_elements: int | None = None) -> int:
    """Images per chunk for running per-image ``modules`` on ``x [B, ...]``; ``B`` means "do not chunk".

    Chunks only where nobody could tell: CPU, no autograd recording, no forward hooks on any of
    ``modules`` (or their children), no attention hooks, not compiling or scripting, fast paths on.
    """
    limit = CHUNK_ELEMENTS.get() if max_elements is None else max_elements
    B = x.shape[0]
    if limit <= 0 or B <= 1 or x.device.type != "cpu" or torch.is_grad_enabled() or not FAST_PATHS.get():
        return B
    per_image = x[0].numel()
    if B * per_image <= limit:
        return B
    if capturing() or attention_observed():
        return B
    if not hookless(*(m for mod in modules for m in mod.modules())):
        return B
    return max(1, limit // max(per_image, 1))


def run_in_batch_chunks(fn: Callable[[Tensor], Tensor], x: Tensor, chunk: int) -> Tensor:
    """``fn(x)`` computed ``chunk`` images at a time: ``[B, ...] -> [B, ...]`` (``fn`` keeps the shape).

    ``fn`` must act on each image independently and return a tensor of ``x``'s shape and dtype.
    """
    if chunk >= x.shape[0]:
        return fn(x)
    out = torch.empty_like(x)
    for xc, oc in zip(x.split(chunk), out.split(chunk)):
        yc = fn(xc)
        if yc.shape != xc.shape:
            raise ValueError(f"run_in_batch_chunks: fn changed the chunk's shape {tuple(xc.shape)} -> "
                             f"{tuple(yc.shape)}; only shape-preserving per-image functions can be chunked")
        oc.copy_(yc)
    return out
