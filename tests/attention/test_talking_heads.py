"""Talking-heads attention against a dense implementation written here from CaiT's formulas (Touvron et al.,
ICCV 2021, arXiv 2103.17239)."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention
from vit_attention.attention import AttentionCall
from vit_attention.functional import switched


def _dense(x: torch.Tensor, sd: dict[str, torch.Tensor], nh: int) -> torch.Tensor:
    """``L = (q·s) kᵀ`` -> mix heads (proj_l) -> softmax over keys -> mix heads (proj_w) -> ``@ v`` -> proj."""
    B, N, C = x.shape
    hd = C // nh
    qkv = (x @ sd["qkv.weight"].T + sd["qkv.bias"]).reshape(B, N, 3, nh, hd).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]  # [B, nh, N, hd]
    logits = (q * hd ** -0.5) @ k.transpose(-2, -1)  # [B, nh, N, N]
    logits = torch.einsum("bhnm,gh->bgnm", logits, sd["proj_l.weight"]) + sd["proj_l.bias"][:, None, None]
    w = logits.softmax(-1)
    w = torch.einsum("bhnm,gh->bgnm", w, sd["proj_w.weight"]) + sd["proj_w.bias"][:, None, None]
    out = (w @ v).transpose(1, 2).reshape(B, N, C)
    return out @ sd["proj.weight"].T + sd["proj.bias"]


@pytest.mark.parametrize("fused", [True, False])
def test_matches_the_dense_formula(fused: bool) -> None:
    torch.manual_seed(0)
    attn = create_attention("talking_heads", 48, 6).double().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    assert set(attn.state_dict()) == {f"{m}.{t}" for m in ("qkv", "proj_l", "proj_w", "proj")
                                      for t in ("weight", "bias")}  # timm's TalkingHeadAttn keys
    x = torch.randn(2, 13, 48, dtype=torch.float64)
    with torch.no_grad(), switched(attn, fused_attention=fused):
        out = attn(x)
    ref = _dense(x, attn.state_dict(), 6)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    assert out.abs().max() > 0.1


def test_context_is_refused() -> None:
    attn = create_attention("talking_heads", 16, 2)
    with pytest.raises(ValueError, match="context"):
        attn(torch.randn(1, 5, 16), AttentionCall(context=torch.randn(1, 3, 16)))


def test_mix_heads_fast_path_equals_the_module_call() -> None:
    """The batched ``W @ a + b`` path == ``Linear`` on the heads-last view (a hook forces the latter); grads too."""
    from vit_attention.attention.talking_heads import mix_heads

    torch.manual_seed(0)
    mix = torch.nn.Linear(4, 4)
    a = torch.randn(2, 3, 4, 5, 7, requires_grad=True)  # two leading batch dims, N != M
    fast = mix_heads(a, mix)
    (g_fast,) = torch.autograd.grad(fast.square().sum(), a)
    handle = mix.register_forward_hook(lambda m, i, o: None)
    try:
        slow = mix_heads(a, mix)
        (g_slow,) = torch.autograd.grad(slow.square().sum(), a)
    finally:
        handle.remove()
    assert fast.shape == a.shape and fast.is_contiguous()
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(g_fast, g_slow)
    want = torch.einsum("gh,hm->gm", mix.weight, a[0, 1, :, 2]) + mix.bias[:, None]  # head g of query row 2
    torch.testing.assert_close(fast[0, 1, :, 2], want)


def test_mix_heads_before_softmax_drops_only_a_softmax_invariant_bias() -> None:
    """``before_softmax``: no bias (a per-head constant), ``scale`` folded into the weight; same softmax."""
    from vit_attention.attention.talking_heads import mix_heads

    torch.manual_seed(1)
    mix = torch.nn.Linear(3, 3)
    with torch.no_grad():
        mix.bias.normal_(0, 2.0)  # a large bias: a wrong drop would show
    a = torch.randn(2, 3, 6, 6)
    full = mix((a * 0.5).movedim(1, 3)).movedim(3, 1)
    with torch.no_grad():
        fast = mix_heads(a, mix, scale=0.5, before_softmax=True)
    assert not torch.allclose(fast, full)  # the bias is left out at inference ...
    torch.testing.assert_close(fast.softmax(-1), full.softmax(-1))  # ... and the softmax cannot tell
    torch.testing.assert_close(mix_heads(a, mix, scale=0.5), full)
    torch.testing.assert_close(mix_heads(a, mix, scale=0.5, before_softmax=True), full)  # autograd: bias kept
