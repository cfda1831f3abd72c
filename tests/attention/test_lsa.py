"""Twins locally-grouped self-attention (attention/lsa.py): both padding policies against a written-out oracle."""

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_attention
from vit_attention.analysis.flops import measure_flops
from vit_attention.attention import LocallyGroupedAttention
from vit_attention.functional import register_attention_hook, switched


def _oracle(attn: LocallyGroupedAttention, x: torch.Tensor, *, pad_mask: bool) -> torch.Tensor:
    """Per-group attention with plain ops: zero-pad, project every slot, attend (padded keys masked or not), crop."""
    B, H, W, C = x.shape
    ws_h, ws_w = attn.fitted_window(H, W)[0]  # the window, clamped to a smaller map unless clamp_window=False
    nh, hd = attn.num_heads, attn.head_dim
    ph, pw = (-H) % ws_h, (-W) % ws_w
    xp = F.pad(x, (0, 0, 0, pw, 0, ph))  # [B, Hp, Wp, C]
    valid = F.pad(torch.ones(1, H, W), (0, pw, 0, ph)).bool()  # [1, Hp, Wp]
    Hp, Wp = H + ph, W + pw
    out = torch.zeros(B, Hp, Wp, C)
    for i in range(0, Hp, ws_h):
        for j in range(0, Wp, ws_w):
            g = xp[:, i:i + ws_h, j:j + ws_w].reshape(B, -1, C)  # [B, N, C]
            keep = valid[:, i:i + ws_h, j:j + ws_w].reshape(1, 1, 1, -1)
            q, k, v = (g @ attn.qkv.weight.T + attn.qkv.bias).view(B, -1, 3, nh, hd).permute(2, 0, 3, 1, 4)
            logits = (q @ k.transpose(-2, -1)) * hd ** -0.5  # [B, nh, N, N]
            if pad_mask:
                logits = logits.masked_fill(~keep, float("-inf"))
            o = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, ws_h, ws_w, C)
            out[:, i:i + ws_h, j:j + ws_w] = o
    return attn.proj(out[:, :H, :W])


def _randomise(m: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


@pytest.mark.parametrize("clamp", [True, False])
@pytest.mark.parametrize("pad_mask", [False, True])
@pytest.mark.parametrize("hw", [(8, 12), (7, 9), (3, 5), (10, 4)])
def test_equals_oracle_both_padding_policies(hw, pad_mask, clamp):
    torch.manual_seed(0)
    attn = _randomise(LocallyGroupedAttention(24, 3, window_size=4, pad_mask=pad_mask, clamp_window=clamp))
    assert attn.fitted_window(*hw)[0] == ((min(hw[0], 4), min(hw[1], 4)) if clamp else (4, 4))
    x = torch.randn(2, *hw, 24)
    with torch.no_grad():
        ref = _oracle(attn, x, pad_mask=pad_mask)
        for fused in (True, False):
            with switched(attn, fused_attention=fused):
                torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=1e-5)


def test_padding_policies_differ_only_where_padding_exists():
    torch.manual_seed(0)
    a = _randomise(LocallyGroupedAttention(16, 2, window_size=4))
    b = LocallyGroupedAttention(16, 2, window_size=4, pad_mask=True).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        x = torch.randn(1, 8, 8, 16)
        torch.testing.assert_close(a(x), b(x))  # multiples of the group: no padding, same result
        x = torch.randn(1, 6, 6, 16)
        ya, yb = a(x), b(x)
    assert not torch.allclose(ya, yb, atol=1e-4)
    torch.testing.assert_close(ya[:, :4, :4], yb[:, :4, :4])  # the first group is whole: no padded keys


def test_masked_padding_gives_padded_keys_zero_weight():
    attn = _randomise(LocallyGroupedAttention(16, 2, window_size=4, pad_mask=True))
    seen = []
    handle = register_attention_hook(lambda w, info: seen.append((w, info["layout"])))
    try:
        with torch.no_grad():
            attn(torch.randn(1, 5, 6, 16))
    finally:
        handle.remove()
    (w, layout), = seen
    key_pos = layout.key_pos.reshape(-1)  # window slots: -1 = padding
    pad = (key_pos < 0).view(-1, 16)  # [nW, N]
    w = w.view(1, pad.shape[0], 2, 16, 16)  # [B, nW, nh, N, N] (windows folded into heads)
    assert pad.any()
    assert float(w.masked_select(pad[None, :, None, None, :].expand_as(w)).abs().max()) == 0.0


def test_registered_with_timm_keys_and_no_bias_or_shift():
    attn = create_attention("lsa", 32, 4, window_size=7)
    assert isinstance(attn, LocallyGroupedAttention)
    assert sorted(attn.state_dict()) == ["proj.bias", "proj.weight", "qkv.bias", "qkv.weight"]
    assert attn.shift_size == (0, 0)
    assert not create_attention("lsa", 32, 4, qkv_bias=False).state_dict().get("qkv.bias")


@pytest.mark.parametrize("hw", [(14, 14), (9, 11)])
def test_flops_formula(hw):
    H, W = hw
    attn = LocallyGroupedAttention(64, 2, window_size=7)
    hw_p = (H + (-H) % 7) * (W + (-W) % 7)
    qkv_tokens = H * W + (hw_p != H * W)  # one zero token's projection is shared by every padded slot
    expected = 3 * qkv_tokens * 64 * 64 + H * W * 64 * 64 + 2 * 49 * hw_p * 64
    assert attn.flops((1, H, W, 64)) == expected
    assert measure_flops(attn, (1, H, W, 64))[0] == expected
    assert measure_flops(LocallyGroupedAttention(64, 2, window_size=7, pad_mask=True), (1, H, W, 64))[0] == expected


def test_bad_arguments_raise_naming_them():
    with pytest.raises(TypeError, match="pad_mask"):
        LocallyGroupedAttention(16, 2, pad_mask="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window_size"):
        LocallyGroupedAttention(16, 2, window_size=0)
    with pytest.raises(ValueError, match="allow_padding"):
        LocallyGroupedAttention(16, 2, window_size=4, allow_padding=False)(torch.randn(1, 5, 5, 16))


def test_backward_runs_with_mask():
    attn = LocallyGroupedAttention(16, 2, window_size=4, pad_mask=True).train()
    x = torch.randn(2, 5, 7, 16, requires_grad=True)
    attn(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
