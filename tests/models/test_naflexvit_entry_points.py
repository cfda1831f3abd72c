"""NaFlexViT: a list of images (and a packed batch) works in every entry point a tensor does, for every preset
(reduced): ``forward``, ``forward_features``, ``forward_intermediates`` and a ``features_only`` model give each
image what it gives run alone; list items are checked up front, naming their index."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixture_utils import assert_parity
from model_outputs import build, small_overrides

from vit_attention import create_model
from vit_attention.models import list_models
from vit_attention.models.naflexvit import patchify_images, split_features

NAMES = list_models("naflexvit*")
SIZES = ((16, 24), (32, 8), (8, 8), (24, 24))  # 2x3 (the table's own grid), 4x1, 1x1, 3x3 patches of 8 px


def _images(in_chans: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(in_chans, h, w, generator=g) for h, w in SIZES]


def test_every_preset_is_swept() -> None:
    assert len(NAMES) >= 6


@pytest.mark.registry
@pytest.mark.parametrize("name", NAMES)
def test_list_in_every_entry_point_equals_each_image_alone(name: str) -> None:
    model, _ = build(name, small_overrides(name))
    imgs = _images(model.cfg.in_chans)
    P = model.num_prefix_tokens
    with torch.no_grad():
        logits = model(imgs)
        tokens = split_features(model.forward_features(imgs), P)
        final, inter = model.forward_intermediates(imgs, norm=True)
        nlc = model.forward_intermediates(imgs, [0, -1], output_fmt="NLC", return_prefix_tokens=True,
                                          intermediates_only=True)
        assert torch.equal(final["patches"], model.forward_features(imgs)["patches"])
        assert len(inter) == len(model.blocks) and all(len(per) == len(imgs) for per in inter)
        for i, img in enumerate(imgs):
            assert_parity(logits[i:i + 1], model(img[None]))
            assert_parity(tokens[i], model.forward_features(img[None])[0])
            _, alone = model.forward_intermediates(img[None], norm=True)
            for k in range(len(model.blocks)):
                assert inter[k][i].shape == alone[k][0].shape  # [C, h_i, w_i]
                assert_parity(inter[k][i], alone[k][0])
            alone_nlc = model.forward_intermediates(img[None], [0, -1], output_fmt="NLC", return_prefix_tokens=True,
                                                    intermediates_only=True)
            for (grid, prefix), (ref_grid, ref_prefix) in zip([per[i] for per in nlc], alone_nlc):
                assert grid.shape == ref_grid[0].shape and prefix.shape == (P, model.embed_dim)
                assert_parity(grid, ref_grid[0])
                if P:
                    assert_parity(prefix, ref_prefix[0])


@pytest.mark.registry
@pytest.mark.parametrize("name", NAMES)
def test_features_only_model_takes_a_list(name: str) -> None:
    over = small_overrides(name)
    model, _ = build(name, over)
    feats = create_model(name, features_only=True, out_indices=(0, 1), **over).eval()
    feats.load_state_dict(model.state_dict(), strict=False)
    imgs = _images(model.cfg.in_chans)
    with torch.no_grad():
        maps = feats(imgs)
        assert len(maps) == 2 and all(len(per) == len(imgs) for per in maps)
        for i, img in enumerate(imgs):
            alone = feats(img[None])
            for k in range(2):
                assert maps[k][i].shape == (model.embed_dim, *(s // 8 for s in SIZES[i]))
                assert_parity(maps[k][i], alone[k][0])


def test_packed_batch_intermediates_equal_the_list_form() -> None:
    """The packed form reads each image's grid from its coordinates; rows need not be row-major."""
    name = NAMES[0]
    model, _ = build(name, small_overrides(name))
    imgs = _images(3)
    batch = patchify_images(imgs, 8, max_seq_len=12)
    perm = torch.randperm(12)  # shuffle the rows (padding included): the coordinates still place each patch
    shuffled = {k: v[:, perm] for k, v in batch.items()}
    with torch.no_grad():
        ref = model.forward_intermediates(imgs, intermediates_only=True)
        for packed in (batch, shuffled):
            out = model.forward_intermediates(packed, intermediates_only=True)
            for per, ref_per in zip(out, ref):
                for a, b in zip(per, ref_per):
                    assert a.shape == b.shape
                    assert_parity(a, b)
        kw = model.forward_intermediates(batch["patches"], [1], patch_coord=batch["patch_coord"],
                                         patch_valid=batch["patch_valid"], intermediates_only=True)
        assert all(torch.equal(a, b) for a, b in zip(kw[0], model.forward_intermediates(batch, [1],
                                                                                          intermediates_only=True)[0]))


@pytest.mark.parametrize("bad, error, match", [
    (lambda imgs: imgs[:1] + [np.zeros((3, 16, 16), np.float32)], TypeError, r"images\[1\] is a numpy.ndarray"),
    (lambda imgs: imgs[:2] + [torch.randn(1, 16, 16)], ValueError, r"images\[2\] has 1 channels.*in_chans=3"),
    (lambda imgs: [torch.randn(1, 3, 16, 16)] + imgs, ValueError, r"images\[0\] has shape \(1, 3, 16, 16\)"),
    (lambda imgs: imgs[:1] + [torch.zeros(3, 16, 16, dtype=torch.uint8)], ValueError, r"images\[1\] has dtype"),
    (lambda imgs: imgs[:3] + [torch.randn(3, 20, 16)], ValueError, r"images\[3\] is 20x16, not a multiple"),
    (lambda imgs: imgs[:1] + [torch.randn(3, 16, 16, dtype=torch.float64)], ValueError,
     r"images\[1\] is torch.float64"),
    (lambda imgs: [], ValueError, "images: the list is empty"),
])
def test_list_items_are_checked_up_front_naming_the_index(bad, error, match) -> None:
    name = NAMES[0]
    model, _ = build(name, small_overrides(name))
    feats = create_model(name, features_only=True, **small_overrides(name)).eval()
    imgs = bad(_images(3))
    for entry in (model, model.forward_features, model.forward_intermediates, feats):
        with pytest.raises(error, match=match):
            entry(imgs)
