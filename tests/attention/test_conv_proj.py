"""CvT's convolutional projection attention (attention/conv_proj.py) against a plain-ops oracle."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_attention
from vit_attention.analysis import flops, measure_flops, record_attention
from vit_attention.attention import AttentionCall
from vit_attention.attention.conv_proj import ConvProjectionAttention
from vit_attention.functional import register_attention_hook, switched
from vit_attention.layers.layout_adapter import apply_attention

DIM, HEADS = 24, 3


def _module(**kw) -> ConvProjectionAttention:
    torch.manual_seed(0)
    attn = create_attention("conv_proj", DIM, HEADS, **kw)
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.2 * torch.randn_like(p))
        for m in attn.modules():
            if isinstance(m, torch.nn.BatchNorm2d):  # running statistics away from 0 / 1
                m.running_mean.copy_(0.2 * torch.randn_like(m.running_mean))
                m.running_var.copy_(0.5 + torch.rand_like(m.running_var))
    return attn.eval()


def _oracle(attn: ConvProjectionAttention, x: torch.Tensor, H: int, W: int, P: int) -> torch.Tensor:
    """The original's forward with plain ops: conv + BN (eval) per q / k / v, prefix prepended, softmax(q kᵀ / √C) v."""
    B, N, C = x.shape
    prefix, fmap = x[:, :P], x[:, P:].transpose(1, 2).reshape(B, C, H, W)

    def project(proj, stride: int) -> torch.Tensor:
        if proj is None:
            t = fmap
        elif attn.method == "avg":
            t = F.avg_pool2d(fmap, attn.kernel_size, stride, attn.kernel_size // 2, ceil_mode=True)
        else:
            t = F.conv2d(fmap, proj.conv.weight, None, stride, attn.kernel_size // 2, groups=C)
            bn = proj.bn
            t = F.batch_norm(t, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
        return torch.cat([prefix, t.flatten(2).transpose(1, 2)], dim=1)

    q = F.linear(project(attn.conv_proj_q, 1), attn.proj_q.weight, attn.proj_q.bias)
    k = F.linear(project(attn.conv_proj_k, attn.stride_kv), attn.proj_k.weight, attn.proj_k.bias)
    v = F.linear(project(attn.conv_proj_v, attn.stride_kv), attn.proj_v.weight, attn.proj_v.bias)
    q, k, v = (t.view(B, t.shape[1], HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
    w = torch.softmax(q @ k.transpose(-2, -1) * C ** -0.5, dim=-1)  # the full width's scale
    out = (w @ v).transpose(1, 2).reshape(B, N, C)
    return F.linear(out, attn.proj.weight, attn.proj.bias)


@pytest.mark.parametrize("method", ["dw_bn", "avg", "linear"])
@pytest.mark.parametrize(("H", "W", "P"), [(5, 7, 1), (4, 4, 0), (3, 6, 2)])
@pytest.mark.parametrize("fused", [True, False])
def test_equals_the_oracle(method: str, H: int, W: int, P: int, fused: bool) -> None:
    attn = _module(method=method)
    x = torch.randn(2, P + H * W, DIM)
    with torch.no_grad(), switched(attn, fused_attention=fused):
        out = attn(x, AttentionCall(feat_size=(H, W), num_prefix_tokens=P))
        torch.testing.assert_close(out, _oracle(attn, x, H, W, P), atol=1e-5, rtol=1e-5)
        res = torch.randn_like(x)
        call = AttentionCall(feat_size=(H, W), num_prefix_tokens=P, residual=res)
        torch.testing.assert_close(attn(x, call), res + out,
                                   atol=1e-5, rtol=1e-5)


def test_scale_is_the_full_width_and_keys_are_strided() -> None:
    attn = _module()
    assert attn.scale == pytest.approx(DIM ** -0.5)  # not the head dim's
    seen = []
    handle = register_attention_hook(lambda q, k, v, info: seen.append((q.shape, k.shape)), weights=False)
    try:
        with torch.no_grad():
            attn(torch.randn(1, 1 + 5 * 7, DIM), AttentionCall(feat_size=(5, 7), num_prefix_tokens=1))
    finally:
        handle.remove()
    (q_shape, k_shape), = seen
    assert q_shape == (1, HEADS, 36, DIM // HEADS) and k_shape == (1, HEADS, 1 + 3 * 4, DIM // HEADS)
    assert attn.key_grid(5, 7) == (3, 4)
    assert _module(method="avg").key_grid(5, 7) == (3, 4) and _module(method="linear").key_grid(5, 7) == (5, 7)
    assert _module(stride_kv=1).key_grid(5, 7) == (5, 7)


def test_prefix_tokens_skip_the_convolutions() -> None:
    """The class token's q / k / v do not depend on the map, and the map's do not depend on it via the convs."""
    attn = _module()
    x = torch.randn(1, 1 + 16, DIM, requires_grad=True)
    q_t = {}
    handle = register_attention_hook(lambda q, k, v, info: q_t.setdefault("q", q), weights=False)
    try:
        attn(x, AttentionCall(feat_size=(4, 4), num_prefix_tokens=1))
    finally:
        handle.remove()
    q_t["q"][0, :, 0].sum().backward()  # the class token's query
    assert x.grad[0, 1:].abs().max() == 0 and x.grad[0, 0].abs().max() > 0


def test_training_uses_batch_statistics() -> None:
    attn = _module()
    x = torch.randn(3, 12, DIM)
    with torch.no_grad():
        eval_out = attn(x, AttentionCall(feat_size=(3, 4)))
        train_out = attn.train()(x, AttentionCall(feat_size=(3, 4)))
    assert train_out.shape == x.shape and torch.isfinite(train_out).all()
    assert not torch.allclose(train_out, eval_out, atol=1e-3)  # normalised by the batch, not the running stats
    assert attn.conv_proj_q.bn.num_batches_tracked.item() == 1  # and the running statistics were updated


@pytest.mark.parametrize("method", ["dw_bn", "avg", "linear"])
@pytest.mark.parametrize(("shape", "grid"), [((2, 1 + 35, DIM), (5, 7)), ((1, 64, DIM), (8, 8)), ((1, 16, DIM), None)])
def test_analytic_flops_equal_measured(method: str, shape: tuple[int, ...], grid: tuple[int, int] | None) -> None:
    attn = _module(method=method)
    if grid is None:  # called without the grid: a square 4x4 map
        assert flops(attn, shape).total == measure_flops(attn, shape)[0] == attn.flops(shape)
        return
    P = shape[1] - grid[0] * grid[1]
    analytic = attn.flops(shape, feat_size=grid)
    x = torch.randn(shape)
    from torch.utils.flop_counter import FlopCounterMode

    from vit_attention.analysis.flops import _extra_mapping

    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=_extra_mapping()) as counter:
        attn(x, AttentionCall(feat_size=grid, num_prefix_tokens=P))
    assert analytic == counter.get_total_flops() // 2


def test_without_the_grid_a_square_is_assumed() -> None:
    attn = _module()
    x = torch.randn(1, 1 + 36, DIM)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, AttentionCall(num_prefix_tokens=1)),
                                   attn(x, AttentionCall(feat_size=(6, 6), num_prefix_tokens=1)))
    with pytest.raises(ValueError, match="feat_size"):
        attn(torch.randn(1, 11, DIM))  # no square: the grid must be given
    with pytest.raises(ValueError, match="feat_size"):
        attn.flops((1, 11, DIM))


def test_recorded_maps_sum_to_one_on_the_image() -> None:
    attn = _module()
    x = torch.randn(1, 1 + 5 * 7, DIM)
    with record_attention(attn) as rec, torch.no_grad():
        apply_attention(attn, x, AttentionCall(feat_size=(5, 7), num_prefix_tokens=1))
    (r,) = rec.records
    assert r.grid == (5, 7) and r.num_prefix_tokens == 1
    assert r.weights.shape == (1, HEADS, 36, 1 + 12)  # keys: the class token + a 3x4 grid
    for q in [(0, 0), (4, 6), "cls"]:
        m = r.query_map(q)  # [1, 5, 7]: the coarse keys spread over the cells they cover
        assert m.shape == (1, 5, 7) and bool((m > 0).all())
        key_weight = r.weights[0, :, 0 if q == "cls" else 1 + q[0] * 7 + q[1], 1:].mean(0).sum()
        torch.testing.assert_close(m.sum(), key_weight)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(kernel_size=4), "kernel_size"), (dict(stride_kv=0), "stride_kv"), (dict(method="conv"), "method"),
])
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        create_attention("conv_proj", DIM, HEADS, **kwargs)


