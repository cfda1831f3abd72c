import pytest
import torch

from vit_attention.functional import merge_heads, split_heads, split_qkv


def test_split_qkv_layout_is_q_k_v_then_heads():
    # Channels of the packed projection: [q(h0 h1) | k(h0 h1) | v(h0 h1)], each head hd wide.
    B, N, nh, hd = 2, 5, 2, 4
    C = nh * hd
    qkv = torch.arange(B * N * 3 * C, dtype=torch.float32).view(B, N, 3 * C)
    q, k, v = split_qkv(qkv, nh)
    assert q.shape == (B, nh, N, hd)
    # head 1 of k for token 2 of sample 1 is channels C + hd .. C + 2hd
    torch.testing.assert_close(k[1, 1, 2], qkv[1, 2, C + hd:C + 2 * hd])
    torch.testing.assert_close(v[0, 0, 1], qkv[0, 1, 2 * C:2 * C + hd])
    # The mistaken permute (1, 3, 0, 2, 4) of the study notes would not even give this shape.
    wrong = qkv.view(B, N, 3, nh, hd).permute(1, 3, 0, 2, 4)
    assert wrong.shape != (3, B, nh, N, hd)


def test_merge_inverts_split():
    x = torch.randn(2, 5, 12)
    torch.testing.assert_close(merge_heads(split_heads(x, 3)), x)


def test_split_errors():
    with pytest.raises(ValueError, match="num_heads=5"):
        split_heads(torch.randn(1, 2, 12), 5)
    with pytest.raises(ValueError, match="3\\*num_heads"):
        split_qkv(torch.randn(1, 2, 12), 5)
