"""MobileViT v1 attention across unfolded patches (attention/unfold.py, functional/unfold.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_attention
from vit_attention.analysis import record_attention
from vit_attention.attention import AttentionCall
from vit_attention.functional import switched
from vit_attention.functional.unfold import fold_patches, patch_positions, unfold_patches


def _randomise(m: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return m.eval()


def _timm_rule(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """timm ``MobileVitBlock``'s unfold / fold (NCHW reshapes, written out) around plain MHSA, with its
    bilinear resize rule; independent of the library's unfold helpers."""
    B, H, W, C = x.shape
    p, nh, hd = attn.patch_size, attn.num_heads, attn.head_dim
    t = x.permute(0, 3, 1, 2)
    Hn, Wn = -(-H // p) * p, -(-W // p) * p
    if (Hn, Wn) != (H, W):
        t = F.interpolate(t, size=(Hn, Wn), mode="bilinear", align_corners=False)
    gh, gw = Hn // p, Wn // p
    t = t.reshape(B * C * gh, p, gw, p).transpose(1, 2).reshape(B, C, gh * gw, p * p)
    t = t.transpose(1, 3).reshape(B * p * p, gh * gw, C)  # [B·P, N, C]
    q, k, v = (t @ attn.qkv.weight.T + attn.qkv.bias).view(B * p * p, -1, 3, nh, hd).permute(2, 0, 3, 1, 4)
    o = ((q @ k.transpose(-2, -1)) * hd ** -0.5).softmax(-1) @ v  # [B·P, nh, N, hd]
    o = o.transpose(1, 2).reshape(B * p * p, -1, C) @ attn.proj.weight.T + attn.proj.bias
    o = o.reshape(B, p * p, gh * gw, C).transpose(1, 3).reshape(B * C * gh, gw, p, p)
    o = o.transpose(1, 2).reshape(B, C, Hn, Wn)
    if (Hn, Wn) != (H, W):
        o = F.interpolate(o, size=(H, W), mode="bilinear", align_corners=False)
    return o.permute(0, 2, 3, 1)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(("H", "W", "p"), [(8, 10, 2), (7, 9, 2), (9, 6, 3), (5, 5, 1)])
def test_equals_the_reference_unfold_and_resize_rule(fused, H, W, p):
    attn = _randomise(create_attention("unfold", 32, 4, patch_size=p))
    x = torch.randn(2, H, W, 32)
    with torch.no_grad(), switched(attn, fused_attention=fused):
        out = attn(x)
        ref = _timm_rule(attn, x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, ref, atol=1e-5 * float(ref.abs().max()), rtol=0)


def test_residual_keyword_adds_the_input():
    attn = _randomise(create_attention("unfold", 16, 2, patch_size=2))
    for H, W in [(8, 8), (7, 9)]:
        x, r = torch.randn(1, H, W, 16), torch.randn(1, H, W, 16)
        with torch.no_grad():
            torch.testing.assert_close(attn(x, AttentionCall(residual=r)), r + attn(x), atol=1e-5, rtol=1e-5)


def test_masked_padding_equals_a_dense_masked_oracle():
    """``resize='mask'``: pixel (y, x) attends exactly to the real pixels with the same offset mod p."""
    H, W, p, nh = 7, 9, 2, 2
    attn = _randomise(create_attention("unfold", 16, nh, patch_size=p, resize="mask"))
    x = torch.randn(2, H, W, 16)
    tokens = x.reshape(2, H * W, 16)
    q, k, v = (tokens @ attn.qkv.weight.T + attn.qkv.bias).view(2, H * W, 3, nh, 8).permute(2, 0, 3, 1, 4)
    ys, xs = torch.arange(H * W) // W, torch.arange(H * W) % W
    same = (ys[:, None] % p == ys[None] % p) & (xs[:, None] % p == xs[None] % p)  # [HW, HW]
    logits = (q @ k.transpose(-2, -1) * 8 ** -0.5).masked_fill(~same, float("-inf"))
    ref = (logits.softmax(-1) @ v).transpose(1, 2).reshape(2, H * W, 16) @ attn.proj.weight.T + attn.proj.bias
    with torch.no_grad():
        out = attn(x)
    torch.testing.assert_close(out.reshape(2, H * W, 16), ref, atol=1e-5, rtol=1e-5)


def test_unfold_order_and_round_trip():
    x = torch.arange(2 * 4 * 6 * 3, dtype=torch.float32).view(2, 4, 6, 3)
    u = unfold_patches(x, 2)  # [2, 4, 6, 3]: P = 4 offsets, N = 6 patches
    assert u.shape == (2, 4, 6, 3)
    assert torch.equal(u[0, 1, 2], x[0, 0, 5])  # offset (0, 1), patch (0, 2) -> pixel (0, 5)
    assert torch.equal(u[1, 2, 4], x[1, 3, 2])  # offset (1, 0), patch (1, 1) -> pixel (3, 2)
    assert torch.equal(fold_patches(u, 2, (2, 3)), x)
    pos = patch_positions(3, 5, 2)  # padded to 4 x 6
    assert pos.shape == (4, 6) and int((pos >= 0).sum()) == 15 and pos[0, 0] == 0 and pos[3, 5] == -1


def test_recorded_maps_cover_the_offset_class():
    attn = _randomise(create_attention("unfold", 16, 2, patch_size=2))
    with record_attention(attn) as rec, torch.no_grad():
        attn(torch.randn(1, 6, 8, 16))
    (r,) = rec.records
    assert r.grid == (6, 8) and r.layout.groups == 4 and r.weights.shape == (4, 2, 12, 12)  # [B·G, nh, n, m]
    m = r.query_map((3, 2))[0]  # row odd, col even: only those pixels
    rows, cols = torch.meshgrid(torch.arange(6), torch.arange(8), indexing="ij")
    assert torch.equal(m > 0, (rows % 2 == 1) & (cols % 2 == 0))
    torch.testing.assert_close(m.sum(), torch.tensor(1.0))


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="patch_size"):
        create_attention("unfold", 16, 2, patch_size=0)
    with pytest.raises(ValueError, match="resize"):
        create_attention("unfold", 16, 2, resize="nearest")
    attn = create_attention("unfold", 16, 2)
    with pytest.raises(ValueError, match=r"\[B, H, W, 16\]"):
        attn(torch.randn(1, 10, 16))
    with pytest.raises(ValueError, match="feat_size"):
        attn(torch.randn(1, 4, 4, 16), AttentionCall(feat_size=(2, 8)))
