"""Outlook attention (VOLO): an independent loop-and-sum oracle, timm ``OutlookAttention`` fixtures, the recorded
window maps, argument checks.

The oracle walks every window and every output slot with plain Python loops: the window's pooled token (the mean
of the ``s x s`` cells inside the map), its generated logits, the softmax over the ``K²`` source slots (zeros past
the border) and the sum of every window's slot outputs at their pixels. No unfold / fold.
Tolerance: max |ours - ref| <= 1e-5 * max |ref|.
"""

from __future__ import annotations

import math

import pytest
import torch
from fixture_utils import assert_parity, load_fixture

from vit_attention.analysis import record_attention
from vit_attention.attention import AttentionCall, create_attention, get_attention_spec
from vit_attention.attention.outlook import OutlookAttention
from vit_attention.functional import switched
from vit_attention.functional.outlook import _fold_by_shifts, outlook_fold, outlook_layout, outlook_unfold


def _oracle(attn: OutlookAttention, x: torch.Tensor) -> torch.Tensor:
    """Outlook attention by loops over windows and slots: ``[B, H, W, C] -> [B, H, W, C]``."""
    B, H, W, C = x.shape
    K, p, s, nh = attn.kernel_size, attn.padding, attn.stride, attn.num_heads
    hd = C // nh
    v = x @ attn.v.weight.T + (attn.v.bias if attn.v.bias is not None else 0)  # [B, H, W, C]
    out = torch.zeros(B, H, W, C)
    for i in range(math.ceil(H / s)):
        for j in range(math.ceil(W / s)):
            cell = x[:, i * s:(i + 1) * s, j * s:(j + 1) * s].mean(dim=(1, 2))  # [B, C]: ceil-mode average
            logits = (cell @ attn.attn.weight.T + attn.attn.bias).view(B, nh, K * K, K * K) * hd ** -0.5
            weights = logits.softmax(dim=-1)  # [B, nh, target, source]
            src = torch.zeros(B, nh, K * K, hd)
            slots = [(i * s - p + a, j * s - p + b) for a in range(K) for b in range(K)]
            for n, (r, c) in enumerate(slots):
                if 0 <= r < H and 0 <= c < W:
                    src[:, :, n] = v[:, r, c].view(B, nh, hd)
            res = weights @ src  # [B, nh, K², hd]
            for n, (r, c) in enumerate(slots):
                if 0 <= r < H and 0 <= c < W:
                    out[:, r, c] += res[:, :, n].reshape(B, C)  # overlapping windows add up
    return out @ attn.proj.weight.T + attn.proj.bias


CASES = [  # (kwargs, (H, W))
    (dict(stride=2), (6, 6)),
    (dict(stride=2), (5, 7)),  # odd sides: ceil-mode pooling, windows past the border
    (dict(stride=1), (4, 5)),
    (dict(kernel_size=5, stride=2, qkv_bias=True), (7, 6)),
    (dict(kernel_size=1, stride=3), (7, 8)),  # 1x1 windows on a strided grid: many pixels in no window
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("kwargs,size", CASES, ids=[str(i) for i in range(len(CASES))])
def test_equals_the_loop_oracle(kwargs: dict, size: tuple[int, int], fused: bool) -> None:
    torch.manual_seed(0)
    attn = OutlookAttention(32, 4, **kwargs).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))
        x = torch.randn(2, *size, 32)
        with switched(attn, fused_attention=fused):
            out = attn(x)
        ref = _oracle(attn, x)
    assert out.shape == ref.shape == x.shape
    assert_parity(out, ref)


@pytest.mark.parity
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("stride", [2, 1])
def test_timm_outlook_attention_fixture(stride: int, fused: bool) -> None:
    """timm 1.0.31 ``OutlookAttention`` weights load as they are (keys ``v``, ``attn``, ``proj``) and give its
    outputs at stride 2 (a 7x9 map) and stride 1 (5x6)."""
    _, t, cfg = load_fixture("timm_volo_outlook")
    state = {k.split(".", 1)[1]: v for k, v in t.items() if k.startswith(f"state_dict_s{stride}.")}
    attn = OutlookAttention(cfg["dim"], cfg["num_heads"], kernel_size=cfg["kernel_size"], padding=cfg["padding"],
                            stride=stride).eval()
    attn.load_state_dict(state)
    with torch.no_grad(), switched(attn, fused_attention=fused):
        out = attn(t[f"input_s{stride}"])
    assert_parity(out, t[f"output_s{stride}"])


def test_fold_sums_overlaps_and_unfold_fold_round_trip_counts_them() -> None:
    """fold(unfold(ones)) counts how many windows hold each pixel: 1, 2 or 4 at stride 2 (interior rows 1, 2, 1, 2 /
    2, 4, 2, 4), 4, 6 or 9 at stride 1; nothing is averaged."""
    ones = torch.ones(1, 6, 6, 4)
    s2 = outlook_fold(outlook_unfold(ones, 2, 3, 1, 2), (6, 6), 3, 1, 2)[0, ..., 0]
    assert s2[0, :4].tolist() == [1, 2, 1, 2] and s2[1, :4].tolist() == [2, 4, 2, 4]
    s1 = outlook_fold(outlook_unfold(ones, 2, 3, 1, 1), (6, 6), 3, 1, 1)[0, ..., 0]
    assert s1[0, 0] == 4 and s1[0, 1] == 6 and s1[2, 2] == 9


@pytest.mark.parametrize("size,K,p,s", [((6, 6), 3, 1, 2), ((5, 7), 3, 1, 2), ((4, 5), 3, 1, 1), ((7, 6), 5, 2, 2),
                                         ((7, 8), 1, 0, 3)])
