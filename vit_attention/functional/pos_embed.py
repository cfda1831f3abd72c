"""Position-embedding functions: fixed 2-D sin-cos tables and resampling to a new grid."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sincos_2d_pos_embed", "resample_abs_pos_embed", "POS_EMBED_RESIZE_RULES", "PosEmbedResize"]

PosEmbedResize = Literal["timm", "dinov2", "bicubic"]
#: The resize rules of :func:`resample_abs_pos_embed` :
#: ``"timm"``: ``size=``, ``interpolation`` (bicubic) with ``antialias`` (on): timm ``resample_abs_pos_embed``, the
#: original DINOv2 register models, HF ``Dinov2WithRegistersModel``;
#: ``"dinov2"``: ``scale_factor=((nh + 0.1) / gh, (nw + 0.1) / gw)``, bicubic, no antialias: the original plain
#: DINOv2 (``interpolate_offset=0.1``, ``interpolate_antialias=False``);
#: ``"bicubic"``: ``size=``, bicubic, no antialias: HF ``interpolate_pos_encoding`` of ViT / CLIP / SigLIP /
#: ``Dinov2Model``.
POS_EMBED_RESIZE_RULES: tuple[str, ...] = ("timm", "dinov2", "bicubic")


def sincos_2d_pos_embed(
    embed_dim: int, grid_size: tuple[int, int], *, temperature: float = 10000.0,
    dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
) -> Tensor:
    """Fixed 2-D sin-cos embedding (MAE / "Simple ViT" layout) -> ``[gh*gw, C]``.

    Channels are ``[sin(y), cos(y), sin(x), cos(x)]`` quarters, rows in raster order.
    """
    if embed_dim % 4:
        raise ValueError(f"embed_dim must be divisible by 4 for 2-D sin-cos, got {embed_dim}")
    gh, gw = grid_size
    ys, xs = torch.meshgrid(
        torch.arange(gh, dtype=torch.float32, device=device),
        torch.arange(gw, dtype=torch.float32, device=device),
        indexing="ij",
    )
    quarter = embed_dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32, device=device) / quarter)
    y = ys.reshape(-1, 1) * omega  # [gh*gw, C/4]
    x = xs.reshape(-1, 1) * omega
    return torch.cat([y.sin(), y.cos(), x.sin(), x.cos()], dim=1).to(dtype)  # [gh*gw, C]


def resample_abs_pos_embed(
    pos_embed: Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    *,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
    rule: PosEmbedResize = "timm",
) -> Tensor:
    """Resample a learned table ``[1, P + gh*gw, C]`` to ``[1, P + nh*nw, C]``.

    ``P = num_prefix_tokens`` (class / distillation tokens) are kept as they are; the grid part
    is interpolated as an image, in float32, ``align_corners=False``. ``old_size`` defaults to the
    square root of the grid length. ``rule`` (:data:`POS_EMBED_RESIZE_RULES`) picks the resize call:

    * ``"timm"`` (default): ``F.interpolate(size=(nh, nw), mode=interpolation, antialias=antialias)``;
      with the defaults (bicubic, antialias) timm's rule, also the original DINOv2 register models' and
      HF ``Dinov2WithRegistersModel``'s.
    * ``"dinov2"``: the original plain DINOv2 (``interpolate_offset=0.1``, no antialias):
      ``scale_factor=((nh + 0.1) / gh, (nw + 0.1) / gw)``, bicubic. The output is ``nh x nw`` but the
      sampling follows the offset scale, ``src = (dst + 0.5) * gh / (nh + 0.1) - 0.5``.
    * ``"bicubic"``: ``size=(nh, nw)``, bicubic, no antialias (HF ``interpolate_pos_encoding`` of ViT,
      CLIP, SigLIP and ``Dinov2Model``).

    ``interpolation`` / ``antialias`` apply to ``"timm"`` only; the other rules fix them. The table is
    returned as it is when the grid does not change (every rule, as the originals).
    """
    if pos_embed.dim() != 3:
        raise ValueError(f"pos_embed must be [1, tokens, C], got {tuple(pos_embed.shape)}")
    if rule not in POS_EMBED_RESIZE_RULES:
        raise ValueError(f"rule must be one of {POS_EMBED_RESIZE_RULES}, got {rule!r}")
    n_grid = pos_embed.shape[1] - num_prefix_tokens
    if old_size is None:
        side = int(math.isqrt(n_grid))
        if side * side != n_grid:
            raise ValueError(f"cannot infer a square grid from {n_grid} tokens; pass old_size")
        old_size = (side, side)
    if old_size[0] * old_size[1] != n_grid:
        raise ValueError(f"old_size {old_size} does not match {n_grid} grid tokens")
    if tuple(new_size) == tuple(old_size):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    C = grid.shape[-1]
    orig_dtype = grid.dtype
    grid = grid.float().reshape(1, old_size[0], old_size[1], C).permute(0, 3, 1, 2)  # [1, C, gh, gw]
    if rule == "dinov2":
        scale = ((new_size[0] + 0.1) / old_size[0], (new_size[1] + 0.1) / old_size[1])
        grid = F.interpolate(grid, scale_factor=scale, mode="bicubic", antialias=False, align_corners=False)
        if tuple(grid.shape[-2:]) != tuple(new_size):  # floor(g * (n + 0.1) / g) = n; guards float rounding
            raise RuntimeError(f"offset resize gave {tuple(grid.shape[-2:])}, expected {tuple(new_size)}")
    elif rule == "bicubic":
        grid = F.interpolate(grid, size=tuple(new_size), mode="bicubic", antialias=False, align_corners=False)
    else:
        grid = F.interpolate(grid, size=tuple(new_size), mode=interpolation,
                             antialias=antialias and interpolation in ("bilinear", "bicubic"),
                             align_corners=False if interpolation in ("bilinear", "bicubic") else None)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_size[0] * new_size[1], C).to(orig_dtype)
    return torch.cat([prefix, grid], dim=1)  # [1, P + nh*nw, C]
