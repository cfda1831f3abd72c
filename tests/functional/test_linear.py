"""The fused linear epilogue path computes what the eager ops compute, and steps aside when it must."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vit_attention.functional.fast_paths import ACTIVATIONS, use_fast_paths
from vit_attention.functional.linear import apply_linear, can_fuse, linear
from vit_attention.layers import Block, Mlp


@pytest.mark.parametrize("act", [None, *ACTIVATIONS])
@pytest.mark.parametrize("with_residual", [False, True])
def test_fused_matches_eager(act: str | None, with_residual: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 7, 24, generator=g), torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    r = torch.randn(2, 7, 40, generator=g) if with_residual else None
    with torch.no_grad():
        fused = linear(x, w, b, act=act, residual=r)
        with use_fast_paths(False):
            eager = linear(x, w, b, act=act, residual=r)
    assert fused.shape == (2, 7, 40)
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)


def test_unknown_activation_names_the_argument() -> None:
    with pytest.raises(ValueError, match="act must be"):
        linear(torch.randn(2, 3), torch.randn(4, 3), act="tanh")


def test_autograd_and_compile_use_the_eager_path() -> None:
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4)
    assert not can_fuse(x, w)  # autograd needs the differentiable ops
    y = linear(x, w, act="gelu")
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == (3, 4)
    with torch.no_grad():
        assert can_fuse(x, w) == torch.backends.mkldnn.is_available()
    with use_fast_paths(False), torch.no_grad():
        assert not can_fuse(x, w)


def test_hooks_see_the_unfused_module_output() -> None:
    lin = nn.Linear(6, 6)
    seen: list[torch.Tensor] = []
    lin.register_forward_hook(lambda m, i, o: seen.append(o))
    x, r = torch.randn(2, 6), torch.randn(2, 6)
    with torch.no_grad():
        out = apply_linear(lin, x, residual=r)
    assert len(seen) == 1  # the module ran (its hook fired) and the residual was added afterwards
    torch.testing.assert_close(out, seen[0] + r)


@pytest.mark.parametrize("init_values", [None, 1e-2])
def test_block_and_mlp_inference_equal_eager(init_values: float | None) -> None:
    torch.manual_seed(0)
    blk = Block(32, 4, init_values=init_values).eval()
    mlp = Mlp(32, 64).eval()
    x = torch.randn(2, 10, 32)
    with torch.inference_mode():
        fast_b, fast_m = blk(x), mlp(x, residual=x)
        with use_fast_paths(False):
            ref_b, ref_m = blk(x), x + mlp(x)
    torch.testing.assert_close(fast_b, ref_b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast_m, ref_m, rtol=1e-5, atol=1e-5)
    blk.train()  # training mode keeps the eager graph (dropout, drop path, autograd)
    y = blk(x.requires_grad_())
    y.sum().backward()
    assert blk.mlp.fc1.weight.grad is not None


def test_training_path_gradients_equal_eager() -> None:
    torch.manual_seed(0)
    x, w, b = (torch.randn(3, 5, 24, requires_grad=True), torch.randn(40, 24, requires_grad=True),
               torch.randn(40, requires_grad=True))
    grads = []
    for enabled in (True, False):
        with use_fast_paths(enabled):
            y = linear(x, w, b, act="gelu")
        y.square().sum().backward()
        grads.append([t.grad.clone() for t in (x, w, b)])
        for t in (x, w, b):
            t.grad = None
    for fast, eager in zip(*grads):
        torch.testing.assert_close(fast, eager, rtol=1e-5, atol=1e-5)


def test_training_path_supports_double_backward() -> None:
    torch.manual_seed(0)
    x, w, b = (torch.randn(4, 6, requires_grad=True), torch.randn(5, 6, requires_grad=True),
               torch.randn(5, requires_grad=True))
    results = []
    for enabled in (True, False):
        with use_fast_paths(enabled):
            y = linear(x, w, b, act="gelu")
            (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)  # gradient penalty
            (gw,) = torch.autograd.grad(gx.square().sum(), w)
        results.append((gx.detach(), gw))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-5)
