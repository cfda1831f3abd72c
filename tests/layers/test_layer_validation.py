"""Layer constructors name the bad argument; PatchEmbed's size errors hint at the right option."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vit_attention.layers import DropPath, Mlp, PatchEmbed


@pytest.mark.parametrize("kw,match", [
    (dict(patch_size=0), r"patch_size must be a positive int or a pair of positive ints, got 0"),
    (dict(patch_size=(16, -16)), r"patch_size must be a positive int"),
    (dict(img_size=0), r"img_size must be a positive int or a pair of positive ints, got 0"),
    (dict(img_size=-224), r"img_size must be a positive int"),
    (dict(img_size="224"), r"img_size must be an int or a pair of ints, got '224'"),
    (dict(img_size=(224, "x")), r"img_size must be an int or a pair of ints"),
    (dict(in_chans=0), r"in_chans must be a positive int, got 0"),
    (dict(embed_dim="abc"), r"embed_dim must be a positive int, got 'abc'"),
])
def test_patch_embed_arguments(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PatchEmbed(**kw)


def test_patch_embed_sizes_reject_bools_and_strings() -> None:
    assert PatchEmbed(32, [8, 4], 3, 16).patch_size == (8, 4)
    with pytest.raises(ValueError, match="patch_size must be an int or a pair of ints, got True"):
        PatchEmbed(32, True, 3, 16)
    with pytest.raises(ValueError, match="patch_size must be an int or a pair of ints, got '16'"):
        PatchEmbed(32, "16", 3, 16)
    with pytest.raises(ValueError, match="patch_size must be an int or a pair of ints"):
        PatchEmbed(32, (8, 8, 8), 3, 16)


def test_patch_embed_size_hints_follow_size_options() -> None:
    own = PatchEmbed(32, 8, 3, 16)
    with pytest.raises(ValueError, match=r"img_size=\(40, 40\) or strict_img_size=False"):
        own(torch.randn(1, 3, 40, 40))
    with pytest.raises(ValueError, match=r"strict_img_size=False and dynamic_img_pad=True to accept sizes that are "
                                         r"not multiples of patch_size \(8, 8\)"):
        own(torch.randn(1, 3, 30, 30))
    swin_like = PatchEmbed(32, 4, 3, 16, size_options=("strict_img_size=False", None))
    with pytest.raises(ValueError, match=r"resize the images to \(32, 32\), or build the model with "
                                         r"strict_img_size=False to accept") as e:
        swin_like(torch.randn(1, 3, 30, 30))
    assert "dynamic" not in str(e.value)
    loose = PatchEmbed(32, 8, 3, 16, strict_img_size=False)
    with pytest.raises(ValueError, match=r"not divisible by patch_size \(8, 8\); resize the images to a multiple "
                                         r"of it, or build the model with dynamic_img_pad=True"):
        loose(torch.randn(1, 3, 30, 30))


@pytest.mark.parametrize("args,kw,match", [
    ((0,), {}, r"Mlp in_features must be a positive int, got 0"),
    ((16, -64), {}, r"Mlp hidden_features must be a positive int or None"),
    ((16, 64, -1), {}, r"Mlp out_features must be a positive int or None"),
    ((16,), dict(hidden_features=2.5), r"Mlp hidden_features must be"),
])
def test_mlp_arguments(args: tuple[Any, ...], kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Mlp(*args, **kw)


def test_drop_path_names_p() -> None:
    with pytest.raises(ValueError, match=r"drop path probability p must be in \[0, 1\), got 1.5"):
        DropPath(1.5)