def test_the_capture_fold_equals_torchs_fold(size: tuple[int, int], K: int, p: int, s: int) -> None:
    """The fold written with pads and adds (what export / ONNX record: opset 17 has no col2im) is ``F.fold``'s sum."""
    h, w = math.ceil(size[0] / s), math.ceil(size[1] / s)
    out = torch.randn(2, h * w, 2, K * K, 4)
    torch.testing.assert_close(_fold_by_shifts(out, size, K, p, s), outlook_fold(out, size, K, p, s), rtol=0,
                               atol=1e-6)


def test_recorded_maps_are_each_windows_weights_on_its_pixels() -> None:
    """The recorded weights are ``[B·h·w, nh, K², K²]`` probability rows; the layout puts window ``(i, j)``'s slots
    at rows ``2i-1 .. 2i+1``, columns ``2j-1 .. 2j+1`` (-1 past the border), and the placed map of a window's own
    slot equals that row restricted to the image."""
    torch.manual_seed(0)
    attn = OutlookAttention(16, 2, kernel_size=3, stride=2).eval()
    x = torch.randn(1, 5, 7, 16)
    with torch.no_grad(), record_attention(attn) as rec:
        attn(x)
    (r,) = rec.records
    w = r.weights
    assert w.shape == (3 * 4, 2, 9, 9)
    torch.testing.assert_close(w.sum(-1), torch.ones(12, 2, 9))
    layout = outlook_layout(5, 7, 3, 1, 2)
    assert layout.query_pos.shape == (12, 9)
    assert layout.query_pos[0].tolist() == [-1, -1, -1, -1, 0, 1, -1, 7, 8]  # window (0, 0) at the corner
    assert layout.query_pos[5].tolist() == [8, 9, 10, 15, 16, 17, 22, 23, 24]  # window (1, 1), inside
    # the corner pixel (0, 0) sits only in window (0, 0), as its slot 4 (the centre)
    m = r.query_map((0, 0), head=0)[0]  # [H, W]
    ref = torch.zeros(5 * 7)
    keep = layout.key_pos[0] >= 0
    ref[layout.key_pos[0][keep]] = w[0, 0, 4][keep]
    torch.testing.assert_close(m.flatten(), ref)
    assert float(m.sum()) < 1.0  # weight on the zero-padded slots is not on the image


def test_weights_come_from_the_pooled_token_not_the_centre() -> None:
    """Changing a pixel of a window's 2x2 pooling cell that is not its centre changes the window's weights."""
    torch.manual_seed(0)
    attn = OutlookAttention(8, 2, stride=2).eval()
    x = torch.randn(1, 4, 4, 8)
    y = x.clone()
    y[0, 1, 1] += 1.0  # cell (0, 0) covers pixels (0..1, 0..1); the window's centre is (0, 0)
    with torch.no_grad():
        a, b = attn.generate_logits(x), attn.generate_logits(y)
    assert not torch.allclose(a[:, 0], b[:, 0]) and torch.equal(a[:, 1:], b[:, 1:])


def test_prefix_tokens_take_the_mean_of_every_value() -> None:
    torch.manual_seed(0)
    attn = OutlookAttention(8, 2).eval()
    tokens = torch.randn(2, 1 + 12, 8)
    with torch.no_grad():
        out = attn.attend_prefix(tokens[:, :1], tokens)
        ref = attn.proj(attn.v(tokens).mean(dim=1, keepdim=True))
    torch.testing.assert_close(out, ref)


def test_transfer_init_makes_every_window_average_its_values() -> None:
    attn = OutlookAttention(8, 2, stride=1)
    notes = attn.transfer_init()
    assert notes and "attn" in notes[0]
    with torch.no_grad(), record_attention(attn) as rec:
        attn(torch.randn(1, 3, 3, 8))
    torch.testing.assert_close(rec.records[0].weights, torch.full((9, 2, 9, 9), 1 / 9))


def test_flops_and_residual() -> None:
    attn = OutlookAttention(32, 4, stride=2).eval()
    # 2·N·C² + h·w·(C·K⁴·nh + nh·K⁴·(K² + hd)) with N = 35, h·w = 12
    assert attn.flops((2, 5, 7, 32)) == 2 * (2 * 35 * 32 * 32 + 12 * (32 * 81 * 4 + 4 * 81 * (9 + 8)))
    x, r = torch.randn(2, 5, 7, 32), torch.randn(2, 5, 7, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, AttentionCall(residual=r)), r + attn(x))


def test_flex_is_refused_with_the_reason() -> None:
    spec = get_attention_spec("outlook")
    assert "flex" not in spec.backends and "generated" in spec.backend_note
    with pytest.raises(ValueError, match="generated"):
        create_attention("outlook", 16, 2, backend="flex")


@pytest.mark.parametrize("kwargs,match", [
    (dict(kernel_size=2), "kernel_size must be odd"),
    (dict(kernel_size=3, padding=0), "padding"),
    (dict(stride=0), "stride must be a positive int"),
    (dict(kernel_size=3.0), "kernel_size must be a positive int"),
])
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OutlookAttention(16, 2, **kwargs)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        OutlookAttention(18, 4)


def test_gradients_reach_every_parameter() -> None:
    attn = OutlookAttention(16, 2, stride=2, qkv_bias=True)
    attn(torch.randn(2, 5, 6, 16)).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in attn.parameters())


def test_token_merging_is_refused_with_the_reason() -> None:
    """A ViT whose blocks run outlook attention refuses token merging, saying why."""
    from vit_attention import create_model

    model = create_model("vit_small_patch16_224", img_size=32, patch_size=8, embed_dim=32, num_heads=2, depth=1,
                         attn_layer="outlook")
    with pytest.raises(ValueError, match="'outlook'.*generated for each cell of the map"):
        model.set_token_merging(2)
