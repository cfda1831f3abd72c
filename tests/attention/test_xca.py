"""XCiT cross-covariance attention against an explicit oracle written here (per head, loops, no library helper),
its recorded channel x channel maps, FLOPs and refusals. Parity with timm 1.0.31's ``XCA`` runs through the family
fixture (tests/models/test_xcit.py)."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention
from vit_attention.analysis import record_attention
from vit_attention.analysis.flops import measure_flops
from vit_attention.attention import AttentionCall
from vit_attention.functional import switched
from vit_attention.functional.tome import TokenMergeState

B, N, C, NH = 2, 13, 24, 3
HD = C // NH


def _oracle(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """XCA by hand (paper §3.2): per head, channel token vectors normalised over the tokens, cosine logits times
    the head's temperature, softmax over the key channels, the values' channels mixed."""
    qkv = x @ m.qkv.weight.T + m.qkv.bias  # [B, N, 3C]
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    outs = []
    for h in range(NH):
        sl = slice(h * HD, (h + 1) * HD)
        qh, kh, vh = q[..., sl], k[..., sl], v[..., sl]  # [B, N, hd]
        qn = qh / qh.norm(dim=1, keepdim=True).clamp_min(1e-12)  # unit length along the tokens
        kn = kh / kh.norm(dim=1, keepdim=True).clamp_min(1e-12)
        logits = torch.einsum("bnc,bnd->bcd", qn, kn) * m.temperature[h, 0, 0]  # [B, hd, hd]
        a = torch.softmax(logits, dim=-1)
        outs.append(torch.einsum("bcd,bnd->bnc", a, vh))  # [B, N, hd]
    return torch.cat(outs, dim=-1) @ m.proj.weight.T + m.proj.bias  # [B, N, C]


def _module(seed: int = 0, **kwargs: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = create_attention("xca", C, NH, **kwargs).eval()
    with torch.no_grad():
        m.temperature.copy_(torch.tensor([0.5, 2.0, 7.0]).view(NH, 1, 1))  # heads far apart
        if m.qkv.bias is not None:
            m.qkv.bias.normal_(0, 0.1)
        m.proj.bias.normal_(0, 0.1)
    return m


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "auto"])
def test_equals_the_explicit_oracle(backend):
    m = _module()
    m.attention_backend = backend
    x = torch.randn(B, N, C)
    with torch.no_grad():
        out = m(x)
    ref = _oracle(m, x)
    assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_logits_are_bounded_by_the_temperature_and_scale_free():
    """Cosine logits: their spread per row is at most 2τ, scaling the queries' and keys' projections changes nothing
    (the norms divide it out), and with temperature 0 every channel mixes all channels of its head equally."""
    m = _module(1)
    x = torch.randn(B, N, C)
    with record_attention(m) as rec, torch.no_grad():
        m(x)
    w = rec.records[0].weights  # [B, nh, hd, hd]
    t = m.temperature.view(1, NH, 1, 1)
    logits_span = (w.log().amax(-1) - w.log().amin(-1))  # max minus min logit per row
    assert (logits_span <= 2 * t[..., 0] + 1e-4).all()
    with torch.no_grad():
        before = m(x)
        m.qkv.weight[:2 * C] *= 3.0
        m.qkv.bias[:2 * C] *= 3.0
        torch.testing.assert_close(m(x), before, atol=1e-5, rtol=1e-5)
        m.qkv.bias.zero_()
        m.temperature.zero_()
        out = m(x)
        v = (x @ m.qkv.weight[2 * C:].T).view(B, N, NH, HD).mean(-1, keepdim=True).expand(B, N, NH, HD)
        ref = v.reshape(B, N, C) @ m.proj.weight.T + m.proj.bias
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_fused_equals_explicit_with_gradients():
    m = _module(2).train()
    x = torch.randn(B, N, C, requires_grad=True)
    results = []
    for fused in (True, False):
        x.grad, m.temperature.grad = None, None
        with switched(m, fused_attention=fused):
            y = m(x)
        y.square().sum().backward()
        results.append((y.detach(), x.grad.clone(), m.temperature.grad.clone()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert results[0][2].abs().min() > 0  # the temperature learns


def test_recorded_maps_are_channel_by_channel_per_head():
    m = _module(3)
    with record_attention(m) as rec, torch.no_grad():
        m(torch.randn(B, N, C))
    (r,) = rec.records
    assert r.weights.shape == (B, NH, HD, HD)
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(B, NH, HD))
    assert r.layout.axis == "channels" and r.grid is None and not r.is_self_attention
    assert rec.self_attention() == []
    with pytest.raises(ValueError, match="channels axis"):
        r.query_map((0, 0))


def test_prefix_tokens_and_feat_size_change_nothing_and_the_residual_adds():
    m = _module(4)
    x, r = torch.randn(B, 1 + 12, C), torch.randn(B, 1 + 12, C)
    with torch.no_grad():
        plain = m(x)
        torch.testing.assert_close(m(x, AttentionCall(feat_size=(3, 4), num_prefix_tokens=1)), plain)
        torch.testing.assert_close(m(x, AttentionCall(residual=r)), plain + r, atol=1e-5, rtol=1e-5)


def test_a_hooked_projection_takes_the_module_path_with_the_same_result():
    m = _module(5, qkv_bias=False)
    x = torch.randn(B, N, C)
    with torch.no_grad():
        plain = m(x)
        seen = []
        handle = m.qkv.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
        hooked = m(x)
        handle.remove()
    assert seen == [(B, N, 3 * C)]
    torch.testing.assert_close(hooked, plain, atol=1e-5, rtol=1e-5)
    assert m.qkv.bias is None


def test_refusals_name_the_argument():
    m = _module(6)
    x = torch.randn(B, N, C)
    with pytest.raises(ValueError, match="context"):
        m(x, AttentionCall(context=x))
    with pytest.raises(ValueError, match="tome"):  # no token x token keys: nothing to merge tokens by
        m(x, AttentionCall(tome=TokenMergeState(x, 0, [1])))
    with pytest.raises(ValueError, match=r"tokens \[B, N, 24\]"):
        m(torch.randn(B, 3, 4, C))
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_attention("xca", 10, 3)


def test_transfer_init_resets_the_temperature():
    m = _module(7)
    notes = m.transfer_init()
    assert torch.equal(m.temperature, torch.ones(NH, 1, 1)) and any("temperature" in n for n in notes)


def test_analytic_flops_equal_measured():
    m = create_attention("xca", 96, 3)
    shape = (2, 56 * 56, 96)
    measured, _ = measure_flops(m, shape)
    assert m.flops(shape) == measured == 2 * (4 * 3136 * 96 * 96 + 2 * 3136 * 96 * 32)
