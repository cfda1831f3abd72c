"""Data configs per preset (input size, mean / std, crop, interpolation), eval / train transforms, class names.

    >>> from vit_attention.data import resolve_data_config, create_transform
    >>> config = resolve_data_config(model)          # the model's, as timm's for the same name and tag
    >>> x = create_transform(config)(image)[None]    # Pillow image -> [1, C, H, W], normalised
    >>> x = create_transform(**config)(path)[None]   # a DataConfig is also a read-only mapping (timm's keys)
    >>> rgb = read_image(path)                       # any Pillow mode (16-bit, alpha, CMYK ...) -> 8-bit RGB
"""

from .config import (
                     CROP_MODES,
                     IMAGENET_MEAN,
                     IMAGENET_STD,
                     INTERPOLATIONS,
                     TRANSFORM_KEYS,
                     DataConfig,
                     resolve_data_config,
)
from .image import UnsupportedImageError, read_image
from .imagenet import imagenet_class_names, imagenet_synsets
from .transforms import ImageTransform, create_transform, resize_size

__all__ = ["CROP_MODES", "DataConfig", "IMAGENET_MEAN", "IMAGENET_STD", "INTERPOLATIONS", "ImageTransform",
           "TRANSFORM_KEYS", "UnsupportedImageError", "create_transform", "imagenet_class_names", "imagenet_synsets",
           "read_image", "resize_size", "resolve_data_config"]
