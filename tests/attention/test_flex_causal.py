"""``causal`` (iGPT) on the flex backend: every call runs :func:`causal_pattern` (bottom-right aligned).

flex == explicit forward and backward without a cache, with a cache of earlier keys for one new token
(no mask) and for several (``kv <= q + M - N``); the pattern equals :func:`causal_mask`; sampling
token by token on flex equals the full-sequence forward; block masks are reused and skip the blocks
above the diagonal at iGPT's 32 x 32 = 1024 tokens.
"""

from __future__ import annotations

import pytest
import torch
from flex_utils import assert_flex_matches_explicit, recorded_patterns

from vit_attention import create_attention
from vit_attention.attention.causal import KVCache, StaticKVCache, causal_mask, causal_pattern
from vit_attention.functional import flex

pytestmark = pytest.mark.compile


def _module() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_attention("causal", 16, 2).eval()


def _rand(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("N", [1, 2, 9, 130])
def test_no_cache(N: int) -> None:
    m = _module()
    x = _rand(2, N, 16)
    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [x])
    assert len(seen) == 1
    assert (seen[0].num_queries, seen[0].num_keys, seen[0].cache_key) == (N, N, ("causal", N, N))
    assert (seen[0].mask_mod is None) == (N == 1)


@pytest.mark.parametrize(("past", "N"), [(6, 1), (6, 4), (1, 5), (3, 3), (140, 7)])
def test_with_cache(past: int, N: int) -> None:
    """``N`` new tokens after ``past`` cached ones (step: the past keys / values get gradients too)."""
    m = _module()
    x, pk, pv = _rand(2, N, 16), _rand(2, 2, past, 8, seed=2), _rand(2, 2, past, 8, seed=3)

    def call(x: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor) -> torch.Tensor:
        out, (k, v) = m.step(x, (pk, pv))
        return out + 0 * (k.sum() + v.sum())  # the returned cache is part of the graph

    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [x, pk, pv], call=call)
    M = past + N
    assert [(p.num_queries, p.num_keys, p.cache_key) for p in seen] == [(N, M, ("causal", N, M))]
    assert (seen[0].mask_mod is None) == (N == 1), "one new token with a cache needs no mask"


def test_kvcache_forward_and_empty_cache() -> None:
    """forward(cache=KVCache) on flex: the first call (empty cache) is the plain causal call, the second
    attends over cached + new keys; both equal the explicit backend (inference: the cache is written in
    place, as in sampling)."""
    m = _module()
    a, b = _rand(1, 5, 16), _rand(1, 3, 16, seed=4)

    def call(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        cache = KVCache(1)
        return torch.cat([m(a, cache=cache), m(b, cache=cache)], dim=1)

    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [a, b], call=call, backward=False)
    assert [p.cache_key for p in seen] == [("causal", 5, 5), ("causal", 3, 8)]


@pytest.mark.parametrize(("N", "M"), [(1, 1), (1, 9), (4, 4), (4, 11), (7, 8)])
def test_pattern_is_causal_mask(N: int, M: int) -> None:
    dense = causal_pattern(N, M).dense_mask()
    want = causal_mask(N, M)
    assert want.all() if dense is None else torch.equal(dense[0, 0], want)
    with pytest.raises(ValueError, match="0 < num_queries <= num_keys"):
        causal_pattern(M + 1, M)


@pytest.mark.parametrize("make_cache", [lambda: KVCache(1, capacity=4), lambda: StaticKVCache(1, 2, 2, 16, 8)],
                         ids=["growing", "static"])
def test_sampling_on_flex_equals_the_full_sequence(make_cache) -> None:
    # the static cache hands the core its visibility mask [N, max_len]: on flex, a mask_mod reading it
    m = _module()
    m.attention_backend = "flex"
    x = _rand(2, 12, 16)
    with torch.no_grad():
        full = m(x)
        cache = make_cache()
        parts = [m(x[:, :5], cache=cache)] + [m(x[:, i:i + 1], cache=cache) for i in range(5, 9)]
        parts.append(m(x[:, 9:], cache=cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-6)
    assert len(cache) == 12


def test_block_mask_is_reused_and_sparse_at_igpt_size() -> None:
    m = _module()
    m.attention_backend = "flex"
    x = _rand(1, 300, 16)
    with torch.no_grad():
        m(x)
        size = len(flex._BLOCK_MASKS)
        m(x)
    assert len(flex._BLOCK_MASKS) == size
    full = flex.block_mask_for(causal_pattern(1024, 1024), torch.device("cpu")).sparsity()
    prefill = flex.block_mask_for(causal_pattern(512, 1024), torch.device("cpu")).sparsity()
    print(f"causal block sparsity %: 1024 x 1024 {full:.1f}, 512 new of 1024 keys {prefill:.1f}")
    assert full > 40 and prefill > 15
