"""Neighbourhood attention against an independent dense oracle (global attention with the neighbourhood
as a boolean mask and the bias gathered by the formula), for random sizes, kernels, dilations and tiles."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vit_attention.analysis.attention_maps import record_attention
from vit_attention.attention import create_attention
from vit_attention.attention.neighborhood import SmallMapWarning
from vit_attention.functional.neighborhood import neighborhood_plan


def _axis_window(p: int, length: int, K: int, d: int) -> list[int]:
    """NATTEN's rule written out: the group of ``p`` (p mod d), clamped start, K group positions."""
    g, s = p % d, p // d
    Lg = math.ceil((length - g) / d)
    start = min(max(s - K // 2, 0), Lg - K)
    return [g + d * u for u in range(start, start + K)]


def oracle(m, x: torch.Tensor) -> torch.Tensor:
    """Dense masked attention over the whole (padded) map: ``[B, H, W, C] -> [B, H, W, C]``."""
    B, H, W, C = x.shape
    (K, _), (d, _) = m.kernel_size, m.dilation
    Hp, Wp = max(H, K * d), max(W, K * d)
    xp = torch.zeros(B, Hp, Wp, C, dtype=x.dtype)
    xp[:, :H, :W] = x
    N, nh, hd = Hp * Wp, m.num_heads, m.head_dim
    q, k, v = (m.qkv(xp.reshape(B, N, C)).view(B, N, 3, nh, hd).permute(2, 0, 3, 1, 4))  # [B, nh, N, hd]
    logits = (q * hd ** -0.5) @ k.transpose(-1, -2)  # [B, nh, N, N]
    allowed = torch.zeros(N, N, dtype=torch.bool)
    bias = torch.zeros(nh, N, N)
    for i in range(Hp):
        for j in range(Wp):
            for r in _axis_window(i, Hp, K, d):
                for c in _axis_window(j, Wp, K, d):
                    allowed[i * Wp + j, r * Wp + c] = True
                    if m.rpb is not None:
                        bias[:, i * Wp + j, r * Wp + c] = m.rpb[:, (r - i) // d + K - 1, (c - j) // d + K - 1]
    logits = (logits + bias).masked_fill(~allowed, float("-inf"))
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, Hp, Wp, C)[:, :H, :W]
    assert int(allowed.sum(-1).min()) == K * K == int(allowed.sum(-1).max())  # every query: K² keys
    return m.proj(out)


@settings(max_examples=25, deadline=None)
@given(K=st.sampled_from([1, 3, 5]), d=st.integers(1, 3), extra_h=st.integers(-4, 5), extra_w=st.integers(-4, 5),
       tile=st.sampled_from([None, 1, 2, 3, 8]), seed=st.integers(0, 2**16))
def test_equals_dense_masked_oracle(K: int, d: int, extra_h: int, extra_w: int, tile: int | None, seed: int) -> None:
    torch.manual_seed(seed)
    H, W = max(1, K * d + extra_h), max(1, K * d + extra_w)  # includes maps smaller than K·d (padded)
    m = create_attention("neighborhood", 16, 2, kernel_size=K, dilation=d, tile_size=tile).eval()
    with torch.no_grad():
        m.rpb.normal_()
        x = torch.randn(2, H, W, 16)
        ref = oracle(m, x)
        out = m(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_output_does_not_depend_on_the_tile_size() -> None:
    torch.manual_seed(0)
    m = create_attention("neighborhood", 32, 4, kernel_size=7, dilation=2).eval()
    x = torch.randn(1, 23, 19, 32)
    with torch.no_grad():
        outs = [(setattr(m, "tile_size", t), m(x))[-1] for t in (1, 4, 7, 16)]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-5, rtol=1e-5)


def test_plan_memory_is_linear_in_tokens() -> None:
    """Gathered keys per token stay bounded as the map grows (never N x N)."""
    per_token = []
    for side in (28, 56, 112):
        plan = neighborhood_plan(side, side, 7, 1, 4)
        per_token.append(plan.key_index.numel() / side ** 2)
    assert max(per_token) <= (4 + 6) ** 2 / 16 + 1e-9  # (T + K - 1)² / T² keys per token
    assert max(per_token) - min(per_token) < 0.5


def test_maps_land_in_image_space_and_sum_to_one() -> None:
    m = create_attention("neighborhood", 16, 2, kernel_size=3, dilation=2).eval()
    x = torch.randn(1, 9, 10, 16)
    with torch.no_grad(), record_attention(m) as rec:
        m(x)
    maps = rec.records[0].query_map((0, 0))  # a corner: the clamped window sits inside the map
    assert maps.shape == (1, 9, 10)
    torch.testing.assert_close(maps.sum(), torch.tensor(1.0))
    support = (maps[0] > 0).nonzero().tolist()
    assert sorted({r for r, _ in support}) == [0, 2, 4] and sorted({c for _, c in support}) == [0, 2, 4]


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        create_attention("neighborhood", 16, 2, kernel_size=4)
    with pytest.raises(ValueError, match="dilation"):
        create_attention("neighborhood", 16, 2, dilation=0)
    with pytest.raises(ValueError, match="tile_size"):
        create_attention("neighborhood", 16, 2, tile_size=0)
    with pytest.raises(ValueError, match=r"channels-last map \[B, H, W, 16\]"):
        create_attention("neighborhood", 16, 2)(torch.randn(1, 5, 16))


@pytest.mark.compile
def test_natten_na2d_agrees_without_bias() -> None:
    """natten 0.21.7's ``na2d`` (CPU, the reference library) gives the same attention with no bias."""
    import natten.functional as natten  # a dev extra (pyproject): a missing reference fails, never skips
    torch.manual_seed(1)
    for K, d, (H, W) in ((3, 1, (9, 11)), (5, 2, (12, 10)), (3, 3, (9, 14))):
        q, k, v = (torch.randn(2, H, W, 2, 8) for _ in range(3))  # [B, H, W, nh, hd]
        ref = natten.na2d(q, k, v, kernel_size=K, dilation=d, scale=8 ** -0.5)  # [B, H, W, nh, hd]
        m = create_attention("neighborhood", 16, 2, kernel_size=K, dilation=d, rel_pos_bias=False).eval()
        qkv = torch.cat([t.reshape(2, H, W, 16) for t in (q, k, v)], dim=-1)  # [B, H, W, 3C], heads contiguous
        with torch.no_grad():
            out = m.attend_packed(qkv)  # the attention between the projections
        torch.testing.assert_close(out, ref.reshape(2, H, W, 16), atol=1e-5, rtol=1e-5)


def test_bias_cache_follows_the_table_and_training_gets_its_gradient() -> None:
    torch.manual_seed(0)
    m = create_attention("neighborhood", 16, 2, kernel_size=3).eval()
    x = torch.randn(1, 8, 9, 16)
    with torch.no_grad():
        a = m(x)
        assert m(x).equal(a)  # served from the cache
        m.rpb.add_(1.0 * torch.randn_like(m.rpb))  # an in-place update (optimizer, load_state_dict)
        b = m(x)
    assert not torch.allclose(a, b)
    with torch.no_grad():
        torch.testing.assert_close(b, oracle(m, x), atol=1e-5, rtol=1e-5)
    m.train()
    m(x).square().sum().backward()
    assert m.rpb.grad is not None and m.rpb.grad.abs().sum() > 0


def test_bias_cache_follows_dtype_and_works_in_inference_mode() -> None:
    with torch.inference_mode():  # inference-tensor parameters (no version counter)
        m = create_attention("neighborhood", 16, 2, kernel_size=3).eval()
        x = torch.randn(1, 8, 9, 16)
        a = m(x)
        assert m(x).equal(a)
        m.rpb.mul_(2.0)
        assert not m(x).equal(a)
    m = create_attention("neighborhood", 16, 2, kernel_size=3).eval()
    with torch.no_grad():
        m(torch.randn(1, 8, 9, 16))
        m.to(torch.float64)
        x = torch.randn(1, 8, 9, 16, dtype=torch.float64)
        out = m(x)
        torch.testing.assert_close(out, oracle(m, x), atol=1e-10, rtol=1e-10)
    assert out.dtype == torch.float64 and m._bias_cache.value.dtype == torch.float64


def test_small_map_warns_once_per_module_naming_what_happens() -> None:
    """A map smaller than K·d is zero-padded and the padding attended (the original's behaviour): the first
    call of each module on such a map warns, naming the map, the kernel, the dilation and the padded share."""
    import warnings

    m = create_attention("neighborhood", 8, 2, kernel_size=7).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a map of K·d or more: no warning
        m(torch.randn(1, 7, 9, 8))
    with pytest.warns(SmallMapWarning) as rec:
        m(torch.randn(1, 3, 3, 8))
        m(torch.randn(1, 3, 3, 8))
        m(torch.randn(1, 2, 5, 8))  # another small map: still once per module
    assert len(rec) == 1 and issubclass(SmallMapWarning, UserWarning)
    msg = str(rec[0].message)
    for words in ("kernel_size=(7, 7)", "dilation=(1, 1)", "3x3 map", "7x7", "zero-padded", "82%"):
        assert words in msg, (words, msg)
    with pytest.warns(SmallMapWarning, match=r"dilation=\(2, 2\) runs on a 4x4 map.*6x6.*56%"):
        create_attention("neighborhood", 8, 2, kernel_size=3, dilation=2)(torch.randn(1, 4, 4, 8))  # a new module


def test_padding_share_is_the_share_of_zero_keys() -> None:
    """With uniform weights (q = k = 0, no bias) and v = 1 on the map, a query's output is its share of real keys."""
    for K, d, H, W in [(7, 1, 3, 3), (3, 2, 4, 4), (3, 2, 5, 6), (5, 3, 7, 20), (3, 1, 5, 5)]:
        m = create_attention("neighborhood", 4, 1, kernel_size=K, dilation=d, rel_pos_bias=False).eval()
        with torch.no_grad():
            m.qkv.weight.zero_()
            m.qkv.bias.zero_()
            m.qkv.weight[8:12] = torch.eye(4)  # v = x
            m.proj.weight.copy_(torch.eye(4))
            m.proj.bias.zero_()
            with pytest.warns(SmallMapWarning) if m.padding_share(H, W) else contextlib.nullcontext():
                y = m(torch.ones(1, H, W, 4))
        assert math.isclose(1 - y[..., 0].mean().item(), m.padding_share(H, W), abs_tol=1e-5), (K, d, H, W)
