"""Class attention against a dense implementation written here from CaiT's formulas (Touvron et al., ICCV 2021,
arXiv 2103.17239)."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention
from vit_attention.attention import AttentionCall
from vit_attention.functional import switched


def _dense_cls(u: torch.Tensor, sd: dict[str, torch.Tensor], nh: int) -> torch.Tensor:
    """``q = W_q u₀`` (cls only), ``k = W_k u``, ``v = W_v u`` (all tokens); ``proj(softmax(q kᵀ s) v)`` [B, 1, C]."""
    B, N, C = u.shape
    hd = C // nh
    q = (u[:, 0] @ sd["q.weight"].T + sd["q.bias"]).reshape(B, nh, 1, hd)
    k = (u @ sd["k.weight"].T + sd["k.bias"]).reshape(B, N, nh, hd).transpose(1, 2)  # [B, nh, N, hd]
    v = (u @ sd["v.weight"].T + sd["v.bias"]).reshape(B, N, nh, hd).transpose(1, 2)
    w = ((q @ k.transpose(-2, -1)) * hd ** -0.5).softmax(-1)  # [B, nh, 1, N]
    out = (w @ v).transpose(1, 2).reshape(B, 1, C)
    return out @ sd["proj.weight"].T + sd["proj.bias"]


def _module() -> torch.nn.Module:
    torch.manual_seed(0)
    attn = create_attention("class_attn", 48, 6).double().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    return attn


@pytest.mark.parametrize("fused", [True, False])
def test_cait_call_matches_the_dense_formula(fused: bool) -> None:
    attn = _module()
    assert set(attn.state_dict()) == {f"{m}.{t}" for m in ("q", "k", "v", "proj")
                                      for t in ("weight", "bias")}  # timm's ClassAttn keys
    u = torch.randn(2, 17, 48, dtype=torch.float64)  # norm([x_cls; x_patches])
    with torch.no_grad(), switched(attn, fused_attention=fused):
        out = attn(u[:, :1], AttentionCall(context=u))  # the class-attention block's call
    assert out.shape == (2, 1, 48)
    torch.testing.assert_close(out, _dense_cls(u, attn.state_dict(), 6), atol=1e-6, rtol=0)
    assert out.abs().max() > 0.1


def test_without_context_every_token_queries_x() -> None:
    attn = _module()
    u = torch.randn(2, 9, 48, dtype=torch.float64)
    with torch.no_grad():
        out = attn(u)
    assert out.shape == u.shape
    rows = torch.cat([_dense_cls(torch.cat([u[:, i:i + 1], u[:, :i], u[:, i + 1:]], 1), attn.state_dict(), 6)
                      for i in range(9)], 1)  # row i: token i queries all tokens (key order does not matter)
    torch.testing.assert_close(out, rows, atol=1e-6, rtol=0)


def test_flops_of_the_cait_call() -> None:
    attn = create_attention("class_attn", 48, 6)
    N, C = 17, 48  # 16 patches + cls
    assert attn.flops((1, 1, C), context_len=N) == 2 * C * C + 2 * N * C * C + 2 * N * C
