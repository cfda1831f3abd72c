"""Every registered mechanism through the same contract checks (docs/attention_core.md)."""

import pytest
import torch

from vit_attention import create_attention, list_attention
from vit_attention.attention import cascaded_group, get_attention_spec
from vit_attention.functional import switched

DIM, HEADS = 32, 4


def _input(name: str) -> torch.Tensor:
    if get_attention_spec(name).layout == "spatial":
        return torch.randn(2, 7, 9, DIM)  # [B, H, W, C], non-square and not a window multiple
    if get_attention_spec(name).needs_feat_size:  # a token mechanism that uses the grid: a square map (4x4)
        return torch.randn(2, 16, DIM)  # [B, N, C]
    return torch.randn(2, 11, DIM)  # [B, N, C]


def _build(name: str) -> torch.nn.Module:
    spec = get_attention_spec(name)
    return create_attention(name, DIM, HEADS, **spec.example_kwargs).eval()


def test_registry_lists_core_mechanisms():
    names = list_attention()
    assert {"mhsa", "mha"} <= set(names)
    assert list_attention("mh*") == sorted(n for n in names if n.startswith("mh"))


@pytest.mark.parametrize("name", list_attention())
def test_shape_preserved_and_backward(name):
    attn = _build(name).train()
    x = _input(name).requires_grad_()
    y = attn(x)
    assert y.shape == x.shape
    y.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    grads = [p.grad for p in attn.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)


@pytest.mark.parametrize("name", list_attention())
def test_fused_equals_explicit(name):
    attn = _build(name)
    x = _input(name)
    with torch.no_grad():
        fused = attn(x)
        with switched(attn, fused_attention=False):
            explicit = attn(x)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", list_attention())
def test_heads_must_divide_dim(name):
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_attention(name, 30, 4, **get_attention_spec(name).example_kwargs)


@pytest.mark.parametrize("name", list_attention())
def test_declares_flops(name):
    attn = _build(name)
    x = _input(name)
    assert attn.flops(tuple(x.shape)) > 0


def test_unknown_mechanism_suggests():
    with pytest.raises(KeyError, match="did you mean 'mhsa'"):
        create_attention("mhsaa", 32, 4)


@pytest.mark.parametrize("name", list_attention())
def test_fused_switch_captured_when_built_and_switched_per_module(name, monkeypatch):
    """Every mechanism captures the fused switch when built and hands it to the core: switched() reaches it."""
    from vit_attention.functional import attention as core
    from vit_attention.functional.runtime import FUSED_ATTENTION

    calls = []
    real = core._fused
    monkeypatch.setattr(core, "_fused", lambda *a, **k: calls.append(1) or real(*a, **k))
    # the switch alone decides here: not the CPU rule that runs wider values than keys explicitly (LeViT, VOLO's
    # outlook, separable; tests/functional/test_attention.py), nor cascaded group's explicit heads on CPU
    # (tests/attention/test_cascaded_group.py)
    monkeypatch.setattr(core, "_math_fallback_on_cpu", lambda q, v: False)
    monkeypatch.setattr(cascaded_group, "_explicit_heads", lambda q: False)
    attn, x = _build(name), _input(name)
    assert attn.fused_attention is FUSED_ATTENTION.default
    attn.fused_attention = True
    with torch.no_grad():
        with switched(attn, fused_attention=False):
            attn(x)
        assert calls == [] and attn.fused_attention is True  # explicit path inside, restored after
        attn(x)
    assert bool(calls) == get_attention_spec(name).fused  # the fused kernel where the mechanism can use it
