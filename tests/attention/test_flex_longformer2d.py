"""``longformer2d`` (ViL) on the flex backend: one call over the whole sequence with its AttentionPattern.

flex == explicit, forward and backward (inputs, projections and the relative-position tables), for
globals 0 / 1 / several, shared and separate global projections, the relative-position bias on and off,
odd maps with bottom / right padding and maps of whole chunks, and every token order; the pattern
equals the module's chunk plan; the block mask is reused across calls and skips blocks at ViL-S's
56x56 stage 1.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from flex_utils import assert_compiled_flex_matches_explicit, assert_flex_matches_explicit, recorded_patterns

from vit_attention import create_attention
from vit_attention.attention import AttentionCall
from vit_attention.functional import flex
from vit_attention.functional.longformer2d import (
    DEFAULT_ORDER,
    ORDERS,
    longformer2d_order,
    longformer2d_pattern,
    longformer2d_plan,
    longformer2d_sequence_index,
    longformer2d_sparsity,
)
from vit_attention.models import model_config

pytestmark = pytest.mark.compile


def _module(G: int, share: bool, rpe: bool, w: int, order: str = DEFAULT_ORDER, dim: int = 16) -> torch.nn.Module:
    torch.manual_seed(0)
    m = create_attention("longformer2d", dim, 2, window_size=w, share_weights=share, rel_pos_bias=rpe,
                         num_global_tokens=G).eval()
    m.flex_order = order
    return m


def _check(m: torch.nn.Module, G: int, H: int, W: int) -> list[flex.AttentionPattern]:
    x = torch.randn(2, G + H * W, m.dim, generator=torch.Generator().manual_seed(1))
    with recorded_patterns() as seen:
        grid = AttentionCall(feat_size=(H, W), num_prefix_tokens=G)
        assert_flex_matches_explicit(m, lambda: [x], lambda t: m(t, grid))
    return seen


@pytest.mark.parametrize(("G", "share", "rpe"), list(itertools.product((0, 1, 3), (True, False), (True, False))))
def test_flex_equals_explicit_globals_weights_bias(G: int, share: bool, rpe: bool) -> None:
    # 7 x 10 with w = 3: 3 x 4 chunks, padded bottom (9) and right (12), chunks beyond the 3x3 block masked
    seen = _check(_module(G, share, rpe, 3), G, 7, 10)
    split = G > 0 and not share
    assert len(seen) == 1, "one attention call over the whole sequence"
    p = seen[0]
    N = G + 70
    assert (p.num_queries, p.num_keys) == (N, 2 * N if split else N)
    assert p.cache_key == ("longformer2d", 7, 10, 3, G, split, DEFAULT_ORDER)
    assert (p.score_mod is not None) == rpe


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("H", "W", "w"), [(5, 7, 2), (6, 6, 3), (9, 4, 4), (3, 3, 7), (11, 8, 3)])
def test_flex_equals_explicit_maps_and_orders(H: int, W: int, w: int, order: str) -> None:
    seen = _check(_module(1, True, True, w, order), 1, H, W)
    assert [p.cache_key for p in seen] == [("longformer2d", H, W, w, 1, False, order)]


@pytest.mark.parametrize("order", ORDERS)
def test_pattern_is_the_chunk_plan(order: str) -> None:
    """The pattern's mask, read back in row-major order, is exactly the module's chunk plan (keys of the 3 x 3
    neighbour chunks that lie in the map, plus the globals; globals see everything)."""
    H, W, w, G = 8, 11, 3, 2
    plan = longformer2d_plan(H, W, w)
    N = G + H * W
    want = torch.zeros(N, N, dtype=torch.bool)
    want[:G], want[:, :G] = True, True
    for qi, keys in zip(plan.query_index, plan.key_index):
        rows, cols = qi[qi >= 0] + G, keys[keys >= 0] + G
        want[rows[:, None], cols[None, :]] = True
    mask = longformer2d_pattern(H, W, w, G, order=order).dense_mask()[0, 0]  # [N, N] in `order`
    gathers = longformer2d_sequence_index(H, W, w, G, order)
    if gathers is not None:
        inv = gathers[1]
        mask = mask[inv][:, inv]  # back to row-major
    assert torch.equal(mask, want)


def test_pattern_bias_is_the_modules_tables() -> None:
    """The score_mod's bias equals the module's per-chunk RPE scattered to the sequence (row-major)."""
    H, W, w, G = 5, 7, 2, 2
    m = _module(G, True, True, w)
    plan = longformer2d_plan(H, W, w)
    local = m._local_bias(G)  # [nh, w², G + 9w²]
    p = longformer2d_pattern(H, W, w, G, order="row", local_table=m.local_relative_position_bias_table,
                             g2l=m.g2l_relative_position_bias, g2g=m.g2g_relative_position_bias)
    bias = p.dense_bias(1, 2)[0].detach()  # [nh, N, N]
    mask = p.dense_mask()[0, 0]
    for qi, keys in zip(plan.query_index, plan.key_index):
        for s, q in enumerate(qi.tolist()):
            if q < 0:
                continue
            for j, k in enumerate([*range(-G, 0), *keys.tolist()]):
                if j < G or k >= 0:
                    key = j if j < G else G + k
                    assert torch.allclose(bias[:, G + q, key], local[:, s, j].detach())
                    assert mask[G + q, key]
    assert torch.allclose(bias[:, :G, :G], m.g2g_relative_position_bias.detach())
    assert torch.allclose(bias[:, :G, G:], m.g2l_relative_position_bias[0].detach()[:, :, None].expand(-1, -1, H * W))


def test_orders_are_permutations() -> None:
    for order in ORDERS:
        flat = longformer2d_order(7, 5, 3, order)
        if order == "row":
            assert flat is None
            continue
        assert sorted(flat.tolist()) == list(range(35))
        index, inverse = longformer2d_sequence_index(7, 5, 3, 2, order)
        assert index[:2].tolist() == [0, 1] and torch.equal(index[inverse], torch.arange(37))
    with pytest.raises(ValueError, match="order must be one of"):
        longformer2d_order(7, 5, 3, "zigzag")


def test_block_mask_is_reused() -> None:
    m = _module(1, True, True, 3)
    x = torch.randn(1, 1 + 49, 16)
    m.attention_backend = "flex"
    with torch.no_grad():
        first = m(x, AttentionCall(feat_size=(7, 7), num_prefix_tokens=1))
        size = len(flex._BLOCK_MASKS)
        with recorded_patterns() as seen:
            second = m(x, AttentionCall(feat_size=(7, 7), num_prefix_tokens=1))
    assert len(flex._BLOCK_MASKS) == size and len(seen) == 1
    assert torch.equal(first, second)


def test_block_mask_skips_blocks_at_vil_small_stage1() -> None:
    """ViL-S stage 1: 56 x 56 map, w = 7, one global (3137 tokens, 25 x 25 blocks of 128)."""
    cfg = model_config("vil_small")
    assert cfg.window_sizes[0] == 7 and cfg.num_global_tokens[0] == 1
    numbers = {order: longformer2d_sparsity(56, 56, 7, 1, order) for order in ORDERS}
    print("ViL-S stage 1 (56x56, w 7, G 1) block sparsity %:", {k: round(v, 1) for k, v in numbers.items()})
    assert numbers["row"] > 50 and numbers[DEFAULT_ORDER] == max(numbers.values()) > numbers["row"] + 10



@pytest.mark.slow  # inductor codegen (about 10 s)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_flex_inference_on_cpu() -> None:
    """torch.compile lowers the whole-sequence pattern (globals, snake order, local table) to FlexAttention's CPU
    kernel: the chunk order is a graph constant, q / k / v reach the kernel as 4-D buffers."""
    G, H, W = 1, 7, 10
    m = _module(G, False, True, 3)

    class Call(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.m(x, AttentionCall(feat_size=(H, W), num_prefix_tokens=G))

    assert_compiled_flex_matches_explicit(Call(), torch.randn(1, G + H * W, m.dim))
