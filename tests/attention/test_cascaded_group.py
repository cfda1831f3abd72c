"""cascaded_group (attention/cascaded_group.py): EfficientViT-MSRA's cascaded group attention against a written-out
reference of timm 1.0.31's LocalWindowAttention / CascadedGroupAttention (the cascade, per-head projections, the
queries' depthwise convolution, LeViT's |offset| table, zero-padded windows), the per-head maps, the table resize
rule, BatchNorm folding, FLOPs and the refusals. Parity with timm itself: tests/models/test_efficientvit_msra.py."""

import math

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_attention
from vit_attention.analysis import record_attention
from vit_attention.analysis.flops import measure_flops
from vit_attention.attention.cascaded_group import CascadedGroupAttention, ConvNorm
from vit_attention.functional.attention_bias import resize_attention_bias_table


def _trained(attn: CascadedGroupAttention, seed: int = 0) -> CascadedGroupAttention:
    """Random weights, table and BatchNorm statistics (a zero table or identity norms could hide a mistake); eval."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        for m in attn.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.2 * torch.randn(m.num_features, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=g))
    return attn.eval()


def _conv_norm(layer: ConvNorm, x: torch.Tensor) -> torch.Tensor:
    """The layer written out: the convolution, then the BatchNorm with its running statistics."""
    c, bn = layer.conv, layer.bn
    y = F.conv2d(x, c.weight, c.bias, c.stride, c.padding, groups=c.groups)
    return F.batch_norm(y, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)


def _reference(attn: CascadedGroupAttention, x: torch.Tensor) -> torch.Tensor:
    """timm's LocalWindowAttention on NCHW ``x`` written out (its formulas, not its code): pad, partition, the
    cascade per window with the scale on q and the table's bias, reverse, crop."""
    B, C, H, W = x.shape
    ws = attn.window_size[0]
    nh, kd, vd = attn.num_heads, attn.key_dim, attn.val_dim
    pb, pr = (ws - H % ws) % ws, (ws - W % ws) % ws
    xp = F.pad(x, (0, pr, 0, pb))
    nH, nW = (H + pb) // ws, (W + pr) // ws
    win = xp.view(B, C, nH, ws, nW, ws).permute(0, 2, 4, 1, 3, 5).reshape(-1, C, ws, ws)
    pts = [(i, j) for i in range(ws) for j in range(ws)]
    idx = torch.tensor([[abs(a[0] - b[0]) * ws + abs(a[1] - b[1]) for b in pts] for a in pts])
    feats, outs = win.chunk(nh, dim=1), []
    f = feats[0]
    for i in range(nh):
        f = f if i == 0 else f + feats[i]
        q, k, v = _conv_norm(attn.qkvs[i], f).split([kd, kd, vd], dim=1)
        q = _conv_norm(attn.dws[i], q)
        q, k, v = q.flatten(2), k.flatten(2), v.flatten(2)
        a = ((q * kd ** -0.5).transpose(-2, -1) @ k + attn.attention_biases[i][idx]).softmax(-1)
        f = (v @ a.transpose(-2, -1)).view(-1, vd, ws, ws)
        outs.append(f)
    y = _conv_norm(attn.proj[1], torch.relu(torch.cat(outs, 1)))
    y = y.view(B, nH, nW, C, ws, ws).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H + pb, W + pr)
    return y[:, :, :H, :W]


@pytest.mark.parametrize("H, W, ws, kernels", [(14, 14, 7, (5, 5, 5)), (9, 11, 4, (7, 5, 3)), (4, 4, 4, (3, 3, 3)),
                                               (3, 5, 7, (1, 3, 5))])
