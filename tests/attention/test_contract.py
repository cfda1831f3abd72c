"""The attention contract (docs/attention_core.md) for every registered mechanism.

Each mechanism runs its spec's small example once; the q, k, v it hands the core (caught by a
shapes-only observer, strides as the mechanism made them) then go through every promise of
``scaled_dot_product_attention``: fused == explicit, ``is_causal`` == a lower-triangular mask,
zero logits give the mean of v, leading batch dims == folded, a learned bias gets its gradient,
fully masked rows are zeros with finite gradients, an identity ``weights_fn`` changes nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch
from torch import Tensor

import vit_attention
from vit_attention import create_attention, list_attention
from vit_attention.attention import AttentionCall, get_attention_spec
from vit_attention.attention.base import CALL_OPTIONS
from vit_attention.functional import register_attention_hook, scaled_dot_product_attention

NAMES = list_attention()
CORE = [n for n in NAMES if not get_attention_spec(n).weights_note]  # those that hand the core q, k, v
TOL = dict(atol=1e-5, rtol=1e-4)


def _example(name: str) -> tuple[torch.nn.Module, Tensor]:
    torch.manual_seed(0)
    attn, shape = get_attention_spec(name).example()
    return attn.eval(), torch.randn(shape)


def _core_inputs(name: str) -> tuple[Tensor, Tensor, Tensor]:
    """The q, k, v the mechanism gives the core on its example, leading dims folded: ``[B', nh', N, hd]`` each
    (a mechanism may hand the core more leading dims, e.g. neighbourhood tiles ``[B, nT, nh, T², hd]``)."""
    attn, x = _example(name)
    seen: list[tuple[Tensor, Tensor, Tensor]] = []
    handle = register_attention_hook(lambda q, k, v, info: seen.append((q, k, v)), weights=False)
    try:
        with torch.no_grad():
            attn(x)
    finally:
        handle.remove()
    assert seen, f"{name} made no call of the attention core"
    q, k, v = seen[0]
    return tuple(t.flatten(0, t.dim() - 4) if t.dim() > 4 else t for t in (q, k, v))  # type: ignore[return-value]


def _reference(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return logits.softmax(-1).nan_to_num(0.0) @ v


@pytest.mark.parametrize("name", NAMES)
def test_forward_backward_with_the_contract_keywords(name: str) -> None:
    attn, x = _example(name)
    attn.train()
    x.requires_grad_()
    grid = tuple(x.shape[1:3]) if x.dim() == 4 else None
    y = attn(x, AttentionCall(feat_size=grid, num_prefix_tokens=0, context=None))
    assert y.shape == x.shape
    y.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in attn.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("fused", [True, False])
def test_is_causal_equals_an_explicit_lower_triangular_mask(name: str, fused: bool) -> None:
    q, k, v = _core_inputs(name)
    tril = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    causal = scaled_dot_product_attention(q, k, v, is_causal=True, fused=fused)
    masked = scaled_dot_product_attention(q, k, v, mask=tril, fused=fused)
    torch.testing.assert_close(causal, masked, **TOL)
    torch.testing.assert_close(causal, _reference(q, k, v, mask=tril), **TOL)
    assert not torch.allclose(causal, scaled_dot_product_attention(q, k, v), **TOL)


@pytest.mark.parametrize("name", CORE)
def test_zero_logits_give_the_mean_of_v(name: str) -> None:
    q, k, v = _core_inputs(name)
    out = scaled_dot_product_attention(q, k, v, logits_fn=lambda a: a * 0)
    torch.testing.assert_close(out, v.mean(dim=-2, keepdim=True).expand_as(out), **TOL)


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("fused", [True, False])
def test_leading_batch_dims_equal_the_folded_call(name: str, fused: bool) -> None:
    q, k, v = _core_inputs(name)
    q5, k5, v5 = (torch.stack([t, t.flip(0) * 0.5]) for t in (q, k, v))  # [2, B', nh', N, hd]
    nh, N, M = q.shape[1], q.shape[2], k.shape[2]
    bias = torch.randn(nh, N, M)  # broadcasts over both leading dims
    mask = torch.rand(2, 1, 1, 1, M) > 0.2  # differs along the new leading dim
    out5 = scaled_dot_product_attention(q5, k5, v5, bias=bias, mask=mask, fused=fused)
    out4 = scaled_dot_product_attention(q5.flatten(0, 1), k5.flatten(0, 1), v5.flatten(0, 1), bias=bias,
                                        mask=mask.expand(2, q.shape[0], 1, 1, M).flatten(0, 1), fused=fused)
    assert out5.shape == (2, *q.shape[:-1], v.shape[-1])
    torch.testing.assert_close(out5.flatten(0, 1), out4, **TOL)
    torch.testing.assert_close(out5, _reference(q5, k5, v5, bias=bias, mask=mask), **TOL)


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("fused", [True, False])
def test_a_bias_with_grad_gets_its_gradient(name: str, fused: bool) -> None:
    q, k, v = (t.detach().clone().requires_grad_() for t in _core_inputs(name))
    bias = torch.randn(q.shape[1], q.shape[2], k.shape[2], requires_grad=True)  # [nh, N, M]
    out = scaled_dot_product_attention(q, k, v, bias=bias, fused=fused)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, bias))
    ref = _reference(q, k, v, bias=bias)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v, bias))
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-3)
    assert grads[-1].abs().sum() > 0


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("fused", [True, False])
def test_fully_masked_rows_are_zeros_with_finite_gradients(name: str, fused: bool) -> None:
    q, k, v = (t.detach().clone().requires_grad_() for t in _core_inputs(name))
    bias = torch.randn(q.shape[1], q.shape[2], k.shape[2], requires_grad=True)
    keep = torch.rand(q.shape[0], 1, q.shape[2], k.shape[2]) > 0.3
    keep[0, :, -1] = False  # the last query of the first batch row may attend to nothing (separable: N = 1)
    keep[1:, :, :, 0] = True  # every other row has a key
    out = scaled_dot_product_attention(q, k, v, bias=bias, mask=keep, fused=fused)
    assert out[0, :, -1].abs().max() == 0 and torch.isfinite(out).all()
    torch.testing.assert_close(out, _reference(q, k, v, bias=bias, mask=keep), **TOL)
    out.square().sum().backward()
    for t in (q, k, v, bias):
        assert t.grad is not None and torch.isfinite(t.grad).all()


@pytest.mark.parametrize("name", CORE)
def test_identity_weights_fn_changes_nothing(name: str) -> None:
    q, k, v = _core_inputs(name)
    seen: list[Tensor] = []
    default = scaled_dot_product_attention(q, k, v)
    out = scaled_dot_product_attention(q, k, v, weights_fn=lambda w: seen.append(w) or w)
    assert len(seen) == 1 and seen[0].shape == (*q.shape[:-1], k.shape[-2])
    torch.testing.assert_close(out, default, **TOL)
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, fused=False), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_spec_is_complete_and_its_example_runs(name: str) -> None:
    spec = get_attention_spec(name)
    assert spec.formula and spec.cost and spec.description and spec.paper
    assert spec.prefix_tokens == ("global" if spec.layout == "spatial" else "attend")
    assert spec.needs_feat_size or spec.layout == "tokens"  # every spatial mechanism needs the grid
    assert spec.cls.attention_name == name and spec.cls.layout == spec.layout
    assert {"dim", "num_heads", "qkv_bias", "attn_drop"} <= spec.init_kwargs and not spec.init_accepts_any
    assert ("qk_norm" in spec.init_kwargs) == (name == "mhsa")
    attn, shape = spec.example()
    assert attn(torch.randn(shape)).shape == shape
    assert spec.qkv_bias_split == ("q_bias" in attn.state_dict())  # what checkpoint converters read
    if spec.doc_example is not None:
        kwargs, doc_shape = spec.doc_example
        with torch.device("meta"):
            doc = spec.cls(doc_shape[-1], 3, **kwargs)
            assert doc(torch.empty(doc_shape)).shape == doc_shape
    if spec.grid_kwargs is not None:
        grid_attn = spec.cls(16, 2, **spec.grid_kwargs((4, 4)))
        grid_shape = (1, 4, 4, 16) if spec.layout == "spatial" else (1, 16, 16)  # a 4x4 map or its 16 tokens
        assert grid_attn(torch.randn(grid_shape)).shape == grid_shape


@pytest.mark.parametrize("name", [n for n in NAMES if get_attention_spec(n).layout == "spatial"])
def test_spatial_mechanisms_refuse_prefix_tokens_and_context(name: str) -> None:
    attn, x = _example(name)
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        attn(x, AttentionCall(num_prefix_tokens=1))
    with pytest.raises(ValueError, match="context"):
        attn(x, AttentionCall(context=torch.randn(2, 3, x.shape[-1])))
    with pytest.raises(ValueError, match="feat_size"):
        attn(x, AttentionCall(feat_size=(x.shape[1] + 1, x.shape[2])))


@pytest.mark.parametrize("name", [n for n in NAMES if get_attention_spec(n).supports_context])
def test_context_supplies_keys_and_values(name: str) -> None:
    attn, x = _example(name)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, AttentionCall(context=x)), attn(x), **TOL)
        other = attn(x, AttentionCall(context=torch.randn(x.shape[0], 5, x.shape[-1])))
    assert other.shape == x.shape and not torch.allclose(other, attn(x))


def test_an_attention_call_is_one_immutable_value() -> None:
    """What a call carries besides ``x``: the grid, the prefix count, then the optional fields, each neutral by
    default; frozen (one default instance is shared by every signature); ``given`` lists the optional fields set."""
    fields = [f.name for f in dataclasses.fields(AttentionCall)]
    assert fields == ["feat_size", "num_prefix_tokens", *CALL_OPTIONS]
    assert vit_attention.AttentionCall is AttentionCall
    call = AttentionCall((2, 3), 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.feat_size = (1, 1)  # type: ignore[misc]
    assert AttentionCall().given() == () and call.given() == ()
    r = torch.zeros(1)
    assert AttentionCall(residual=r, mask=r).given() == ("mask", "residual")
    assert dataclasses.replace(call, residual=r).num_prefix_tokens == 1


def _field_value(field: str, x: Tensor) -> object:
    """A value of the optional AttentionCall ``field`` for input ``x`` (what it holds does not matter: refused)."""
    B, L = x.shape[0], x.shape[1]
    return {"context": torch.randn(B, 3, x.shape[-1]), "mask": torch.ones(1, 1, 1, L, dtype=torch.bool),
            "rope_coords": torch.zeros(B, L, 2, dtype=torch.long), "rope_valid": torch.ones(B, L, dtype=torch.bool),
            "tome": object(), "residual": torch.zeros_like(x)}[field]


@pytest.mark.parametrize("name", NAMES)
def test_the_forward_takes_x_and_one_attention_call(name: str) -> None:
    """``forward(x, call=AttentionCall())`` for every mechanism; the old keyword call fails as Python makes it
    fail (TypeError naming the keyword)."""
    spec = get_attention_spec(name)
    params = list(inspect.signature(spec.cls.forward).parameters.values())
    assert [p.name for p in params[1:3]] == ["x", "call"]
    assert isinstance(params[2].default, AttentionCall) and not params[2].default.given()
    attn, x = _example(name)
    for keyword in ("feat_size", "num_prefix_tokens", "context"):
        with pytest.raises(TypeError, match=keyword):
            attn(x, **{keyword: None})


def _refusals(name: str) -> list[tuple[str, AttentionCall, str]]:
    """``(field, call, message)`` for each optional field mechanism ``name`` does not read, on its example."""
    attn, x = _example(name)
    prefix = rf"{type(attn).__name__} \('{name}'\) takes no"
    return [(field, AttentionCall(**{field: _field_value(field, x)}), f"{prefix} {field}")
            for field in CALL_OPTIONS if field not in attn.accepts]


@pytest.mark.parametrize("name", NAMES)
def test_the_adapter_refuses_a_call_field_the_mechanism_does_not_read_naming_both(name: str) -> None:
    """``accepts`` names optional AttentionCall fields only (the spec's ``supports_context`` reads it). The adapter
    refuses any other field given, naming the field and the mechanism, so nothing asked for is dropped silently;
    the residual it adds itself when the mechanism does not read it, and the result is ``residual + attn(x)``
    either way."""
    from vit_attention.layers.layout_adapter import apply_attention

    spec = get_attention_spec(name)
    assert spec.cls.accepts <= set(CALL_OPTIONS)
    assert spec.supports_context == ("context" in spec.cls.accepts)
    attn, x = _example(name)
    for field, call, message in _refusals(name):
        if field != "residual":
            with pytest.raises(ValueError, match=message):
                apply_attention(attn, x, call)
    r = torch.randn_like(x)
    with torch.no_grad():
        grid = AttentionCall()
        if x.dim() == 4 or spec.needs_feat_size:  # the map's own size; the grid mechanisms' examples: 16 tokens
            grid = AttentionCall(tuple(x.shape[1:3]) if x.dim() == 4 else (4, 4))
        torch.testing.assert_close(apply_attention(attn, x, dataclasses.replace(grid, residual=r)),
                                   r + attn(x, grid), **TOL)
        if "residual" in attn.accepts:
            torch.testing.assert_close(attn(x, dataclasses.replace(grid, residual=r)), r + attn(x, grid), **TOL)


@pytest.mark.parametrize("name", NAMES)
def test_a_mechanism_called_directly_refuses_a_call_field_it_does_not_read(name: str) -> None:
    """The package's mechanisms check their call as the adapter does (``check_tokens_call`` /
    ``check_map_tokens_call`` / ``check_spatial_call``): a field they do not read, the residual included, raises
    naming it and the mechanism."""
    attn, x = _example(name)
    for _field, call, message in _refusals(name):
        with pytest.raises(ValueError, match=message):
            attn(x, call)


def test_exactly_one_softmax_over_attention_logits() -> None:
    """Mechanisms, layers and functional code reach the softmax only through the core."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "vit_attention"
    core = root / "functional" / "attention.py"
    pattern = re.compile(r"(\.softmax\(|F\.softmax|torch\.softmax|nn\.Softmax)")
    offenders = [f"{path.relative_to(root)}:{i}" for sub in ("functional", "attention", "layers")
                 for path in sorted((root / sub).rglob("*.py"))
                 for i, line in enumerate(path.read_text().splitlines(), 1)
                 if path != core and pattern.search(line.split("#")[0]) and '"' not in line]
    assert not offenders, offenders
    assert len(pattern.findall(core.read_text())) == 1


