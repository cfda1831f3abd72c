"""Neighbourhood attention on the flex backend: the whole map as one AttentionPattern (clamped, dilated window as
mask_mod, rpb in score_mod) equals the tiled explicit path, forward and backward, for every option; the pattern
ran (one per call, full map, cached block mask), the token order is the measured-best and skips blocks."""

from __future__ import annotations

import warnings

import pytest
import torch
from flex_utils import assert_compiled_flex_matches_explicit, assert_flex_matches_explicit, recorded_patterns, rel_err

from vit_attention.attention import create_attention, set_attention_backend
from vit_attention.functional import flex
from vit_attention.functional import neighborhood as nb
from vit_attention.functional.attention import scaled_dot_product_attention as sdpa
from vit_attention.functional.neighborhood import (
    ORDER_CANDIDATES,
    TOKEN_ORDERS,
    neighborhood_attention,
    neighborhood_pattern,
    token_order,
)

pytestmark = pytest.mark.compile


def _module(K: int | tuple[int, int], d: int | tuple[int, int], rpb: bool = True, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = create_attention("neighborhood", 16, 2, kernel_size=K, dilation=d, rel_pos_bias=rpb)
    if m.rpb is not None:
        with torch.no_grad():
            m.rpb.normal_()  # a table far from zero: its gathers matter
    return m


def _map(H: int, W: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, H, W, 16, generator=torch.Generator().manual_seed(seed))


CASES = [  # K, dilation, H, W: odd and non-square maps, borders, maps smaller than K·d (padded)
    (3, 1, 7, 9), (5, 1, 9, 6), (7, 1, 11, 9),
    (3, 2, 9, 7), (5, 2, 11, 13), (7, 2, 15, 14),
    (3, 3, 10, 11), (5, 3, 16, 15),
    (3, (1, 2), 7, 8),  # per-axis dilation
    ((3, 5), 1, 7, 9), ((5, 3), (2, 1), 11, 8),  # rectangular kernels
    (3, 2, 4, 5), (5, 1, 3, 4), (3, 3, 2, 9),  # smaller than K·d: zero-padded and attended, as the original
]


@pytest.mark.parametrize("rpb", [True, False], ids=["rpb", "no_rpb"])
@pytest.mark.parametrize(("K", "d", "H", "W"), CASES)
def test_flex_equals_explicit_forward_and_backward(K: int | tuple[int, int], d: int | tuple[int, int], H: int, W: int,
                                                  rpb: bool) -> None:
    m = _module(K, d, rpb)
    x = _map(H, W)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SmallMapWarning on the padded cases
        with recorded_patterns() as seen:
            assert_flex_matches_explicit(m, lambda: [x])
    Hp, Wp = m.padded_size(H, W)
    assert len(seen) == 1  # one pattern for the one call on flex (explicit ran its tiles)
    (pattern,) = seen
    assert (pattern.num_queries, pattern.num_keys) == (Hp * Wp, Hp * Wp)
    assert pattern.cache_key is not None and (Hp, Wp) == pattern.cache_key[1:3]
    assert (pattern.score_mod is not None) == rpb


def test_block_mask_is_built_once_per_map_and_reused() -> None:
    m = _module(5, 2)
    set_attention_backend(m, "flex")
    flex.clear_block_mask_cache()
    with torch.no_grad():
        m(_map(12, 13))
        size = len(flex._BLOCK_MASKS)
        m(_map(12, 13, seed=2))
        assert len(flex._BLOCK_MASKS) == size == 1
        m(_map(13, 12))  # same token count, another map: another mask
        assert len(flex._BLOCK_MASKS) == 2


def test_rpb_is_read_on_each_call() -> None:
    """The score_mod reads the parameter: an edit shows at once (nothing cached across steps)."""
    m = _module(3, 1).eval()
    set_attention_backend(m, "flex")
    x = _map(6, 7)
    with torch.no_grad():
        before = m(x)
        m.rpb.add_(torch.randn_like(m.rpb))
        after = m(x)
        set_attention_backend(m, "explicit")
        assert rel_err(after, m(x)) <= 1e-5
    assert rel_err(before, after) > 1e-3


@pytest.mark.parametrize("order", TOKEN_ORDERS)
@pytest.mark.parametrize("d", [1, 2])
def test_every_token_order_describes_the_same_attention(order: str, d: int) -> None:
    """The pattern in any order, permuted back to row-major, is the row-major pattern (mask and bias)."""
    Hp, Wp, K = 9, 11, 3
    rpb = torch.randn(2, 2 * K - 1, 2 * K - 1)
    ref, _, _ = neighborhood_pattern(Hp, Wp, K, d, rpb=rpb, order="row")
    pat, perm, inverse = neighborhood_pattern(Hp, Wp, K, d, rpb=rpb, order=order, tile=4)
    assert (perm is None) == (order == "row")
    perm = torch.arange(Hp * Wp) if perm is None else perm
    assert torch.equal(perm.sort().values, torch.arange(Hp * Wp))
    rows, cols = perm[:, None], perm[None, :]  # sequence position i holds map token perm[i]
    mask = pat.dense_mask()
    assert torch.equal(mask, ref.dense_mask()[..., rows, cols])
    bias, bias_ref = pat.dense_bias(1, 2), ref.dense_bias(1, 2)[..., rows, cols]
    assert torch.equal(bias.masked_fill(~mask, 0), bias_ref.masked_fill(~mask, 0))
    assert int(mask.sum(-1).min()) == K * K == int(mask.sum(-1).max())


def test_token_orders() -> None:
    assert torch.equal(token_order(3, 4, "row"), torch.arange(12))
    assert token_order(4, 4, "tile", tile=2).tolist() == [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    # residue-major, row-major inside each (r mod 2, c mod 2) group
    assert token_order(4, 4, "residue", tile=0, dilation=2).tolist() == [0, 2, 8, 10, 1, 3, 9, 11, 4, 6, 12, 14,
                                                                         5, 7, 13, 15]
    with pytest.raises(ValueError, match="order must be one of"):
        token_order(4, 4, "spiral")


def _skipped(order: str | None, K: int, d: int, size: int = 56) -> float:
    pattern, _, _ = neighborhood_pattern(size, size, K, d, order=order)
    return flex.block_mask_for(pattern, torch.device("cpu")).sparsity()


def test_block_mask_skips_blocks_at_stage_one_and_the_default_order_is_the_better() -> None:
    """56 x 56, K = 7 (NAT / DiNAT stage 1): most 128 x 128 blocks are skipped; the default order skips at least
    as many as the others (row-major for d = 1: 80 %; residue-major for d = 4: 88 % against 49 % row-major)."""
    assert nb._flex_order(56, 56, (7, 7), (1, 1)) == ("row", 0)
    assert nb._flex_order(56, 56, (7, 7), (4, 4)) == ("residue", 0)
    dense_1, tiled_1 = _skipped(None, 7, 1), _skipped("tile", 7, 1)
    dense_4, row_4 = _skipped(None, 7, 4), _skipped("row", 7, 4)
    print(f"56x56 K=7 block sparsity: d=1 row {dense_1:.1f}% tile {tiled_1:.1f}%; d=4 residue {dense_4:.1f}% "
          f"row {row_4:.1f}%")
    assert dense_1 > 75 and dense_1 >= tiled_1
    assert dense_4 > 85 and dense_4 > row_4 + 20


def _visited(block_mask: object) -> int:
    full = block_mask.full_kv_num_blocks
    return int(block_mask.kv_num_blocks.sum()) + (0 if full is None else int(full.sum()))


@pytest.mark.parametrize(("H", "W", "K", "d"), [(28, 28, 7, 2), (20, 33, 5, 3), (9, 90, 5, 1), (23, 19, 3, (1, 2))])
def test_visited_block_count_is_the_block_masks(H: int, W: int, K: int, d: int | tuple[int, int]) -> None:
    """The order chooser's exact count equals the block mask's visited blocks, for every candidate order."""
    dd = (d, d) if isinstance(d, int) else d
    for order, tile in ORDER_CANDIDATES:
        pattern, _, _ = neighborhood_pattern(H, W, K, d, order=order, tile=tile)
        counted = nb._visited_blocks(H, W, (K, K), dd, order, tile)
        assert _visited(flex.block_mask_for(pattern, torch.device("cpu"))) == counted


def test_a_wide_map_takes_tiles() -> None:
    """14 x 200, K = 7: a row (200 tokens) outgrows a 128-token block; 8 x 8 tiles visit half the blocks."""
    assert nb._flex_order(14, 200, (7, 7), (1, 1)) == ("tile", 8)
    assert 2 * nb._visited_blocks(14, 200, (7, 7), (1, 1), "tile", 8) < nb._visited_blocks(
        14, 200, (7, 7), (1, 1), "row", 0) + 5


def test_auto_and_explicit_run_the_tiles_not_the_pattern() -> None:
    m = _module(3, 2)
    x = _map(8, 9)
    for backend in ("auto", "explicit", "sdpa"):
        set_attention_backend(m, backend)
        with recorded_patterns() as seen, torch.no_grad():
            m(x)
        assert seen == []


def test_functional_precomputed_bias_keeps_the_tiles_on_flex() -> None:
    """A tiles' bias handed in (a caller's cache) cannot be a full-map score_mod: the tiles run (generic flex)."""
    from vit_attention.functional.neighborhood import neighborhood_bias

    qkv = torch.randn(1, 7, 8, 48)
    rpb = torch.randn(2, 5, 5)
    bias = neighborhood_bias(rpb, 7, 8, 3, 1, 4)
    with recorded_patterns() as seen:
        out = neighborhood_attention(qkv, 2, 3, bias=bias, tile_size=4, backend="flex")
    assert all(p.cache_key is None for p in seen)
    assert rel_err(out, neighborhood_attention(qkv, 2, 3, rpb=rpb, backend="flex")) <= 1e-5


def test_flex_refuses_attention_dropout_by_name() -> None:
    m = create_attention("neighborhood", 16, 2, kernel_size=3, attn_drop=0.1, backend="flex").train()
    with pytest.raises(ValueError, match="dropout"), torch.no_grad():
        m(_map(6, 6))


@pytest.mark.parametrize("tile", [4, 3, 7])
def test_tiled_gradient_counts_each_query_once(tile: int) -> None:
    """A tile that does not divide the map repeats a query in its empty slots; only the real slot is read back,
    so the gradient equals the dense masked oracle (the pattern's mask on global attention)."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 7, 9, 48, generator=g, dtype=torch.float64, requires_grad=True)
    rpb = torch.randn(2, 5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 7, 9, 16, generator=g, dtype=torch.float64)
    out = neighborhood_attention(qkv, 2, 3, 2 if tile == 3 else 1, rpb=rpb, tile_size=tile, backend="explicit")
    grads = torch.autograd.grad((out * weight).sum(), (qkv, rpb))
    pattern, _, _ = neighborhood_pattern(7, 9, 3, 2 if tile == 3 else 1, rpb=rpb, order="row")
    q, k, v = qkv.reshape(2, 63, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
    ref = sdpa(q, k, v, pattern=pattern, backend="explicit").transpose(1, 2).reshape(2, 7, 9, 16)
    ref_grads = torch.autograd.grad((ref * weight).sum(), (qkv, rpb))
    assert rel_err(out, ref) <= 1e-10
    for a, b in zip(grads, ref_grads):
        assert rel_err(a, b) <= 1e-10


def test_pattern_equals_dense_flex_call() -> None:
    """The functional flex path on a map equals the core's flex call with the pattern's dense mask and bias."""
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(1, 9, 10, 48, generator=g)
    rpb = torch.randn(2, 5, 5, generator=g)
    out = neighborhood_attention(qkv, 2, 3, 2, rpb=rpb, backend="flex")
    pattern, _, _ = neighborhood_pattern(9, 10, 3, 2, rpb=rpb, order="row")
    q, k, v = qkv.reshape(1, 90, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
    ref = sdpa(q, k, v, bias=pattern.dense_bias(1, 2), mask=pattern.dense_mask(), backend="explicit")
    assert rel_err(out, ref.transpose(1, 2).reshape(1, 9, 10, 16)) <= 1e-5



def test_pattern_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="smaller than kernel_size"):
        neighborhood_pattern(5, 9, 3, 2)
    with pytest.raises(ValueError, match="odd and positive"):
        neighborhood_pattern(9, 9, 4)
    with pytest.raises(ValueError, match="dilation must be"):
        neighborhood_pattern(9, 9, 3, 0)
    with pytest.raises(ValueError, match="rpb must be"):
        neighborhood_pattern(9, 9, 3, rpb=torch.zeros(2, 3, 3))
    neighborhood_pattern(6, 9, 3, (2, 3))  # exactly K·d fits


@pytest.mark.parametrize("d", [1, 2])
def test_empty_batch_on_flex(d: int) -> None:
    m = create_attention("neighborhood", 16, 2, kernel_size=3, dilation=d, backend="flex")
    with torch.no_grad():  # CPU flex: inference only outside the tests' backward helper
        assert m(torch.randn(0, 6, 7, 16)).shape == (0, 6, 7, 16)


@pytest.mark.parametrize("d", [1, 2])
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")  # cached index plans
def test_flex_path_traces_without_graph_breaks(d: int) -> None:
    """torch.compile sees one graph: the pattern's index tensors are built without reading tensor values."""
    import torch._dynamo as dynamo

    m = create_attention("neighborhood", 16, 2, kernel_size=3, dilation=d, backend="flex").eval()
    dynamo.reset()
    with torch.no_grad():
        explained = dynamo.explain(m)(_map(9, 10)[:1])
    dynamo.reset()
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_flex_inference_on_cpu() -> None:
    """torch.compile lowers the pattern to FlexAttention's CPU kernel (its index tensors enter the graph as
    inputs, the only form that kernel template reads) and gives the explicit numbers."""
    m = _module(3, 2).eval()
    x = _map(9, 10)[:1]
    assert_compiled_flex_matches_explicit(m, x)


@pytest.mark.slow  # inductor codegen (about 10 s)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_flex_dilated_neighbourhood_on_cpu() -> None:
    # DiNAT's dilated neighbourhood through inductor's CPU FlexAttention kernel
    torch.manual_seed(0)
    module = create_attention("neighborhood", 32, 4, kernel_size=3, dilation=2).eval()
    x = torch.randn((1, 9, 8, 32), generator=torch.Generator().manual_seed(4))
    assert_compiled_flex_matches_explicit(module, x)
