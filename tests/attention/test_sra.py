"""Spatial-reduction attention against a dense oracle written here from PVT's formulas (Wang et al., ICCV 2021,
arXiv 2102.12122; PVTv2, arXiv 2106.13797)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_attention
from vit_attention.analysis import flops, measure_flops, record_attention
from vit_attention.attention import AttentionCall
from vit_attention.functional import switched


def _oracle(x: torch.Tensor, sd: dict[str, torch.Tensor], nh: int, grid: tuple[int, int], P: int, *,
            sr_ratio: int = 1, linear: bool = False, pool: int = 7, eps: float = 1e-5) -> torch.Tensor:
    """``softmax(q kᵀ / sqrt(hd)) v`` with keys / values from ``[x_prefix; LN(conv(x_grid))]``, then proj."""
    B, N, C = x.shape
    hd = C // nh
    H, W = grid
    q = F.linear(x, sd["q.weight"], sd["q.bias"]).reshape(B, N, nh, hd).transpose(1, 2)
    src = x
    if linear or sr_ratio > 1:
        m = x[:, P:].transpose(1, 2).reshape(B, C, H, W)
        if linear:
            m = F.adaptive_avg_pool2d(m, pool)
        m = F.conv2d(m, sd["sr.weight"], sd["sr.bias"], stride=1 if linear else sr_ratio)
        r = F.layer_norm(m.flatten(2).transpose(1, 2), (C,), sd["norm.weight"], sd["norm.bias"], eps)
        src = torch.cat([x[:, :P], F.gelu(r) if linear else r], 1)
    kv = F.linear(src, sd["kv.weight"], sd["kv.bias"]).reshape(B, -1, 2, nh, hd).permute(2, 0, 3, 1, 4)
    w = (q @ kv[0].transpose(-2, -1) * hd ** -0.5).softmax(-1)  # [B, nh, N, M]
    out = (w @ kv[1]).transpose(1, 2).reshape(B, N, C)
    return F.linear(out, sd["proj.weight"], sd["proj.bias"])


def _module(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    attn = create_attention("sra", 48, 6, **kw).double().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return attn


CASES = [  # kwargs, grid, prefix tokens
    (dict(sr_ratio=2), (6, 8), 0),
    (dict(sr_ratio=2), (7, 9), 1),  # floor: the last row / column reach no key (timm, the original)
    (dict(sr_ratio=4, norm_eps=1e-6), (8, 8), 2),
    (dict(sr_ratio=1), (5, 6), 1),
    (dict(linear=True), (8, 10), 0),
    (dict(linear=True), (4, 5), 1),  # the pool upsamples a map smaller than 7x7
    (dict(linear=True, pool_size=3), (6, 6), 0),
]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kw, grid, P", CASES)
def test_matches_the_dense_formula(kw, grid, P, fused) -> None:
    attn = _module(**kw)
    x = torch.randn(2, P + grid[0] * grid[1], 48, dtype=torch.float64)
    with torch.no_grad(), switched(attn, fused_attention=fused):
        out = attn(x, AttentionCall(feat_size=grid, num_prefix_tokens=P))
        fused_res = attn(x, AttentionCall(feat_size=grid, num_prefix_tokens=P, residual=x))
    ref = _oracle(x, attn.state_dict(), 6, grid, P, sr_ratio=kw.get("sr_ratio", 1), linear=kw.get("linear", False),
                  pool=kw.get("pool_size", 7), eps=kw.get("norm_eps", 1e-5))
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(fused_res, x + ref, atol=1e-10, rtol=0)
    assert out.abs().max() > 0.05


def test_key_names_follow_timm_and_pvt() -> None:
    def keys(**kw):
        return set(create_attention("sra", 32, 4, **kw).state_dict())

    base = {f"{m}.{t}" for m in ("q", "kv", "proj") for t in ("weight", "bias")}
    assert keys(sr_ratio=1) == base
    reduced = base | {"sr.weight", "sr.bias", "norm.weight", "norm.bias"}
    assert keys(sr_ratio=2) == reduced and keys(linear=True) == reduced
    assert create_attention("sra", 32, 4, sr_ratio=4).sr.kernel_size == (4, 4)
    assert create_attention("sra", 32, 4, linear=True).sr.kernel_size == (1, 1)
    assert create_attention("sra", 32, 4, sr_ratio=2, norm_eps=1e-6).norm.eps == 1e-6


def test_grid_defaults_to_a_square_and_bad_grids_raise_naming_feat_size() -> None:
    attn = create_attention("sra", 32, 4, sr_ratio=2).eval()
    x = torch.randn(1, 1 + 36, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, AttentionCall(num_prefix_tokens=1)),
                                   attn(x, AttentionCall(feat_size=(6, 6), num_prefix_tokens=1)))
    with pytest.raises(ValueError, match="feat_size"):
        attn(torch.randn(1, 30, 32))  # not square: the grid must be given
    with pytest.raises(ValueError, match="feat_size"):
        attn(x, AttentionCall(feat_size=(5, 6), num_prefix_tokens=1))  # 30 != 36 grid tokens
    with pytest.raises(ValueError, match="feat_size"):
        create_attention("sra", 32, 4, sr_ratio=8)(torch.randn(1, 24, 32), AttentionCall(feat_size=(4, 6)))  # no key
    with pytest.raises(ValueError, match="context"):
        attn(x, AttentionCall(context=x))
    with pytest.raises(ValueError, match="sr_ratio"):
        create_attention("sra", 32, 4, sr_ratio=0)


@pytest.mark.parametrize("kw, grid, P", CASES)
def test_analytic_flops_equal_the_measured_count(kw, grid, P) -> None:
    attn = create_attention("sra", 48, 6, **kw).eval()

    class Caller(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = attn

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, AttentionCall(feat_size=grid, num_prefix_tokens=P))

    shape = (2, P + grid[0] * grid[1], 48)
    report = flops(Caller(), shape)
    assert report.modules == {"attn": attn.flops(shape, feat_size=grid)}
    assert report.total == measure_flops(Caller(), shape)[0]


def test_flops_formula_of_the_paper() -> None:
    """PVT's ``3NC² + 2NC²/R² + 2N²C/R²`` (plus the LayerNorm); R = 1: ``4NC² + 2N²C``;
    linear: ``2NC² + 147C² + 98NC``."""
    N, C, R = 56 * 56, 64, 8
    sra = create_attention("sra", C, 1, sr_ratio=R)
    assert sra.flops((1, N, C), feat_size=(56, 56)) == 3 * N * C * C + 2 * N * C * C // R**2 + 2 * N * N * C // R**2 \
        + 5 * (N // R**2) * C
    assert create_attention("sra", C, 1).flops((1, N, C)) == 4 * N * C * C + 2 * N * N * C
    lin = create_attention("sra", C, 1, linear=True)
    assert lin.flops((1, N, C), feat_size=(56, 56)) == 2 * N * C * C + 147 * C * C + 98 * N * C + 5 * 49 * C


def test_query_map_places_the_coarse_keys_in_image_space() -> None:
    """With R = 2 on a 6x8 map, a query's map covers exactly the cells its output depends on (through the keys)."""
    attn = create_attention("sra", 16, 2, sr_ratio=2).eval()
    torch.manual_seed(0)
    x = torch.randn(1, 1 + 48, 16, requires_grad=True)
    with record_attention(attn) as rec:
        out = attn(x, AttentionCall(feat_size=(6, 8), num_prefix_tokens=1))
    (r,) = rec.records
    m = r.query_map((2, 3))  # [1, 6, 8]
    assert m.shape == (1, 6, 8)
    cls_weight = r.weights[0, :, 1 + 2 * 8 + 3, 0].mean()  # the class-token key takes the rest of the row
    torch.testing.assert_close(m.sum(), 1 - cls_weight, atol=1e-5, rtol=0)
    assert bool((m > 0).all())  # every cell lies under some reduced key
    coarse = m[0].reshape(3, 2, 4, 2).permute(0, 2, 1, 3).reshape(12, 4)  # each key's 2x2 cells
    torch.testing.assert_close(coarse, coarse[:, :1].expand(-1, 4))  # spread evenly over its cells
    cls = r.query_map("cls")
    assert cls.shape == (1, 6, 8) and cls.sum() < 1
    out[0, 0].sum().backward()  # the class token attends to the reduced map: every cell feeds it
    assert bool((x.grad[0, 1:].abs().sum(-1) > 0).all())
