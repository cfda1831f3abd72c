"""MaxViT's ``block`` and ``grid`` attention (Tu et al. 2022) against a dense row-major formulation of the paper's
definitions, and their sizes, padding, table resizing and FlexAttention path.

The reference below attends over the whole row-major map with a boolean mask (same block:
``(r // P, c // P)`` equal; same grid group: ``(r % (H/G), c % (W/G))`` equal) and reads the TF table at the
in-partition offsets, key minus query (google-research/maxvit ``attention_utils.py``; timm 1.0.31
``RelPosBiasTf``). The library partitions instead; both must agree. Parity with timm's layers as a whole runs in
``tests/models/test_maxvit.py`` (fixtures of the family).
"""

from __future__ import annotations

import pytest
import torch

from vit_attention.attention import create_attention
from vit_attention.attention.multi_axis import resize_tf_bias_table
from vit_attention.attention.window import resize_window_bias_table
from vit_attention.functional.multi_axis import (
    multi_axis_partition,
    multi_axis_reverse,
    partition_geometry,
    partition_positions,
)
from vit_attention.functional.runtime import switched


def dense_reference(attn, x: torch.Tensor, kind: str) -> torch.Tensor:
    """Row-major global attention with the partition as a mask and the TF table read by offset; padded maps:
    zero-padded to the partition multiple, padded keys masked, cropped."""
    B, H, W, C = x.shape
    (ph, pw), (Hp, Wp) = partition_geometry(H, W, attn.window_size)
    xp = torch.nn.functional.pad(x, (0, 0, 0, Wp - W, 0, Hp - H))
    r = torch.arange(Hp).repeat_interleave(Wp)
    c = torch.arange(Wp).repeat(Hp)
    gh, gw = Hp // ph, Wp // pw
    if kind == "block":
        group = (r // ph) * gw + c // pw
        pr, pc = r % ph, c % pw
    else:
        group = (r % gh) * gw + c % gw
        pr, pc = r // gh, c // gw
    same = group[:, None] == group[None, :]
    real = ((r < H) & (c < W))[None, :]
    P, Q = attn.window_size
    table = attn.bias_table()[:, P - ph:P + ph - 1, Q - pw:Q + pw - 1]
    dr = pr[None, :] - pr[:, None] + ph - 1
    dc = pc[None, :] - pc[:, None] + pw - 1
    bias = table[:, dr, dc]  # [nh, L, L]
    nh = attn.num_heads
    qkv = attn.qkv(xp.reshape(B, Hp * Wp, C)).reshape(B, Hp * Wp, 3, nh, C // nh).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    logits = q @ k.transpose(-1, -2) * attn.scale + bias
    logits = logits.masked_fill(~(same & real), float("-inf"))
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, Hp, Wp, C)[:, :H, :W]
    return attn.proj(out)


CASES = [((8, 12), 4), ((8, 12), (2, 3)), ((12, 12), 3), ((7, 9), 4), ((5, 11), (2, 4)), ((3, 5), 7)]


@pytest.mark.parametrize("kind", ["block", "grid"])
@pytest.mark.parametrize("size,window", CASES)
def test_attention_equals_the_masked_row_major_definition(kind: str, size: tuple[int, int], window) -> None:
    torch.manual_seed(0)
    attn = create_attention(kind, 32, 4, window_size=window).eval()
    x = torch.randn(2, *size, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), dense_reference(attn, x, kind), rtol=1e-5, atol=1e-5)


