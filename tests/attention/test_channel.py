"""DaViT channel group attention: both published forms against an explicit oracle written here."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention
from vit_attention.analysis import record_attention
from vit_attention.analysis.flops import measure_flops
from vit_attention.attention import AttentionCall
from vit_attention.functional import switched

B, N, C, NH = 2, 13, 24, 3
HD = C // NH


def _oracle(m: torch.nn.Module, x: torch.Tensor, form: str, dynamic: bool = True) -> torch.Tensor:
    """Channel attention by hand, per group, with explicit loops over the groups (no library helper)."""
    qkv = x @ m.qkv.weight.T + m.qkv.bias  # [B, N, 3C]
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    outs = []
    for g in range(NH):
        sl = slice(g * HD, (g + 1) * HD)
        qg, kg, vg = q[..., sl], k[..., sl], v[..., sl]  # [B, N, hd]
        if form == "davit":  # keys x values -> [hd, hd]; the queries are mixed
            a = torch.softmax(torch.einsum("bnc,bnd->bcd", kg * HD ** -0.5, vg), dim=-1)  # [B, hd, hd]
            outs.append(torch.einsum("bcd,bnd->bnc", a, qg))  # [B, N, hd]
        else:  # Florence-2: softmax((q s)ᵀ k) vᵀ
            s = x.shape[1] ** -0.5 if dynamic else HD ** -0.5
            a = torch.softmax(torch.einsum("bnc,bnd->bcd", qg * s, kg), dim=-1)
            outs.append(torch.einsum("bcd,bnd->bnc", a, vg))
    return torch.cat(outs, dim=-1) @ m.proj.weight.T + m.proj.bias  # [B, N, C]


@pytest.mark.parametrize(("form", "dynamic"), [("davit", True), ("florence2", True), ("florence2", False)])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
def test_equals_the_explicit_oracle(form, dynamic, fused):
    torch.manual_seed(0)
    m = create_attention("channel", C, NH, form=form, dynamic_scale=dynamic).eval()
    with torch.no_grad():
        m.qkv.bias.normal_(0, 0.1)
        m.proj.bias.normal_(0, 0.1)
    x = torch.randn(B, N, C)
    with torch.no_grad(), switched(m, fused_attention=fused):
        out = m(x)
    ref = _oracle(m, x, form, dynamic)
    assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_fused_equals_explicit_with_gradients():
    torch.manual_seed(1)
    m = create_attention("channel", C, NH)
    x = torch.randn(B, N, C, requires_grad=True)
    grads = []
    for fused in (True, False):
        x.grad = None
        with switched(m, fused_attention=fused):
            y = m(x)
        y.square().sum().backward()
        grads.append((y.detach(), x.grad.clone()))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-5, rtol=1e-5)


def test_the_forms_differ_and_the_dynamic_scale_follows_n():
    torch.manual_seed(2)
    a = create_attention("channel", C, NH, form="davit").eval()
    b = create_attention("channel", C, NH, form="florence2").eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(B, N, C)
    with torch.no_grad():
        assert not torch.allclose(a(x), b(x), atol=1e-4)
    assert b.scale_for(49) == pytest.approx(1 / 7) and a.scale_for(49) == pytest.approx(HD ** -0.5)
    assert create_attention("channel", C, NH, form="florence2", dynamic_scale=False).scale_for(49) == \
        pytest.approx(HD ** -0.5)


def test_recorded_maps_are_channel_by_channel_per_group():
    torch.manual_seed(3)
    m = create_attention("channel", C, NH).eval()
    with record_attention(m) as rec, torch.no_grad():
        m(torch.randn(B, N, C))
    (r,) = rec.records
    assert r.weights.shape == (B, NH, HD, HD)  # [B, nh, C/nh, C/nh]
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(B, NH, HD))
    assert r.layout.axis == "channels" and r.grid is None and not r.is_self_attention
    assert rec.self_attention() == []  # no spatial record: image maps skip it
    with pytest.raises(ValueError, match="channels axis"):
        r.query_map((0, 0))


def test_prefix_tokens_and_feat_size_change_nothing_and_context_raises():
    torch.manual_seed(4)
    m = create_attention("channel", C, NH).eval()
    x = torch.randn(B, 1 + 12, C)
    with torch.no_grad():
        torch.testing.assert_close(m(x, AttentionCall(feat_size=(3, 4), num_prefix_tokens=1)), m(x))
    with pytest.raises(ValueError, match="context"):
        m(x, AttentionCall(context=x))
    with pytest.raises(ValueError, match=r"tokens \[B, N, 24\]"):
        m(torch.randn(B, 3, 4, C))


def test_bad_arguments_raise_naming_them():
    with pytest.raises(ValueError, match="form"):
        create_attention("channel", C, NH, form="v3")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_attention("channel", 10, 3)


@pytest.mark.parametrize("form", ["davit", "florence2"])
def test_analytic_flops_equal_measured(form):
    m = create_attention("channel", 96, 3, form=form)
    shape = (2, 56 * 56, 96)
    measured, _ = measure_flops(m, shape)
    assert m.flops(shape) == measured == 2 * (4 * 3136 * 96 * 96 + 2 * 3136 * 96 * 32)


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_a_hooked_projection_takes_the_module_path_with_the_same_result(qkv_bias):
    """Plain Linears run as batched GEMMs into the channels-major layout; a hooked one runs as a module."""
    torch.manual_seed(5)
    m = create_attention("channel", C, NH, qkv_bias=qkv_bias).eval()
    x, r = torch.randn(B, N, C), torch.randn(B, N, C)
    with torch.no_grad():
        plain, plain_res = m(x), m(x, AttentionCall(residual=r))
        seen = []
        handle = m.qkv.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
        hooked, hooked_res = m(x), m(x, AttentionCall(residual=r))
        handle.remove()
    assert seen == [(B, N, 3 * C)] * 2  # the hook saw the module run
    torch.testing.assert_close(hooked, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hooked_res, plain_res, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain_res, plain + r, atol=1e-5, rtol=1e-5)
