"""ViTDet (Li et al. 2022, "Exploring Plain Vision Transformer Backbones for Object Detection").

A plain, non-hierarchical ViT run at detection resolution (1024², a 64x64 token map) and a
*simple feature pyramid* built from its last map alone:

* **Backbone.** Patch embedding (stride 16, channels-last ``[B, H', W', C]`` from there on), plus
  the MAE pre-training absolute position embedding ``pos_embed [1, 1 + 14·14, C]`` (class row
  dropped, grid resized bicubically to the map at run time, as detectron2 / Hugging Face do). Then
  pre-norm blocks (LayerNorm eps 1e-6) whose attention is the ``rel_pos`` mechanism
  (:mod:`vit_attention.attention.rel_pos`): window attention (``ws = 14``, no shift, unmasked zero
  padding 64 -> 70) everywhere but at ``global_block_indices`` (B: 2, 5, 8, 11; L: 5, 11, 17, 23;
  H: 7, 15, 23, 31), which attend globally; all with MViTv2's decomposed relative positions. No
  final norm (the references have none).
* **Simple feature pyramid** (detectron2 ``SimpleFeaturePyramid``) from the stride-16 map:
  ``p2`` (stride 4: deconv 2x2 -> LayerNorm -> GELU -> deconv 2x2), ``p3`` (stride 8: one
  deconv), ``p4`` (16: identity), ``p5`` (32: max-pool 2x2), each then conv 1x1 + LN and conv 3x3
  + LN to 256 channels (no conv bias), and ``p6`` = max-pool(kernel 1, stride 2) of ``p5``.

How it meets the library's model contract (every registered model is a classifier too):

* :meth:`ViTDet.forward_pyramid` ``[B, 3, H, W] -> {"p2": [B, 256, H/4, W/4], ..., "p6": ...}``
  is the detection output, like detectron2's backbone; :meth:`ViTDet.output_shape` gives each
  level's channels and stride.
* ``create_model(name, features_only=True)`` returns the same pyramid as a list (``feature_info``
  describes the five levels, ``forward_intermediates`` computes them).
* ``forward`` / ``forward_features`` / ``forward_head`` are the classifier of the contract:
  ``forward_features`` is the last backbone map ``[B, H', W', C]`` (channels-last, unnormalised)
  and the probe average-pools it (``pool``) into ``num_classes`` logits (``head.fc``: an ImageNet-style
  probe that ViTDet itself does not have; ``num_classes=0`` removes it). So ``forward`` costs the backbone only,
  which is what the published parameter counts and GMACs measure.

Any image size runs: images are zero-padded to a patch multiple, maps to the window multiple inside
window blocks; global blocks resize their relative-position tables when the map is not the grid
the model was built for (``img_size / patch``). :meth:`ViTDet.set_input_size` makes another size the
model's own: the global blocks' tables resized once to the new grid, as the forward resizes them.

State-dict keys are detectron2's (``backbone.net.*`` without the prefix; timm ``samvit`` /
Hugging Face ``VitDet`` name the same tensors): ``pos_embed``, ``patch_embed.proj``,
``blocks.{i}.{norm1, attn.{qkv, proj, rel_pos_h, rel_pos_w}, norm2, mlp.{fc1, fc2}}``,
``simfp_{2,3,4,5}.*`` (``backbone.simfp_*``), and the probe ``head.fc``. Other layouts are
converted by :mod:`vit_attention.weights.vitdet`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import resample_abs_pos_embed
from ..functional.rel_pos import resize_rel_pos
from ..layers import Block, ClassifierHead, PatchEmbed, accepted_kwargs, drop_path_schedule, run_blocks_with_taps
from ..layers.head import init_linear_weights
from ..layers.norm import LayerNorm2d
from ._config import (
    ConfigMixin,
    check_attn_layer,
    check_choice,
    check_common,
    check_float,
    check_int,
    check_int_seq,
    check_size,
    check_width_heads,
)
from .backbone import IsotropicBackbone, isotropic_taps
from .registry import register_family

__all__ = ["ViTDetConfig", "ViTDet", "ShapeSpec", "ConvNorm", "pyramid_stage", "reduced_config"]

_SCALES = (4.0, 2.0, 1.0, 0.5)  # the scale factors the simple feature pyramid knows


class ShapeSpec(NamedTuple):
    """Channels and stride of one output map (detectron2's ``ShapeSpec``, without the unused sizes)."""

    channels: int
    stride: int


@dataclass
class ViTDetConfig(ConfigMixin):
    """Everything a :class:`ViTDet` is built from (JSON-serialisable).

    ``global_block_indices``: blocks that attend globally (indices past the last block are
    ignored, so a preset keeps working at a smaller ``depth``); every other block uses windows of
    ``window_size`` (0 = every block global). ``rel_pos_impl="augment"``: global blocks compute the
    decomposed position term through augmented q / k instead of a materialised ``[B, nh, N, N]``
    bias (the same numbers; O(N) memory with the fused kernel, more multiply-adds; see
    :mod:`vit_attention.attention.rel_pos`). ``pretrain_img_size`` / ``pretrain_use_cls_token``:
    the grid (and class row) of the stored absolute position embedding, resized to the map at run
    time. ``pyramid``: build the simple feature pyramid (``pyramid_channels``, ``scale_factors``
    from {4, 2, 1, 0.5}, ``top_block`` adds ``p6``); False gives the plain backbone (Hugging Face
    ``VitDetModel``) whose features are its blocks.
    """

    img_size: int | tuple[int, int] = 1024
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    window_size: int = 14
    global_block_indices: tuple[int, ...] = (2, 5, 8, 11)
    use_rel_pos: bool = True
    rel_pos_impl: Literal["bias", "augment"] = "bias"  # "augment": global blocks without the [N, N] bias
    use_abs_pos: bool = True
    pretrain_img_size: int = 224
    pretrain_use_cls_token: bool = True
    drop_rate: float = 0.0
    drop_path_rate: float = 0.1
    attn_layer: str = "rel_pos"  # any registered spatial mechanism ([B, H, W, C])
    attn_kwargs: dict[str, Any] = field(default_factory=dict)  # given to every block's mechanism as they are
    pyramid: bool = True
    pyramid_channels: int = 256
    scale_factors: tuple[float, ...] = _SCALES
    top_block: bool = True
    pyramid_norm_eps: float = 1e-6

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self)
        check_int(self.patch_size, "patch_size")
        dim, heads = check_width_heads(self)
        check_int(self.depth, "depth", min_value=0)
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_float(self.norm_eps, "norm_eps")
        check_int(self.window_size, "window_size", min_value=0)
        if self.global_block_indices:  # indices past the last block are ignored (a preset at a smaller depth)
            check_int_seq(self.global_block_indices, "global_block_indices", min_value=0)
        check_choice(self.rel_pos_impl, "rel_pos_impl", ("bias", "augment"))
        check_int(self.pretrain_img_size, "pretrain_img_size")
        check_attn_layer(self.attn_layer, self.attn_kwargs, layout="spatial")
        check_int(self.pyramid_channels, "pyramid_channels")
        if isinstance(self.scale_factors, (str, bytes)) or not isinstance(self.scale_factors, Sequence) \
                or not self.scale_factors or any(s not in _SCALES for s in self.scale_factors) \
                or list(self.scale_factors) != sorted(set(self.scale_factors), reverse=True):
            raise ValueError(f"scale_factors must be distinct values of {_SCALES} from large to small, "
                             f"got {self.scale_factors!r}")
        if self.pyramid and (4.0 in self.scale_factors and dim % 4 or 2.0 in self.scale_factors and dim % 2):
            raise ValueError(f"embed_dim={dim} must be divisible by 4 (scale 4) / 2 (scale 2) for the pyramid's "
                             "deconvolutions")
        check_float(self.pyramid_norm_eps, "pyramid_norm_eps")


