import math

import pytest
import torch
import torch.nn.functional as F

from vit_attention.functional import (
    attention_context,
    register_attention_hook,
    scaled_dot_product_attention,
)


def _qkv(B=2, nh=3, N=5, M=7, hd=8, hdv=6):
    return torch.randn(B, nh, N, hd), torch.randn(B, nh, M, hd), torch.randn(B, nh, M, hdv)


def _reference(q, k, v, mask=None, scale=None):
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    logits = torch.einsum("bhnd,bhmd->bhnm", q, k) * scale
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    w = torch.exp(logits - logits.amax(-1, keepdim=True))
    w = w / w.sum(-1, keepdim=True)
    return torch.einsum("bhnm,bhmd->bhnd", w, v), w


@pytest.mark.parametrize("fused", [True, False])
def test_matches_formula_with_cross_shapes(fused):
    q, k, v = _qkv()
    out = scaled_dot_product_attention(q, k, v, fused=fused)
    ref, _ = _reference(q, k, v)
    assert out.shape == (2, 3, 5, 6)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_return_weights_and_custom_scale():
    q, k, v = _qkv()
    out, w = scaled_dot_product_attention(q, k, v, scale=0.3, return_weights=True)
    ref, ref_w = _reference(q, k, v, scale=0.3)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))


def test_bool_and_additive_masks_agree_and_broadcast():
    q, k, v = _qkv()
    keep = torch.rand(1, 1, 5, 7) > 0.3
    keep[..., 0] = True
    additive = torch.zeros(1, 1, 5, 7).masked_fill(~keep, -1e4)
    a = scaled_dot_product_attention(q, k, v, mask=keep)
    b = scaled_dot_product_attention(q, k, v, bias=additive)
    ref, _ = _reference(q, k, v, mask=keep)
    torch.testing.assert_close(a, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fully_masked_rows_give_zeros_not_nan(fused, with_bias):
    q, k, v = (t.requires_grad_() for t in _qkv())
    keep = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    keep[0, :, 2] = False  # query 2 of sample 0 may attend to nothing
    bias = torch.randn(3, 5, 7, requires_grad=True) if with_bias else None
    out = scaled_dot_product_attention(q, k, v, mask=keep, bias=bias, fused=fused)
    assert torch.isfinite(out).all()
    assert out[0, :, 2].abs().max() == 0
    assert out[1, :, 2].abs().max() > 0
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v) + ((bias,) if with_bias else ()))


def test_fused_equals_explicit_with_gradients():
    q, k, v = (t.requires_grad_() for t in _qkv())
    bias = torch.randn(1, 3, 5, 7)
    out_f = scaled_dot_product_attention(q, k, v, bias=bias)
    grads_f = torch.autograd.grad(out_f.square().sum(), (q, k, v))
    out_e = scaled_dot_product_attention(q, k, v, bias=bias, fused=False)
    grads_e = torch.autograd.grad(out_e.square().sum(), (q, k, v))
    torch.testing.assert_close(out_f, out_e, atol=1e-5, rtol=1e-5)
    for gf, ge in zip(grads_f, grads_e):
        torch.testing.assert_close(gf, ge, atol=1e-4, rtol=1e-4)


def test_hooks_receive_weights_and_context():
    q, k, v = _qkv()
    seen = []
    handle = register_attention_hook(lambda w, info: seen.append((w.shape, dict(info))))
    try:
        with attention_context(module="blocks.0.attn", layout="global"):
            scaled_dot_product_attention(q, k, v)
    finally:
        handle.remove()
    scaled_dot_product_attention(q, k, v)
    assert seen == [((2, 3, 5, 7), {"module": "blocks.0.attn", "layout": "global", "mask": None, "bias": None,
                                    "is_causal": False})]


def test_dropout_only_in_explicit_when_asked():
    q, k, v = _qkv()
    torch.manual_seed(1)
    a = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    b = scaled_dot_product_attention(q, k, v)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("bad", ["rank", "hd", "keys"])
