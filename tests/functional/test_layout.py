"""AttentionLayout: placing attention weights on the grid from the layout alone (synthetic layouts)."""

from __future__ import annotations

import pytest
import torch

from vit_attention.functional.attention import scaled_dot_product_attention
from vit_attention.functional.layout import AttentionLayout, spread_matrix, token_layout, window_layout
from vit_attention.functional.observers import register_attention_hook


def _softmax_weights(*shape: int) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(*shape).softmax(dim=-1)


def test_coarser_key_grid_spreads_weight_evenly_and_sums_to_one():
    """Keys on a 2x2 grid (spatial reduction of a 4x4 map): each key's weight / 4 on each cell it covers."""
    B, nh = 2, 3
    layout = AttentionLayout((4, 4), torch.arange(16), torch.arange(4), key_grid=(2, 2))
    w = _softmax_weights(B, nh, 16, 4)  # [B, nh, N, M]
    for q in range(16):
        r, c = divmod(q, 4)
        m = layout.query_map(w, (r, c))  # [B, 4, 4]
        torch.testing.assert_close(m.sum(dim=(-2, -1)), torch.ones(B))
        expect = w[:, :, q].mean(dim=1) / 4  # [B, 4]: per coarse key, mean over heads, spread over 4 cells
        for k in range(4):
            kr, kc = divmod(k, 2)
            block = m[:, 2 * kr:2 * kr + 2, 2 * kc:2 * kc + 2]  # [B, 2, 2]
            torch.testing.assert_close(block, expect[:, k, None, None].expand(B, 2, 2))
        one = layout.query_map(w, (r, c), head=1)
        torch.testing.assert_close(one[:, ::2, ::2].reshape(B, 4), w[:, 1, q] / 4)


@pytest.mark.parametrize(("key_grid", "grid"), [((2, 2), (4, 4)), ((3, 3), (7, 7)), ((2, 3), (5, 7)), ((3, 3), (3, 3))])
def test_spread_matrix_covers_every_cell_once(key_grid, grid):
    S = spread_matrix(key_grid, grid)  # [h·w, H·W]
    assert S.shape == (key_grid[0] * key_grid[1], grid[0] * grid[1])
    torch.testing.assert_close(S.sum(dim=1), torch.ones(S.shape[0]))  # weight kept
    assert torch.equal((S > 0).sum(dim=0), torch.ones(S.shape[1], dtype=torch.long))  # one coarse cell per fine cell


@pytest.mark.parametrize("pad_first", [True, False])
@pytest.mark.parametrize(("H", "W", "ws", "shift"), [(7, 9, 4, (2, 1)), (5, 5, 3, (1, 2)), (3, 10, 4, (3, 0)),
                                                   (8, 8, 8, (4, 4)), (1, 1, 2, (1, 1))])