class ConvNorm(nn.Conv2d):
    """Conv2d followed by a channels-first LayerNorm, ``[B, Cin, H, W] -> [B, Cout, H', W']``.

    detectron2's ``Conv2d(..., norm=LayerNorm)``: keys ``weight`` (and ``bias``) of the conv and
    ``norm.{weight, bias}``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, padding: int = 0,
                 bias: bool = False, eps: float = 1e-6) -> None:
        super().__init__(in_channels, out_channels, kernel_size, padding=padding, bias=bias)
        self.norm = LayerNorm2d(out_channels, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, Cout, H', W']``: convolution, then the channel LayerNorm."""
        return self.norm(super().forward(x))


def pyramid_stage(dim: int, scale: float, out_channels: int, *, eps: float = 1e-6) -> nn.Sequential:
    """One level of the simple feature pyramid, ``[B, C, H, W] -> [B, out, H·scale, W·scale]``.

    Scale 4: deconv 2x2 s2 (C -> C/2), LN, GELU, deconv 2x2 s2 (-> C/4); 2: one deconv (-> C/2);
    1: nothing; 0.5: max-pool 2x2. Then conv 1x1 + LN and conv 3x3 + LN to ``out_channels``.
    Indices as detectron2's ``simfp_*`` Sequentials.
    """
    if scale == 4.0:
        layers: list[nn.Module] = [nn.ConvTranspose2d(dim, dim // 2, kernel_size=2, stride=2),
                                   LayerNorm2d(dim // 2, eps=eps), nn.GELU(),
                                   nn.ConvTranspose2d(dim // 2, dim // 4, kernel_size=2, stride=2)]
        width = dim // 4
    elif scale == 2.0:
        layers, width = [nn.ConvTranspose2d(dim, dim // 2, kernel_size=2, stride=2)], dim // 2
    elif scale == 1.0:
        layers, width = [], dim
    elif scale == 0.5:
        layers, width = [nn.MaxPool2d(kernel_size=2, stride=2)], dim
    else:
        raise ValueError(f"scale must be one of {_SCALES}, got {scale!r}")
    layers += [ConvNorm(width, out_channels, 1, eps=eps), ConvNorm(out_channels, out_channels, 3, padding=1, eps=eps)]
    return nn.Sequential(*layers)


class ViTDet(IsotropicBackbone):
    """ViTDet backbone + simple feature pyramid (+ a pooled linear probe), ``[B, Cin, H, W] -> [B, num_classes]``.

    See the module docstring: :meth:`forward_pyramid` gives the detection maps ``{"p2": ..., "p6":
    ...}`` (``NCHW``), :meth:`forward_features` the last backbone map ``[B, H/16, W/16, C]``. An
    isotropic :class:`~vit_attention.models.backbone.Backbone` (one stage of ``blocks`` on the map);
    the probe pools by :meth:`Backbone.pool` (the map's mean) into ``head.fc``.
    """

    token_merging_note: ClassVar[str] = ("its windowed blocks, interleaved with the global ones, partition the token "
                                         "grid, which merged tokens no longer fill")

    family = "vitdet"
    config_cls = ViTDetConfig
    no_weight_decay_keys = ("pos_embed", "rel_pos_h", "rel_pos_w")  # the position embedding and tables
    pools = ("avg", "")

    def __init__(self, cfg: ViTDetConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        C = cfg.embed_dim
        self.global_pool = cfg.global_pool
        self.embed_dim = self.num_features = C
        self.grad_checkpointing = False
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, C, flatten=False,
                                      strict_img_size=False, dynamic_img_pad=True)
        assert self.patch_embed.grid_size is not None
        self.grid_size = self.patch_embed.grid_size
        pg = cfg.pretrain_img_size // cfg.patch_size
        self.pretrain_grid = (pg, pg)
        self.num_pos_prefix = int(cfg.pretrain_use_cls_token)
        self.pos_embed = (nn.Parameter(torch.zeros(1, self.num_pos_prefix + pg * pg, C)) if cfg.use_abs_pos
                          else None)

        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        dpr = drop_path_schedule(cfg.drop_path_rate, (cfg.depth,))[0]
        blocks = []
        for i in range(cfg.depth):
            ws = 0 if i in cfg.global_block_indices else cfg.window_size
            own = dict(window_size=ws, input_size=self.grid_size, use_rel_pos=cfg.use_rel_pos,
                       rel_pos_impl=cfg.rel_pos_impl, clamp_window=False)  # pads small maps, as detectron2
            blocks.append(Block(C, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, drop_path=dpr[i],
                                norm_layer=norm_layer, attn_layer=cfg.attn_layer,
                                attn_kwargs={**accepted_kwargs(cfg.attn_layer, own), **cfg.attn_kwargs},
                                depth_index=i))
        self.blocks = nn.Sequential(*blocks)

        self.pyramid_levels: list[str] = []  # "p2" ... in order, then "p6" when top_block
        self._strides: dict[str, int] = {}
        if cfg.pyramid:
            for scale in cfg.scale_factors:
                stride = int(cfg.patch_size / scale)
                level = int(math.log2(stride))
                self.add_module(f"simfp_{level}", pyramid_stage(C, scale, cfg.pyramid_channels,
                                                                eps=cfg.pyramid_norm_eps))
                self.pyramid_levels.append(f"p{level}")
                self._strides[f"p{level}"] = stride
            if cfg.top_block:
                level = int(self.pyramid_levels[-1][1:]) + 1
                self.pyramid_levels.append(f"p{level}")
                self._strides[f"p{level}"] = 2 ** level
            self.feature_info = [dict(num_chs=cfg.pyramid_channels, reduction=self._strides[p],
                                      module=f"simfp_{p[1:]}" if p != self.pyramid_levels[-1] or not cfg.top_block
                                      else "top_block") for p in self.pyramid_levels]
        else:  # the plain backbone: every block's map, like ViT
            self.feature_info = [dict(num_chs=C, reduction=cfg.patch_size, module=f"blocks.{i}")
                                 for i in range(cfg.depth)]
        self.head = ClassifierHead(C, cfg.num_classes, global_pool="", drop=cfg.drop_rate)  # pooled by self.pool
        self._init_weights()

    # ------------------------------------------------------------------ construction
    def _init_weights(self) -> None:
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        init_linear_weights(self)

    # ------------------------------------------------------------------ API
    def output_shape(self) -> dict[str, ShapeSpec]:
        """Channels and stride of each pyramid level (``{"p2": ShapeSpec(256, 4), ...}``), or of
        ``"last_feat"`` for a model built with ``pyramid=False`` (detectron2's ``output_shape``)."""
        if not self.pyramid_levels:
            return {"last_feat": ShapeSpec(self.embed_dim, self.cfg.patch_size)}
        pruned = {p for p in self.pyramid_levels if getattr(self, f"simfp_{p[1:]}", True) is None}
        return {p: ShapeSpec(self.cfg.pyramid_channels, self._strides[p]) for p in self.pyramid_levels
                if p not in pruned}

    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Change the nominal input size for good, as a model built at it with the same weights.

        The absolute ``pos_embed`` stays on its pre-training grid (the forward resizes it to any map at
        run time); the patch embedding's ``grid_size`` (rounded up: images are padded to a patch
        multiple) becomes every block's ``input_size``, and each global block's relative-position tables
        ``rel_pos_h`` / ``rel_pos_w`` are resized to ``2·H' - 1`` / ``2·W' - 1`` rows by
        :func:`~vit_attention.functional.rel_pos.resize_rel_pos`, the resize the mechanism applies at
        run time to a map of another size (window blocks' tables depend on the window only).
        ``cfg.img_size`` records the size. A bad ``img_size`` raises naming it, before anything changes.
        """
        if img_size is None:
            return
        img = check_size(img_size, "img_size")
        self._check_img_size(img)
        self.patch_embed.set_input_size(img)
        assert self.patch_embed.grid_size is not None
        grid = self.grid_size = self.patch_embed.grid_size
        with torch.no_grad():
            for blk in self.blocks:
                attn = blk.attn
                if not hasattr(attn, "input_size"):  # another mechanism: nothing built on the grid
                    continue
                attn.input_size = grid
                if getattr(attn, "use_rel_pos", False) and not attn.is_windowed:
                    for name, n in (("rel_pos_h", grid[0]), ("rel_pos_w", grid[1])):
                        old = getattr(attn, name)
                        table = resize_rel_pos(old.detach(), 2 * n - 1).clone().contiguous()
                        setattr(attn, name, nn.Parameter(table, requires_grad=old.requires_grad))
        self.cfg.img_size = img[0] if img[0] == img[1] else img

    # ------------------------------------------------------------------ forward
    def abs_pos(self, grid: tuple[int, int]) -> Tensor:
        """The position embedding on a token ``grid``: ``[1, H', W', C]`` (class row dropped, bicubic resize)."""
        assert self.pos_embed is not None
        pos = resample_abs_pos_embed(self.pos_embed, grid, self.pretrain_grid, num_prefix_tokens=self.num_pos_prefix,
                                     antialias=False)  # [1, P + H'·W', C]
        return pos[:, self.num_pos_prefix:].reshape(1, grid[0], grid[1], self.embed_dim)

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> ``[B, H', W', C]`` (+ the position embedding)."""
        x = self.patch_embed(x)  # [B, H', W', C]
        if self.pos_embed is not None:
            x = x + self.abs_pos((x.shape[1], x.shape[2]))
        return x

    def _run_blocks(self, x: Tensor, indices: set[int] | None = None, *, stop: bool = False
                    ) -> tuple[Tensor, list[Tensor]]:
        """Map ``[B, H', W', C]`` through the blocks: ``-> (map [B, H', W', C], [outputs of blocks indices])``;
        ``stop``: none after the last of ``indices``."""
        return run_blocks_with_taps(self.blocks, x, checkpoint=self.grad_checkpointing and self.training, taps=indices,
                                    stop_at_last_tap=stop)

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> the last backbone map ``[B, H/16, W/16, C]`` (channels-last)."""
        return self._run_blocks(self._embed(x))[0]

    def pyramid_from_map(self, x: Tensor, levels: Sequence[str] | None = None) -> dict[str, Tensor]:
        """Last backbone map ``[B, H', W', C]`` -> the pyramid ``{"p2": [B, 256, 4H', 4W'], ..., "p6": ...}``
        (only ``levels``, in the model's order, when given: ``forward_intermediates`` computes what it returns)."""
        if not self.pyramid_levels:
            raise ValueError("this model was built with pyramid=False: it has no feature pyramid")
        convs, top = self._pyramid_parts()
        have = [p for p in convs if getattr(self, f"simfp_{p[1:]}") is not None]  # pruned branches are None
        if levels is None:
            want = set(have) | (set(top) if convs and convs[-1] in have else set())
        else:
            want = set(levels)
            gone = sorted(p for p in want if p in convs and p not in have)
            if gone:
                raise ValueError(f"pyramid level(s) {gone} were removed by prune_intermediate_layers; "
                                 f"this model computes {sorted(have + top)}")
        want = self._levels_read(want)
        feat = x.permute(0, 3, 1, 2)  # [B, C, H', W']
        maps = {p: getattr(self, f"simfp_{p[1:]}")(feat) for p in convs if p in want}
        if top and top[0] in want:
            maps[top[0]] = F.max_pool2d(maps[convs[-1]], kernel_size=1, stride=2, padding=0)
        return {p: maps[p] for p in self.pyramid_levels if p in want}

    def forward_pyramid(self, x: Tensor) -> dict[str, Tensor]:
        """Images ``[B, Cin, H, W]`` -> ``{"p2", "p3", "p4", "p5", "p6"}`` maps ``[B, 256, H/s, W/s]``
        (``s`` = 4 ... 64, :meth:`output_shape`), as detectron2's ``SimpleFeaturePyramid`` returns."""
        return self.pyramid_from_map(self.forward_features(x))

    def _num_levels(self) -> int:
        return len(self.pyramid_levels) if self.pyramid_levels else len(self.blocks)

    def _pyramid_parts(self) -> tuple[list[str], list[str]]:
        """``(the convolution levels "p2" ..., ["p6"] for the top block unless pruned away, else [])``."""
        n = len(self.cfg.scale_factors)
        return self.pyramid_levels[:n], self.pyramid_levels[n:]

    def _levels_read(self, levels: set[str]) -> set[str]:
        """``levels`` plus the convolution level the top one reads (detectron2's LastLevelMaxPool: the last)."""
        convs, top = self._pyramid_parts()
        return levels | ({convs[-1]} if top and top[0] in levels else set())

    def _prune_levels(self, take: Sequence[int]) -> None:
        """Without a pyramid, the blocks after the last level in ``take`` go (``prune_intermediate_layers``); with
        one, every pyramid branch no level in ``take`` reads (the top level reads the last convolution level):
        the levels after the last one leave ``pyramid_levels``, a skipped one in between keeps its place (the
        indices stay) with its branch set to None. Every level comes from the last block, which stays."""
        if not self.pyramid_levels:
            self.blocks = self.blocks[:max(take) + 1]
            return
        convs, _ = self._pyramid_parts()
        keep = self._levels_read({self.pyramid_levels[i] for i in take})
        for p in convs:
            if p not in keep:
                setattr(self, f"simfp_{p[1:]}", None)
        self.pyramid_levels = self.pyramid_levels[:max(take) + 1]

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
                              output_fmt: Literal["NCHW", "NHWC"] = "NCHW", intermediates_only: bool = False,
                              stop_early: bool = False) -> Any:
        """Last backbone map plus the chosen pyramid levels (or blocks, with ``pyramid=False``).

        ``indices`` index :attr:`feature_info` (an int ``n`` = the last ``n``; negative allowed;
        default all): the levels ``p2 ... p6`` ``[B, 256, H/s, W/s]`` (``NCHW``) or channels-last
        (``NHWC``). ``norm`` is accepted for the contract and changes nothing (ViTDet has no final
        norm). Returns ``(last map [B, H', W', C], [maps])`` or only the list. ``stop_early`` (timm): with
        blocks, none after the last chosen one runs and the "last map" is its output; the pyramid levels all
        read the last block's map, so every block runs there.
        """
        # counted from the model's own levels / blocks: a features model narrows feature_info to its picks
        levels_total = len(self.pyramid_levels) if self.pyramid_levels else len(self.blocks)
        take = isotropic_taps(indices, levels_total, output_fmt, ("NCHW", "NHWC"), "feature level")
        if self.pyramid_levels:
            last, _ = self._run_blocks(self._embed(x))
            levels = self.pyramid_from_map(last, [self.pyramid_levels[i] for i in take])
            outs = [levels[self.pyramid_levels[i]] for i in take]  # [B, 256, H/s, W/s]
            if output_fmt == "NHWC":
                outs = [o.permute(0, 2, 3, 1) for o in outs]
        else:
            last, outs = self._run_blocks(self._embed(x), set(take),
                                          stop=intermediates_only or stop_early)  # [B, H', W', C] each
            if output_fmt == "NCHW":
                outs = [o.permute(0, 3, 1, 2) for o in outs]
        if intermediates_only:
            return outs
        return last, outs


# ---------------------------------------------------------------------------- presets (data)
# detectron2 projects/ViTDet/configs/COCO/mask_rcnn_vitdet_{b,l,h}_*.py: sizes, global blocks, drop path.
_PRESETS: dict[str, dict[str, Any]] = {
    "vitdet_base_patch16_1024": dict(embed_dim=768, depth=12, num_heads=12, global_block_indices=(2, 5, 8, 11),
                                     drop_path_rate=0.1),
    "vitdet_large_patch16_1024": dict(embed_dim=1024, depth=24, num_heads=16,
                                      global_block_indices=(5, 11, 17, 23), drop_path_rate=0.4),
    "vitdet_huge_patch16_1024": dict(embed_dim=1280, depth=32, num_heads=16,
                                     global_block_indices=(7, 15, 23, 31), drop_path_rate=0.5),
}

# Backbone parameters (no pyramid, no probe): Hugging Face VitDetModel at these sizes (transformers 5.23.0).
_PUBLISHED_PARAMS_M = {"vitdet_base_patch16_1024": 85.89, "vitdet_large_patch16_1024": 303.43,
                       "vitdet_huge_patch16_1024": 631.12}


def reduced_config(cfg: ViTDetConfig) -> dict[str, Any]:
    """Overrides that shrink a ViTDet preset for tests: width 32, 2 heads, 3 blocks (windows of 3 on a 4x4 map,
    padded to 6x6; block 1 global), a 3x3 pre-training position grid resized to 4x4, a 16-channel pyramid
    (64 px at patch 16: every level a whole stride, p6 1x1)."""
    return dict(embed_dim=32, num_heads=2, depth=3, global_block_indices=(1,), window_size=3,
                img_size=cfg.patch_size * 4, pretrain_img_size=cfg.patch_size * 3, pyramid_channels=16)


register_family("vitdet", ViTDet, ViTDetConfig, _PRESETS,
                meta={k: {"published_params_m": v, "published_params_exclude": ("head.", "simfp_")}
                      for k, v in _PUBLISHED_PARAMS_M.items()}, reduced=reduced_config)
