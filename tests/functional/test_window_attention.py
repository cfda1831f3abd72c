"""``functional.window_attention``: the plain function of tensors against a step-by-step reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vit_attention.functional.window import shift_window_mask, window_partition, window_reverse
from vit_attention.functional.window_attention import window_attention, window_geometry, window_tokens


def _reference(x, w_qkv, bias, nh, ws, shift, pad_first, temperature=None):
    """Roll / pad / partition / attend / reverse / unroll / crop, one step at a time (torchvision or timm order)."""
    B, H, W, C = x.shape
    (Hp, Wp), (sh, sw) = window_geometry(H, W, ws, shift, pad_first=pad_first)
    pad = (0, 0, 0, Wp - W, 0, Hp - H)
    y = torch.roll(F.pad(x, pad), (-sh, -sw), (1, 2)) if pad_first else F.pad(torch.roll(x, (-sh, -sw), (1, 2)), pad)
    win = window_partition(y, ws)  # [B·nW, N, C]
    q, k, v = (win @ w_qkv.t()).view(win.shape[0], -1, 3, nh, C // nh).permute(2, 0, 3, 1, 4)
    if temperature is None:
        logits = q @ k.transpose(-2, -1) / math.sqrt(C // nh)
    else:
        logits = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) * temperature
    region = shift_window_mask(Hp, Wp, ws, (sh, sw))  # [nW, N, N]
    logits = logits.view(B, -1, nh, *logits.shape[-2:]) + bias + region[:, None]
    out = (logits.softmax(-1).flatten(0, 1) @ v).transpose(1, 2).reshape(win.shape)  # [B·nW, N, C]
    out = window_reverse(out, ws, Hp, Wp)
    if pad_first:
        return torch.roll(out, (sh, sw), (1, 2))[:, :H, :W]
    return torch.roll(out[:, :H, :W], (sh, sw), (1, 2))


@pytest.mark.parametrize("hw", [(8, 8), (7, 9), (4, 4), (3, 10)])
@pytest.mark.parametrize("shift", [(0, 0), (2, 2), (0, 1)])
@pytest.mark.parametrize("pad_first", [True, False])
@pytest.mark.parametrize("cosine", [False, True])
def test_matches_the_step_by_step_reference(hw, shift, pad_first, cosine):
    torch.manual_seed(0)
    B, C, nh, ws = 2, 8, 2, (4, 4)
    x = torch.randn(B, *hw, C)
    w_qkv = torch.randn(3 * C, C) / math.sqrt(C)
    bias = torch.randn(nh, 16, 16)
    temperature = torch.tensor([3.0, 7.0]).view(nh, 1, 1) if cosine else None
    tokens = window_tokens(x, ws, shift, pad_first=pad_first)
    out = window_attention(tokens @ w_qkv.t(), bias, feat_size=hw, num_heads=nh, window_size=ws, shift_size=shift,
                           pad_first=pad_first, logit_scale=temperature)  # [B, H·W, C]
    ref = _reference(x, w_qkv, bias, nh, ws, shift, pad_first, temperature)
    torch.testing.assert_close(out.view(B, *hw, C), ref, atol=1e-5, rtol=1e-5)


def test_window_tokens_layouts_and_the_bias_cache():
    x = torch.randn(2, 8, 8, 4)
    assert window_tokens(x, 4).shape == (8, 16, 4)  # neither shifted nor padded: windows
    assert window_tokens(x, 4, 2).shape == (2, 64, 4)  # shifted: the map's tokens
    padded = window_tokens(torch.randn(2, 7, 8, 4), 4)
    assert padded.shape == (2, 57, 4) and padded[:, -1].abs().max() == 0  # + one zero token
    cache: dict = {}
    qkv = torch.randn(2, 64, 12)
    bias = torch.randn(1, 16, 16)
    a = window_attention(qkv, bias, feat_size=(8, 8), num_heads=1, window_size=4, shift_size=2, bias_cache=cache)
    (key, combined), = cache.items()
    b = window_attention(qkv, bias, feat_size=(8, 8), num_heads=1, window_size=4, shift_size=2, bias_cache=cache)
    assert cache[key] is combined and torch.equal(a, b) and combined.shape == (1, 4, 16, 16)