def test_shape_errors_are_clear(bad):
    q, k, v = _qkv()
    if bad == "rank":
        q = q[0]
    elif bad == "hd":
        k = k[..., :4]
    else:
        v = v[:, :, :3]
    with pytest.raises(ValueError, match="q|k|v"):
        scaled_dot_product_attention(q, k, v)


def test_int_mask_rejected():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="mask must be bool"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(5, 7, dtype=torch.long))
    with pytest.raises(TypeError, match="mask must be bool.*bias="):
        scaled_dot_product_attention(q, k, v, mask=torch.zeros(5, 7))
    with pytest.raises(TypeError, match="bias must be a floating"):
        scaled_dot_product_attention(q, k, v, bias=torch.ones(5, 7, dtype=torch.bool))
    with pytest.raises(TypeError, match="scale must be a float"):
        scaled_dot_product_attention(q, k, v, scale=torch.ones(3, 1, 1))


def _spy_on_torch_sdpa(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The keyword arguments of every call to torch's ``scaled_dot_product_attention`` from now on (it still runs)."""
    calls: list[dict] = []
    real = F.scaled_dot_product_attention

    def spy(*a, **kw):
        calls.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def test_torch_sdpa_is_what_fused_path_calls(monkeypatch):
    calls = _spy_on_torch_sdpa(monkeypatch)
    q, k, v = _qkv(hdv=8)
    scaled_dot_product_attention(q, k, v)
    scaled_dot_product_attention(q, k, v, return_weights=True)
    assert len(calls) == 1


@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_values_wider_than_keys_skip_torch_math_fallback(monkeypatch, with_bias):
    # torch's CPU kernel needs one head width for q, k and v; with wider values (LeViT) it would run its math path
    torch.manual_seed(0)
    q, k, v = _qkv(hd=4, hdv=8)
    bias = torch.randn(1, 3, 5, 7) if with_bias else None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    calls = _spy_on_torch_sdpa(monkeypatch)
    with torch.inference_mode():
        out = scaled_dot_product_attention(q, k, v, bias=bias)
    assert not calls  # the explicit path
    torch.testing.assert_close(out, ref)
    scaled_dot_product_attention(q, k, v, bias=bias, backend="sdpa")  # asked for: torch's kernel
    scaled_dot_product_attention(q[..., :4], k, v[..., :4], bias=bias)  # one width: torch's kernel
    assert len(calls) == 2


def test_learned_bias_in_cpu_training_skips_torch_math_fallback(monkeypatch):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 3, 5, 5, requires_grad=True)  # e.g. Swin's relative-position bias
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v, bias))
    calls = []
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1))
    out = scaled_dot_product_attention(q, k, v, bias=bias)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, bias))
    assert not calls  # explicit path: torch's kernel would only fall back to its math path here
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_is_causal_takes_the_fused_flag_and_logits_fn_forces_the_explicit_path(monkeypatch):
    calls = _spy_on_torch_sdpa(monkeypatch)
    q, k, v = _qkv(M=5, hdv=8)
    scaled_dot_product_attention(q, k, v, is_causal=True)
    assert calls[-1]["is_causal"] is True and calls[-1]["attn_mask"] is None
    n = len(calls)
    scaled_dot_product_attention(q, k, v, logits_fn=lambda a: a)
    scaled_dot_product_attention(q, k, v, weights_fn=lambda w: w)
    assert len(calls) == n  # both transforms need the weights: explicit path


def test_hook_info_carries_layout_bias_mask_and_causal():
    q, k, v = _qkv()
    seen = []
    handles = [register_attention_hook(lambda w, info: seen.append(("weights", info))),
               register_attention_hook(lambda q, k, v, info: seen.append(("shapes", info)), weights=False)]
    layout = object()
    try:
        scaled_dot_product_attention(q, k, v, bias=torch.zeros(3, 5, 7), mask=torch.ones(5, 7, dtype=torch.bool),
                                     layout=layout)
    finally:
        for h in handles:
            h.remove()
    assert [kind for kind, _ in seen] == ["shapes", "weights"]
    for _, info in seen:
        assert info["layout"] is layout and info["bias"] == (3, 5, 7) and info["mask"] == (5, 7)
        assert info["is_causal"] is False


