"""Data for training: the embedded digits set, image folders, batching, and on-device augmentation.

Datasets yield ``(image [C, H, W] float in [0, 1], label)``; normalisation and the random
augmentations run batch-wise on the training device (:class:`BatchTransform`, built from
kornia), so the loaders stay simple and a seed fixes every random draw.

* ``digits`` (default): scikit-learn's handwritten digits, 1,797 grayscale 8x8 images of 10
  classes, split 75 / 25 (stratified, ``random_state=0``) into 1,347 train and 450 test images.
* An image folder ``ROOT/<class>/<image>`` (or ``ROOT/train/<class>/...`` plus ``ROOT/val/...``):
  images are read with Pillow, resized (shorter side to ``img_size / crop_pct``) and
  centre-cropped; without a ``val`` folder a seeded ``val_fraction`` of each class is held out.
* NaFlex (``build_data(..., naflex_patch=p, max_seq_len=N)``, ``train --naflex``): the same folders,
  each image kept at its aspect ratio and resized to the largest size of at most ``N`` patches
  (:class:`NaFlexImageFolderDataset`); its ``collate_fn`` (:class:`~vit_attention.data.naflex.NaFlexCollate`)
  packs a batch into ``{"patches": [B, N, p·p·C], "patch_coord": [B, N, 2], "patch_valid": [B, N]}``,
  which :class:`BatchTransform` normalises (no augmentation) and NaFlexVit takes as it is.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from ..data.naflex import load_naflex_image  # moved to data.naflex (attn reads images the same way); still here

__all__ = ["IMG_EXTENSIONS", "DataBundle", "TensorImageDataset", "ImageFolderDataset",
           "NaFlexImageFolderDataset", "to_device", "load_digits_split",
           "scan_image_folder", "build_data", "load_image", "load_naflex_image", "BatchTransform", "mix_batch",
           "batch_indices",
           "shard_indices", "iterate_batches", "CorruptImageWarning", "check_classifiable", "describe_input_size"]

IMG_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class CorruptImageWarning(UserWarning):
    """An image file could not be decoded and was skipped."""


@dataclass
class DataBundle:
    """A train and a test (or validation) split plus what a model needs to know about them."""

    name: str
    train: Dataset
    test: Dataset
    classes: list[str]
    in_chans: int
    img_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    skipped: list[str] = field(default_factory=list)  # corrupt files left out
    median_side: float | None = None  # median shorter side (px) of an image folder's train images; None for tensors

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    def normalised_with(self, mean: Sequence[float], std: Sequence[float]) -> DataBundle:
        """The same splits, normalised with ``mean`` / ``std`` (one value per channel) instead."""
        return replace(self, mean=tuple(mean), std=tuple(std))


class TensorImageDataset(Dataset):
    """In-memory images ``[N, C, H, W]`` (float, ``[0, 1]``) and labels ``[N]``."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        if images.ndim != 4 or labels.shape != images.shape[:1]:
            raise ValueError(f"images must be [N, C, H, W] and labels [N], got {list(images.shape)} and "
                             f"{list(labels.shape)}")
        self.images, self.labels = images, labels.long()

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.images[i], self.labels[i]

    def gather(self, idx: Sequence[int]) -> tuple[Tensor, Tensor]:
        """A whole batch at once: ``[b, C, H, W]``, ``[b]``."""
        t = torch.as_tensor(idx, dtype=torch.long)
        return self.images[t], self.labels[t]


def load_digits_split(img_size: int | None = None) -> DataBundle:
    """scikit-learn's digits: 1,347 train / 450 test images ``[1, 8, 8]`` (or resized to ``img_size``)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    images = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0  # [N, 1, 8, 8] in [0, 1]
    labels = torch.tensor(d.target, dtype=torch.long)
    tr, te = train_test_split(np.arange(len(labels)), test_size=0.25, random_state=0, stratify=d.target)
    if img_size is not None and img_size != 8:
        images = F.interpolate(images, size=(img_size, img_size), mode="bilinear", align_corners=False)
    tr_t, te_t = torch.as_tensor(tr), torch.as_tensor(te)
    mean, std = images[tr_t].mean().item(), images[tr_t].std().item()
    size = images.shape[-1]
    return DataBundle("digits", TensorImageDataset(images[tr_t], labels[tr_t]),
                      TensorImageDataset(images[te_t], labels[te_t]), [str(i) for i in range(10)], 1,
                      (size, size), (mean,), (std,))


def _geometry(img_size: int | tuple[int, int], in_chans: int, crop_pct: float) -> Any:
    """The eval geometry (resize, centre crop) of a run's images, as an :class:`~vit_attention.data.ImageTransform`."""
    from ..data import DataConfig, ImageTransform

    h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
    if in_chans not in (1, 3):
        raise ValueError(f"in_chans must be 1 (grayscale) or 3 (RGB) for image files, got {in_chans}")
    if not 0 < crop_pct < math.inf:
        raise ValueError(f"crop_pct must be a positive number (crop size / resize size), got {crop_pct}")
    return ImageTransform(DataConfig(input_size=(in_chans, h, w), interpolation="bicubic", crop_pct=crop_pct,
                                     crop_mode="center", mean=(0.0,) * in_chans, std=(1.0,) * in_chans))


