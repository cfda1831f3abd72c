"""Halo attention on the flex backend: the whole map as one AttentionPattern (queries of the query map against the
halo-padded keys; the block's window, and the image with pad_mask, as mask_mod; the relative logits read from the
per-query tables in score_mod) equals the blocked explicit path, forward and backward, for every option; the
pattern ran (one per call, full sizes, cached block mask) and its token orders skip the most blocks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from flex_utils import (
    assert_compiled_flex_matches_explicit,
    assert_flex_matches_explicit,
    flex_backward_on_cpu,
    recorded_patterns,
    rel_err,
)

from vit_attention.attention import create_attention, set_attention_backend
from vit_attention.functional import flex
from vit_attention.functional import halo as halo_fn
from vit_attention.functional.halo import ORDERS, halo_attention, halo_pattern

pytestmark = pytest.mark.compile


def _module(seed: int = 0, **kwargs: Any) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_attention("halo", 16, 2, **kwargs)


def _map(H: int, W: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, H, W, 16, generator=torch.Generator().manual_seed(seed))


CASES = {  # name: (module kwargs, H, W)
    "b4h1": (dict(block_size=4, halo_size=1), 8, 8),
    "b4h2_odd_map": (dict(block_size=4, halo_size=2), 7, 10),  # padded to block multiples (zeros, attended)
    "b3h1_odd_block": (dict(block_size=3, halo_size=1), 9, 6),
    "b5h2_pad_mask": (dict(block_size=5, halo_size=2, pad_mask=True), 9, 11),
    "b2h0_no_halo": (dict(block_size=2, halo_size=0), 6, 5),
    "b4h3_halo_past_the_map": (dict(block_size=4, halo_size=3, pad_mask=True), 4, 8),
    "scale_pos_embed": (dict(block_size=4, halo_size=1, scale_pos_embed=True), 8, 12),
    "scale_pos_embed_pad_mask": (dict(block_size=3, halo_size=2, scale_pos_embed=True, pad_mask=True), 7, 8),
    "stride2": (dict(block_size=4, halo_size=2, stride=2), 9, 8),  # strided q: 2 x 2 query blocks
    "stride2_odd_block_pool": (dict(block_size=3, halo_size=1, stride=2), 7, 7),  # pooled after
    "qk_ratio": (dict(block_size=4, halo_size=1, qk_ratio=0.5, dim_out=32), 8, 9),  # hd_qk != hd_v
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flex_equals_explicit_forward_and_backward(case: str) -> None:
    kwargs, H, W = CASES[case]
    m = _module(**kwargs)
    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [_map(H, W)])
    Hp, Wp = m.padded_size(H, W)
    s, h = m.block_stride, m.halo_size
    assert len(seen) == 1  # one pattern for the one flex call (explicit ran its blocks)
    (pattern,) = seen
    assert (pattern.num_queries, pattern.num_keys) == ((Hp // s) * (Wp // s), (Hp + 2 * h) * (Wp + 2 * h))
    assert pattern.cache_key is not None and pattern.score_mod is not None


@pytest.mark.parametrize("orders", ORDERS)
def test_every_token_order_gives_the_same_attention(orders: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(halo_fn, "FLEX_ORDER", orders)
    m = _module(block_size=3, halo_size=1, pad_mask=True)
    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [_map(8, 7)])
    assert seen[0].cache_key[-1] == orders


@pytest.mark.parametrize("pad_mask", [False, True])
@pytest.mark.parametrize("stride", [1, 2])
def test_functional_without_relative_tables(pad_mask: bool, stride: int) -> None:
    """No tables: the pattern has no score_mod; flex == explicit forward and backward (q and kv)."""
    g = torch.Generator().manual_seed(4)
    b, h, Hp, Wp = 4, 2, 8, 12
    q0 = torch.randn(2, Hp // stride, Wp // stride, 2 * 8, generator=g, dtype=torch.float64)
    kv0 = torch.randn(2, Hp, Wp, 2 * (8 + 6), generator=g, dtype=torch.float64)
    weight = torch.randn(2, Hp // stride, Wp // stride, 12, generator=g, dtype=torch.float64)
    results = []
    for backend in ("explicit", "flex"):
        q, kv = q0.clone().requires_grad_(), kv0.clone().requires_grad_()
        with recorded_patterns() as seen, flex_backward_on_cpu():
            out = halo_attention(q, kv, 2, b, h, pad_mask=pad_mask, grid=(7, 10), backend=backend)
            results.append((out, *torch.autograd.grad((out * weight).sum(), (q, kv))))
        assert len(seen) == (backend == "flex")
        assert all(p.score_mod is None for p in seen)
    for a, e in zip(results[1], results[0]):
        assert rel_err(a, e) <= 1e-10


def test_block_mask_is_built_once_per_geometry_and_reused() -> None:
    m = _module(block_size=4, halo_size=1)
    set_attention_backend(m, "flex")
    flex.clear_block_mask_cache()
    with torch.no_grad():
        m(_map(8, 12))
        m(_map(8, 12, seed=2))
        assert len(flex._BLOCK_MASKS) == 1
        m(_map(12, 8))  # same token counts, another map: another mask
        assert len(flex._BLOCK_MASKS) == 2


def test_tables_are_read_on_each_call() -> None:
    m = _module(block_size=4, halo_size=1).eval()
    set_attention_backend(m, "flex")
    x = _map(8, 8)
    with torch.no_grad():
        before = m(x)
        m.pos_embed.height_rel.add_(torch.randn_like(m.pos_embed.height_rel))  # a constant would cancel
        after = m(x)
        set_attention_backend(m, "explicit")
        assert rel_err(after, m(x)) <= 1e-5
    assert rel_err(before, after) > 1e-3


def _visited(bm: Any) -> int:
    full = bm.full_kv_num_blocks
    return int(bm.kv_num_blocks.sum()) + (0 if full is None else int(full.sum()))


@pytest.mark.parametrize(("size", "b", "h", "s"), [(16, 8, 2, 1), (24, 3, 1, 1), (12, 4, 2, 2), (28, 7, 2, 1)])
def test_visited_block_count_is_the_block_masks(size: int, b: int, h: int, s: int) -> None:
    """The order chooser's exact count equals the block mask's visited blocks for every order."""
    for orders in ORDERS:
        pattern = halo_pattern(size, size, b, h, s, orders=orders)[0]
        block_mask = flex.block_mask_for(pattern, torch.device("cpu"))
        assert _visited(block_mask) == halo_fn._visited_blocks(size, size, b, h, s, orders)


def test_block_mask_skips_blocks_at_a_realistic_size() -> None:
    """64 x 64, b = 8, h = 3 (HaloNet-H1 stage 1 at 256 px): query blocks together and keys in 8 x 8 tiles skip
    88 % of the 128 x 128 blocks, row-major 77.5 %; the chooser takes that pair."""
    chosen = halo_fn._flex_orders(64, 64, 8, 3, 1)
    assert chosen == ("block", "tile")
    skipped = {o: flex.block_mask_for(halo_pattern(64, 64, 8, 3, orders=o)[0], torch.device("cpu")).sparsity()
               for o in (("row", "row"), chosen)}
    print(f"halo 64x64 b=8 h=3 block sparsity: row/row {skipped['row', 'row']:.1f}% "
          f"block/tile {skipped[chosen]:.1f}%")
    assert skipped[chosen] > 85 and skipped[chosen] > skipped["row", "row"] + 5
    assert halo_fn._flex_orders(16, 16, 8, 2, 1) == ("row", "row")  # a small map: row-major visits fewer


def test_auto_and_explicit_run_the_blocks_not_the_pattern() -> None:
    m = _module(block_size=4, halo_size=1)
    for backend in ("auto", "explicit", "sdpa"):
        set_attention_backend(m, backend)
        with recorded_patterns() as seen, torch.no_grad():
            m(_map(8, 8))
        assert seen == []


def test_orders_are_checked() -> None:
    with pytest.raises(ValueError, match="orders must be one of"):
        halo_pattern(8, 8, 4, 1, orders=("tile", "row"))


def test_flex_refuses_attention_dropout_by_name() -> None:
    m = create_attention("halo", 16, 2, block_size=4, halo_size=1, attn_drop=0.1, backend="flex").train()
    with pytest.raises(ValueError, match="dropout"), torch.no_grad():
        m(_map(8, 8))


@pytest.mark.parametrize("stride", [1, 2])
def test_empty_batch_on_flex(stride: int) -> None:
    m = _module(block_size=4, halo_size=1, stride=stride)
    set_attention_backend(m, "flex")
    with torch.no_grad():  # CPU flex: inference only outside the tests' backward helper
        assert m(torch.randn(0, 8, 8, 16)).shape == (0, 8 // stride, 8 // stride, 16)


@pytest.mark.parametrize(("kwargs", "hw"), [(dict(block_size=4, halo_size=1, pad_mask=True), (7, 12)),
                                            (dict(block_size=3, halo_size=1), (24, 24))])  # row / block-tile orders
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")  # cached index plans
def test_flex_path_traces_without_graph_breaks(kwargs: dict[str, Any], hw: tuple[int, int]) -> None:
    import torch._dynamo as dynamo

    m = _module(**kwargs).eval()
    set_attention_backend(m, "flex")
    dynamo.reset()
    with torch.no_grad():
        explained = dynamo.explain(m)(_map(*hw)[:1])
    dynamo.reset()
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_flex_inference_on_cpu() -> None:
    """torch.compile lowers the pattern (per-query relative logits in the score_mod) to FlexAttention's CPU kernel."""
    m = _module(block_size=3, halo_size=1, pad_mask=True).eval()
    x = _map(24, 23)[:1]  # block-major queries and tiled keys
    assert_compiled_flex_matches_explicit(m, x)
