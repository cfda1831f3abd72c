"""Hiera's mask-unit attention: live parity with Hugging Face transformers' ``HieraMaskUnitAttention`` (the
installed version, 5.24.0 when written; timm 1.0.31's ``MaskUnitAttention`` is the same code, compared through the
family fixtures), an image-space oracle written here (window attention on the rerolled map, q max-pooled 2x2 on the
map), the unroll order against its formula, prefix tokens, recorded maps placed on the image, FLOPs and
refusals (flex: test_flex_mask_unit.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixture_utils import seeded

from vit_attention import create_attention
from vit_attention.analysis import record_attention
from vit_attention.analysis.flops import measure_flops
from vit_attention.attention import AttentionCall
from vit_attention.attention.mask_unit import MaskUnitPoolAttention
from vit_attention.functional.mask_unit import reroll, unroll, unrolled_positions


def _hf_attention(dim: int, dim_out: int, heads: int, q_stride: int, window: int, mu: bool) -> torch.nn.Module:
    from transformers.models.hiera.modeling_hiera import HieraMaskUnitAttention
    return HieraMaskUnitAttention(dim, dim_out, heads, query_stride=q_stride, window_size=window,
                                  use_mask_unit_attn=mu).eval()


@pytest.mark.parity
@pytest.mark.parametrize(("mu", "q_stride"), [(True, 1), (True, 4), (False, 1), (False, 4)])
def test_equals_hugging_face_hiera_mask_unit_attention(mu: bool, q_stride: int) -> None:
    """Hiera's four cases: mask-unit or global, with or without q pooling (then the width doubles)."""
    dim, dim_out, heads, unit = 16, 32 if q_stride > 1 else 16, 2, 2  # unit side after pooling
    if q_stride > 1:
        ours = seeded(MaskUnitPoolAttention(dim, dim_out, heads, q_stride=4, mask_unit=unit, mask_unit_attn=mu), 0)
    else:
        ours = seeded(create_attention("mask_unit", dim, heads, mask_unit=unit, mask_unit_attn=mu), 0)
    ref = _hf_attention(dim, dim_out, heads, q_stride, unit * unit, mu)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 8 * 12, dim)  # an 8 x 12 grid: 2 unroll steps before pooling, 1 after
    with torch.no_grad():
        out = ours(x, AttentionCall(feat_size=(8, 12)))
        expected = ref(x)[0]
    assert out.shape == (3, 8 * 12 // q_stride, dim_out)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_unroll_order_is_the_documented_formula_and_reroll_inverts_it() -> None:
    H, W, k = 16, 24, 3
    pos = unrolled_positions((H, W), k)  # grid index of each unrolled position
    nmu = (H >> k) * (W >> k)
    for n in (0, 5, 77, 200, H * W - 1):
        y, x = divmod(int(pos[n]), W)
        a = [((y >> j) & 1) * 2 + ((x >> j) & 1) for j in range(k)]
        expected = ((a[0] * 4 + a[1]) * 4 + a[2]) * nmu + (y >> k) * (W >> k) + (x >> k)
        assert expected == n
    m = torch.randn(2, H, W, 5)
    u = unroll(m, k)
    torch.testing.assert_close(reroll(u, (H, W), k), m, atol=0, rtol=0)
    # the 2x2 max-pool of the map is the max over the four quarters of the unrolled sequence (one step fewer)
    pooled = u.view(2, 4, -1, 5).amax(1)
    ref = F.max_pool2d(m.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)
    torch.testing.assert_close(reroll(pooled, (H // 2, W // 2), k - 1), ref, atol=0, rtol=0)


def _window_oracle(m: torch.nn.Module, x_map: torch.Tensor, unit: int, pool: bool) -> torch.Tensor:
    """Image-space oracle: window attention without bias on ``unit x unit`` windows of the key map (the last ones cut
    by the border), per head, queries max-pooled 2x2 on the map when ``pool`` (their window is then ``unit/2``);
    -> the output map."""
    B, H, W, C = x_map.shape
    Co, nh = m.dim_out, m.num_heads
    hd = Co // nh
    qkv = x_map @ m.qkv.weight.T + m.qkv.bias  # [B, H, W, 3C']
    q, k, v = qkv[..., :Co], qkv[..., Co:2 * Co], qkv[..., 2 * Co:]
    if pool:
        q = F.max_pool2d(q.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)
    qu = unit // 2 if pool else unit
    out = torch.zeros(B, q.shape[1], q.shape[2], Co)
    for wy in range(-(-H // unit)):  # windows from the top left; the last ones cut by the border
        for wx in range(-(-W // unit)):
            qs = q[:, wy * qu:(wy + 1) * qu, wx * qu:(wx + 1) * qu]
            hq, wq = qs.shape[1], qs.shape[2]
            ks = k[:, wy * unit:(wy + 1) * unit, wx * unit:(wx + 1) * unit].reshape(B, -1, nh, hd)
            vs = v[:, wy * unit:(wy + 1) * unit, wx * unit:(wx + 1) * unit].reshape(B, -1, nh, hd)
            a = torch.einsum("bqhd,bkhd->bhqk", qs.reshape(B, -1, nh, hd), ks) * hd ** -0.5
            o = torch.einsum("bhqk,bkhd->bqhd", a.softmax(-1), vs).reshape(B, hq, wq, Co)
            out[:, wy * qu:(wy + 1) * qu, wx * qu:(wx + 1) * qu] = o
    return out @ m.proj.weight.T + m.proj.bias


@pytest.mark.parametrize("pool", [False, True])
def test_mask_units_are_windows_of_the_map(pool: bool) -> None:
    """Unrolled with k steps, units of side 2^k are Swin-style windows of the map; pooling max-pools q on it."""
    H, W, k, C = 8, 16, 2, 12
    if pool:
        m = seeded(MaskUnitPoolAttention(C, 24, 3, q_stride=4, mask_unit=2), 1)
    else:
        m = seeded(create_attention("mask_unit", C, 3, mask_unit=4), 1)
    x_map = torch.randn(2, H, W, C)
    with torch.no_grad():
        out = m(unroll(x_map, k), AttentionCall(feat_size=(H, W)))
        out_map = reroll(out, (H // 2, W // 2) if pool else (H, W), k - 1 if pool else k)
        torch.testing.assert_close(out_map, _window_oracle(m, x_map, 4, pool), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("grid", [(7, 10), (2, 24)])
def test_a_grid_without_whole_units_takes_row_major_tokens_and_border_cut_windows(grid) -> None:
    """A generic use on a map Hiera would refuse (7x10; 2x24 holds 3 units' worth of tokens but no 4x4 window): the
    tokens are row-major and the units the map's 4x4 windows from the top left, cut by the border."""
    m = seeded(create_attention("mask_unit", 12, 3, mask_unit=4), 5)
    x_map = torch.randn(2, *grid, 12)
    with torch.no_grad():
        out = m(x_map.reshape(2, -1, 12), AttentionCall(feat_size=grid)).reshape(2, *grid, 12)
        torch.testing.assert_close(out, _window_oracle(m, x_map, 4, False), atol=1e-5, rtol=1e-5)


def test_prefix_tokens_attend_to_all_and_are_seen_by_all() -> None:
    m = seeded(create_attention("mask_unit", 8, 2, mask_unit=2), 2)
    P, H, W = 2, 4, 6
    x = torch.randn(2, P + H * W, 8)
    nmu = H * W // 4
    idx = torch.arange(P + H * W)
    allowed = (idx[:, None] < P) | (idx[None, :] < P) | ((idx[:, None] - P) % nmu == (idx[None, :] - P) % nmu)
    qkv = x @ m.qkv.weight.T + m.qkv.bias
    q, k, v = (t.view(2, -1, 2, 4).transpose(1, 2) for t in qkv.split(8, -1))
    a = (q @ k.transpose(-1, -2) * 0.5).masked_fill(~allowed, float("-inf")).softmax(-1)
    ref = (a @ v).transpose(1, 2).reshape(2, -1, 8) @ m.proj.weight.T + m.proj.bias
    with torch.no_grad():
        out = m(x, AttentionCall(feat_size=(H, W), num_prefix_tokens=P))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_recorded_maps_sit_inside_each_query_window_on_the_image() -> None:
    m = seeded(create_attention("mask_unit", 8, 2, mask_unit=4), 3)
    H, W = 8, 12
    with record_attention(m) as rec, torch.no_grad():
        m(unroll(torch.randn(1, H, W, 8), 2), AttentionCall(feat_size=(H, W)))
    (r,) = rec.records
    for y, x in [(0, 0), (5, 9), (7, 11)]:
        qmap = r.query_map((y, x))[0]  # [H, W] of the one image (mean over heads)
        inside = torch.zeros(H, W, dtype=torch.bool)
        inside[y // 4 * 4:(y // 4 + 1) * 4, x // 4 * 4:(x // 4 + 1) * 4] = True
        assert qmap[~inside].abs().max() == 0
        torch.testing.assert_close(qmap[inside].sum(), torch.tensor(1.0))


def test_flops_equal_the_measured_count() -> None:
    cases = [(create_attention("mask_unit", 16, 2, mask_unit=2), (2, 64, 16), (8, 8)),
             (create_attention("mask_unit", 16, 2, mask_unit=2, mask_unit_attn=False), (2, 64, 16), (8, 8)),
             (create_attention("mask_unit", 16, 2, mask_unit=2), (2, 65, 16), (8, 8)),
             (create_attention("mask_unit", 16, 2, mask_unit=2), (2, 35, 16), (5, 7)),
             (MaskUnitPoolAttention(16, 32, 2, mask_unit=2), (2, 64, 16), None),
             (MaskUnitPoolAttention(16, 32, 2, mask_unit=1, mask_unit_attn=False), (2, 64, 16), None)]
    for m, shape, grid in cases:
        measured, _ = measure_flops(_CallWith(m, grid), shape)
        assert m.flops(shape, feat_size=grid) == measured


class _CallWith(torch.nn.Module):
    """The module called with a grid (and the prefix tokens in front of it)."""

    def __init__(self, m: torch.nn.Module, grid: tuple[int, int] | None) -> None:
        super().__init__()
        self.m, self.grid = m, grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        P = 0 if self.grid is None else x.shape[1] - self.grid[0] * self.grid[1]
        return self.m(x, AttentionCall(feat_size=self.grid, num_prefix_tokens=P))


def test_refusals_name_the_argument() -> None:
    with pytest.raises(ValueError, match="mask_unit must be a power of 2"):
        create_attention("mask_unit", 16, 2, mask_unit=3)
    with pytest.raises(ValueError, match="mask_unit_attn must be a bool"):
        create_attention("mask_unit", 16, 2, mask_unit_attn=1)
    m = create_attention("mask_unit", 16, 2, mask_unit=4)
    with pytest.raises(ValueError, match="pass feat_size"):  # no whole units and no grid to place windows on
        m(torch.randn(1, 40, 16))
    pool = MaskUnitPoolAttention(16, 32, 2)
    with pytest.raises(ValueError, match="needs a grid whose sides are multiples of 8"):
        pool(torch.randn(1, 64, 16), AttentionCall(feat_size=(4, 16)))
    with pytest.raises(ValueError, match="num_prefix_tokens=1"):
        pool(torch.randn(1, 65, 16), AttentionCall(num_prefix_tokens=1))
    with pytest.raises(ValueError, match="q_stride must be 1 or 4"):
        MaskUnitPoolAttention(16, 32, 2, q_stride=2)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        MaskUnitPoolAttention(16, 30, 4)
