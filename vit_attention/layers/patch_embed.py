"""Patch embedding: image ``[B, Cin, H, W]`` -> tokens ``[B, N, C]`` (or a map ``[B, H', W', C]``)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.patch_embed import resample_patch_embed
from ..functional.window import to_pair

__all__ = ["PatchEmbed", "ConvStemPatchEmbed"]


def _positive_pair(x: int | Sequence[int], name: str) -> tuple[int, int]:
    """``x`` (an int or a pair of ints) as a pair of positive ints; anything else raises naming ``name``."""
    items = (x,) if isinstance(x, numbers.Integral) else x
    if (isinstance(x, (str, bytes)) or not isinstance(items, Sequence)
            or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in items)):
        raise ValueError(f"{name} must be an int or a pair of ints, got {x!r}")
    t = to_pair(int(x) if isinstance(x, numbers.Integral) else tuple(int(v) for v in items), name)  # 7 -> (7, 7)
    if min(t) <= 0:
        raise ValueError(f"{name} must be a positive int or a pair of positive ints, got {x!r}")
    return t


class PatchEmbed(nn.Module):
    """Non-overlapping convolutional patch projection, ``[B, Cin, H, W] -> [B, N, C]``.

    With ``flatten=False`` the output is the channels-last map ``[B, H/p, W/p, C]`` (Swin layout).
    ``strict_img_size`` checks the input against ``img_size``; ``dynamic_img_pad`` pads the
    right/bottom edges up to a multiple of the patch instead of raising.

    ``size_options`` names, for the error messages, the options of the model being built that
    lift the fixed input size and that allow sizes that are not patch multiples (default: this
    layer's own ``strict_img_size=False`` and ``dynamic_img_pad=True``; ViT passes
    ``dynamic_img_size=True``; Swin passes ``strict_img_size=False`` alone, which does both).
    """

    def __init__(
        self,
        img_size: int | Sequence[int] | None = 224,
        patch_size: int | Sequence[int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        *,
        bias: bool = True,
        norm_layer: type[nn.Module] | None = None,
        flatten: bool = True,
        strict_img_size: bool = True,
        dynamic_img_pad: bool = False,
        size_options: tuple[str, str | None] = ("strict_img_size=False", "dynamic_img_pad=True"),
    ) -> None:
        super().__init__()
        self.patch_size = _positive_pair(patch_size, "patch_size")
        self.img_size = _positive_pair(img_size, "img_size") if img_size is not None else None
        for name, value in (("in_chans", in_chans), ("embed_dim", embed_dim)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.size_options = size_options
        self.grid_size: tuple[int, int] | None
        self.grid_size, self.num_patches = self._grid(self.img_size, self.patch_size, dynamic_img_pad)
        self.in_chans, self.embed_dim = in_chans, embed_dim
        self.flatten = flatten
        self.strict_img_size = strict_img_size and self.img_size is not None
        self.dynamic_img_pad = dynamic_img_pad
        self.proj = self._build_proj(in_chans, embed_dim, bias)
        self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

    @staticmethod
    def _grid(img_size: tuple[int, int] | None, patch_size: tuple[int, int], dynamic_img_pad: bool
              ) -> tuple[tuple[int, int] | None, int]:
        """``(grid_size, num_patches)`` for ``img_size`` (``(None, 0)`` without one); a size that is no
        multiple of the patch raises naming ``img_size`` unless ``dynamic_img_pad`` (the grid rounds up)."""
        if img_size is None:
            return None, 0
        for s, p in zip(img_size, patch_size):
            if s % p and not dynamic_img_pad:
                raise ValueError(f"img_size {img_size} is not divisible by patch_size {patch_size}")
        ph, pw = patch_size
        grid = ((img_size[0] + ph - 1) // ph, (img_size[1] + pw - 1) // pw)
        return grid, grid[0] * grid[1]

    def _build_proj(self, in_chans: int, embed_dim: int, bias: bool) -> nn.Module:
        return nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    def set_input_size(self, img_size: int | Sequence[int] | None = None,
                       patch_size: int | Sequence[int] | None = None, *, interpolation: str = "bicubic",
                       antialias: bool = True) -> None:
        """Change the nominal image size and / or the patch size, in place (timm's ``set_input_size``).

        ``img_size``: the new ``img_size`` (None = keep); it must be a multiple of the (new) patch
        size unless ``dynamic_img_pad``. ``patch_size``: a new kernel ``(Q, Q')`` replaces ``proj``,
        its weight ``[C, Cin, P, P'] -> [C, Cin, Q, Q']`` resampled by
        :func:`~vit_attention.functional.resample_patch_embed` (``interpolation`` / ``antialias``:
        the resize it inverts), the bias, dtype, device, ``requires_grad`` and train mode kept.
        ``grid_size`` and ``num_patches`` follow. Everything is checked before anything changes; an
        error names the argument. A conv stem (:class:`ConvStemPatchEmbed`) keeps its patch size.
        """
        new_patch = self.patch_size if patch_size is None else _positive_pair(patch_size, "patch_size")
        new_img = self.img_size if img_size is None else _positive_pair(img_size, "img_size")
        if new_img is not None:
            if not self.dynamic_img_pad and (new_img[0] % new_patch[0] or new_img[1] % new_patch[1]):
                pad = self.size_options[1]
                raise ValueError(f"img_size={new_img} is not divisible by patch_size={new_patch}; use a multiple "
                                 f"of the patch size{'' if pad is None else ', or build the model with ' + pad}")
        if new_patch != self.patch_size:
            self._resample_proj(new_patch, interpolation=interpolation, antialias=antialias)
            self.patch_size = new_patch
        self.img_size = new_img
        self.grid_size, self.num_patches = self._grid(new_img, self.patch_size, self.dynamic_img_pad)

    def _resample_proj(self, patch_size: tuple[int, int], *, interpolation: str, antialias: bool) -> None:
        """Replace the ``proj`` conv by one with kernel and stride ``patch_size``, its weight resampled."""
        old = self.proj
        assert isinstance(old, nn.Conv2d)
        with torch.no_grad():
            weight = resample_patch_embed(old.weight, patch_size, interpolation=interpolation, antialias=antialias)
            new = nn.Conv2d(old.in_channels, old.out_channels, kernel_size=patch_size, stride=patch_size,
                            bias=old.bias is not None, device=old.weight.device, dtype=old.weight.dtype)
            new.weight.copy_(weight)
            new.weight.requires_grad_(old.weight.requires_grad)
            if old.bias is not None:
                assert new.bias is not None
                new.bias.copy_(old.bias)
                new.bias.requires_grad_(old.bias.requires_grad)
        new.train(old.training)
        self.proj = new

    def check_input(self, x: Tensor) -> None:
        """Raise a clear error for a wrong rank, channel count or image size."""
        if x.dim() != 4:
            raise ValueError(f"expected images [B, {self.in_chans}, H, W], got a {x.dim()}-D tensor {tuple(x.shape)}")
        if x.shape[1] != self.in_chans:
            raise ValueError(f"expected {self.in_chans} input channels (in_chans={self.in_chans}), "
                             f"got {x.shape[1]} in input of shape {tuple(x.shape)}")
        H, W = x.shape[-2:]
        if self.strict_img_size and (H, W) != self.img_size:
            raise ValueError(self._size_error(H, W))
        if not self.dynamic_img_pad and (H % self.patch_size[0] or W % self.patch_size[1]):
            raise ValueError(self._size_error(H, W))

    def _size_error(self, H: int, W: int) -> str:
        """The message for an input size this layer refuses, with the option that accepts it."""
        multiple = not (H % self.patch_size[0] or W % self.patch_size[1])
        any_size, pad = self.size_options
        if self.strict_img_size and (H, W) != self.img_size:
            if multiple or self.dynamic_img_pad:
                hint = f"img_size=({H}, {W}) or {any_size}"
            else:  # rebuilding at this size cannot work: it is no patch multiple
                hint = any_size if pad is None else f"{any_size} and {pad}"
                hint += f" to accept sizes that are not multiples of patch_size {self.patch_size}"
            return (f"expected image size {self.img_size}, got ({H}, {W}); resize the images to "
                    f"{self.img_size}, or build the model with {hint}")
        hint = f"; resize the images to a multiple of it{'' if pad is None else ', or build the model with ' + pad}"
        return f"image size ({H}, {W}) is not divisible by patch_size {self.patch_size}{hint}"

    def dynamic_feat_size(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Token grid ``(H', W')`` for an image of size ``hw``."""
        ph, pw = self.patch_size
        return ((hw[0] + ph - 1) // ph, (hw[1] + pw - 1) // pw)  # ceil (ONNX-safe form)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W]`` -> ``[B, H'·W', C]`` (``flatten``) or ``[B, H', W', C]``."""
        self.check_input(x)
        if self.dynamic_img_pad:
            ph = (-x.shape[-2]) % self.patch_size[0]
            pw = (-x.shape[-1]) % self.patch_size[1]
            if ph or pw:
                x = F.pad(x, (0, pw, 0, ph))
        x = self.proj(x).permute(0, 2, 3, 1)  # [B, H', W', C]
        if self.flatten:
            x = x.flatten(1, 2)  # [B, N, C]
        return self.norm(x)


class ConvStemPatchEmbed(PatchEmbed):
    """Early convolutional stem (Xiao et al., 2021, "Early convolutions help transformers see better").

    ``log2(patch)`` stride-2 3x3 conv + BatchNorm + ReLU stages, then a 1x1 conv to ``embed_dim``:
    ``[B, Cin, H, W] -> [B, N, C]``. ``stem_chs`` lists the widths of the 3x3 stages.
    """

    def __init__(self, img_size: int | Sequence[int] | None = 224, patch_size: int | Sequence[int] = 16,
                 in_chans: int = 3, embed_dim: int = 768, *, stem_chs: Sequence[int] = (48, 96, 192, 384),
                 **kwargs: object) -> None:
        self.stem_chs = tuple(stem_chs)
        super().__init__(img_size, patch_size, in_chans, embed_dim, **kwargs)  # type: ignore[arg-type]

    def _resample_proj(self, patch_size: tuple[int, int], *, interpolation: str, antialias: bool) -> None:
        raise ValueError(f"patch_size={patch_size}: a conv stem's patch size is fixed by its "
                         f"{len(self.stem_chs)} stride-2 stages ({self.patch_size}); change img_size only")

    def _build_proj(self, in_chans: int, embed_dim: int, bias: bool) -> nn.Module:
        ph, pw = self.patch_size
        if ph != pw or (1 << len(self.stem_chs)) != ph:
            raise ValueError(f"a conv stem of {len(self.stem_chs)} stride-2 stages gives patch "
                             f"{1 << len(self.stem_chs)}, but patch_size={self.patch_size}")
        layers: list[nn.Module] = []
        prev = in_chans
        for ch in self.stem_chs:
            layers += [nn.Conv2d(prev, ch, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(ch),
                       nn.ReLU(inplace=True)]
            prev = ch
        layers.append(nn.Conv2d(prev, embed_dim, 1, bias=bias))
        return nn.Sequential(*layers)