def test_grid_is_block_attention_on_the_regrouped_map() -> None:
    """Rows ``r -> (r % gh)·G + r // gh`` (and columns) regrouped, grid attention is block attention."""
    torch.manual_seed(1)
    H, W, G = 12, 8, 4
    grid = create_attention("grid", 32, 2, window_size=G).eval()
    block = create_attention("block", 32, 2, window_size=G).eval()
    block.load_state_dict(grid.state_dict())
    x = torch.randn(2, H, W, 32)
    gh, gw = H // G, W // G
    rows = torch.tensor([(r % gh) * G + r // gh for r in range(H)])
    cols = torch.tensor([(c % gw) * G + c // gw for c in range(W)])
    regrouped = torch.empty_like(x)
    regrouped[:, rows[:, None], cols[None, :]] = x
    with torch.no_grad():
        out = block(regrouped)[:, rows[:, None], cols[None, :]]
        torch.testing.assert_close(grid(x), out, rtol=1e-5, atol=1e-6)
    assert not torch.equal(rows, torch.arange(H))  # the regrouping is not the identity here


def test_partition_order_follows_timm() -> None:
    """timm 1.0.31 ``grid_partition``: ``view(B, G, H/G, G, W/G, C).permute(0, 2, 4, 1, 3, 5)``; token (7, 11) of a
    12x18 map with G = 3 lands in group 23 at position 4 (the catalogue's worked example)."""
    H, W, G = 12, 18, 3
    pos = partition_positions(H, W, (G, G), "grid")
    group, slot = (pos == 7 * W + 11).nonzero()[0].tolist()
    assert (group, slot) == (23, 4)
    x = torch.arange(H * W, dtype=torch.float32).view(1, H, W, 1)
    for kind in ("block", "grid"):
        parts = multi_axis_partition(x, (G, G), kind)
        assert torch.equal(parts.view(-1).long(), partition_positions(H, W, (G, G), kind).view(-1))
        assert torch.equal(multi_axis_reverse(parts, (G, G), (H, W), kind), x)


def test_padding_masks_the_padded_keys_and_can_be_refused() -> None:
    torch.manual_seed(2)
    for kind in ("block", "grid"):
        attn = create_attention(kind, 32, 4, window_size=4, allow_padding=False).eval()
        with pytest.raises(ValueError, match="window_size=.*does not tile the 7x9 map.*allow_padding=False"):
            attn(torch.randn(1, 7, 9, 32))
        assert attn(torch.randn(1, 8, 12, 32)).shape == (1, 8, 12, 32)
    # a padded map: no real token's output depends on what the padding holds (masked keys)
    attn = create_attention("grid", 32, 4, window_size=4).eval()
    assert (partition_positions(7, 9, (4, 4), "grid") < 0).sum() == 8 * 12 - 7 * 9
    x = torch.randn(1, 7, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), dense_reference(attn, x, "grid"), rtol=1e-5, atol=1e-5)


def test_a_partition_larger_than_the_map_is_global_attention_with_the_central_offsets() -> None:
    torch.manual_seed(3)
    for kind in ("block", "grid"):
        big = create_attention(kind, 32, 2, window_size=9).eval()
        small = create_attention(kind, 32, 2, window_size=(4, 6)).eval()
        state = big.state_dict()
        state["relative_position_bias_table"] = state["relative_position_bias_table"][:, 5:12, 3:14]
        small.load_state_dict(state)
        x = torch.randn(2, 4, 6, 32)
        with torch.no_grad():
            torch.testing.assert_close(big(x), small(x), rtol=1e-5, atol=1e-6)


def test_set_window_size_resamples_the_table_by_timms_rule_and_refuses_a_shift() -> None:
    attn = create_attention("block", 32, 2, window_size=7)
    table = attn.relative_position_bias_table.detach().clone()
    attn.set_window_size(12)
    assert attn.window_size == (12, 12) and attn.relative_position_bias_table.shape == (2, 23, 23)
    flat = resize_window_bias_table(table.reshape(2, -1).T, (7, 7), (12, 12))  # the Swin-layout rule per head
    torch.testing.assert_close(attn.relative_position_bias_table.detach(), flat.T.reshape(2, 23, 23))
    torch.testing.assert_close(resize_tf_bias_table(table, (7, 7)), table)
    with pytest.raises(ValueError, match="shift_size must be 0"):
        attn.set_window_size(12, 6)
    with pytest.raises(ValueError, match="window_size must be positive"):
        create_attention("grid", 32, 2, window_size=0)


@pytest.mark.compile
@pytest.mark.parametrize("kind", ["block", "grid"])
@pytest.mark.parametrize("size", [(8, 12), (7, 9)])
def test_flex_backend_equals_the_explicit_path(kind: str, size: tuple[int, int]) -> None:
    """One FlexAttention call over the partition-major sequence (eager on CPU) = the partitioned explicit path."""
    torch.manual_seed(4)
    attn = create_attention(kind, 32, 2, window_size=4).eval()
    x = torch.randn(2, *size, 32)
    with torch.no_grad():
        ref = attn(x)
        with switched(attn, attention_backend="flex"):
            out = attn(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_offset_bias_is_the_tf_table_for_block_only() -> None:
    block = create_attention("block", 32, 2, window_size=3)
    grid = create_attention("grid", 32, 2, window_size=3)
    torch.testing.assert_close(block.get_offset_bias(), block.relative_position_bias_table.detach())
    offsets = torch.randn(2, 3, 3)
    assert block.set_offset_bias(offsets)
    torch.testing.assert_close(block.relative_position_bias_table.detach()[:, 1:4, 1:4], offsets)
    assert block.relative_position_bias_table.detach()[:, 0].abs().sum() == 0
    assert grid.get_offset_bias() is None and not grid.set_offset_bias(offsets)  # offsets in group steps


@pytest.mark.compile
def test_mlp_bias_is_timms_log_offset_mlp_and_follows_the_partition():
    """``rel_pos="mlp"`` (timm RelPosMlp, mode cr): bias[h, q, k] = fc2(ReLU(fc1(sign(d)·ln(1 + |d|))))[h], d the
    offset query minus key; the same MLP serves any partition side (nothing to resample)."""
    torch.manual_seed(5)
    for kind in ("block", "grid"):
        attn = create_attention(kind, 32, 4, window_size=4, rel_pos="mlp", rel_pos_dim=16).eval()
        assert not hasattr(attn, "relative_position_bias_table")
        bias = attn.compute_position_bias((4, 4))  # [nh, 16, 16]
        r, c = torch.arange(16) // 4, torch.arange(16) % 4
        d = torch.stack([r[:, None] - r[None, :], c[:, None] - c[None, :]], dim=-1).float()  # query minus key
        mlp = attn.rel_pos_mlp
        want = mlp.fc2(torch.relu(mlp.fc1(torch.sign(d) * torch.log1p(d.abs())))).permute(2, 0, 1)
        torch.testing.assert_close(bias, want)
        x = torch.randn(2, 8, 12, 32)
        with torch.no_grad():
            torch.testing.assert_close(attn(x), dense_reference(attn, x, kind), rtol=1e-5, atol=1e-5)
            with switched(attn, attention_backend="flex"):
                torch.testing.assert_close(attn(x), dense_reference(attn, x, kind), rtol=1e-5, atol=1e-5)
        attn.set_window_size(6)  # the MLP is read at the new offsets
        assert attn.bias_table().shape == (4, 11, 11)
        offsets = attn.get_offset_bias()  # block: the MLP's values as an offset grid; grid: none (group steps)
        assert offsets is None if kind == "grid" else offsets.shape == (4, 11, 11)
        assert attn.set_offset_bias(torch.zeros(4, 3, 3)) is False
        assert attn.flops((1, 12, 12, 32)) == create_attention(kind, 32, 4, window_size=6).flops(
            (1, 12, 12, 32)) + 11 * 11 * (2 * 16 + 16 * 4)
        attn.transfer_init()
        assert attn.compute_position_bias((6, 6)).abs().max() == 0


def test_mlp_bias_dropout_while_training_is_not_cached():
    torch.manual_seed(6)
    attn = create_attention("block", 32, 2, window_size=3, rel_pos="mlp").train()
    with torch.no_grad():
        a, b = attn.position_bias(), attn.position_bias()
    assert not torch.equal(a, b)  # dropout 0.125 on the hidden layer, drawn anew
    attn.eval()
    with torch.no_grad():
        assert torch.equal(attn.position_bias(), attn.position_bias())
    with pytest.raises(ValueError, match="rel_pos must be 'table' or 'mlp'"):
        create_attention("grid", 32, 2, rel_pos="cpb")
