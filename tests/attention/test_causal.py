"""Causal self-attention (``causal``): the mask, the key/value cache, and its cost."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vit_attention.analysis.flops import _extra_mapping
from vit_attention.attention import (
    AttentionCall,
    CausalSelfAttention,
    KVCache,
    StaticKVCache,
    causal_mask,
    create_attention,
)
from vit_attention.functional import switched

TOL = dict(atol=1e-5, rtol=1e-4)


def _attn(dim: int = 32, heads: int = 4) -> CausalSelfAttention:
    torch.manual_seed(0)
    return create_attention("causal", dim, heads).eval()  # type: ignore[return-value]


def _oracle(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Dense masked attention written out: softmax(q kᵀ/√hd, -inf above the diagonal) v."""
    B, N, C = x.shape
    nh, hd = attn.num_heads, C // attn.num_heads
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).view(B, N, 3, nh, hd).permute(2, 0, 3, 1, 4)
    logits = q @ k.transpose(-2, -1) / math.sqrt(hd)
    logits = logits.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, N, C)
    return out @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize("fused", [True, False])
def test_equals_the_dense_masked_oracle(fused: bool) -> None:
    attn, x = _attn(), torch.randn(2, 13, 32)
    with switched(attn, fused_attention=fused), torch.no_grad():
        torch.testing.assert_close(attn(x), _oracle(attn, x), **TOL)


def test_a_token_depends_only_on_earlier_tokens() -> None:
    attn = _attn()
    x = torch.randn(1, 9, 32, requires_grad=True)
    out = attn(x)
    for i in range(9):
        (g,) = torch.autograd.grad(out[0, i].sum(), x, retain_graph=True)
        seen = g[0].abs().sum(-1) > 0  # [N]
        assert seen[: i + 1].all() and not seen[i + 1:].any(), i


def test_causal_mask_is_bottom_right_aligned() -> None:
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    m = causal_mask(2, 5)  # the last two of five positions
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]
    with pytest.raises(ValueError, match="num_queries"):
        causal_mask(3, 2)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("chunks", [(1,) * 10, (4, 1, 3, 2), (10,)])
def test_cached_steps_equal_the_full_forward(fused: bool, chunks: tuple[int, ...]) -> None:
    attn, x = _attn(), torch.randn(3, 10, 32)
    cache = KVCache(num_layers=1, capacity=3)  # small: the buffers grow while stepping
    outs, start = [], 0
    with switched(attn, fused_attention=fused), torch.no_grad():
        full = attn(x)
        for n in chunks:
            outs.append(attn(x[:, start:start + n], cache=cache))
            start += n
    assert len(cache) == 10
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TOL)


def test_cache_refuses_another_batch_and_context_is_refused() -> None:
    attn, cache = _attn(), KVCache(1)
    with torch.no_grad():
        attn(torch.randn(2, 3, 32), cache=cache)
        with pytest.raises(ValueError, match="KVCache"):
            attn(torch.randn(1, 1, 32), cache=cache)
    with pytest.raises(ValueError, match="context"):
        attn(torch.randn(2, 3, 32), AttentionCall(context=torch.randn(2, 3, 32)))
    with pytest.raises(ValueError, match="num_layers"):
        KVCache(0)


@pytest.mark.parametrize("cached", [0, 7])
def test_analytic_cost_equals_measured_with_and_without_a_cache(cached: int) -> None:
    attn = _attn()
    cache = KVCache(1)
    with torch.no_grad():
        if cached:
            attn(torch.randn(2, cached, 32), cache=cache)
        counter = FlopCounterMode(display=False, custom_mapping=_extra_mapping())
        with counter:
            attn(torch.randn(2, 1 if cached else 11, 32), cache=cache if cached else None)
    shape = (2, 1 if cached else 11, 32)
    assert counter.get_total_flops() // 2 == attn.flops(shape, num_cached=cached)
    if cached:  # one new token: linear in the cached length, not quadratic
        assert attn.flops(shape, num_cached=cached) == 2 * (4 * 32 * 32 + 2 * (cached + 1) * 32)


def test_step_takes_past_keys_and_values_and_returns_the_new_ones() -> None:
    attn, x = _attn(), torch.randn(2, 9, 32)
    with torch.no_grad():
        full = attn(x)
        out0, past = attn.step(x[:, :4])
        assert past[0].shape == past[1].shape == (2, 4, 4, 8)
        outs = [out0]
        for i in range(4, 9):
            out, past = attn.step(x[:, i:i + 1], past)
            outs.append(out)
    assert past[0].shape == (2, 4, 9, 8)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TOL)
    with pytest.raises(ValueError, match="empty"):
        KVCache(1).get(0)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("chunks", [(1,) * 9, (4, 1, 3, 1)])
def test_static_cache_steps_equal_one_full_forward(fused: bool, chunks: tuple[int, ...]) -> None:
    # fixed shapes: every call attends over all max_len slots, the unwritten ones masked
    attn, x = _attn(), torch.randn(2, sum(chunks), 32)
    cache = StaticKVCache(1, batch_size=2, num_heads=4, max_len=12, head_dim=8)
    outs, start = [], 0
    with switched(attn, fused_attention=fused), torch.no_grad():
        full = attn(x)
        for n in chunks:
            before = cache.position().clone()
            outs.append(attn(x[:, start:start + n], cache=cache))
            assert int(cache.position()) == int(before) + n and len(cache) == start + n
            start += n
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TOL)
    k, v, visible = cache.update(0, torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8))  # shapes stay fixed
    assert k.shape == v.shape == (2, 4, 12, 8) and visible.shape == (1, 12)
    assert visible[0].tolist() == [True] * (start + 1) + [False] * (12 - start - 1)
    cache.reset()
    assert len(cache) == 0 and not cache._k[0].any()


def test_static_cache_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        StaticKVCache(1, 2, 4, 0, 8)
    with pytest.raises(ValueError, match="dtype must be a floating"):
        StaticKVCache(1, 2, 4, 8, 8, dtype=torch.long)
    cache = StaticKVCache(1, 2, 4, 8, 8)
    with pytest.raises(ValueError, match=r"holds \[B, nh"):
        cache.update(0, torch.zeros(3, 4, 1, 8), torch.zeros(3, 4, 1, 8))
    with pytest.raises(ValueError, match="dtype=torch.float64"):
        cache.update(0, torch.zeros(2, 4, 1, 8, dtype=torch.float64), torch.zeros(2, 4, 1, 8, dtype=torch.float64))
    assert len(cache) == 0  # nothing was written by the refused calls
