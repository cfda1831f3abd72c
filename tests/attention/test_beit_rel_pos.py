"""BEiT's relative-position attention: the index with its class-token rows, the math against a direct
reference (timm 1.0.31 ``timm/models/beit.py`` ``Attention``), the table resize and the refusals."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention
from vit_attention.attention import AttentionCall
from vit_attention.attention.beit_rel_pos import (
    beit_rel_pos_pattern,
    beit_relative_position_index,
    resize_beit_bias_table,
)
from vit_attention.attention.window import resize_window_bias_table
from vit_attention.functional.tome import TokenMergeState
from vit_attention.functional.window import relative_position_index


def test_index_has_the_class_token_rows_at_the_end_of_the_table() -> None:
    """3x4 grid: 38 rows; class -> class is 37, class -> patch 35, patch -> class 36, patches at most 34 (Swin's)."""
    idx = beit_relative_position_index((3, 4))
    assert idx.shape == (13, 13)
    assert idx[0, 0] == 37 and (idx[0, 1:] == 35).all() and (idx[1:, 0] == 36).all()
    assert torch.equal(idx[1:, 1:], relative_position_index((3, 4))) and idx[1:, 1:].max() == 34
    assert torch.equal(beit_relative_position_index((3, 4), 0), relative_position_index((3, 4)))
    two = beit_relative_position_index((3, 4), 2)  # more prefix tokens share the class token's rows
    assert (two[:2, :2] == 37).all() and (two[:2, 2:] == 35).all() and (two[2:, :2] == 36).all()


def _reference(attn: torch.nn.Module, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """timm's Beit Attention written out: offsets from coordinates, the class rows by hand, an explicit softmax."""
    B, N, C = x.shape
    nh = attn.num_heads
    qkv = torch.nn.functional.linear(x, attn.qkv.weight, torch.cat([attn.q_bias, torch.zeros(C), attn.v_bias]))
    q, k, v = qkv.view(B, N, 3, nh, C // nh).permute(2, 0, 3, 1, 4)
    L = (2 * H - 1) * (2 * W - 1) + 3
    idx = torch.empty(N, N, dtype=torch.long)
    for i in range(N):
        for j in range(N):
            if i == 0 or j == 0:
                idx[i, j] = L - 1 if i == j == 0 else (L - 3 if i == 0 else L - 2)
            else:
                (yi, xi), (yj, xj) = divmod(i - 1, W), divmod(j - 1, W)
                idx[i, j] = (yi - yj + H - 1) * (2 * W - 1) + (xi - xj + W - 1)
    bias = attn.relative_position_bias_table[idx].permute(2, 0, 1)  # [nh, N, N]
    a = (q @ k.transpose(-2, -1) * (C // nh) ** -0.5 + bias).softmax(-1)
    return attn.proj((a @ v).transpose(1, 2).reshape(B, N, C))


@pytest.mark.parametrize("backend", ["explicit", "sdpa"])
def test_forward_equals_timm_attention_written_out(backend: str) -> None:
    torch.manual_seed(0)
    attn = create_attention("beit_rel_pos", 32, 4, window_size=(3, 4)).eval()
    attn.attention_backend = backend
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        out = attn(x, AttentionCall((3, 4), 1))
        torch.testing.assert_close(out, _reference(attn, x, 3, 4), atol=1e-5, rtol=1e-5)
        attn.relative_position_bias_table.zero_()
        assert not torch.allclose(out, attn(x, AttentionCall((3, 4), 1)), atol=1e-3)  # the table matters


def test_table_resize_keeps_the_class_rows_and_matches_set_window_size() -> None:
    torch.manual_seed(0)
    table = torch.randn(7 * 7 + 3, 2)
    resized = resize_beit_bias_table(table, (4, 4), (6, 6))
    assert resized.shape == (11 * 11 + 3, 2)
    torch.testing.assert_close(resized[-3:], table[-3:])
    torch.testing.assert_close(resized[:-3], resize_window_bias_table(table[:-3], (4, 4), (6, 6)))
    assert resize_beit_bias_table(table, (4, 4), (4, 4)) is table
    with pytest.raises(ValueError, match=r"\(2H-1\)\(2W-1\) \+ 3"):
        resize_beit_bias_table(table[:-1], (4, 4), (6, 6))
    attn = create_attention("beit_rel_pos", 16, 2, window_size=4).eval()
    with torch.no_grad():
        attn.relative_position_bias_table.copy_(table)
        x = torch.randn(1, 37, 16)
        on_the_fly = attn(x, AttentionCall((6, 6), 1))  # the table read resampled at another grid
        attn.set_window_size(6)
        assert attn.relative_position_bias_table.shape == (124, 2)
        torch.testing.assert_close(attn(x, AttentionCall((6, 6), 1)), on_the_fly)
    with pytest.raises(ValueError, match="shift_size must be 0"):
        attn.set_window_size(6, 3)


def test_q_and_v_biases_only_and_the_refusals() -> None:
    attn = create_attention("beit_rel_pos", 16, 2, window_size=2)
    assert attn.qkv.bias is None and attn.q_bias.shape == attn.v_bias.shape == (16,)
    assert "k_bias" not in attn.state_dict()
    assert create_attention("beit_rel_pos", 16, 2, qkv_bias=False).q_bias is None
    with pytest.raises(ValueError, match="qkv_bias"):
        create_attention("beit_rel_pos", 16, 2, qkv_bias="qv")
    with pytest.raises(ValueError, match="window_size"):
        create_attention("beit_rel_pos", 16, 2, window_size=0)
    x = torch.randn(1, 5, 16)
    with pytest.raises(ValueError, match="takes no tome"):  # the table follows grid places, merged tokens have none
        attn(x, AttentionCall((2, 2), 1, tome=TokenMergeState(x, 1, [1])))


@pytest.mark.compile
def test_flex_reads_the_table_in_a_score_mod_equal_to_the_dense_bias(monkeypatch) -> None:
    """On "flex" the index is computed from the positions (no [N, N] bias): the same outputs as the explicit path,
    with the class token, a second prefix token and a grid other than the table's (FlexAttention has no backward
    on CPU; the table's gradient through it is torch's)."""
    import vit_attention.attention.beit_rel_pos as mod

    torch.manual_seed(0)
    attn = create_attention("beit_rel_pos", 32, 4, window_size=(3, 4)).eval()
    with torch.no_grad():
        attn.relative_position_bias_table.normal_(0, 0.5)
    built = []

    def spy(*args):
        built.append(args)
        return beit_rel_pos_pattern(*args)

    monkeypatch.setattr(mod, "beit_rel_pos_pattern", spy)
    for grid, P in (((3, 4), 1), ((3, 4), 2), ((4, 4), 1)):
        x = torch.randn(2, P + grid[0] * grid[1], 32)
        outs = []
        for backend in ("explicit", "flex"):
            attn.attention_backend = backend
            with torch.no_grad():
                outs.append(attn(x, AttentionCall(grid, P)))
        torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    assert len(built) == 3  # the flex calls went through the score_mod
