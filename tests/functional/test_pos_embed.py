import pytest
import torch

from vit_attention.functional import resample_abs_pos_embed, sincos_2d_pos_embed


def test_sincos_layout():
    pe = sincos_2d_pos_embed(16, (3, 5))
    assert pe.shape == (15, 16)
    # token (y=0, x=0): sin parts 0, cos parts 1
    torch.testing.assert_close(pe[0], torch.tensor([0.0] * 4 + [1.0] * 4 + [0.0] * 4 + [1.0] * 4))
    # the x quarter of token (y=0, x=1) is sin(1 * omega)
    omega = 1 / 10000 ** (torch.arange(4) / 4)
    torch.testing.assert_close(pe[1, 8:12], torch.sin(omega))
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d_pos_embed(10, (2, 2))


def test_resample_keeps_prefix_and_identity():
    pos = torch.randn(1, 1 + 16, 8)
    assert resample_abs_pos_embed(pos, (4, 4)) is pos
    out = resample_abs_pos_embed(pos, (6, 2))
    assert out.shape == (1, 1 + 12, 8)
    torch.testing.assert_close(out[:, :1], pos[:, :1])
    # a constant grid stays constant under interpolation
    const = torch.ones(1, 16, 8)
    torch.testing.assert_close(resample_abs_pos_embed(const, (7, 7), num_prefix_tokens=0), torch.ones(1, 49, 8))


def test_resample_errors():
    with pytest.raises(ValueError, match="square grid"):
        resample_abs_pos_embed(torch.randn(1, 1 + 15, 8), (4, 4))
    with pytest.raises(ValueError, match="old_size"):
        resample_abs_pos_embed(torch.randn(1, 16, 8), (4, 4), (3, 3), num_prefix_tokens=0)
