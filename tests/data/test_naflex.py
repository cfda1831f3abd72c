"""NaFlex data side (data/naflex.py): timm's size-for-sequence rule, the collate into NaFlexVit's packed
batch, and length bucketing."""

from __future__ import annotations

import pytest
import torch

from vit_attention.data.naflex import NaFlexCollate, bucket_by_seq_len, resize_to_seq_len, size_for_seq_len
from vit_attention.models.naflexvit import NaFlexVit, NaFlexVitConfig

# timm 1.0.31 get_image_size_for_seq(hw, p, L)[1], recorded with the side environment
TIMM_SIZES = [((480, 640), 16, 256, (224, 288)), ((100, 1000), 16, 576, (128, 1152)),
              ((37, 53), 14, 49, (84, 112)), ((224, 224), 16, 196, (224, 224)), ((1000, 100), 8, 30, (120, 16))]


@pytest.mark.parametrize("hw,p,L,want", TIMM_SIZES)
def test_size_for_seq_len_equals_timm(hw, p, L, want):
    assert size_for_seq_len(hw, p, L) == want


@pytest.mark.parametrize("hw", [(480, 640), (33, 500), (512, 17), (64, 64)])
@pytest.mark.parametrize("L", [16, 100, 576])
def test_size_for_seq_len_fits_and_is_largest(hw, L):
    p = 16
    h, w = size_for_seq_len(hw, p, L)
    assert h % p == 0 and w % p == 0 and h >= p and w >= p
    assert (h // p) * (w // p) <= L
    # no larger scale fits: scanning scales finely finds no patch count above ours that is still <= L
    best = 0
    for i in range(1, 4001):
        r = i / 200.0
        th, tw = max(p, -(-hw[0] * r // p) * p), max(p, -(-hw[1] * r // p) * p)
        n = int(th // p) * int(tw // p)
        if n <= L:
            best = max(best, n)
    assert (h // p) * (w // p) >= best


def test_resize_keeps_aspect_roughly():
    img = torch.rand(3, 300, 600)
    out = resize_to_seq_len(img, 16, 128)
    assert out.shape[0] == 3 and out.shape[1] % 16 == 0 and out.shape[2] % 16 == 0
    assert (out.shape[1] // 16) * (out.shape[2] // 16) <= 128
    assert abs(out.shape[2] / out.shape[1] - 2.0) < 0.3


def test_collate_feeds_naflexvit():
    collate = NaFlexCollate(patch_size=8, max_seq_len=20)
    batch = [(torch.rand(3, 50, 90), 1), (torch.rand(3, 120, 30), 3), (torch.rand(3, 8, 8), 0)]
    packed, labels = collate(batch)
    assert packed["patches"].shape == (3, 20, 8 * 8 * 3) and packed["patch_coord"].shape == (3, 20, 2)
    assert packed["patch_valid"].dtype == torch.bool and labels.tolist() == [1, 3, 0]
    n = packed["patch_valid"].sum(1)
    assert (n <= 20).all() and n[2] == 16  # the 8x8 image is upscaled to the largest square grid within 20: 4x4
    assert not packed["patches"][~packed["patch_valid"]].any()  # padding is zeros
    torch.manual_seed(0)
    model = NaFlexVit(NaFlexVitConfig(embed_dim=32, num_heads=2, depth=1, patch_size=8, num_classes=4,
                                      pos_embed_grid_size=(4, 4), global_pool="avg")).eval()
    with torch.no_grad():
        out = model(packed)
        assert out.shape == (3, 4)
        # each image alone (its resized form, no padding) gives the same logits
        for i, (img, _) in enumerate(batch):
            alone = model(resize_to_seq_len(img, 8, 20)[None])
            assert torch.allclose(out[i], alone[0], atol=1e-5)


def test_collate_rejects_too_long_without_resize():
    collate = NaFlexCollate(patch_size=8, max_seq_len=4, resize=False)
    with pytest.raises(ValueError, match="max_seq_len"):
        collate([(torch.rand(3, 24, 24), 0)])


def test_bucket_by_seq_len():
    lens = [5, 100, 7, 98, 6, 99]
    batches = list(bucket_by_seq_len(lens, 3, shuffle=False))
    assert batches == [[0, 4, 2], [3, 5, 1]]
    g = torch.Generator().manual_seed(0)
    shuffled = list(bucket_by_seq_len(lens, 3, generator=g))
    assert sorted(map(sorted, shuffled)) == [[0, 2, 4], [1, 3, 5]]
