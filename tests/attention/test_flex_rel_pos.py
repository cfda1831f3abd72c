"""``rel_pos`` (ViTDet) on the flex backend.

Global blocks run one call with the decomposed-position pattern (score_mod reading ``q·R_h [B, nh, N, H]``
and ``q·R_w [B, nh, N, W]``, no ``N x N`` bias): flex == explicit forward and backward (q, k, v and both
tables) with and without the positions, both ``rel_pos_impl`` values, non-square maps, tables resized to
another grid. Window blocks go through window_attention (its own flex path) and stay equal too, alone
and inside a reduced ViTDet with windowed and global blocks.
"""

from __future__ import annotations

import pytest
import torch
from flex_utils import assert_compiled_flex_matches_explicit, assert_flex_matches_explicit, recorded_patterns

from vit_attention import create_attention
from vit_attention.functional import flex
from vit_attention.functional.rel_pos import decomposed_rel_pos_bias, decomposed_rel_pos_pattern

pytestmark = pytest.mark.compile


def _module(**kwargs: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_attention("rel_pos", 16, 2, rel_pos_zero_init=False, **kwargs).eval()


def _x(H: int, W: int) -> torch.Tensor:
    return torch.randn(2, H, W, 16, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("impl", ["bias", "augment"])
@pytest.mark.parametrize(("H", "W", "grid"), [(5, 7, (5, 7)), (6, 4, (6, 4)), (5, 7, (3, 4)), (4, 4, (6, 6))])
def test_global_flex_equals_explicit(H: int, W: int, grid: tuple[int, int], impl: str) -> None:
    m = _module(window_size=0, input_size=grid, rel_pos_impl=impl)
    x = _x(H, W)
    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [x])
    assert len(seen) == 1, "one attention call over the map"
    p = seen[0]
    assert (p.num_queries, p.num_keys, p.cache_key) == (H * W, H * W, ("rel_pos", H, W))
    assert p.score_mod is not None and p.mask_mod is None


def test_global_without_rel_pos() -> None:
    m = _module(window_size=0, input_size=(3, 5), use_rel_pos=False)
    x = _x(3, 5)
    with recorded_patterns() as seen:
        assert_flex_matches_explicit(m, lambda: [x])
    assert [(p.num_queries, p.score_mod, p.mask_mod) for p in seen] == [(15, None, None)]


@pytest.mark.parametrize("use_rel_pos", [True, False])
@pytest.mark.parametrize(("H", "W", "ws"), [(7, 5, 3), (6, 6, 3), (4, 9, (2, 4))])
def test_windowed_flex_equals_explicit(H: int, W: int, ws: int | tuple[int, int], use_rel_pos: bool) -> None:
    m = _module(window_size=ws, use_rel_pos=use_rel_pos)
    x = _x(H, W)
    assert_flex_matches_explicit(m, lambda: [x])


@pytest.mark.parametrize(("q_size", "k_size"), [((4, 6), None), ((4, 6), (8, 3)), ((3, 3), (2, 5))])
def test_pattern_bias_is_the_decomposed_bias(q_size: tuple[int, int], k_size: tuple[int, int] | None) -> None:
    """The pattern's score_mod, evaluated densely, is decomposed_rel_pos_bias (also for q / k grids that differ)."""
    g = torch.Generator().manual_seed(0)
    kh, kw = k_size or q_size
    q = torch.randn(2, 3, q_size[0] * q_size[1], 8, generator=g)
    rh, rw = torch.randn(2 * max(q_size[0], kh) - 1, 8, generator=g), torch.randn(9, 8, generator=g)
    pattern = decomposed_rel_pos_pattern(q, rh, rw, q_size, k_size)
    assert (pattern.num_queries, pattern.num_keys) == (q.shape[2], kh * kw)
    want = decomposed_rel_pos_bias(q, rh, rw, q_size, k_size)  # [2, 3, N, M]
    torch.testing.assert_close(pattern.dense_bias(2, 3), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"needs q \[B, nh, N, hd\]"):
        decomposed_rel_pos_pattern(q[0], rh, rw, q_size, k_size)


def test_no_block_mask_and_no_dense_bias_at_1024px() -> None:
    """ViTDet-B's global block at 1024 px (64 x 64 = 4096 tokens): the pattern holds only the per-query terms
    [B, nh, 4096, 64] (no [4096, 4096] tensor) and no mask, so no block mask is built (a dense pattern:
    0 % of the blocks skipped, nothing cached)."""
    q = torch.randn(1, 12, 64 * 64, 64)
    rh, rw = torch.randn(127, 64), torch.randn(127, 64)
    pattern = decomposed_rel_pos_pattern(q, rh, rw, (64, 64))
    captured = [c.cell_contents for c in pattern.score_mod.__closure__ if isinstance(c.cell_contents, torch.Tensor)]
    assert sorted(tuple(t.shape) for t in captured) == [(1, 12, 4096, 64)] * 2
    size = len(flex._BLOCK_MASKS)
    assert flex.block_mask_for(pattern, q.device) is None and len(flex._BLOCK_MASKS) == size


@pytest.mark.parametrize("impl", ["bias", "augment"])
def test_reduced_vitdet_windowed_and_global_blocks(impl: str) -> None:
    """A reduced ViTDet (window blocks of 3 on a 4 x 4 map padded to 6 x 6, one global block with tables
    resized from a 3 x 3 grid) on flex == explicit, forward and backward."""
    from model_outputs import build, small_overrides

    over = {**small_overrides("vitdet_base_patch16_1024"), "rel_pos_impl": impl}
    model, x = build("vitdet_base_patch16_1024", over)
    modes = {m.is_windowed for m in model.modules() if type(m).__name__ == "RelPosAttention"}
    assert modes == {True, False}
    with recorded_patterns() as seen:
        assert_flex_matches_explicit(model, lambda: [x[:1]])
    assert any(p.cache_key == ("rel_pos", 4, 4) for p in seen)


@pytest.mark.slow  # inductor codegen (about 10 s)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_flex_global_block_on_cpu() -> None:
    # ViTDet's global block (window_size=0): the decomposed terms the graph computes lower into inductor's kernel
    torch.manual_seed(0)
    module = create_attention("rel_pos", 32, 4, window_size=0, input_size=(6, 7), rel_pos_zero_init=False).eval()
    x = torch.randn((1, 6, 7, 32), generator=torch.Generator().manual_seed(4))
    assert_compiled_flex_matches_explicit(module, x)
