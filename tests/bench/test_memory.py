"""No mechanism materialises the N x M attention matrix unless the weights are asked for.

(A mechanism whose spec says the fused kernel does not apply asks for them itself: for it the
test checks the matrix is there, as its spec declares.)

Measured, not timed: the dispatch-level tracker sums the bytes of every tensor the forward creates.
Quadrupling the number of tokens multiplies a linear-memory forward's peak by about 4 and one
that builds ``[B, nh, N, N]`` by about 16; the threshold sits between.
"""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention, list_attention
from vit_attention.attention import get_attention_spec
from vit_attention.bench import TensorMemoryTracker, measure_peak_memory
from vit_attention.functional import register_attention_hook

DIM, HEADS, B = 32, 2, 1
SIDES = (16, 32)  # spatial maps; tokens use the same counts: 256 and 1024


def _peak(attn: torch.nn.Module, layout: str, side: int) -> tuple[int, int]:
    x = torch.randn(B, side, side, DIM) if layout == "spatial" else torch.randn(B, side * side, DIM)
    with torch.no_grad(), TensorMemoryTracker() as mem:
        attn(x)
    return mem.peak_bytes, mem.largest_bytes


def _growth(name: str) -> tuple[float, int]:
    spec = get_attention_spec(name)
    attn = create_attention(name, DIM, HEADS, **spec.example_kwargs).eval()
    (p1, _), (p2, largest) = (_peak(attn, spec.layout, s) for s in SIDES)
    return p2 / p1, largest


@pytest.mark.parametrize("name", list_attention())
def test_peak_memory_grows_linearly_with_tokens(name: str) -> None:
    growth, largest = _growth(name)
    n = SIDES[1] ** 2
    attn_matrix = B * HEADS * n * n * 4  # bytes of one fp32 [B, nh, N, N]
    spec = get_attention_spec(name)
    if not spec.fused and not spec.weights_note:  # the mechanism itself needs the weights (talking heads)
        assert largest >= attn_matrix and growth > 10, f"{name}: declared unfused, yet no N x N matrix was seen"
        return
    if get_attention_spec(name).dense_bias:  # its own dense [*, nh, N, M] bias (BEiT: M = N; MViTv2's pooled keys:
        # M = N / 4 at stride 2), one per call; growth varies with caches
        assert attn_matrix / 4 <= largest <= 2 * attn_matrix, f"{name}: no single dense bias seen"
        return
    assert largest < attn_matrix / 4, f"{name}: a tensor of {largest} bytes ~ the N x N attention matrix"
    assert growth < 8, f"{name}: peak memory grew {growth:.1f}x for 4x tokens (quadratic would be ~16x)"


def test_requested_weights_do_materialise_and_are_detected() -> None:
    handle = register_attention_hook(lambda w, info: None)  # forces the explicit path
    try:
        growth, largest = _growth("mhsa")
    finally:
        handle.remove()
    n = SIDES[1] ** 2
    assert largest >= B * HEADS * n * n * 4 and growth > 10


def test_tracker_counts_new_tensors_not_views_and_frees_dead_ones() -> None:
    x = torch.randn(1000)  # 4000 bytes, created before tracking: not counted
    with TensorMemoryTracker() as mem:
        v = x.view(10, 100)  # a view: no new memory
        y = x * 2  # 4000 new bytes
        del y
        z = x + 1  # reuses the budget freed by y
    assert v.shape == (10, 100) and z.shape == (1000,)
    assert mem.peak_bytes == 4000 and mem.largest_bytes == 4000
    assert measure_peak_memory(lambda: torch.ones(250), "cpu")["peak_bytes"] == 1000