def test_window_layout_places_every_cell_once(H, W, ws, shift, pad_first):
    layout = window_layout(H, W, ws, shift, pad_first=pad_first)
    pos = layout.query_pos  # [nW, ws²]
    assert pos.shape == (-(-H // ws) * -(-W // ws), ws * ws) and torch.equal(layout.key_pos, pos)
    assert torch.equal(pos[pos >= 0].sort().values, torch.arange(H * W))
    assert int((pos == -1).sum()) == pos.numel() - H * W


def test_channel_axis_raises_naming_the_axis():
    layout = AttentionLayout((2, 2), torch.arange(8), torch.arange(8), axis="channels")
    w = _softmax_weights(1, 2, 8, 8)
    with pytest.raises(ValueError, match="channels axis"):
        layout.query_map(w, (0, 0))
    with pytest.raises(ValueError, match="channels axis"):
        layout.received(w)


def test_windows_folded_into_heads_or_batch_place_the_same():
    lay_b = window_layout(6, 6, 3, (1, 1), fold="batch")
    lay_h = window_layout(6, 6, 3, (1, 1), fold="heads")
    B, nW, nh = 2, 4, 3
    w = _softmax_weights(B, nW, nh, 9, 9)
    for q in [(0, 0), (2, 4), (5, 5)]:
        torch.testing.assert_close(lay_b.query_map(w.reshape(B * nW, nh, 9, 9), q),
                                   lay_h.query_map(w.reshape(B, nW * nh, 9, 9), q))
    # a wrong fold puts weights of one window in another: the maps differ
    assert not torch.allclose(lay_b.query_map(w.reshape(B * nW, nh, 9, 9), (2, 4)),
                              lay_b.query_map(w.reshape(B, nW * nh, 9, 9).transpose(0, 1).reshape(B * nW, nh, 9, 9),
                                              (2, 4)))


def test_prefix_tokens_and_cls():
    layout = token_layout(18, (4, 4), 2)  # [cls, dist, 16 patches]
    assert layout.num_prefix_tokens == 2 and layout.is_global and layout.grid == (4, 4)
    w = _softmax_weights(1, 2, 18, 18)
    torch.testing.assert_close(layout.query_map(w, "cls")[0], w[0, :, 0, 2:].mean(0).view(4, 4))
    torch.testing.assert_close(layout.query_map(w, (1, 2), head=0)[0], w[0, 0, 2 + 6, 2:].view(4, 4))
    assert token_layout(18, (4, 4), 2) is layout  # cached per size
    no_cls = token_layout(16, (4, 4))
    with pytest.raises(ValueError, match="no prefix"):
        no_cls.query_map(w[:, :, 2:, 2:], "cls")
    with pytest.raises(ValueError, match="outside the 4x4 grid"):
        no_cls.query_map(w[:, :, 2:, 2:], (4, 0))


def test_cross_attention_keys_are_not_on_the_grid():
    layout = token_layout(16, (4, 4), num_context=5)
    with pytest.raises(ValueError, match="not on the image grid"):
        layout.query_map(_softmax_weights(1, 2, 16, 5), (0, 0))


def test_prefix_queries_over_a_prefix_and_grid_context_are_placed():
    """CaiT's class attention: 1 class-token query, keys = [class; 3x4 grid] context; the map is the grid part."""
    layout = token_layout(1, (3, 4), 1, num_context=13)
    assert layout.grid == (3, 4) and layout.key_pos is not None
    assert layout.query_pos.tolist() == [[-2]] and layout.key_pos.tolist() == [[-2] + list(range(12))]
    w = _softmax_weights(2, 2, 1, 13)
    torch.testing.assert_close(layout.query_map(w, "cls", 0).flatten(1), w[:, 0, 0, 1:])
    assert token_layout(1, (3, 4), 0, num_context=13).key_pos is None  # a grid query row: still a context


def test_invalid_layouts_raise():
    with pytest.raises(ValueError, match="outside the 2x2 grid"):
        AttentionLayout((2, 2), torch.arange(5))
    with pytest.raises(ValueError, match="fold"):
        AttentionLayout((2, 2), torch.arange(4), fold="windows")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="long tensor"):
        AttentionLayout((2, 2), torch.arange(4.0))
    with pytest.raises(ValueError, match="do not match"):
        token_layout(16, (4, 4)).query_map(_softmax_weights(1, 1, 15, 15), (0, 0))


def test_core_builds_a_callable_layout_only_for_observers():
    q = k = v = torch.randn(1, 2, 4, 8)
    built: list[int] = []
    layout = token_layout(4, (2, 2))

    def build() -> AttentionLayout:
        built.append(1)
        return layout

    scaled_dot_product_attention(q, k, v, layout=build)
    assert built == []
    seen = []
    handle = register_attention_hook(lambda w, info: seen.append(info["layout"]))
    try:
        scaled_dot_product_attention(q, k, v, layout=build)
    finally:
        handle.remove()
    assert built == [1] and seen == [layout]


def test_token_layout_with_a_coarser_key_grid() -> None:
    """Spatial reduction (PVT / Twins sra, CvT's strided k / v): prefix keys first, then the coarse map;
    a query's map spreads each coarse key over the 2x2 cells it covers and sums to its grid weight."""
    layout = token_layout(1 + 16, (4, 4), 1, key_grid=(2, 2))
    assert layout.key_grid == (2, 2) and layout.key_pos.tolist() == [[-2, 0, 1, 2, 3]]
    assert not layout.is_global
    w = torch.softmax(torch.randn(2, 3, 17, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
    m = layout.query_map(w, (1, 2))
    assert m.shape == (2, 4, 4)
    row = w[:, :, 1 + 1 * 4 + 2].mean(dim=1)  # [B, 5]: mean over heads
    torch.testing.assert_close(m.sum(dim=(1, 2)), row[:, 1:].sum(dim=-1))
    # the top-right coarse key (index 1) covers cells (0..1, 2..3), a quarter each
    torch.testing.assert_close(m[:, 0, 3], row[:, 2] / 4)
