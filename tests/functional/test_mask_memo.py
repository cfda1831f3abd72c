"""A mask passed again is checked once per version (CPU), and in-place edits are seen."""

from __future__ import annotations

import gc
import weakref

import torch

from vit_attention.functional import fused_attention, scaled_dot_product_attention


def test_reused_mask_follows_in_place_edits_and_is_not_kept_alive() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 2, 5, 4)
    mask = torch.zeros(1, 2, 5, 5)
    first = scaled_dot_product_attention(q, q, q, mask=mask)
    torch.testing.assert_close(scaled_dot_product_attention(q, q, q, mask=mask), first)
    mask[..., 2, :] = float("-inf")  # row 2 may attend to nothing now: its output must be zeros
    fused = scaled_dot_product_attention(q, q, q, mask=mask)
    with fused_attention(False):
        explicit = scaled_dot_product_attention(q, q, q, mask=mask)
    assert torch.equal(fused[..., 2, :], torch.zeros_like(fused[..., 2, :]))
    torch.testing.assert_close(fused, explicit)
    ref = weakref.ref(mask)
    del mask
    gc.collect()
    assert ref() is None  # the memo holds the mask weakly and never through its own value


def test_bool_mask_stays_bool_when_reused() -> None:
    q = torch.randn(1, 1, 4, 8)
    mask = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    a = scaled_dot_product_attention(q, q, q, mask=mask)
    b = scaled_dot_product_attention(q, q, q, mask=mask)
    with fused_attention(False):
        c = scaled_dot_product_attention(q, q, q, mask=mask)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)