def load_image(path: str | Path, img_size: int | tuple[int, int], *, in_chans: int = 3,
               crop_pct: float = 0.875) -> Tensor:
    """Read an image (any Pillow mode, :func:`~vit_attention.data.read_image`) -> ``[C, H, W]`` in [0, 1].

    Shorter side to ``img_size / crop_pct`` (bicubic), centre crop to ``img_size`` (an int or
    ``(H, W)``): the eval geometry of :func:`vit_attention.data.create_transform` for the same
    size and crop, so ``predict`` and ``attn`` see what training saw.
    """
    tf = _geometry(img_size, in_chans, crop_pct)
    return tf.to_tensor(tf.resize_crop(path))


def _probe(path: Path) -> tuple[int, int] | None:
    """``(W, H)`` of a decodable image, ``None`` for a corrupt file.

    Raises :class:`~vit_attention.data.UnsupportedImageError` (a ``ValueError`` naming the file,
    its mode and values) for a 32-bit integer or float image whose values have no 8-bit reading.
    """
    from PIL import Image

    from ..data.image import WIDE_MODES, UnsupportedImageError, read_image

    try:
        with Image.open(path) as im:
            im.load()  # full decode: truncated / garbage files fail here
            size = im.size
            wide = im.mode in WIDE_MODES
    except Exception:  # noqa: BLE001 - Pillow raises many types for bad files
        return None
    if wide:
        try:
            read_image(path)  # refuses values it cannot map, naming the file
        except UnsupportedImageError:
            raise
        except Exception:  # noqa: BLE001
            return None
    return size


def scan_image_folder(root: str | Path) -> tuple[list[str], list[tuple[Path, int]], list[str]]:
    """Classes (sorted sub-folder names), ``(file, class index)`` samples, and skipped corrupt files.

    Raises ``FileNotFoundError`` for a missing folder and ``ValueError`` for a folder without class
    sub-folders, with a class folder that holds no readable image, or with an image that has no
    safe 8-bit reading (:class:`~vit_attention.data.UnsupportedImageError`, naming the file and its mode).
    """
    classes, samples, skipped, _ = _scan(root)
    return classes, samples, skipped


