"""MobileViT v2 separable self-attention (attention/separable.py): the reference, masks, linear cost."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_attention
from vit_attention.analysis import flops, record_attention
from vit_attention.bench.memory import measure_peak_memory
from vit_attention.functional import register_attention_hook, switched
from vit_attention.functional.layout import AttentionLayout

from .test_unfold import _randomise


def _timm_linear_self_attention(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """timm ``LinearSelfAttention`` on the unfolded ``[B, C, P, N]`` map (1x1 convs, softmax over N)."""
    B, H, W, C = x.shape
    p = attn.patch_size
    t = x.permute(0, 3, 1, 2).reshape(B, C, H // p, p, W // p, p).permute(0, 1, 3, 5, 2, 4).reshape(B, C, p * p, -1)
    qkv = F.conv2d(t, attn.qkv_proj.weight[:, :, None, None], attn.qkv_proj.bias)
    q, k, v = qkv.split([1, C, C], dim=1)
    context = (k * F.softmax(q, dim=-1)).sum(dim=-1, keepdim=True)  # [B, C, P, 1]
    out = F.conv2d(F.relu(v) * context, attn.out_proj.weight[:, :, None, None], attn.out_proj.bias)
    out = out.reshape(B, C, p, p, H // p, W // p).permute(0, 1, 4, 2, 5, 3).reshape(B, C, H, W)
    return out.permute(0, 2, 3, 1)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("p", [1, 2])
def test_equals_timm_linear_self_attention(fused, p):
    attn = _randomise(create_attention("separable", 24, 1, patch_size=p))
    x = torch.randn(2, 8, 6, 24)
    with torch.no_grad(), switched(attn, fused_attention=fused):
        out, ref = attn(x), _timm_linear_self_attention(attn, x)
    torch.testing.assert_close(out, ref, atol=1e-5 * float(ref.abs().max()), rtol=0)


def test_one_all_ones_query_with_unit_head_keys():
    """The context is ONE core call: q = ones [B, P·nh, 1, 1], k = scores [B, P·nh, N, 1], v = keys."""
    attn = _randomise(create_attention("separable", 16, 2, patch_size=2))
    seen = []
    handle = register_attention_hook(lambda q, k, v, info: seen.append((q.shape, k.shape, v.shape, q)), weights=False)
    try:
        with torch.no_grad():
            attn(torch.randn(3, 8, 8, 16))
    finally:
        handle.remove()
    ((qs, ks, vs, q),) = seen
    assert qs == (3, 8, 1, 1) and ks == (3, 8, 16, 1) and vs == (3, 8, 16, 8)
    assert bool((q == 1).all())


def test_masked_padding_equals_per_group_softmax_on_real_pixels():
    H, W, p, C = 5, 7, 2, 16
    attn = _randomise(create_attention("separable", C, 1, patch_size=p))
    x = torch.randn(1, H, W, C)
    s, k, v = (x @ attn.qkv_proj.weight.T + attn.qkv_proj.bias).split([1, C, C], dim=-1)
    out = torch.empty(1, H, W, C)
    for oy in range(p):
        for ox in range(p):
            sl = (slice(None), slice(oy, None, p), slice(ox, None, p))
            w = s[sl].reshape(-1).softmax(0)  # over the real pixels of this offset only
            c = (w[:, None] * k[sl].reshape(-1, C)).sum(0)
            out[sl] = F.relu(v[sl]) * c
    ref = out @ attn.out_proj.weight.T + attn.out_proj.bias
    with torch.no_grad():
        torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=1e-5)


def test_recorded_context_scores_stand_for_their_group():
    attn = _randomise(create_attention("separable", 16, 1, patch_size=2))
    with record_attention(attn) as rec, torch.no_grad():
        attn(torch.randn(1, 6, 4, 16))
    (r,) = rec.records
    assert r.weights.shape == (4, 1, 1, 6) and r.layout.groups == 4  # [B·G, nh, n, m]
    m = r.query_map((2, 3))[0]  # the context scores of offset (0, 1)
    rows, cols = torch.meshgrid(torch.arange(6), torch.arange(4), indexing="ij")
    assert torch.equal(m > 0, (rows % 2 == 0) & (cols % 2 == 1))
    torch.testing.assert_close(m.sum(), torch.tensor(1.0))
    with pytest.raises(ValueError, match="query_cells"):
        AttentionLayout((2, 2), torch.zeros(1, 1, dtype=torch.long), query_cells=torch.zeros(2, 1, 1).long())


def _time_and_memory(name: str, n_side: int) -> tuple[float, int]:
    C = 32
    attn = create_attention(name, C, 1, **({"patch_size": 1} if name == "separable" else {})).eval()
    x = torch.randn(1, n_side * n_side, C)
    call = (lambda: attn(x.view(1, n_side, n_side, C))) if name == "separable" else (lambda: attn(x))
    with torch.no_grad():
        call()
        t0 = time.perf_counter()
        call()
        elapsed = time.perf_counter() - t0
        with switched(attn, fused_attention=False):  # explicit path: an N x N matrix would be a tensor the tracker sees
            peak = measure_peak_memory(call, "cpu")["peak_bytes"]
    return elapsed, peak


@pytest.mark.slow
def test_separable_cost_grows_linearly_where_mhsa_grows_quadratically():
    """1k, 4k, 16k tokens: separable's peak memory and MACs grow ~4x per step, MHSA's attention ~16x."""
    sides = (32, 64, 128)  # 1024, 4096, 16384 tokens
    sep = [_time_and_memory("separable", s) for s in sides]
    mem_sep = [m for _, m in sep]
    assert mem_sep[1] / mem_sep[0] < 5 and mem_sep[2] / mem_sep[1] < 5  # linear (x4 tokens -> ~x4 memory)
    mhsa_mem = [_time_and_memory("mhsa", s)[1] for s in sides[:2]]  # 16k tokens would hold a 1 GB N x N matrix
    assert mhsa_mem[1] / mhsa_mem[0] > 10  # quadratic: the N x N weights dominate
    assert mhsa_mem[1] > 20 * mem_sep[1]
    macs = [flops(create_attention("separable", 32, 1), (1, s, s, 32)).total for s in sides]
    assert macs[1] == 4 * macs[0] and macs[2] == 4 * macs[1]