def test_a_token_mechanism_that_needs_the_grid_is_told_so_by_the_adapter(monkeypatch) -> None:
    import dataclasses

    from vit_attention.attention import registry
    from vit_attention.layers.layout_adapter import apply_attention

    spec = get_attention_spec("mhsa")
    monkeypatch.setitem(registry._ATTENTION, "mhsa", dataclasses.replace(spec, needs_feat_size=True))
    attn = spec.cls(32, 4)
    with pytest.raises(ValueError, match="feat_size"):
        apply_attention(attn, torch.randn(1, 5, 32))
    assert apply_attention(attn, torch.randn(1, 5, 32), AttentionCall(feat_size=(1, 5))).shape == (1, 5, 32)


SPATIAL = [n for n in NAMES if len(get_attention_spec(n).example()[1]) == 4]  # the map mechanisms


@pytest.mark.parametrize("name", SPATIAL)
def test_a_spatial_mechanism_names_the_layout_it_was_given(name: str) -> None:
    """A CNN's ``[B, C, H, W]`` map or flat tokens get an error that says how to hand the map over."""
    attn, shape = get_attention_spec(name).example()
    B, H, W, C = shape
    with pytest.raises(ValueError, match=r"\[B, C, H, W\] feature map: pass x.permute\(0, 2, 3, 1\).*plug"):
        attn(torch.randn(B, C, H + 1, W + 2))
    with pytest.raises(ValueError, match=rf"tokens \[B, N, C\] of a known grid pass x.reshape\(B, H, W, {C}\)"):
        attn(torch.randn(B, H * W, C))


