"""``mask_unit`` (Hiera) on the flex backend: flex == explicit, forward and backward, for mask units in the
unit-major sequence, units with prefix tokens, border-cut windows of a grid without whole units and global
attention; the unit-major pattern is block-diagonal and skips blocks at Hiera's first stage."""

from __future__ import annotations

import pytest
import torch
from fixture_utils import seeded
from flex_utils import assert_flex_matches_explicit, recorded_patterns

from vit_attention import create_attention
from vit_attention.attention import AttentionCall
from vit_attention.attention.mask_unit import mask_unit_pattern, window_rows_pattern
from vit_attention.functional import flex

pytestmark = pytest.mark.compile


@pytest.mark.parametrize(("P", "mu", "grid"), [(0, True, (4, 8)), (1, True, (4, 8)), (0, False, (4, 8)),
                                               (1, True, (5, 7))])
def test_flex_equals_explicit(P: int, mu: bool, grid: tuple[int, int]) -> None:
    m = seeded(create_attention("mask_unit", 8, 2, mask_unit=2, mask_unit_attn=mu), 4)
    x = torch.randn(2, P + grid[0] * grid[1], 8)
    call = AttentionCall(feat_size=grid, num_prefix_tokens=P)
    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [x], lambda t: m(t, call))
    if mu and grid == (4, 8):
        assert seen and seen[0].mask_mod is not None
        dense = seen[0].dense_mask()[0, 0]
        assert dense.sum() == (P * (2 * (P + 32) - P) + 32 * 4 if P else 8 * 4 * 4)


def test_unit_major_pattern_is_block_diagonal_and_skips_blocks_at_hiera_stage_one() -> None:
    """56x56 tokens in 49 units of 64: the unit-major sequence puts each unit in one run, so whole 128 x 128 blocks
    away from the diagonal are skipped (at least 90 %)."""
    p = mask_unit_pattern(49, 64, 64)
    dense = p.dense_mask()[0, 0]
    assert dense.sum() == 49 * 64 * 64 and bool(dense[:64, :64].all()) and not bool(dense[:64, 64:].any())
    skipped, total = flex.skipped_blocks(p)
    assert skipped / total >= 0.9


def test_border_cut_windows_pattern_matches_the_grid_rule() -> None:
    H, W, m, P = 5, 7, 2, 1
    dense = window_rows_pattern((H, W), m, P).dense_mask()[0, 0]
    r = torch.arange(H * W)
    same = ((r[:, None] // W) // m == (r[None, :] // W) // m) & ((r[:, None] % W) // m == (r[None, :] % W) // m)
    assert bool(dense[:P].all()) and bool(dense[:, :P].all())
    assert torch.equal(dense[P:, P:], same)
