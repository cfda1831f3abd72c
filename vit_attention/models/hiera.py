"""Hiera (Ryali et al., "Hiera: A Hierarchical Vision Transformer without the Bells-and-Whistles", ICML 2023).

Config dataclass -> :class:`Hiera` -> presets registered as data (timm 1.0.31's names and configs,
``timm/models/hiera.py``, adapted from facebookresearch/hiera; the ``abswin`` variants from "Window Attention is
Bugged: How not to Interpolate Position Embeddings", Bolya et al., arXiv 2311.05613):

* patch embedding: conv 7x7 stride 4 padding 3 (with bias) -> a map ``[B, H/4, W/4, C]``, plus an absolute position
  embedding ``pos_embed [1, N, C]`` (row-major), or (``abs_win_pos_embed``) a global table ``pos_embed [1, C, g, g]``
  resampled to the token grid (bicubic, antialiased) plus a mask-unit table ``pos_embed_win [1, C, 8, 8]`` tiled over
  the units;
* stages of Hiera blocks on the tokens in Hiera's unrolled order (:mod:`vit_attention.functional.mask_unit`): each
  stage unrolls its input map, runs its blocks and rerolls the result to a map (a permutation both ways: the same
  numbers as timm's one unroll at the start, and every stage's output is a spatial map for the intermediates);
* a block: ``u = LN1(x)``; at a stage transition the skip is ``maxpool(Linear(u))`` (or, ``use_expand_proj=False``,
  ``[maxpool(x) | meanpool(x)]``) and the attention (:class:`~vit_attention.attention.mask_unit.MaskUnitPoolAttention`)
  max-pools its queries 2x2 and doubles the width; otherwise ``x + attn(u)`` with the ``mask_unit`` mechanism; then
  ``x + MLP(LN2(x))`` (GELU, ratio 4); LayerNorm eps 1e-6, optional LayerScale;
* the schedule: the first block of every later stage pools; ``mask_unit_attn`` (per stage; timm: ``(T, T, F, F)``)
  is lagged by one block, so a stage's first block keeps the previous stage's kind of attention; mask units are
  ``8x8`` tokens in stage 1, ``4x4`` in stage 2, ... (always 32x32 pixels);
* head: the mean over the last map, LayerNorm (``head.norm``), dropout, ``head.fc`` (timm's keys).

State-dict keys: ``patch_embed.proj``, ``pos_embed`` (``pos_embed_win``), ``stages.{s}.blocks.{j}.{norm1, proj,
attn.qkv, attn.proj, ls1.gamma, norm2, mlp.fc1, mlp.fc2, ls2.gamma}``, ``head.norm``, ``head.fc``; timm's flat
``blocks.{i}``, the original repository's and Hugging Face's names load through
:mod:`vit_attention.weights.hiera`.

Sizes: the token grid must hold whole mask units and survive the poolings, so the image sides must be multiples of
``4 · 2^(stages-1)`` (32 px with four stages); other sizes are refused naming the rule. A model with the row-major
``pos_embed`` runs at the size it was built for; :meth:`Hiera.set_input_size` resamples that table to another size
(bicubic without antialiasing, as transformers' ``interpolate_pos_encoding``). The ``abswin`` tables are resampled
on every call, so those models run at any allowed size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.base import AttentionCall
from ..attention.mask_unit import MaskUnitAttention, MaskUnitPoolAttention
from ..functional.mask_unit import reroll, unroll
from ..layers import DropPath, stage_feature_info
from ..layers.head import ClassifierHead, init_linear_weights
from ..layers.layer_scale import LayerScale
from ..layers.mlp import Mlp
from ..layers.stage import drop_path_schedule, run_blocks
from ._config import ConfigMixin, check_common, check_float, check_int, check_int_seq, check_size
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["HieraConfig", "Hiera", "HieraBlock", "HieraStage", "reduced_config"]

PATCH_STRIDE = 4  # the 7x7 stride-4 convolution of the patch embedding


@dataclass
class HieraConfig(ConfigMixin):
    """Everything a :class:`Hiera` is built from (JSON-serialisable).

    ``embed_dim`` / ``num_heads``: stage 1's; both double at every later stage. ``depth``: blocks per stage.
    ``mask_unit_attn``: per stage, mask-unit (True) or global attention (lagged by one block). ``abs_win_pos_embed``:
    the ``abswin`` position embedding with a ``global_pos_size`` global table; ``use_expand_proj``: the transition
    skip is a projection (True) or ``[maxpool | meanpool]`` of the raw tokens (False, doubling the width).
    ``init_values``: LayerScale (None = none).
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    embed_dim: int = 96
    num_heads: int = 1
    depth: tuple[int, ...] = (2, 3, 16, 3)
    mask_unit_attn: tuple[bool, ...] = (True, True, False, False)
    mlp_ratio: float = 4.0
    abs_win_pos_embed: bool = False
    global_pos_size: tuple[int, int] = (14, 14)
    use_expand_proj: bool = True
    init_values: float | None = None
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        img = check_common(self)
        depth = check_int_seq(self.depth, "depth")
        dim, heads = check_int(self.embed_dim, "embed_dim"), check_int(self.num_heads, "num_heads")
        if dim % heads:
            raise ValueError(f"embed_dim={dim} must be divisible by num_heads={heads}")
        mu = self.mask_unit_attn
        if not isinstance(mu, (tuple, list)) or len(mu) != len(depth) or not all(isinstance(b, bool) for b in mu):
            raise ValueError(f"mask_unit_attn must be one bool per stage like depth {tuple(depth)}, got {mu!r}")
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        for name in ("abs_win_pos_embed", "use_expand_proj"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        check_size(self.global_pos_size, "global_pos_size")
        if self.init_values is not None:
            check_float(self.init_values, "init_values", low_open=True)
        check_hiera_size(img, len(depth), "img_size")


def check_hiera_size(img_size: tuple[int, int], num_stages: int, what: str = "img_size") -> tuple[int, int]:
    """``(H, W)`` after checking both are multiples of ``4 · 2^(num_stages-1)``: the token grid (stride 4) must
    hold whole mask units (``2^(num_stages-1)`` tokens a side) and halve at every stage; else ``ValueError``."""
    step = PATCH_STRIDE * 2 ** (num_stages - 1)
    H, W = int(img_size[0]), int(img_size[1])
    if H % step or W % step:
        raise ValueError(f"{what}={(H, W)}: Hiera needs image sides that are multiples of {step} (the stride-4 token "
                         f"grid holds whole {step // PATCH_STRIDE}x{step // PATCH_STRIDE}-token mask units and "
                         f"halves at each of its {num_stages - 1} stage transitions)")
    return H, W


class HieraBlock(nn.Module):
    """One Hiera block on unrolled tokens, ``[B, N, C] -> [B, N / q_stride, C']`` (timm 1.0.31's ``HieraBlock``).

    ``q_stride`` 4 (a stage's first block): the attention max-pools its queries and the skip is
    ``maxpool(proj(LN1 x))`` (or ``[maxpool(x) | meanpool(x)]`` without ``use_expand_proj``). ``mask_unit``: the
    unit side after pooling. Keys: ``norm1``, ``proj`` (transitions), ``attn.qkv``, ``attn.proj``, ``ls1.gamma``,
    ``norm2``, ``mlp.fc1`` / ``fc2``, ``ls2.gamma``.
    """

    def __init__(self, dim: int, dim_out: int, num_heads: int, *, q_stride: int = 1, mask_unit: int = 8,
                 mask_unit_attn: bool = True, mlp_ratio: float = 4.0, drop_path: float = 0.0,
                 init_values: float | None = None, use_expand_proj: bool = True) -> None:
        super().__init__()
        self.dim, self.dim_out, self.q_stride = dim, dim_out, q_stride
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.proj: nn.Module | None = None
        if dim != dim_out and use_expand_proj:
            self.proj = nn.Linear(dim, dim_out)
        elif dim != dim_out and dim_out != 2 * dim:
            raise ValueError(f"without use_expand_proj the width must double at a transition, got {dim} -> {dim_out}")
        self.attn: nn.Module
        if q_stride > 1 or dim != dim_out:
            self.attn = MaskUnitPoolAttention(dim, dim_out, num_heads, q_stride=q_stride, mask_unit=mask_unit,
                                              mask_unit_attn=mask_unit_attn)
        else:
            self.attn = MaskUnitAttention(dim, num_heads, mask_unit=mask_unit, mask_unit_attn=mask_unit_attn)
        self.ls1 = LayerScale(dim_out, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim_out, eps=1e-6)
        self.mlp = Mlp(dim_out, int(dim_out * mlp_ratio))
        self.ls2 = LayerScale(dim_out, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """``x [B, N, C]`` (unrolled tokens of the map ``grid``) -> ``[B, N / q_stride, C']``."""
        u = self.norm1(x)
        if self.dim != self.dim_out:
            B, N, s = x.shape[0], x.shape[1], self.q_stride  # every size spelled out: B may be 0
            if self.proj is not None:
                p = self.proj(u)
                x = p.reshape(B, s, N // s, p.shape[-1]).amax(dim=1)  # the unrolled 2x2 max-pool
            else:
                q = x.reshape(B, s, N // s, x.shape[-1])
                x = torch.cat([q.amax(dim=1), q.mean(dim=1)], dim=-1)
        plain1 = isinstance(self.ls1, nn.Identity) and isinstance(self.drop_path1, nn.Identity)
        if plain1:  # the residual add fused into the attention's output projection
            x = self.attn(u, AttentionCall(feat_size=grid, residual=x))
        else:
            x = x + self.drop_path1(self.ls1(self.attn(u, AttentionCall(feat_size=grid))))
        if isinstance(self.ls2, nn.Identity) and isinstance(self.drop_path2, nn.Identity):
            return self.mlp(self.norm2(x), residual=x)  # fused into fc2
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class HieraStage(nn.Module):
    """A Hiera stage on maps, ``[B, H, W, C] -> [B, H', W', C']``: unroll (``in_steps`` steps), the blocks (the
    first one pooling when ``pooled``: ``H' = H/2``), reroll (``in_steps - pooled`` steps). Keys ``blocks.{j}``."""

    def __init__(self, blocks: list[HieraBlock], in_steps: int, pooled: bool) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.in_steps, self.pooled = in_steps, pooled
        self.grad_checkpointing = False

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, H', W', C']``."""
        B, H, W, _ = x.shape
        t = unroll(x, self.in_steps)  # [B, H·W, C]
        grid, steps = (H, W), self.in_steps
        checkpoint = self.grad_checkpointing and self.training
        if self.pooled:
            t = run_blocks(self.blocks[:1], t, grid, checkpoint=checkpoint)
            grid, steps = (H // 2, W // 2), steps - 1
            t = run_blocks(self.blocks[1:], t, grid, checkpoint=checkpoint)
        else:
            t = run_blocks(self.blocks, t, grid, checkpoint=checkpoint)
        return reroll(t, grid, steps)


class PatchEmbed(nn.Module):
    """Conv 7x7 stride 4 padding 3: images ``[B, Cin, H, W] -> [B, H/4, W/4, C]`` (key ``proj``)."""

    def __init__(self, in_chans: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, 7, PATCH_STRIDE, 3)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, H/4, W/4, C]``."""
        return self.proj(x).permute(0, 2, 3, 1)


class Hiera(StagedBackbone):
    """Hiera backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last stage's map ``[B, H/32, W/32, C_3]`` (no final norm: Hiera normalises after
    pooling, in ``head.norm``), ``forward_intermediates`` each stage's map (rerolled to image order).
    """

    family = "hiera"
    config_cls = HieraConfig
    no_weight_decay_keys = ("pos_embed",)
    token_merging_note = ("its tokens sit in Hiera's unrolled order, attend within fixed mask units and are max-pooled "
                          "by quarters of the sequence: merged tokens would break all three")

    def __init__(self, cfg: HieraConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        n = len(cfg.depth)
        dims = [cfg.embed_dim * 2 ** s for s in range(n)]
        heads = [cfg.num_heads * 2 ** s for s in range(n)]
        self.global_pool = cfg.global_pool
        self.num_features = dims[-1]
        self.num_stages = n
        self.mask_unit_size = 2 ** (n - 1)
        self.patch_embed = PatchEmbed(cfg.in_chans, dims[0])
        H, W = check_size(cfg.img_size, "img_size")
        grid = (H // PATCH_STRIDE, W // PATCH_STRIDE)
        self.pos_embed_win: nn.Parameter | None = None
        if cfg.abs_win_pos_embed:
            self.pos_embed = nn.Parameter(torch.zeros(1, dims[0], *check_size(cfg.global_pos_size, "global_pos_size")))
            self.pos_embed_win = nn.Parameter(torch.zeros(1, dims[0], self.mask_unit_size, self.mask_unit_size))
        else:
            self.pos_embed = nn.Parameter(torch.zeros(1, grid[0] * grid[1], dims[0]))
        self.grid_size = grid

        rates = drop_path_schedule(cfg.drop_path_rate, cfg.depth)  # linear over all blocks, per stage
        stages = []
        for s in range(n):
            blocks = []
            unit = self.mask_unit_size >> s  # the unit side after this stage's pooling
            for j in range(cfg.depth[s]):
                first = j == 0 and s > 0
                blocks.append(HieraBlock(
                    dims[s - 1] if first else dims[s], dims[s], heads[s], q_stride=4 if first else 1, mask_unit=unit,
                    mask_unit_attn=cfg.mask_unit_attn[s - 1] if first else cfg.mask_unit_attn[s],
                    mlp_ratio=cfg.mlp_ratio, drop_path=rates[s][j], init_values=cfg.init_values,
                    use_expand_proj=cfg.use_expand_proj))
            stages.append(HieraStage(blocks, n - 1 - max(s - 1, 0), pooled=s > 0))
        self.stages = nn.Sequential(*stages)
        self.feature_info = stage_feature_info(dims, [PATCH_STRIDE * 2 ** s for s in range(n)], "stages")
        self.norm = nn.Identity()  # Hiera normalises after pooling (head.norm)
        self.head = ClassifierHead(self.num_features, cfg.num_classes, global_pool="", drop=cfg.drop_rate,
                                   norm_layer=partial(nn.LayerNorm, eps=1e-6))
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """timm's init: linear weights truncated normal (std 0.02), biases 0, the position tables likewise."""
        init_linear_weights(self)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.pos_embed_win is not None:
            nn.init.trunc_normal_(self.pos_embed_win, std=0.02)

    def _position(self, grid: tuple[int, int]) -> Tensor:
        """The position embedding on the token grid, channels-last ``[1, h, w, C]``."""
        if self.pos_embed_win is not None:
            units = (grid[0] // self.mask_unit_size, grid[1] // self.mask_unit_size)
            win = self.pos_embed_win.tile(1, 1, *units)  # [1, C, h, w]
            glob = F.interpolate(self.pos_embed, size=grid, mode="bicubic", antialias=True)
            return (glob + win).permute(0, 2, 3, 1)
        if tuple(grid) != tuple(self.grid_size):
            raise ValueError(f"images of {grid[0] * PATCH_STRIDE}x{grid[1] * PATCH_STRIDE} px: this Hiera's position "
                             f"embedding is built for img_size={self.cfg.img_size}; call set_input_size to resample "
                             "it (or build the model at that img_size)")
        return self.pos_embed.reshape(1, grid[0], grid[1], -1)

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> the first stage's map ``[B, H/4, W/4, C_0]`` with the position embedding."""
        self.check_channels(x)
        check_hiera_size(tuple(x.shape[-2:]), self.num_stages, "the input size")
        x = self.patch_embed(x)
        return x + self._position((x.shape[1], x.shape[2]))

    def _check_img_size(self, img_size: tuple[int, int]) -> None:
        check_hiera_size(img_size, self.num_stages, "img_size")

    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Change the nominal input size in place: the size is checked (multiples of 32 px with four stages), the
        row-major ``pos_embed`` is resampled to the new token grid (bicubic, no antialiasing: transformers'
        ``interpolate_pos_encoding``), and ``cfg.img_size`` records it (``abswin`` tables need nothing)."""
        if img_size is None:
            return
        img = check_size(img_size, "img_size")
        self._check_img_size(img)
        grid = (img[0] // PATCH_STRIDE, img[1] // PATCH_STRIDE)
        if self.pos_embed_win is None and grid != tuple(self.grid_size):
            old = self.pos_embed
            h, w = self.grid_size
            with torch.no_grad():
                table = old.reshape(1, h, w, -1).permute(0, 3, 1, 2)
                table = F.interpolate(table, size=grid, mode="bicubic", align_corners=False)
                table = table.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1).contiguous()
            self.pos_embed = nn.Parameter(table, requires_grad=old.requires_grad)
        self.grid_size = grid
        self.cfg.img_size = img[0] if img[0] == img[1] else img


# ---------------------------------------------------------------------------- presets (data)
_PRESETS: dict[str, dict[str, Any]] = {
    "hiera_tiny_224": dict(embed_dim=96, num_heads=1, depth=(1, 2, 7, 2)),
    "hiera_small_224": dict(embed_dim=96, num_heads=1, depth=(1, 2, 11, 2)),
    "hiera_base_224": dict(embed_dim=96, num_heads=1, depth=(2, 3, 16, 3)),
    "hiera_base_plus_224": dict(embed_dim=112, num_heads=2, depth=(2, 3, 16, 3)),
    "hiera_large_224": dict(embed_dim=144, num_heads=2, depth=(2, 6, 36, 4)),
    "hiera_huge_224": dict(embed_dim=256, num_heads=4, depth=(2, 6, 36, 4)),
    "hiera_small_abswin_256": dict(embed_dim=96, num_heads=1, depth=(1, 2, 11, 2), img_size=256,
                                   abs_win_pos_embed=True, global_pos_size=(16, 16), init_values=1e-5,
                                   use_expand_proj=False),
    "hiera_base_abswin_256": dict(embed_dim=96, num_heads=1, depth=(2, 3, 16, 3), img_size=256,
                                  abs_win_pos_embed=True, init_values=1e-5),
}

# timm 1.0.31 parameters on the meta device (the default tag's head) and GMACs at the preset's size from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs)
_PUBLISHED: dict[str, tuple[float, float]] = {
    "hiera_tiny_224": (27.910, 4.91),
    "hiera_small_224": (35.008, 6.42),
    "hiera_base_224": (51.525, 9.40),
    "hiera_base_plus_224": (69.897, 12.67),
    "hiera_large_224": (213.740, 40.34),
    "hiera_huge_224": (672.780, 124.85),
    "hiera_small_abswin_256": (34.362, 8.29),
    "hiera_base_abswin_256": (51.267, 12.46),
}
_META = published_meta(_PUBLISHED, "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs",
                       meta_device=_PUBLISHED)


def reduced_config(cfg: HieraConfig) -> dict[str, Any]:
    """Overrides that shrink a Hiera preset for tests: width 16 with 1 head (32 / 64 / 128 and 2 / 4 / 8 after),
    depths (1, 2, 2, 1) on 64 px (token grid 16x16: four 8x8 mask units), which keeps every kind of block: mask-unit
    blocks with and without pooling, the lagged mask-unit pooling block opening stage 3, global blocks with and
    without pooling; the position embedding kind, LayerScale and the skip are the preset's (an ``abswin`` global
    table of 4x4)."""
    out: dict[str, Any] = dict(embed_dim=16, num_heads=1, depth=(1, 2, 2, 1), img_size=64)
    if cfg.abs_win_pos_embed:
        out["global_pos_size"] = (4, 4)
    return out


register_family("hiera", Hiera, HieraConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.9)
_256 = data_cfg(256, 0.95)
PRETRAINED = pretrained_tags({
    "hiera_base_224.mae_in1k_ft_in1k": _224,
    "hiera_base_224.mae": dict(_224, num_classes=0),
    "hiera_base_abswin_256.untrained": dict(_256, hf_hub_id=None, license="apache-2.0"),
    "hiera_base_plus_224.mae_in1k_ft_in1k": _224,
    "hiera_base_plus_224.mae": dict(_224, num_classes=0),
    "hiera_huge_224.mae_in1k_ft_in1k": _224,
    "hiera_huge_224.mae": dict(_224, num_classes=0),
    "hiera_large_224.mae_in1k_ft_in1k": _224,
    "hiera_large_224.mae": dict(_224, num_classes=0),
    "hiera_small_224.mae_in1k_ft_in1k": _224,
    "hiera_small_224.mae": dict(_224, num_classes=0),
    "hiera_small_abswin_256.sbb2_e200_in12k_ft_in1k": dict(_256, license="apache-2.0"),
    "hiera_small_abswin_256.sbb2_pd_e200_in12k_ft_in1k": dict(_256, license="apache-2.0"),
    "hiera_small_abswin_256.sbb2_e200_in12k": dict(_256, num_classes=11821, license="apache-2.0"),
    "hiera_small_abswin_256.sbb2_pd_e200_in12k": dict(_256, num_classes=11821, license="apache-2.0"),
    "hiera_tiny_224.mae_in1k_ft_in1k": _224,
    "hiera_tiny_224.mae": dict(_224, num_classes=0),
}, license="cc-by-nc-4.0")

