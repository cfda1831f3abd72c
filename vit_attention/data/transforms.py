"""Image transforms from a :class:`~vit_attention.data.DataConfig`: Pillow for resizing and cropping, torch after.

The eval transform follows timm's for the same config (``crop_mode="center"``: shorter side
resized to ``floor(size / crop_pct)``, the longer one to ``int(that * long / short)``, centre
crop with ``round``ed offsets; ``"squash"``: both sides to ``floor(size / crop_pct)``;
``"border"``: the longer side to it), then ``[0, 255] -> [0, 1]`` and ``(x - mean) / std`` in
float32. ``crop_pct`` above 1 (timm's VOLO 448 / 512 px tags use 1.15) leaves the resized image
smaller than the crop: it is padded, ``(crop - side) // 2`` before and the rest after, with
black in the ``"center"`` and ``"squash"`` modes (torchvision's ``CenterCrop``, which timm uses
there) and with the mean colour in ``"border"`` mode (timm's ``CenterCropOrPad(fill=mean)``).
Both resize with Pillow, so on Pillow images the outputs are equal bit for bit
(tests/data/test_transforms.py checks a ViT, a DeiT and a Swin config, a bilinear one and the
three modes at crop_pct 1.15 against timm's output). Tensors are not resized here: timm would resize them
with torchvision's tensor kernels, which differ from Pillow's by up to a few grey levels; give
images (or paths) instead. Images of every Pillow mode (16-bit, float, transparent, CMYK ...) are
read by :func:`~vit_attention.data.read_image` first (its rules keep their values; never clipped).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .config import DataConfig
from .image import read_image

__all__ = ["ImageTransform", "create_transform", "resize_size"]


def _pil_filter(name: str) -> Any:
    from PIL import Image

    return {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
            "nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS,
            "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING}[name]


def resize_size(image_wh: tuple[int, int], config: DataConfig) -> tuple[int, int]:
    """``(W, H)`` the eval transform resizes an image of ``image_wh`` to, before cropping to ``config.img_size``."""
    w, h = image_wh
    th, tw = config.img_size
    sh, sw = math.floor(th / config.crop_pct), math.floor(tw / config.crop_pct)
    if config.crop_mode == "squash":
        return sw, sh
    if config.crop_mode == "border":  # the longer side (relative to the target) fits
        ratio = max(h / sh, w / sw)
        return round(w / ratio), round(h / ratio)
    if sh == sw:  # shorter side to s, longer side truncated (as torchvision's Resize(int) computes it)
        if w <= h:
            return sh, int(sh * h / w)
        return int(sh * w / h), sh
    ratio = min(h / sh, w / sw)  # non-square target: the shorter side (relative to the target) fits
    return round(w / ratio), round(h / ratio)


def _center_crop_or_pad(img: Any, size: tuple[int, int], fill: tuple[int, ...]) -> Any:
    """Crop the centre ``size`` ``(H, W)`` out of a Pillow image, padding with ``fill`` where it is smaller."""
    from PIL import Image

    th, tw = size
    w, h = img.size
    if w < tw or h < th:
        nw, nh = max(w, tw), max(h, th)
        canvas = Image.new(img.mode, (nw, nh), fill if img.mode != "L" else fill[0])
        canvas.paste(img, ((nw - w) // 2, (nh - h) // 2))
        img, w, h = canvas, nw, nh
    top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
    return img.crop((left, top, left + tw, top + th))


class ImageTransform:
    """A Pillow image (or an image path) -> normalised float32 tensor ``[C, H, W]``, as ``config`` says.

    ``training=True`` adds a random-resized crop (area 8-100 %, aspect 3/4-4/3) and a horizontal
    flip with probability 0.5, drawn from ``generator`` (a ``torch.Generator``; default: torch's
    global one), in place of the resize and centre crop.
    """

    def __init__(self, config: DataConfig, *, training: bool = False, generator: torch.Generator | None = None
                 ) -> None:
        if not isinstance(config, DataConfig):
            raise TypeError(f"config must be a DataConfig (resolve_data_config(model) gives one), got "
                            f"{type(config).__name__}")
        self.config = config
        self.training = training
        self.generator = generator
        self._mean = torch.tensor(config.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std = torch.tensor(config.std, dtype=torch.float32).view(-1, 1, 1)

    def __repr__(self) -> str:
        c = self.config
        return (f"ImageTransform(input_size={c.input_size}, interpolation={c.interpolation!r}, crop_pct={c.crop_pct}, "
                f"crop_mode={c.crop_mode!r}, mean={c.mean}, std={c.std}, training={self.training})")

    def _open(self, image: Any) -> Any:
        """A path or Pillow image of any mode -> 8-bit ``L`` / ``RGB`` (:func:`~vit_attention.data.read_image`)."""
        if isinstance(image, Tensor):
            raise TypeError("ImageTransform takes Pillow images or paths, not tensors (resizing tensors would "
                            "differ from the reference transforms); Image.fromarray(...) first")
        if self.config.input_size[0] not in (1, 3):
            raise ValueError(f"input_size has {self.config.input_size[0]} channels; images have 1 (grey) or 3 (RGB)")
        return read_image(image, channels=self.config.input_size[0])

    def resize_crop(self, image: Any) -> Any:
        """The eval geometry only: a Pillow image -> the resized and cropped Pillow image ``size`` ``(W, H)``."""
        img = self._open(image)
        cfg = self.config
        size = resize_size(img.size, cfg)
        if size != img.size:
            img = img.resize(size, _pil_filter(cfg.interpolation))
        # timm pads with the mean colour in "border" mode only; torchvision's CenterCrop pads with 0
        fill = tuple(round(255 * m) for m in cfg.mean) if cfg.crop_mode == "border" else (0,) * len(cfg.mean)
        return _center_crop_or_pad(img, cfg.img_size, fill)

    def _random_resized_crop(self, image: Any) -> Any:
        img = self._open(image)
        w, h = img.size
        g = self.generator

        def uniform(lo: float, hi: float) -> float:
            return lo + (hi - lo) * torch.rand((), generator=g).item()

        box = (0, 0, w, h)
        for _ in range(10):
            area = w * h * uniform(0.08, 1.0)
            aspect = math.exp(uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 0 < cw <= w and 0 < ch <= h:
                left = int(torch.randint(0, w - cw + 1, (), generator=g))
                top = int(torch.randint(0, h - ch + 1, (), generator=g))
                box = (left, top, left + cw, top + ch)
                break
        th, tw = self.config.img_size
        img = img.resize((tw, th), _pil_filter(self.config.interpolation), box=box)
        if torch.rand((), generator=g).item() < 0.5:
            from PIL import Image

            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return img

    def to_tensor(self, image: Any) -> Tensor:
        """A Pillow image -> float32 ``[C, H, W]`` in ``[0, 1]`` (no normalisation)."""
        arr = np.asarray(image, dtype=np.uint8)
        t = torch.from_numpy(arr.copy())
        t = t[None] if t.ndim == 2 else t.permute(2, 0, 1)  # [C, H, W]
        return t.to(torch.float32).div(255)

    def __call__(self, image: Any) -> Tensor:
        """Image or path -> ``[C, H, W]`` float32, normalised."""
        img = self._random_resized_crop(image) if self.training else self.resize_crop(image)
        return (self.to_tensor(img) - self._mean) / self._std


def create_transform(config: DataConfig | Mapping[str, Any] | Any = None, *, training: bool = False,
                     generator: torch.Generator | None = None, input_size: Sequence[int] | None = None,
                     interpolation: str | None = None, mean: Sequence[float] | None = None,
                     std: Sequence[float] | None = None, crop_pct: float | None = None, crop_mode: str | None = None,
                     is_training: bool | None = None) -> ImageTransform:
    """The transform of ``config``: a callable image (path or Pillow image) -> ``[C, H, W]`` float32.

    ``config``: a :class:`DataConfig`, a model, a registered name or a ``pretrained_cfg`` dict
    (resolved with :func:`~vit_attention.data.resolve_data_config`), or ``None`` (the generic
    ImageNet config). The transform fields may also be given as keywords, alone or on top of
    ``config``, so timm's habit works: ``create_transform(**resolve_data_config(model))``
    (``input_size``, ``interpolation``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``).
    ``training=False`` (timm's ``is_training``): the eval transform (resize, crop, normalise);
    ``True``: random resized crop and flip (see :class:`ImageTransform`).
    """
    if is_training is not None:
        if training and not is_training:
            raise ValueError("training=True and is_training=False contradict each other; give one of them")
        training = bool(is_training) or training
    if not isinstance(config, DataConfig):
        from .config import resolve_data_config

        config = resolve_data_config(config)
    fields = {k: v for k, v in (("input_size", input_size), ("interpolation", interpolation), ("mean", mean),
                                ("std", std), ("crop_pct", crop_pct), ("crop_mode", crop_mode)) if v is not None}
    if fields:
        config = DataConfig.from_dict({**config.to_dict(), **fields})
    return ImageTransform(config, training=training, generator=generator)
