"""``attention_bias`` (LeViT) on the flex backend: one call whose ``score_mod`` reads the table at the index computed
from the query and key positions (no ``N x M`` bias). flex == explicit forward and backward (input, projections and
the table) on non-square grids, with prefix tokens, on a grid the table is resampled to, and for the shrink
attention (queries every second point); the pattern's dense bias is the index's."""

from __future__ import annotations

import pytest
import torch
from flex_utils import assert_compiled_flex_matches_explicit, assert_flex_matches_explicit, recorded_patterns

from vit_attention import create_attention
from vit_attention.attention import AttentionCall
from vit_attention.attention.attention_bias import AttentionBiasShrink
from vit_attention.functional.attention_bias import attention_bias_index, attention_bias_pattern

pytestmark = pytest.mark.compile


def _module(resolution: tuple[int, int]) -> torch.nn.Module:
    torch.manual_seed(0)
    m = create_attention("attention_bias", 16, 2, key_dim=4, resolution=resolution).eval()
    with torch.no_grad():
        m.attention_biases.normal_()
    return m


@pytest.mark.parametrize(("grid", "table", "prefix"), [((3, 5), (3, 5), 0), ((4, 4), (4, 4), 1), ((5, 3), (4, 4), 0)])
def test_flex_equals_explicit(grid: tuple[int, int], table: tuple[int, int], prefix: int) -> None:
    m = _module(table)
    x = torch.randn(2, prefix + grid[0] * grid[1], 16, generator=torch.Generator().manual_seed(1))
    call = AttentionCall(grid, prefix)
    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [x], call=lambda t: m(t, call))
    assert {(p.num_queries, p.num_keys, p.cache_key) for p in seen} == {
        (x.shape[1], x.shape[1], ("attention_bias", *grid, 1, prefix))}
    assert all(p.score_mod is not None and p.mask_mod is None for p in seen)


@pytest.mark.parametrize(("grid", "stride", "prefix"), [((3, 4), 1, 0), ((5, 7), 2, 0), ((4, 4), 1, 2), ((7, 7), 3, 0)])
def test_pattern_bias_is_the_index_into_the_table(grid: tuple[int, int], stride: int, prefix: int) -> None:
    table = torch.randn(3, grid[0] * grid[1])
    p = attention_bias_pattern(table, grid, stride, prefix)
    want = table[:, attention_bias_index(grid, stride)]  # [nh, Nq, H·W]
    dense = p.dense_bias(1, 3)[0]  # [nh, P + Nq, P + H·W]
    torch.testing.assert_close(dense[:, prefix:, prefix:], want, rtol=0, atol=0)
    assert not dense[:, :prefix].any() and not dense[:, :, :prefix].any()


@pytest.mark.parametrize("grid", [(7, 7), (5, 8)])
def test_shrink_attention_flex_equals_explicit(grid: tuple[int, int]) -> None:
    torch.manual_seed(0)
    m = AttentionBiasShrink(16, 24, key_dim=4, num_heads=4, resolution=grid).eval()
    with torch.no_grad():
        m.attention_biases.normal_()
    x = torch.randn(2, *grid, 16, generator=torch.Generator().manual_seed(1))
    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [x])
    assert {p.cache_key for p in seen} == {("attention_bias", *grid, 2, 0)}


class _OnGrid(torch.nn.Module):
    """The mechanism called on a fixed grid (what a LeViT block does)."""

    def __init__(self, attn: torch.nn.Module, grid: tuple[int, int]) -> None:
        super().__init__()
        self.attn, self.grid = attn, grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, AttentionCall(self.grid))


@pytest.mark.slow  # inductor codegen
def test_compiled_flex_on_a_resampled_non_square_grid_equals_explicit() -> None:
    m = _OnGrid(_module((4, 4)), (3, 5))
    assert_compiled_flex_matches_explicit(m, torch.randn(1, 15, 16, generator=torch.Generator().manual_seed(2)))
