"""ViTDet's attention (attention/rel_pos.py), window and global modes: against Hugging Face ``VitDetAttention``
on its own window partition (unmasked zero padding), plain window / global attention without the tables,
fused == explicit, analytic == measured FLOPs, and argument errors."""

from __future__ import annotations

import pytest
import torch
from transformers import VitDetConfig
from transformers.models.vitdet.modeling_vitdet import VitDetAttention, window_partition, window_unpartition

from vit_attention import create_attention
from vit_attention.analysis.flops import measure_flops
from vit_attention.attention import AttentionCall, RelPosAttention
from vit_attention.functional import switched

DIM, HEADS = 24, 3


def _pair(window_size: int, input_size: tuple[int, int]) -> tuple[RelPosAttention, VitDetAttention]:
    """Ours and HF's with the same (perturbed) weights; HF sizes its tables by input_size = window or grid."""
    torch.manual_seed(0)
    ours = RelPosAttention(DIM, HEADS, window_size=window_size, input_size=input_size,
                           clamp_window=False)  # HF pads a map smaller than the window
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.3 * torch.randn_like(p))
    cfg = VitDetConfig(hidden_size=DIM, num_attention_heads=HEADS, use_relative_position_embeddings=True)
    ref = VitDetAttention(cfg, input_size=(window_size, window_size) if window_size else input_size)
    ref.load_state_dict(ours.state_dict())
    return ours.eval(), ref.eval()


@pytest.mark.parity
@pytest.mark.parametrize("hw", [(8, 8), (7, 9), (3, 5)])
def test_window_mode_equals_hf_on_its_padded_partition(hw):
    ours, ref = _pair(4, (14, 14))
    x = torch.randn(2, *hw, DIM)
    with torch.no_grad():
        windows, pad = window_partition(x, 4)  # zero-padded, unmasked
        expected = window_unpartition(ref(windows)[0], 4, pad, hw)
        out = ours(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parity
@pytest.mark.parametrize("hw", [(6, 6), (5, 8), (9, 4)])  # the built grid, then resized tables
def test_global_mode_equals_hf(hw):
    ours, ref = _pair(0, (6, 6))
    assert ours.rel_pos_h.shape == (11, DIM // HEADS)
    x = torch.randn(2, *hw, DIM)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x)[0], rtol=1e-5, atol=1e-5)


def test_without_tables_it_is_plain_window_or_global_attention():
    torch.manual_seed(1)
    x = torch.randn(2, 7, 9, DIM)
    win = create_attention("rel_pos", DIM, HEADS, window_size=4, use_rel_pos=False).eval()
    lsa = create_attention("lsa", DIM, HEADS, window_size=4).eval()  # unshifted windows, unmasked padding
    glob = create_attention("rel_pos", DIM, HEADS, window_size=0, use_rel_pos=False).eval()
    mhsa = create_attention("mhsa", DIM, HEADS).eval()
    assert not any("rel_pos" in k for k in win.state_dict())
    lsa.load_state_dict(win.state_dict())
    mhsa.load_state_dict(glob.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(win(x), lsa(x))
        torch.testing.assert_close(glob(x), mhsa(x.reshape(2, 63, DIM)).view(2, 7, 9, DIM))


@pytest.mark.parametrize("window_size", [0, 3])
def test_fused_equals_explicit_and_tables_get_gradients(window_size):
    attn, _ = _pair(window_size, (5, 5))
    x = torch.randn(2, 5, 7, DIM)
    with torch.no_grad(), switched(attn, fused_attention=False):
        explicit = attn(x)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), explicit, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(attn(x, AttentionCall(residual=x)), x + explicit, rtol=1e-5, atol=1e-5)
    attn.train()(x).square().sum().backward()
    assert attn.rel_pos_h.grad.abs().sum() > 0 and attn.rel_pos_w.grad.abs().sum() > 0


@pytest.mark.parametrize("window_size,hw", [(0, (6, 6)), (0, (4, 7)), (3, (7, 5)), (3, (6, 6))])
def test_analytic_flops_equal_measured(window_size, hw):
    attn, _ = _pair(window_size, (6, 6))
    shape = (2, *hw, DIM)
    measured, _ = measure_flops(attn, shape, device=None)
    assert attn.flops(shape) == pytest.approx(measured, rel=0.01)
    H, W = hw
    if window_size == 0:  # the position term: (H + W) multiply-adds per query channel
        plain = RelPosAttention(DIM, HEADS, use_rel_pos=False).flops(shape)
        assert attn.flops(shape) - plain == 2 * (H + W) * H * W * DIM


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="window_size"):
        RelPosAttention(DIM, HEADS, window_size=-1)
    with pytest.raises(ValueError, match="window_size"):
        RelPosAttention(DIM, HEADS, window_size=(0, 3))
    with pytest.raises(ValueError, match="input_size"):
        RelPosAttention(DIM, HEADS, input_size=0)
    attn = RelPosAttention(DIM, HEADS, window_size=2)
    with pytest.raises(ValueError, match="channels-last"):
        attn(torch.randn(2, 10, DIM))
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        attn(torch.randn(1, 4, 4, DIM), AttentionCall(num_prefix_tokens=1))
    assert "window_size=(2, 2)" in repr(attn) and "global" in repr(RelPosAttention(DIM, HEADS))


@pytest.mark.parametrize("hw", [(6, 6), (5, 8)])
def test_augment_impl_equals_the_bias(hw):
    """rel_pos_impl='augment' (global): the same outputs and gradients, FLOPs counted for the longer q / k rows."""
    ours, _ = _pair(0, (6, 6))
    aug = RelPosAttention(DIM, HEADS, window_size=0, input_size=(6, 6), rel_pos_impl="augment")
    aug.load_state_dict(ours.state_dict())
    x = torch.randn(2, *hw, DIM)
    with torch.no_grad():
        torch.testing.assert_close(aug.eval()(x), ours(x), rtol=1e-5, atol=1e-5)
        with switched(aug, fused_attention=False), switched(ours, fused_attention=False):
            torch.testing.assert_close(aug(x), ours(x), rtol=1e-5, atol=1e-5)
    aug.train()(x).sum().backward()
    ours.train()(x).sum().backward()
    torch.testing.assert_close(aug.rel_pos_h.grad, ours.rel_pos_h.grad, rtol=1e-4, atol=1e-5)
    shape = (2, *hw, DIM)
    measured, _ = measure_flops(aug, shape, device=None)
    assert aug.flops(shape) == pytest.approx(measured, rel=0.01)
    assert aug.flops(shape) - ours.flops(shape) == 2 * HEADS * sum(hw) * (hw[0] * hw[1]) ** 2
    with pytest.raises(ValueError, match="rel_pos_impl"):
        RelPosAttention(DIM, HEADS, rel_pos_impl="fast")