def _scan(root: str | Path) -> tuple[list[str], list[tuple[Path, int]], list[str], list[int]]:
    """:func:`scan_image_folder` plus the shorter side (pixels) of every readable image."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"data folder not found: {root}")
    if not root.is_dir():
        raise ValueError(f"data must be a folder with one sub-folder per class, got the file {root}")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ValueError(f"data folder {root} has no class sub-folders (expected {root}/<class>/<image>)")
    samples: list[tuple[Path, int]] = []
    skipped: list[str] = []
    sides: list[int] = []
    for ci, c in enumerate(classes):
        files = sorted(p for p in (root / c).rglob("*") if p.suffix.lower() in IMG_EXTENSIONS and p.is_file())
        good = []
        for f in files:
            size = _probe(f)
            if size is None:
                skipped.append(str(f))
                warnings.warn(f"skipping corrupt image {f}", CorruptImageWarning, stacklevel=3)
                continue
            good.append((f, ci))
            sides.append(min(size))
        if not good:
            what = "only corrupt images" if files else f"no images ({', '.join(IMG_EXTENSIONS[:4])}, ...)"
            raise ValueError(f"class folder {root / c} holds {what}; every class needs at least one image")
        samples += good
    return classes, samples, skipped, sides


class ImageFolderDataset(Dataset):
    """Image files with labels: ``(path, class index)`` -> ``([C, H, W] in [0, 1], label)``."""

    def __init__(self, samples: Sequence[tuple[Path, int]], img_size: tuple[int, int], *, in_chans: int = 3,
                 crop_pct: float = 0.875) -> None:
        self.samples, self.img_size, self.in_chans, self.crop_pct = list(samples), img_size, in_chans, crop_pct
        self._geometry = _geometry(img_size, in_chans, crop_pct)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        path, label = self.samples[i]
        return self._geometry.to_tensor(self._geometry.resize_crop(path)), torch.tensor(label)


class NaFlexImageFolderDataset(Dataset):
    """Image files with labels for NaFlex training: ``(path, class index)`` -> ``([C, H', W'] in [0, 1], label)``.

    Each image keeps its aspect ratio: resized (Pillow, bicubic) to the largest size whose patch count
    ``H'/ph · W'/pw`` is at most ``max_seq_len`` (:func:`~vit_attention.data.naflex.size_for_seq_len`,
    timm's ``ResizeKeepRatioToSequence``), sides multiples of the patch. ``collate_fn`` (a
    :class:`~vit_attention.data.naflex.NaFlexCollate`) turns a list of items into the packed batch
    ``({"patches": [B, max_seq_len, ph·pw·C], "patch_coord": [B, max_seq_len, 2], "patch_valid":
    [B, max_seq_len]}, labels [B])``.
    """

    def __init__(self, samples: Sequence[tuple[Path, int]], patch_size: int | tuple[int, int], max_seq_len: int, *,
                 in_chans: int = 3) -> None:
        from ..data.naflex import NaFlexCollate

        if in_chans not in (1, 3):
            raise ValueError(f"in_chans must be 1 (grayscale) or 3 (RGB) for image files, got {in_chans}")
        self.samples, self.in_chans = list(samples), in_chans
        self.patch_size = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
        self.max_seq_len = int(max_seq_len)
        self.collate_fn = NaFlexCollate(self.patch_size, self.max_seq_len, resize=False)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        path, label = self.samples[i]
        return load_naflex_image(path, self.patch_size, self.max_seq_len, in_chans=self.in_chans), torch.tensor(label)


def to_device(x: Tensor | Mapping[str, Tensor], device: Any) -> Tensor | dict[str, Tensor]:
    """A batch ``[B, C, H, W]``, or a packed NaFlex batch (a dict of tensors), moved to ``device``."""
    if isinstance(x, Mapping):
        return {k: v.to(device, non_blocking=True) for k, v in x.items()}
    return x.to(device, non_blocking=True)


def build_data(data: str | Path | None = None, *, img_size: int | None = None, in_chans: int = 3,
               val_fraction: float = 0.1, crop_pct: float = 0.875, seed: int = 0,
               naflex_patch: int | tuple[int, int] | None = None, max_seq_len: int = 576) -> DataBundle:
    """The embedded digits (``data`` None or ``"digits"``) or an image folder, as a :class:`DataBundle`.

    ``naflex_patch`` (the NaFlex model's patch size): the folder's images as
    :class:`NaFlexImageFolderDataset` (aspect kept, at most ``max_seq_len`` patches, packed by its
    ``collate_fn``); ``img_size`` is then only the model's standard-mode default.
    """
    if data is None or str(data) == "digits":
        if naflex_patch is not None:
            raise ValueError("--naflex trains on an image folder of any sizes and aspects: pass --data ROOT")
        return load_digits_split(img_size)
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    root = Path(data)
    size = img_size or 224
    hw = (size, size)
    if (root / "train").is_dir() and ((root / "val").is_dir() or (root / "test").is_dir()):
        classes, train_s, skipped, sides = _scan(root / "train")
        val_root = root / "val" if (root / "val").is_dir() else root / "test"
        val_classes, val_s, skipped_val, _ = _scan(val_root)
        if val_classes != classes:
            raise ValueError(f"{val_root} has classes {val_classes}, but {root / 'train'} has {classes}")
        skipped += skipped_val
    else:
        classes, samples, skipped, sides = _scan(root)
        rng = np.random.default_rng(seed)
        train_s, val_s = [], []
        for ci in range(len(classes)):
            items = [s for s in samples if s[1] == ci]
            order = rng.permutation(len(items))
            n_val = int(math.floor(len(items) * val_fraction)) if len(items) > 1 else 0
            val_s += [items[j] for j in order[:n_val]]
            train_s += [items[j] for j in order[n_val:]]
        if not val_s:
            raise ValueError(f"val_fraction={val_fraction} leaves no validation image in {root}; "
                             "add images or raise val_fraction")
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if in_chans == 3 else ((0.5,), (0.5,))

    def dataset(samples: list[tuple[Path, int]]) -> Dataset:
        if naflex_patch is not None:
            return NaFlexImageFolderDataset(samples, naflex_patch, max_seq_len, in_chans=in_chans)
        return ImageFolderDataset(samples, hw, in_chans=in_chans, crop_pct=crop_pct)

    return DataBundle(root.name, dataset(train_s), dataset(val_s), classes, in_chans, hw, mean, std, skipped,
                      float(np.median(sides)) if sides else None)


def describe_input_size(data: DataBundle, source: str) -> list[str]:
    """The run's input-size line, plus a warning when the images are much larger than that input.

    ``source``: where the size came from (``"--img-size"``, ``"the digits' default"``, ...).
    Returns ``["input 8x8 px (SOURCE)", ...]``; the warning (a line starting ``warning:``) comes
    when an image folder's median shorter side is over 4x the input's side and a larger input
    (up to 224 px, a power of two) would keep more of it.
    """
    h, w = data.img_size
    lines = [f"input {w}x{h} px ({source})"]
    side, median = max(h, w), data.median_side
    if median is None or median <= 4 * side:
        return lines
    suggest = min(224, 2 ** int(math.log2(median)))
    if suggest > side:
        lines.append(f"warning: the images are much larger than the model's input: their median shorter side is "
                     f"{median:.0f} px, the input {w}x{h} px, so each is shrunk about {median / side:.0f}x and its "
                     f"detail is lost; train at a larger size with --img-size (e.g. --img-size {suggest})")
    return lines


def check_classifiable(data: DataBundle, *, val_fraction: float | None = None) -> list[str]:
    """Refuse data that cannot train a classifier; return warnings about data that can, but poorly.

    Raises ``ValueError`` when there are fewer than two classes. Warns (returned sentences) when
    the training or the held-out split has fewer images than there are classes.
    """
    if data.num_classes < 2:
        found = f"only the class {data.classes[0]!r}" if data.classes else "no class"
        raise ValueError(f"data {data.name}: found {found}; a classifier needs at least two classes "
                         "(one sub-folder per class: ROOT/<class>/<image>)")
    warnings_: list[str] = []
    held_out = "validation" if data.name != "digits" else "test"
    for split, ds in (("training", data.train), (held_out, data.test)):
        if len(ds) < data.num_classes:
            hint = (f"; raise --val-fraction (now {val_fraction:g}) or add a val/ folder"
                    if split == held_out and val_fraction is not None else "; add images")
            warnings_.append(f"the {split} split of {data.name} has {len(ds)} image(s) for {data.num_classes} "
                             f"classes, so some classes are never {'trained on' if split == 'training' else 'tested'}"
                             + hint)
    return warnings_


# ---------------------------------------------------------------------------- batching
def batch_indices(n: int, global_batch: int, *, epoch: int, seed: int, shuffle: bool = True,
                  drop_last: bool = False) -> list[list[int]]:
    """The global batches of one epoch: a permutation seeded by ``(seed, epoch)`` cut into ``global_batch``.

    ``drop_last`` drops the last partial batch, unless it is the only one: fewer than ``global_batch``
    images make one batch of all ``n`` (a small image folder trains at the default batch size).
    """
    if global_batch <= 0:
        raise ValueError(f"batch size must be positive, got {global_batch}")
    if shuffle:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    stop = n - n % global_batch if drop_last and n >= global_batch else n
    return [order[i:i + global_batch] for i in range(0, stop, global_batch)]


def shard_indices(idx: Sequence[int], rank: int, world_size: int) -> list[int]:
    """This rank's contiguous share of one global batch (sizes differ by at most one)."""
    n = len(idx)
    lo, hi = n * rank // world_size, n * (rank + 1) // world_size
    return list(idx[lo:hi])


def iterate_batches(dataset: Dataset, batches: Sequence[Sequence[int]], *, workers: int = 0
                    ) -> Iterator[tuple[Any, Tensor]]:
    """Yield ``(images [b, C, H, W], labels [b])`` for each index list (in-memory sets are sliced directly).

    A dataset with a ``collate_fn`` attribute batches through it (NaFlex: the packed dict instead of images).
    """
    if isinstance(dataset, TensorImageDataset):
        for idx in batches:
            yield dataset.gather(idx)
        return
    loader = DataLoader(dataset, batch_sampler=[list(b) for b in batches], num_workers=workers,
                        persistent_workers=False, pin_memory=torch.cuda.is_available(),
                        collate_fn=getattr(dataset, "collate_fn", None))
    yield from loader


# ---------------------------------------------------------------------------- augmentation
class BatchTransform(nn.Module):
    """On-device batch pipeline ``[B, C, H, W]`` in [0, 1] -> augmented and normalised ``[B, C, H, W]``.

    Training: random resized crop (``crop_scale``), horizontal flip (``hflip``), RandAugment
    (``randaugment=(n, m)``), random affine (probability ``affine``: ±10°, ±10 % shift, 0.9-1.1
    zoom), from kornia; then normalisation with ``mean`` / ``std``. In eval
    mode only the normalisation runs.

    A packed NaFlex batch (a dict with ``patches [B, L, ph·pw·C]``, channel fastest, and ``patch_valid
    [B, L]``) is normalised per channel only (no augmentation; padding rows stay zero).
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], *, img_size: tuple[int, int],
                 crop_scale: tuple[float, float] | None = None, hflip: float = 0.0,
                 randaugment: tuple[int, int] | None = None, affine: float = 0.0) -> None:
        super().__init__()
        import kornia.augmentation as K

        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        augs: list[nn.Module] = []
        if crop_scale is not None:
            augs.append(K.RandomResizedCrop(img_size, scale=crop_scale))
        if hflip > 0:
            augs.append(K.RandomHorizontalFlip(p=hflip))
        if affine > 0:  # small rotations, shifts and zooms (handwriting varies like this)
            augs.append(K.RandomAffine(degrees=10.0, translate=(0.1, 0.1), scale=(0.9, 1.1), p=affine))
        if randaugment is not None:
            n, m = randaugment
            augs.append(K.auto.RandAugment(n=n, m=m))
        self.augment = nn.Sequential(*augs)

    def forward(self, x: Tensor | Mapping[str, Tensor]) -> Any:
        """``[B, C, H, W]`` in [0, 1] -> ``[B, C, H, W]`` normalised (augmented in training); a packed NaFlex
        dict -> the same dict with ``patches [B, L, ph·pw·C]`` normalised."""
        if isinstance(x, Mapping):
            p = x["patches"]
            B, L, D = p.shape
            mean, std = self.mean.reshape(-1), self.std.reshape(-1)  # [C]
            normed = ((p.reshape(B, L, D // mean.numel(), mean.numel()) - mean) / std).reshape(B, L, D)
            return {**x, "patches": normed * x["patch_valid"][..., None].to(normed.dtype)}  # padding rows zero
        if self.training and len(self.augment):
            x = self.augment(x).clamp_(0, 1)
        return (x - self.mean) / self.std


def mix_batch(x: Tensor, y: Tensor, num_classes: int, *, mixup: float = 0.0, cutmix: float = 0.0,
              label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """Mixup / CutMix (kornia; one of them per batch, chosen at random when both are on) with soft targets.

    ``x [B, C, H, W]``, ``y [B]`` -> ``(mixed x [B, C, H, W], targets [B, num_classes])``; the
    targets are smoothed by ``label_smoothing`` first. ``mixup`` / ``cutmix`` are the Beta(α, α)
    parameters; 0 turns a method off.
    """
    import kornia.augmentation as K

    off = label_smoothing / num_classes
    target = torch.full((y.shape[0], num_classes), off, device=y.device, dtype=torch.float32)
    target.scatter_(1, y[:, None], 1.0 - label_smoothing + off)  # [B, K]
    use_mix = mixup > 0 and (cutmix <= 0 or torch.rand(()).item() < 0.5)
    use_cut = cutmix > 0 and not use_mix
    if not (use_mix or use_cut):
        return x, target
    if use_mix:  # kornia's third label column is the paired image's share
        lam = torch.distributions.Beta(mixup, mixup).sample().clamp(0.0, 1.0).item()
        aug: Any = K.RandomMixUpV2(lambda_val=torch.tensor([lam, lam]), p=1.0, data_keys=["input", "class"])
        x_mixed, lab = aug(x, y.float())  # lab [B, 3]: label, paired label, paired share
        paired_share = lab[:, 2].float()
    else:  # CutMix: the third column is the original image's share of pixels
        aug = K.RandomCutMixV2(num_mix=1, beta=cutmix, p=1.0, use_correct_lambda=True, data_keys=["input", "class"])
        x_mixed, lab = aug(x, y.float())
        lab = lab.reshape(-1, x.shape[0], 3)[0]  # [B, 3]
        paired_share = 1.0 - lab[:, 2].float()
    paired = lab[:, 1].long()
    other = torch.full_like(target, off)
    other.scatter_(1, paired[:, None], 1.0 - label_smoothing + off)
    target = (1 - paired_share)[:, None] * target + paired_share[:, None] * other  # [B, K]
    return x_mixed, target


def num_workers_default() -> int:
    """A sensible loader worker count for this machine."""
    return min(4, os.cpu_count() or 1)