def test_equals_the_written_out_reference(H, W, ws, kernels):
    """Whole windows, padded non-square maps, one window that is the map, a window larger than the map."""
    attn = _trained(CascadedGroupAttention(48, 3, key_dim=8, window_size=ws, kernels=kernels))
    x = torch.randn(2, 48, H, W)
    with torch.no_grad():
        ours = attn(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        torch.testing.assert_close(ours, _reference(attn, x), rtol=1e-5, atol=1e-5)


def test_the_cascade_feeds_each_head_the_previous_heads_output():
    """Changing only the first head's channels changes every head's output, while the last head's channels reach
    only the last head: with the output projection the identity on each head's block, the first blocks stay."""
    attn = _trained(CascadedGroupAttention(24, 3, key_dim=4, window_size=3))
    with torch.no_grad():
        proj = attn.proj[1]
        proj.conv.weight.copy_(torch.eye(24).view(24, 24, 1, 1))
        proj.bn.weight.fill_(1.0)
        proj.bn.bias.zero_()
        proj.bn.running_mean.zero_()
        proj.bn.running_var.fill_(1.0 - proj.bn.eps)
        x = torch.randn(1, 3, 3, 24)
        base = attn(x)
        last = x.clone()
        last[..., 16:] += 1.0
        first = x.clone()
        first[..., :8] += 1.0
        torch.testing.assert_close(attn(last)[..., :16], base[..., :16], rtol=0, atol=0)
        assert not torch.allclose(attn(last)[..., 16:], base[..., 16:])
        assert all(not torch.allclose(attn(first)[..., s:s + 8], base[..., s:s + 8]) for s in (0, 8, 16))


def test_maps_are_recorded_per_head_on_the_image():
    """One recorded call holding every head's map (the heads' inputs written out, then one core call), placed on
    the image by the windows; the recorded output equals the unrecorded one and each head's weights are the
    written-out softmax of its own queries."""
    attn = _trained(CascadedGroupAttention(32, 4, key_dim=8, window_size=4))
    x = torch.randn(2, 6, 7, 32)
    with torch.no_grad():
        plain = attn(x)
        with record_attention(attn) as rec:
            recorded = attn(x)
    torch.testing.assert_close(recorded, plain, rtol=1e-5, atol=1e-5)
    (r,) = rec.records
    assert r.weights.shape == (2 * 4, 4, 16, 16)  # two images x four 4x4 windows (8x8 padded), four heads
    assert r.layout.grid == (6, 7) and r.layout.groups == 4
    assert int((r.layout.query_pos == -1).sum()) == 64 - 42  # the padded cells
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(8, 4, 16))  # rows over the window, padding included


def test_fused_conv_norms_give_the_same_outputs():
    attn = _trained(CascadedGroupAttention(32, 4, key_dim=8, window_size=4))
    x = torch.randn(2, 5, 9, 32)
    with torch.no_grad():
        before = attn(x)
        for m in attn.modules():
            if isinstance(m, ConvNorm):
                m.fuse()
        assert all(m.fused and isinstance(m.bn, torch.nn.Identity) for m in attn.modules() if isinstance(m, ConvNorm))
        torch.testing.assert_close(attn(x), before, rtol=1e-5, atol=1e-5)


def test_set_window_size_resamples_the_table_by_timms_rule():
    attn = _trained(CascadedGroupAttention(32, 4, key_dim=8, window_size=4))
    table = attn.attention_biases.detach().clone()
    attn.set_window_size(5)
    assert attn.window_size == (5, 5) and attn.attention_biases.shape == (4, 25)
    image = F.interpolate(table.view(1, 4, 4, 4), size=(5, 5), mode="bicubic", antialias=True).view(4, 25)
    torch.testing.assert_close(attn.attention_biases.detach(), image, rtol=0, atol=0)
    torch.testing.assert_close(resize_attention_bias_table(table, (4, 4), (5, 5)), image, rtol=0, atol=0)
    attn.set_window_size(5)  # the same window: unchanged
    torch.testing.assert_close(attn.attention_biases.detach(), image, rtol=0, atol=0)
    with pytest.raises(ValueError, match="shift_size must be 0"):
        attn.set_window_size(5, 2)


