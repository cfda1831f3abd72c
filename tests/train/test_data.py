"""Data: the embedded digits split, image folders (split, corrupt files, empty classes), batching, augmentation."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from vit_attention.train.data import (
    BatchTransform,
    CorruptImageWarning,
    batch_indices,
    build_data,
    load_image,
    mix_batch,
    scan_image_folder,
    shard_indices,
)

from ._utils import make_image_folder


def test_digits_fixed_split() -> None:
    a, b = build_data(None), build_data("digits")
    assert (len(a.train), len(a.test), a.num_classes, a.in_chans, a.img_size) == (1347, 450, 10, 1, (8, 8))
    assert torch.equal(a.test.labels, b.test.labels) and torch.equal(a.train.images, b.train.images)
    assert 0.0 <= float(a.train.images.min()) and float(a.train.images.max()) <= 1.0
    assert torch.bincount(a.test.labels).min() >= 43  # stratified: every digit ~45 times
    assert build_data(None, img_size=16).train.images.shape[-2:] == (16, 16)


def test_image_folder_split_and_loading(image_folder: Path) -> None:
    data = build_data(image_folder, img_size=8, val_fraction=0.25, seed=0)
    assert data.classes == ["cat", "dog", "fox"] and data.num_classes == 3
    assert (len(data.train), len(data.test)) == (27, 9)  # 3 of 12 per class held out
    train_files = {s[0] for s in data.train.samples}
    assert not train_files & {s[0] for s in data.test.samples}
    x, y = data.train[0]
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    assert int(y) in (0, 1, 2)
    # same seed, same split
    again = build_data(image_folder, img_size=8, val_fraction=0.25, seed=0)
    assert [s[0] for s in again.test.samples] == [s[0] for s in data.test.samples]


def test_image_folder_with_train_val_subfolders(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "ds" / "train", {"a": 4, "b": 4})
    make_image_folder(tmp_path / "ds" / "val", {"a": 2, "b": 2})
    data = build_data(tmp_path / "ds", img_size=8, in_chans=1)
    assert (len(data.train), len(data.test), data.in_chans) == (8, 4, 1)
    assert data.train[0][0].shape == (1, 8, 8)


def test_corrupt_image_is_skipped_with_warning_and_counted(image_folder: Path) -> None:
    (image_folder / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    (image_folder / "cat" / "truncated.png").write_bytes((image_folder / "cat" / "0.png").read_bytes()[:60])
    with pytest.warns(CorruptImageWarning) as rec:
        classes, samples, skipped = scan_image_folder(image_folder)
    assert len(samples) == 36 and len(skipped) == 2
    assert {Path(str(w.message).split()[-1]).name for w in rec} == {"broken.png", "truncated.png"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorruptImageWarning)
        assert len(build_data(image_folder, img_size=8).skipped) == 2


def test_clear_errors(tmp_path: Path, image_folder: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data folder not found"):
        build_data(tmp_path / "nope")
    (image_folder / "empty").mkdir()
    with pytest.raises(ValueError, match=r"class folder .*empty holds no images"):
        build_data(image_folder)
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.png").write_bytes(b"")
    with pytest.raises(ValueError, match="no class sub-folders"):
        build_data(tmp_path / "flat")
    only_bad = tmp_path / "bad"
    (only_bad / "a").mkdir(parents=True)
    (only_bad / "a" / "x.png").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="only corrupt images"), pytest.warns(CorruptImageWarning):
        build_data(only_bad)


def test_load_image_resize_and_centre_crop(tmp_path: Path) -> None:
    from PIL import Image

    img = torch.zeros(20, 40, 3, dtype=torch.uint8)
    img[:, 10:30] = 255  # white centre band, black sides
    Image.fromarray(img.numpy()).save(tmp_path / "wide.png")
    x = load_image(tmp_path / "wide.png", 10, crop_pct=1.0)
    assert x.shape == (3, 10, 10)
    assert x[:, :, 3:7].min() > 0.9  # the crop keeps the centre of the wide image
    g = load_image(tmp_path / "wide.png", (6, 8), in_chans=1)
    assert g.shape == (1, 6, 8)
    with pytest.raises(ValueError, match="in_chans"):
        load_image(tmp_path / "wide.png", 8, in_chans=2)
    with pytest.raises(ValueError, match="crop_pct must be a positive number"):
        load_image(tmp_path / "wide.png", 8, crop_pct=0.0)


def test_load_image_crop_pct_above_one_pads_black(tmp_path: Path) -> None:
    """crop_pct 1.6 at 8 px: shorter side to floor(8 / 1.6) = 5, padded to 8 with black, 1 row above, 2 below."""
    from PIL import Image

    Image.fromarray(torch.full((20, 40, 3), 200, dtype=torch.uint8).numpy()).save(tmp_path / "grey.png")
    x = load_image(tmp_path / "grey.png", 8, crop_pct=1.6)  # resized to 10x5, then 8 columns of its centre
    assert x.shape == (3, 8, 8)
    assert torch.equal(x[:, 1:6], torch.full((3, 5, 8), 200 / 255))
    assert x[:, :1].abs().max() == 0 and x[:, 6:].abs().max() == 0


def test_batches_are_seeded_and_shards_partition() -> None:
    a = batch_indices(100, 32, epoch=3, seed=1, drop_last=True)
    assert a == batch_indices(100, 32, epoch=3, seed=1, drop_last=True)
    assert a != batch_indices(100, 32, epoch=4, seed=1, drop_last=True)
    assert [len(b) for b in a] == [32, 32, 32] and len({i for b in a for i in b}) == 96
    assert [len(b) for b in batch_indices(100, 32, epoch=0, seed=0)] == [32, 32, 32, 4]
    gb = list(range(10))
    parts = [shard_indices(gb, r, 3) for r in range(3)]
    assert sum(parts, []) == gb and sorted(len(p) for p in parts) == [3, 3, 4]
    with pytest.raises(ValueError, match="batch size"):
        batch_indices(10, 0, epoch=0, seed=0)


def test_mix_batch_targets() -> None:
    torch.manual_seed(0)
    x, y = torch.rand(8, 3, 16, 16), torch.arange(8) % 4
    xs, t = mix_batch(x, y, 4, label_smoothing=0.2)
    assert xs is x and torch.allclose(t.sum(1), torch.ones(8))
    assert torch.allclose(t[torch.arange(8), y], torch.full((8,), 0.85))  # 1 - 0.2 + 0.2 / 4
    for kw in ({"mixup": 0.8}, {"cutmix": 1.0}):
        xm, tm = mix_batch(x, y, 4, **kw)
        assert xm.shape == x.shape and not torch.equal(xm, x)
        assert torch.allclose(tm.sum(1), torch.ones(8)) and tm.max() <= 1
        assert (tm > 0).sum(1).max() <= 2  # two classes per mixed image


def test_batch_transform_normalises_and_augments() -> None:
    torch.manual_seed(0)
    tf = BatchTransform((0.5,), (0.25,), img_size=(16, 16), crop_scale=(0.5, 1.0), hflip=0.5, randaugment=(2, 9))
    x = torch.rand(4, 1, 16, 16)
    tf.eval()
    assert torch.allclose(tf(x), (x - 0.5) / 0.25)
    tf.train()
    y = tf(x)
    assert y.shape == x.shape and not torch.allclose(y, (x - 0.5) / 0.25)
