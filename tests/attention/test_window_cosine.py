"""SwinV2 scaled cosine window attention (attention/cosine_window.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

from vit_attention.attention import create_attention
from vit_attention.attention.cosine_window import CosineWindowAttention
from vit_attention.functional import switched
from vit_attention.functional.window import log_relative_coords_table, relative_position_index, window_partition


def _randomised(**kw) -> CosineWindowAttention:
    attn = CosineWindowAttention(16, 2, window_size=4, **kw)
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return attn.eval()


def test_matches_formula_on_one_window():
    attn = _randomised()
    x = torch.randn(1, 4, 4, 16)
    win = window_partition(x, 4)  # [1, 16, 16]
    qkv = F.linear(win, attn.qkv.weight, torch.cat([attn.q_bias, torch.zeros(16), attn.v_bias]))
    q, k, v = qkv.view(1, 16, 3, 2, 8).permute(2, 0, 3, 1, 4)
    cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
    temp = attn.logit_scale.clamp(max=math.log(100)).exp()
    table = attn.cpb_mlp(log_relative_coords_table(4).view(-1, 2))  # [49, nh]
    bias = 16 * torch.sigmoid(table[relative_position_index(4).view(-1)].view(16, 16, 2).permute(2, 0, 1))
    out = ((cos * temp + bias).softmax(-1) @ v).transpose(1, 2).reshape(1, 16, 16)
    expect = attn.proj(out).view(1, 4, 4, 16)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), expect, atol=1e-5, rtol=1e-5)
        with switched(attn, fused_attention=False):
            torch.testing.assert_close(attn(x), expect, atol=1e-5, rtol=1e-5)


def test_logit_scale_is_clamped_at_log_100():
    attn = _randomised(shift_size=2)
    x = torch.randn(1, 8, 8, 16)
    with torch.no_grad():
        attn.logit_scale.fill_(math.log(100.0))
        a = attn(x)
        attn.logit_scale.fill_(8.0)
        b = attn(x)
        attn.logit_scale.fill_(1.0)
        c = attn(x)
    torch.testing.assert_close(a, b)
    assert (a - c).abs().max() > 1e-3


def test_bias_is_bounded_and_pretrained_window_changes_it():
    a = _randomised()
    b = CosineWindowAttention(16, 2, window_size=4, pretrained_window_size=8).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        ba, bb = a.position_bias(), b.position_bias()
    assert ba.shape == (2, 16, 16) and ba.min() > 0 and ba.max() < 16
    assert (ba - bb).abs().max() > 1e-4


def test_no_key_bias_and_qkv_bias_option():
    attn = _randomised()
    packed = attn.project_qkv(torch.zeros(1, 1, 16))[0, 0]
    assert torch.equal(packed[:16], attn.q_bias) and torch.all(packed[16:32] == 0)
    assert torch.equal(packed[32:], attn.v_bias)
    plain = CosineWindowAttention(16, 2, window_size=4, qkv_bias=False)
    assert plain.q_bias is None and "q_bias" not in plain.state_dict()


def test_state_dict_keys_are_timm_layout():
    keys = set(CosineWindowAttention(16, 2, window_size=4).state_dict())
    assert keys == {"qkv.weight", "q_bias", "v_bias", "logit_scale", "cpb_mlp.0.weight", "cpb_mlp.0.bias",
                    "cpb_mlp.2.weight", "proj.weight", "proj.bias"}


def test_cpb_cache_refreshes_and_trains():
    attn = _randomised(shift_size=2)
    x = torch.randn(2, 6, 10, 16)
    with torch.no_grad():
        y1 = attn(x)
        attn.cpb_mlp[2].weight.mul_(3.0)
        y2 = attn(x)
    assert (y1 - y2).abs().max() > 1e-4
    attn.train()
    attn(x).square().mean().backward()
    assert attn.cpb_mlp[0].weight.grad.abs().sum() > 0 and attn.logit_scale.grad is not None


def test_cpb_cache_hits_until_an_edit_and_follows_dtype():
    attn = _randomised(shift_size=2)
    x = torch.randn(2, 6, 10, 16)
    with torch.no_grad():
        b1 = attn.position_bias()
        assert attn.position_bias() is b1  # cached while the MLP is unchanged
        attn.cpb_mlp[0].bias.add_(0.5)  # one of the three MLP parameters, in place
        b2 = attn.position_bias()
        assert b2 is not b1 and (b2 - b1).abs().max() > 1e-4
        attn.to(torch.float64)
        out = attn(x.double())
    assert out.dtype == torch.float64 and attn.position_bias().dtype == torch.float64


def test_errors():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_attention("cosine_window", 18, 4)
    with pytest.raises(ValueError, match="smaller than window_size"):
        CosineWindowAttention(16, 2, window_size=4, shift_size=4)