@pytest.mark.parametrize("shape", [(2, 8, 8, 32), (1, 7, 9, 32)])
def test_flops_formula_equals_the_measured_count(shape):
    attn = CascadedGroupAttention(32, 4, key_dim=8, window_size=4, kernels=(7, 5, 3, 3)).eval()
    B, H, W, C = shape
    N, nW = 16, math.ceil(H / 4) * math.ceil(W / 4)
    want = B * nW * (sum(N * 8 * (16 + 8) + N * 8 * k * k for k in (7, 5, 3, 3)) + 4 * N * N * 16 + N * C * C)
    norms = 5 * B * nW * N * (4 * (24 + 8) + C)  # fvcore's 5 per BatchNorm element (qkvs, dws, proj)
    assert attn.flops(shape) == want + norms
    assert measure_flops(attn, shape, device=None)[0] == want + norms
    for m in attn.modules():
        if isinstance(m, ConvNorm):
            m.fuse()
    assert attn.flops(shape) == want == measure_flops(attn, shape, device=None)[0]


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_attention("cascaded_group", 30, 4)
    with pytest.raises(ValueError, match="kernels"):
        create_attention("cascaded_group", 32, 4, kernels=(5, 5, 5))
    with pytest.raises(ValueError, match="kernels"):
        create_attention("cascaded_group", 32, 4, kernels=(5, 4, 5, 5))
    with pytest.raises(ValueError, match="key_dim"):
        create_attention("cascaded_group", 32, 4, key_dim=0)
    with pytest.raises(ValueError, match="window_size"):
        create_attention("cascaded_group", 32, 4, window_size=0)
    with pytest.raises(ValueError, match="qkv_bias"):
        create_attention("cascaded_group", 32, 4, qkv_bias="yes")
    with pytest.raises(ValueError, match="channels-last map"):
        create_attention("cascaded_group", 32, 4)(torch.randn(2, 16, 32))


def _bn_stats(layer: ConvNorm, seed: int = 1) -> ConvNorm:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.conv.weight.copy_(0.3 * torch.randn(layer.conv.weight.shape, generator=g))
        layer.bn.weight.copy_(1 + 0.2 * torch.randn(layer.bn.num_features, generator=g))
        layer.bn.bias.copy_(0.2 * torch.randn(layer.bn.num_features, generator=g))
        layer.bn.running_mean.copy_(0.2 * torch.randn(layer.bn.num_features, generator=g))
        layer.bn.running_var.copy_(0.5 + torch.rand(layer.bn.num_features, generator=g))
    return layer