@pytest.mark.parametrize("name", [n for n in CORE if get_attention_spec(n).layout == "spatial"])
def test_spatial_mechanisms_prefix_tokens_attend_to_every_token_with_their_own_projections(name: str) -> None:
    """``attend_prefix``: softmax attention of the prefix queries over all tokens' keys / values (no position
    term), written out from the mechanism's own weights; SwinV2: cosine logits times its temperature."""
    import torch.nn.functional as F

    attn = create_attention(name, 32, 4, **get_attention_spec(name).example_kwargs).eval()
    B, P, N, nh = 2, 2, 2 + 12, 4
    tokens = torch.randn(B, N, 32)
    with torch.no_grad():
        out = attn.attend_prefix(tokens[:, :P], tokens)
        if name == "separable":
            s, k, v = attn.qkv_proj(tokens).split([nh, 32, 32], dim=-1)
            ctx = torch.einsum("bnh,bnhd->bhd", s.softmax(dim=1), k.reshape(B, N, nh, 8)).reshape(B, 1, 32)
            ref = attn.out_proj(F.relu(v[:, :P]) * ctx)
        elif name == "outlook":  # no query-key score: equal weights, the mean of every token's value
            ref = attn.proj(attn.v(tokens).mean(dim=1, keepdim=True)).expand(-1, P, -1)
        elif name == "cascaded_group":  # the cascade over all tokens, each a lone point (the q conv's centre tap)
            kd, vd, slices, outs = attn.key_dim, attn.val_dim, tokens.chunk(nh, dim=-1), []
            f = slices[0]
            for i in range(nh):
                f = f if i == 0 else slices[i] + f
                qkv = attn.qkvs[i](f.unsqueeze(2)).squeeze(2)  # channels-last [B, N, 1, vd] -> [B, N, 2kd + vd]
                q, k, v = qkv.split([kd, kd, vd], dim=-1)
                dw = attn.dws[i]
                c = dw.conv.kernel_size[0] // 2
                q = F.batch_norm((q * dw.conv.weight[:, 0, c, c]).reshape(-1, kd), dw.bn.running_mean,
                                 dw.bn.running_var, dw.bn.weight, dw.bn.bias, False, 0.0, dw.bn.eps).reshape(B, N, kd)
                f = (q @ k.transpose(-2, -1) * attn.scale).softmax(dim=-1) @ v  # [B, N, vd]
                outs.append(f[:, :P])
            ref = attn.proj(torch.cat(outs, dim=-1).unsqueeze(2)).squeeze(2)
        else:
            if name == "halo":
                q = F.linear(tokens[:, :P], attn.q.weight.flatten(1), attn.q.bias).reshape(B, P, nh, -1)
                kv = F.linear(tokens, attn.kv.weight.flatten(1), attn.kv.bias).reshape(B, N, nh, -1)
                k, v = kv.split([attn.dim_head_qk, attn.dim_head_v], dim=-1)
            else:
                qkv = attn.project_qkv(tokens) if hasattr(attn, "project_qkv") else attn.qkv(tokens)
                q, k, v = (t.reshape(B, -1, nh, 8) for t in (qkv[:, :P, :32], qkv[..., 32:64], qkv[..., 64:]))
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, nh, *, hd]
            if name == "cosine_window":
                logits = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) * attn.logit_temperature()
            else:
                logits = q @ k.transpose(-2, -1) * attn.scale
            ref = (logits.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, P, -1)
            ref = ref if name == "halo" else attn.proj(ref)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