def test_logits_fn_sees_scaled_logits_plus_bias_and_masks_stay_masked():
    q, k, v = _qkv()
    bias = torch.randn(3, 5, 7)
    keep = torch.ones(5, 7, dtype=torch.bool)
    keep[:, 3] = False
    seen = []
    out, w = scaled_dot_product_attention(q, k, v, bias=bias, mask=keep, scale=0.5, return_weights=True,
                                          logits_fn=lambda a: seen.append(a.clone()) or a * 0)
    torch.testing.assert_close(seen[0], (q * 0.5) @ k.transpose(-2, -1) + bias)
    assert w[..., 3].abs().max() == 0  # the masked key stays masked after the transform
    torch.testing.assert_close(w[..., 0], torch.full_like(w[..., 0], 1 / 6))


def test_a_reused_mask_follows_in_place_edits():
    q = torch.randn(1, 2, 5, 4)
    mask = torch.ones(5, 5, dtype=torch.bool)
    first = scaled_dot_product_attention(q, q, q, mask=mask)
    mask[2] = False  # row 2 may attend to nothing now: its output must be zeros
    second = scaled_dot_product_attention(q, q, q, mask=mask)
    assert torch.equal(second[..., 2, :], torch.zeros_like(second[..., 2, :]))
    torch.testing.assert_close(second[..., :2, :], first[..., :2, :])


def test_an_unobserved_call_is_hidden_from_every_observer_and_computes_the_same() -> None:
    """``observed=False`` (the parts of a cascade reported as one call): no weights hook and no shape hook sees it,
    and it takes the path it would take with nobody watching; ``observed=True`` (the default) is seen by both."""
    from vit_attention.functional import register_attention_hook

    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    seen: list[str] = []
    handles = [register_attention_hook(lambda w, info: seen.append("weights")),
               register_attention_hook(lambda q, k, v, info: seen.append("shapes"), weights=False)]
    try:
        hidden = scaled_dot_product_attention(q, k, v, observed=False)
        assert seen == []
        shown = scaled_dot_product_attention(q, k, v)
        assert sorted(seen) == ["shapes", "weights"]
    finally:
        for h in handles:
            h.remove()
    torch.testing.assert_close(hidden, shown, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bias_shape", [(5, 7), (1, 5, 7), (3, 1, 7), (2, 3, 5, 7), (2, 1, 1, 7), (1, 1, 1, 1)])
def test_the_explicit_path_adds_a_bias_of_any_broadcast_shape_and_leaves_it_unchanged(bias_shape):
    """The logits take the bias in place (no autograd); the bias itself is never written."""
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 6)
    bias = torch.randn(bias_shape)
    kept = bias.clone()
    with torch.no_grad():
        out = scaled_dot_product_attention(q, k, v, bias=bias, scale=0.5, backend="explicit")
    torch.testing.assert_close(out, ((q * 0.5) @ k.transpose(-2, -1) + kept).softmax(-1) @ v)
    assert torch.equal(bias, kept)


def test_explicit_inference_normalises_its_own_logits_in_place_with_the_same_numbers():
    torch.manual_seed(0)
    q, k, v = _qkv()
    bias = torch.randn(1, 3, 5, 7)
    kept = bias.clone()
    with torch.no_grad():
        out, w = scaled_dot_product_attention(q, k, v, bias=bias, backend="explicit", return_weights=True)
        ref_w = (q * q.shape[-1] ** -0.5 @ k.transpose(-2, -1) + bias).softmax(-1)
        transformed = scaled_dot_product_attention(q, k, v, bias=bias, logits_fn=lambda a: a, backend="explicit")
    torch.testing.assert_close(w, ref_w, rtol=0, atol=0)
    torch.testing.assert_close(out, ref_w @ v, rtol=0, atol=0)
    torch.testing.assert_close(transformed, out, rtol=0, atol=0)
    assert torch.equal(bias, kept)  # the caller's bias is never the buffer normalised
