"""EfficientViT-MIT's LiteMLA (attention/lite_mla.py, functional/lite_mla.py): timm's computation, the quadratic form
it equals, float32 inside, no weights to record, prefix tokens and options."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_attention, list_attention
from vit_attention.analysis import record_attention
from vit_attention.attention import AttentionCall, get_attention_spec
from vit_attention.functional import register_attention_hook
from vit_attention.functional.lite_mla import relu_linear_attention


def _randomise(attn: torch.nn.Module) -> torch.nn.Module:
    """Random weights and BatchNorm statistics (a fresh BatchNorm is the identity)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        attn.norm.running_mean.copy_(torch.randn_like(attn.norm.running_mean) * 0.2)
        attn.norm.running_var.copy_(torch.rand_like(attn.norm.running_var) + 0.5)
    return attn.eval()


def _timm_lite_mla(attn: torch.nn.Module, x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """timm 1.0.31 ``LiteMLA.forward`` (``timm/models/efficientvit_mit.py``) written out on the NCHW map, with this
    module's weights as its 1x1 convolutions: ``[B, H, W, C]`` in and out (permuted at the ends)."""
    B, H, W, C = x.shape
    dim = attn.head_dim
    t = x.permute(0, 3, 1, 2)
    qkv = F.conv2d(t, attn.qkv.weight[:, :, None, None], attn.qkv.bias)
    ms = torch.cat([qkv, *(op(qkv) for op in attn.aggreg)], dim=1)
    ms = ms.reshape(B, -1, 3 * dim, H * W).transpose(-1, -2)
    q, k, v = ms.chunk(3, dim=-1)
    q, k = F.relu(q), F.relu(k)
    v = F.pad(v, (0, 1), mode="constant", value=1.0)
    kv = k.float().transpose(-1, -2) @ v.float()
    out = q.float() @ kv
    out = out[..., :-1] / (out[..., -1:] + eps)
    out = out.transpose(-1, -2).reshape(B, -1, H, W)
    out = F.conv2d(out, attn.proj.weight[:, :, None, None], attn.proj.bias)
    bn = attn.norm
    out = F.batch_norm(out, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    return out.permute(0, 2, 3, 1)


@pytest.mark.parametrize("scales", [(5,), (3, 5), ()])
@pytest.mark.parametrize("shape", [(2, 7, 9), (1, 1, 1), (1, 13, 4)])
def test_equals_timm_lite_mla(scales, shape):
    attn = _randomise(create_attention("lite_mla", 32, 2, scales=scales))
    x = torch.randn(*shape, 32)
    with torch.no_grad():
        out, ref = attn(x), _timm_lite_mla(attn, x)
    torch.testing.assert_close(out, ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-5)


def test_training_normalises_with_the_batch_statistics():
    attn = _randomise(create_attention("lite_mla", 16, 2)).train()
    x = torch.randn(2, 5, 6, 16)
    out = attn(x)
    flat = out.reshape(-1, 16)  # train-mode BatchNorm: per channel zero mean, unit variance (weight 1, bias 0 aside)
    ref = (flat - attn.norm.bias) / attn.norm.weight
    torch.testing.assert_close(ref.mean(0), torch.zeros(16), atol=1e-4, rtol=0)
    torch.testing.assert_close(ref.var(0, unbiased=False), torch.ones(16), atol=1e-3, rtol=0)


def test_the_linear_form_equals_the_quadratic_form():
    """``out_i = Σ_j (q_i·k_j) v_j / (Σ_j q_i·k_j + eps)`` with ReLU on q and k, from an explicit ``N x N`` matrix."""
    q, k, v = torch.randn(2, 3, 20, 8), torch.randn(2, 3, 20, 8), torch.randn(2, 3, 20, 8)
    a = F.relu(q) @ F.relu(k).transpose(-1, -2)  # [2, 3, N, N]
    ref = (a @ v) / (a.sum(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(relu_linear_attention(q, k, v), ref, atol=1e-5, rtol=1e-5)
    few = relu_linear_attention(q[:, :, :4], k, v)  # fewer queries than keys (prefix tokens)
    torch.testing.assert_close(few, ref[:, :, :4], atol=1e-5, rtol=1e-5)


def test_a_query_meeting_no_key_gives_zeros_not_nan():
    q, k, v = -torch.rand(1, 1, 5, 4), torch.rand(1, 1, 5, 4), torch.randn(1, 1, 5, 4)  # ReLU(q) = 0
    out = relu_linear_attention(q, k, v)
    assert bool(torch.isfinite(out).all()) and out.abs().max() == 0


def test_products_run_in_float32_and_return_the_input_dtype():
    q, k, v = (torch.randn(2, 2, 30, 8) for _ in range(3))
    ref = relu_linear_attention(q, k, v)
    out = relu_linear_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = relu_linear_attention(q, k, v)
    assert auto.dtype == torch.float32  # autocast is off inside: the float32 values come back as they are
    torch.testing.assert_close(auto, ref, atol=0, rtol=0)
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.05)


def test_never_calls_the_core_and_recording_refuses_with_the_reason():
    attn = create_attention("lite_mla", 32, 4)
    seen = []
    handle = register_attention_hook(lambda q, k, v, info: seen.append(q.shape), weights=False)
    try:
        with torch.no_grad():
            attn(torch.randn(1, 6, 6, 32))
    finally:
        handle.remove()
    assert seen == []
    note = get_attention_spec("lite_mla").weights_note
    assert "no attention weights" in note
    with pytest.raises(ValueError, match="no attention maps to record: the model is 'lite_mla': ReLU linear"):
        with record_attention(attn):
            pass
    net = torch.nn.Sequential(torch.nn.Identity(), attn)
    with pytest.raises(ValueError, match="1 is 'lite_mla'"):
        with record_attention(net):
            pass


def test_every_mechanism_without_weights_never_reaches_the_core():
    """The spec's ``weights_note`` is the declaration the core's sweeps read: true of every mechanism declaring it."""
    weightless = [n for n in list_attention() if get_attention_spec(n).weights_note]
    assert "lite_mla" in weightless
    for name in weightless:
        attn, shape = get_attention_spec(name).example()
        seen: list[int] = []
        handle = register_attention_hook(lambda q, k, v, info, seen=seen: seen.append(1), weights=False)
        try:
            with torch.no_grad():
                attn(torch.randn(shape))
        finally:
            handle.remove()
        assert seen == [], name


def test_prefix_tokens_read_every_token_as_its_own_one_pixel_map():
    """``attend_prefix``: each token's aggregation is the depthwise kernel's centre tap, then the grouped 1x1; the
    prefix queries run the same ReLU linear attention over every token, then ``proj`` and ``norm``."""
    attn = _randomise(create_attention("lite_mla", 16, 2, scales=(3,)))
    B, P, N = 2, 2, 11
    tokens = torch.randn(B, N, 16)
    with torch.no_grad():
        out = attn.attend_prefix(tokens[:, :P], tokens)
        # each token alone as a 1x1 map: timm's computation on it gives its q, k, v rows
        qkv = F.linear(tokens, attn.qkv.weight)  # [B, N, 48]
        dw, pw = attn.aggreg[0]
        agg = F.conv2d(qkv.reshape(B * N, 48, 1, 1), dw.weight, padding=1, groups=48)
        agg = F.conv2d(agg, pw.weight, groups=pw.groups).reshape(B, N, 48)
        ms = torch.cat([qkv, agg], -1).reshape(B, N, 4, 24).transpose(1, 2)  # [B, G=4, N, 3·8]
        q, k, v = ms.split(8, dim=-1)
        a = F.relu(q[:, :, :P]) @ F.relu(k).transpose(-1, -2)  # [B, G, P, N]
        heads = (a @ v) / (a.sum(-1, keepdim=True) + 1e-5)
        ref = F.linear(heads.transpose(1, 2).reshape(B, P, 32), attn.proj.weight)
        bn = attn.norm
        ref = (ref - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_residual_is_added_in_training_and_at_inference():
    attn = _randomise(create_attention("lite_mla", 16, 2))
    x, r = torch.randn(1, 4, 5, 16), torch.randn(1, 4, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, AttentionCall(residual=r)), r + attn(x), atol=1e-6, rtol=1e-6)
        attn.train()
        torch.testing.assert_close(attn(x, AttentionCall(residual=r)), r + attn(x), atol=1e-6, rtol=1e-6)


def test_transfer_slots_name_each_heads_q_k_v_rows():
    """timm's channel order: head ``h`` owns rows ``[3h·hd, 3(h+1)·hd)`` of ``qkv``, as ``[q_h | k_h | v_h]``."""
    from vit_attention.attention.transfer import get_projections

    attn = create_attention("lite_mla", 16, 2)
    proj = get_projections(attn)
    w = attn.qkv.weight.detach().reshape(2, 3, 8, 16)  # [nh, (q, k, v), hd, C]
    for i, role in enumerate("qkv"):
        torch.testing.assert_close(proj.weight[role], w[:, i].reshape(16, 16), atol=0, rtol=0)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="attn_drop=0.1: lite_mla has no attention weights to drop"):
        create_attention("lite_mla", 16, 2, attn_drop=0.1)
    with pytest.raises(ValueError, match="scales must be a sequence of odd positive ints"):
        create_attention("lite_mla", 16, 2, scales=(4,))
    with pytest.raises(ValueError, match="scales must be"):
        create_attention("lite_mla", 16, 2, scales=5)
    with pytest.raises(ValueError, match="eps must be"):
        create_attention("lite_mla", 16, 2, eps=-1.0)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_attention("lite_mla", 30, 4)
    with pytest.raises(ValueError, match="expected q"):
        relu_linear_attention(torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 4, 8))


def test_flops_are_linear_in_the_pixels():
    attn = create_attention("lite_mla", 32, 2)
    small, large = attn.flops((1, 8, 8, 32)), attn.flops((1, 16, 16, 32))
    assert large == 4 * small


def test_transfer_init_makes_each_scale_repeat_the_projection_and_the_norm_neutral():
    attn = _randomise(create_attention("lite_mla", 16, 2, scales=(3, 5), qkv_bias=True))
    notes = attn.transfer_init()
    assert any(n.startswith("aggreg: the identity") for n in notes) and any(n.startswith("proj:") for n in notes)
    x = torch.randn(2, 5, 6, 16)
    with torch.no_grad():
        ms = attn.multi_scale_qkv(x)
        qkv = attn.qkv(x)
        torch.testing.assert_close(ms, torch.cat([qkv] * 3, dim=-1), atol=1e-6, rtol=1e-6)
        y = torch.randn(7, 16)
        torch.testing.assert_close(attn.norm(y), y, atol=1e-6, rtol=1e-6)