@pytest.mark.parametrize("k, stride, groups", [(1, 1, 1), (3, 1, 16), (3, 2, 16), (3, 2, 1), (5, 1, 4)])
@pytest.mark.parametrize("training", [False, True])
def test_conv_norm_on_channels_last_maps_equals_conv_then_batch_norm(k, stride, groups, training):
    """A channels-last map in and out; eval: the folded layer (a 1x1 one a linear layer) with the ReLU and the
    residual fused; training: the batch statistics, the running ones updated as the module's own BatchNorm."""
    layer = _bn_stats(ConvNorm(16, 32, k, stride, groups=groups)).train(training)
    twin = _bn_stats(ConvNorm(16, 32, k, stride, groups=groups)).train(training)
    x = torch.randn(2, 9, 7, 16)
    ref = twin.bn(F.conv2d(x.permute(0, 3, 1, 2), twin.conv.weight, None, stride, k // 2, groups=groups))
    ref = ref.permute(0, 2, 3, 1)
    r = torch.randn(ref.shape)
    with torch.no_grad():
        out = layer(x, act="relu", residual=r)
    torch.testing.assert_close(out, r + torch.relu(ref), rtol=1e-5, atol=1e-5)
    if training:
        torch.testing.assert_close(layer.bn.running_mean, twin.bn.running_mean)


def test_folded_weights_follow_every_change_of_the_layer():
    """At inference the folded weights are kept, and an in-place edit, a new buffer, a loaded state or another
    dtype is seen at once: each output equals the layer written out."""
    layer = _bn_stats(ConvNorm(16, 24, 3, groups=8)).eval()
    x = torch.randn(2, 5, 6, 16)

    def check(layer: ConvNorm, x: torch.Tensor) -> None:
        with torch.no_grad():
            out = layer(x)
            again = layer(x)
        torch.testing.assert_close(out, _conv_norm(layer, x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))
        torch.testing.assert_close(again, out, rtol=0, atol=0)

    check(layer, x)
    with torch.no_grad():
        layer.bn.running_var.mul_(3.0)
    check(layer, x)
    with torch.no_grad():
        layer.conv.weight.add_(0.5)
    check(layer, x)
    layer.bn.running_mean = torch.ones(24)
    check(layer, x)
    layer.load_state_dict(_bn_stats(ConvNorm(16, 24, 3, groups=8), seed=5).state_dict())
    check(layer, x)
    check(layer.double(), x.double())
    with torch.inference_mode():  # inference tensors carry no version counter: folded on every call
        fresh = _bn_stats(ConvNorm(16, 24, 1)).eval()
        y, again = fresh(x.float()), fresh(x.float())
        ref = _conv_norm(fresh, x.float().permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(again, ref)


def test_an_edited_table_takes_effect_at_once():
    attn = _trained(CascadedGroupAttention(48, 3, key_dim=8, window_size=4))
    x = torch.randn(2, 48, 8, 8)
    with torch.no_grad():
        before = attn(x.permute(0, 2, 3, 1))
        attn.attention_biases.mul_(-2.0)
        after = attn(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    torch.testing.assert_close(after, _reference(attn, x), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before.permute(0, 3, 1, 2), atol=1e-3)


@pytest.mark.parametrize("H, W", [(4, 4), (8, 12), (6, 7)])
def test_a_residual_is_added_on_one_window_several_and_a_padded_map(H, W):
    """One window (added in the output projection), several (added while the windows are put back), padded."""
    from vit_attention.attention.base import AttentionCall

    attn = _trained(CascadedGroupAttention(48, 3, key_dim=8, window_size=4))
    x, r = torch.randn(2, H, W, 48), torch.randn(2, H, W, 48)
    with torch.no_grad():
        out = attn(x, AttentionCall(residual=r))
        ref = r + _reference(attn, x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert out.is_contiguous()


@pytest.mark.parametrize("k", [3, 5])
def test_a_depthwise_layer_plus_its_input_is_one_convolution_at_inference(k):
    """``layer(x, residual=x)``: the identity folded into the centre tap (before and after ``fuse``), or the
    BatchNorm's batch statistics in training; each equals ``x + BN(conv(x))``."""
    layer = _bn_stats(ConvNorm(16, 16, k, groups=16))
    assert layer.identity_foldable and not ConvNorm(16, 16, 3, 2, groups=16).identity_foldable
    assert not ConvNorm(16, 32, 3, groups=16).identity_foldable
    x = torch.randn(2, 6, 5, 16)
    with torch.no_grad():
        ref = x + _conv_norm(layer.eval(), x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        torch.testing.assert_close(layer(x, residual=x), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer(x, residual=x.clone()), ref, rtol=1e-5, atol=1e-5)
        layer.fuse()
        torch.testing.assert_close(layer(x, residual=x), ref, rtol=1e-5, atol=1e-5)
        train = _bn_stats(ConvNorm(16, 16, k, groups=16)).train()
        y = train.bn(train.conv(x.permute(0, 3, 1, 2))).permute(0, 2, 3, 1)
        torch.testing.assert_close(train(x, residual=x), x + y, rtol=1e-5, atol=1e-5)


def test_auto_runs_each_head_on_the_explicit_path_on_cpu(monkeypatch):
    """'auto' in eager CPU inference: no head reaches torch's fused kernel (slower on these heads); 'sdpa' does, and
    both give the same outputs."""
    from vit_attention.attention import set_attention_backend

    attn = _trained(CascadedGroupAttention(32, 4, key_dim=8, window_size=4))
    x = torch.randn(2, 8, 8, 32)
    calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    with torch.no_grad():
        auto = attn(x)
        assert calls == []
        set_attention_backend(attn, "sdpa")
        sdpa = attn(x)
    assert len(calls) == 4
    torch.testing.assert_close(sdpa, auto, rtol=1e-5, atol=1e-5)
