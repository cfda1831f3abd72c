"""Talking-heads attention against a dense implementation written here from CaiT's formulas (FAMILIES.md §5)."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention
from vit_attention.functional import fused_attention


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
    with torch.no_grad(), fused_attention(fused):
        out = attn(x)
    ref = _dense(x, attn.state_dict(), 6)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    assert out.abs().max() > 0.1


def test_context_is_refused() -> None:
    attn = create_attention("talking_heads", 16, 2)
    with pytest.raises(ValueError, match="context"):
        attn(torch.randn(1, 5, 16), context=torch.randn(1, 3, 16))