def test_bad_calls_are_named() -> None:
    attn = _module()
    x = torch.randn(1, 1 + 12, DIM)
    with pytest.raises(ValueError, match="feat_size"):
        attn(x, AttentionCall(feat_size=(4, 4), num_prefix_tokens=1))
    with pytest.raises(ValueError, match="context"):
        attn(x, AttentionCall(feat_size=(3, 4), num_prefix_tokens=1, context=x))
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        attn(x, AttentionCall(num_prefix_tokens=13))
    with pytest.raises(ValueError, match="feat_size"):
        apply_attention(attn, x, AttentionCall(num_prefix_tokens=1))  # the adapter asks for the grid (needs_feat_size)


def test_batchnorm_folded_at_inference_equals_conv_then_bn() -> None:
    attn = _module()
    x = torch.randn(2, 1 + 5 * 7, DIM)
    with torch.no_grad():
        folded = attn(x, AttentionCall(feat_size=(5, 7), num_prefix_tokens=1))
        seen = []
        handle = attn.conv_proj_k.bn.register_forward_hook(lambda m, i, o: seen.append(o.shape))  # forces conv, bn
        try:
            plain = attn(x, AttentionCall(feat_size=(5, 7), num_prefix_tokens=1))
        finally:
            handle.remove()
    assert seen == [(2, DIM, 3, 4)]
    torch.testing.assert_close(folded, plain, atol=1e-5, rtol=1e-5)
