"""PVTv2 (Wang et al. 2022): pyramid of spatial-reduction attention stages with overlapping patch embeddings.

Config dataclass -> :class:`PyramidVisionTransformerV2` -> presets registered as data. The state-dict
layout is timm's ``pvt_v2``: ``patch_embed.{proj,norm}`` (stem: conv 7x7 stride 4 + LN),
``stages.{i}.downsample.{proj,norm}`` (conv 3x3 stride 2 + LN, i > 0),
``stages.{i}.blocks.{j}.{norm1, attn.{q,kv,sr,norm,proj}, norm2, mlp.{fc1,dwconv,fc2}}``,
``stages.{i}.norm``; the classifier is ``head.fc`` (timm: ``head``; ``vit_attention.weights.pvt``
renames it, and converts the original whai362/PVT and Hugging Face ``PvtV2*`` layouts).

What is PVTv2's own here: the overlapping embeddings (:class:`~vit_attention.layers.ConvEmbed`),
the depthwise-conv MLP (:class:`~vit_attention.layers.mlp_dwconv.MlpDWConv`, ReLU after fc1 in the
linear ``-Li`` variant) and the ``sra`` mechanism per stage (``sr_ratio``, ``linear``). The stages are
the shared scaffold (:class:`~vit_attention.layers.Stage` with a per-stage LayerNorm) and the one
:class:`~vit_attention.layers.Block`; any registered mechanism can replace ``sra``. There is no
position embedding: any input size from 29 px up works (maps are channels-last ``[B, H, W, C]``
throughout); below it the first stage's map is smaller than its ``sr_ratio`` of 8 (:class:`MinInputSize`:
``model.min_input_size``; the linear ``-Li`` variant pools its keys and takes any size).

LayerNorm eps: ``norm_eps`` (blocks, stage norms: 1e-6 in timm / the original) and ``embed_norm_eps``
(patch embeddings and the SRA reduction norm: the ``nn.LayerNorm`` default 1e-5 there; Hugging Face
uses 1e-6 for all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from torch import Tensor, nn

from ..attention.sra import SpatialReductionAttention
from ..layers import Block, ClassifierHead, Stage, accepted_kwargs, drop_path_schedule, stage_feature_info
from ..layers.conv_embed import ConvEmbed
from ..layers.mlp_dwconv import MlpDWConv
from ._config import ConfigMixin, check_attn_layer, check_choice, check_common, check_float, check_int_seq, check_size
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["PvtV2Config", "PyramidVisionTransformerV2", "check_pyramid", "MinInputSize", "MinInputSizeMixin",
           "reduced_config"]


def check_pyramid(cfg: Any) -> int:
    """Validate the per-stage fields shared by PVT v1 and PVTv2 configs; returns the number of stages."""
    check_common(cfg, pools=None)
    depths = check_int_seq(cfg.depths, "depths", min_value=0)
    n = len(depths)
    dims = check_int_seq(cfg.embed_dims, "embed_dims", length=n)
    heads = check_int_seq(cfg.num_heads, "num_heads", length=n)
    check_int_seq(cfg.sr_ratios, "sr_ratios", length=n)
    if len(cfg.mlp_ratios) != n:
        raise ValueError(f"mlp_ratios must have one entry per stage ({n}), got {cfg.mlp_ratios!r}")
    for i, r in enumerate(cfg.mlp_ratios):
        check_float(r, f"mlp_ratios[{i}]", low_open=True)
    for i, (d, h) in enumerate(zip(dims, heads)):
        if d % h:
            raise ValueError(f"stage {i} width embed_dims[{i}]={d} is not divisible by num_heads[{i}]={h}")
    for name in ("norm_eps", "embed_norm_eps"):
        check_float(getattr(cfg, name), name, low_open=True)
    check_attn_layer(cfg.attn_layer, cfg.attn_kwargs)
    return n


@dataclass(frozen=True)
class MinInputSize:
    """The smallest input a pyramid of spatial-reduction stages takes (PVT v1, PVTv2, Twins).

    Stage ``i`` sees a map of side ``⌊S / strides[i]⌋`` for an image side ``S`` (convs with kernel =
    stride, PVT v1 and Twins) or ``⌈S / strides[i]⌉`` (``padded``: PVTv2's overlapping padded convs).
    A spatial-reduction attention with ``sr_ratio = r`` (conv reduction, not the pooled ``linear``
    one) needs a map of at least ``r x r``: its ``r x r`` stride-``r`` conv must leave a key. ``needs``:
    that smallest map side per stage (1 where nothing reduces).
    """

    strides: tuple[int, ...]
    needs: tuple[int, ...]
    padded: bool = False

    @classmethod
    def of(cls, stages: Sequence[nn.Module], strides: Sequence[int], *, padded: bool = False) -> MinInputSize:
        """Read each stage's ``blocks``' attention (``sr_ratio`` of a reducing SRA) -> the rule."""
        needs = tuple(max((int(b.attn.sr_ratio) for b in stage.blocks
                           if isinstance(b.attn, SpatialReductionAttention) and b.attn.reduces and not b.attn.linear),
                          default=1) for stage in stages)
        return cls(tuple(int(s) for s in strides), needs, padded)

    @property
    def side(self) -> int:
        """The smallest image side (px) every stage takes."""
        return max(s * (n - 1) + 1 if self.padded else s * n for s, n in zip(self.strides, self.needs))

    def map_side(self, stage: int, side: int) -> int:
        """The side of stage ``stage``'s map for an image side ``side``."""
        return -(-side // self.strides[stage]) if self.padded else side // self.strides[stage]

    def check(self, size: tuple[int, int], *, option: bool = False) -> None:
        """Raise ``ValueError`` when an image ``size = (H, W)`` is below :attr:`side` on a side.

        ``option``: ``size`` is the ``img_size`` the model is built with (else the input of a forward).
        The message names the minimum, the stage and ``sr_ratio`` that set it, and ``img_size`` /
        ``--img-size``.
        """
        H, W = int(size[0]), int(size[1])
        m = self.side
        if H >= m and W >= m:
            return
        i = next(i for i, n in enumerate(self.needs) if min(self.map_side(i, H), self.map_side(i, W)) < n)
        what = (f"img_size={H if H == W else (H, W)}" if option else f"input {H}x{W} px")
        why = (f"smaller than its sr_ratio={self.needs[i]} (spatial reduction would leave no key)"
               if self.needs[i] > 1 else "an empty map")
        fix = (f"build it with img_size >= {m} (create_model(..., img_size={m}); --img-size {m} on the command "
               "line)") if option else (f"feed images of at least {m}x{m} px (img_size= in create_model / "
                                        "--img-size on the command line sets the size images are read at)")
        raise ValueError(f"{what} is below the minimum input size of this model, {m}x{m} px: stage {i} would "
                         f"see a {self.map_side(i, H)}x{self.map_side(i, W)} map, {why}; {fix}")


class MinInputSizeMixin:
    """``model.min_input_size`` of a pyramid of spatial-reduction stages (PVT v1, PVTv2, Twins), written once.

    The model calls :meth:`_set_min_input` once its stages exist (it reads the rule off them and
    checks the config's ``img_size``) and :meth:`_check_input` on each input, in ``_embed``;
    ``set_input_size`` checks the new ``img_size`` by :meth:`_check_img_size`.
    """

    _min_input: MinInputSize

    def _set_min_input(self, stages: Sequence[nn.Module], strides: Sequence[int], img_size: tuple[int, int], *,
                       padded: bool = False) -> None:
        """The rule of ``stages`` at ``strides`` (:meth:`MinInputSize.of`); ``img_size`` below it raises
        ``ValueError`` naming the minimum and ``img_size`` / ``--img-size``."""
        self._min_input = MinInputSize.of(stages, strides, padded=padded)
        self._min_input.check(img_size, option=True)

    @property
    def min_input_size(self) -> tuple[int, int]:
        """The smallest input ``(H, W)`` every stage's spatial reduction takes (sr_ratios 8, 4, 2, 1: 29 x 29
        for PVTv2's padded overlapping embeddings, 32 x 32 for PVT v1 and Twins)."""
        return self._min_input.side, self._min_input.side

    def _check_input(self, x: Tensor) -> None:
        """Images ``[B, Cin, H, W]`` below :attr:`min_input_size` raise ``ValueError`` saying the minimum."""
        self._min_input.check(tuple(x.shape[-2:]))

    def _check_img_size(self, img_size: tuple[int, int]) -> None:
        """``set_input_size``: an ``img_size = (H, W)`` below :attr:`min_input_size` raises ``ValueError`` naming it."""
        self._min_input.check(img_size, option=True)


@dataclass
class PvtV2Config(ConfigMixin):
    """Everything a :class:`PyramidVisionTransformerV2` is built from (JSON-serialisable).

    ``img_size`` is the default input (data config, FLOPs); any size from ``model.min_input_size``
    up runs (29 px with the default ``sr_ratios``, any with ``linear``). ``linear``: PVTv2-Li
    (pooled 7x7 keys, ReLU in the MLP). ``attn_layer``: any registered mechanism (``sra`` gets
    ``sr_ratio``, ``linear`` and ``norm_eps = embed_norm_eps`` per stage where it takes them).
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    embed_dims: tuple[int, ...] = (64, 128, 320, 512)
    depths: tuple[int, ...] = (3, 4, 6, 3)
    num_heads: tuple[int, ...] = (1, 2, 5, 8)
    mlp_ratios: tuple[float, ...] = (8.0, 8.0, 4.0, 4.0)
    sr_ratios: tuple[int, ...] = (8, 4, 2, 1)
    linear: bool = False
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    embed_norm_eps: float = 1e-5
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    attn_layer: str = "sra"
    attn_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field."""
        check_pyramid(self)
        check_choice(self.global_pool, "global_pool", ("avg", ""))


def pyramid_blocks(cfg: Any, i: int, drop_path: list[float], mlp_layer: Any = None) -> list[Block]:
    """The pre-norm blocks of stage ``i`` of a PVT-style config (``sra`` keywords given where taken; each block
    with its 0-based index in the model, ``depth_index``)."""
    sra = dict(sr_ratio=cfg.sr_ratios[i], linear=getattr(cfg, "linear", False), norm_eps=cfg.embed_norm_eps)
    kw = {**accepted_kwargs(cfg.attn_layer, sra), **cfg.attn_kwargs}
    return [Block(cfg.embed_dims[i], cfg.num_heads[i], mlp_ratio=cfg.mlp_ratios[i], qkv_bias=cfg.qkv_bias,
                  drop=cfg.proj_drop_rate, attn_drop=cfg.attn_drop_rate, drop_path=dp,
                  norm_layer=partial(nn.LayerNorm, eps=cfg.norm_eps), attn_layer=cfg.attn_layer, attn_kwargs=kw,
                  depth_index=sum(cfg.depths[:i]) + j, **({} if mlp_layer is None else {"mlp_layer": mlp_layer}))
            for j, dp in enumerate(drop_path)]


class PyramidVisionTransformerV2(MinInputSizeMixin, StagedBackbone):
    """PVTv2 backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]`` (inputs of ``min_input_size`` or more).

    ``forward_features`` gives the last stage's normalised map ``[B, H/32, W/32, C4]`` (channels-last;
    timm returns it NCHW), ``forward_intermediates`` every stage's map (``NCHW`` by default, stride
    ``4·2^i``), ``forward_head`` average-pools and classifies.
    """

    family = "pvt_v2"
    config_cls = PvtV2Config
    no_weight_decay_keys = ()  # no position embeddings

    def __init__(self, cfg: PvtV2Config | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        dims = cfg.embed_dims
        strides = [4 * 2 ** i for i in range(len(dims))]
        self.global_pool = cfg.global_pool
        self.num_features = dims[-1]
        self.patch_embed = ConvEmbed(cfg.in_chans, dims[0], kernel_size=7, stride=4, padding=3,
                                     norm_eps=cfg.embed_norm_eps)
        mlp = partial(MlpDWConv, extra_relu=cfg.linear)
        stages = []
        for i, dpr in enumerate(drop_path_schedule(cfg.drop_path_rate, cfg.depths)):
            down = None if i == 0 else ConvEmbed(dims[i - 1], dims[i], kernel_size=3, stride=2, padding=1,
                                                 norm_eps=cfg.embed_norm_eps, channels_last_input=True)
            stages.append(Stage(pyramid_blocks(cfg, i, dpr, mlp), down, nn.LayerNorm(dims[i], eps=cfg.norm_eps)))
        self.stages = nn.Sequential(*stages)
        self.feature_info = stage_feature_info(dims, strides, "stages")
        self.norm = nn.Identity()  # every stage ends with its own norm
        self.head = ClassifierHead(dims[-1], cfg.num_classes, global_pool="", drop=cfg.drop_rate)  # pool: Backbone
        init_pyramid_weights(self)
        self._set_min_input(self.stages, strides, check_size(cfg.img_size, "img_size"), padded=True)

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> ``[B, H/4, W/4, C1]`` (overlapping 7x7 stride-4 conv + LN).

        An input below :attr:`min_input_size` raises ``ValueError`` saying the minimum.
        """
        self._check_input(x)
        return self.patch_embed(x)


def init_pyramid_weights(model: nn.Module) -> None:
    """timm / the original's init: Linear trunc-normal(0.02), zero bias; conv normal(0, sqrt(2 / fan_out))."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Conv2d):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
            nn.init.normal_(m.weight, 0.0, (2.0 / fan_out) ** 0.5)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


# ---------------------------------------------------------------------------- presets (data)
_B1 = dict(embed_dims=(64, 128, 320, 512))
_PRESETS: dict[str, dict[str, Any]] = {
    "pvt_v2_b0": dict(embed_dims=(32, 64, 160, 256), depths=(2, 2, 2, 2)),
    "pvt_v2_b1": dict(_B1, depths=(2, 2, 2, 2)),
    "pvt_v2_b2": dict(_B1, depths=(3, 4, 6, 3)),
    "pvt_v2_b3": dict(_B1, depths=(3, 4, 18, 3)),
    "pvt_v2_b4": dict(_B1, depths=(3, 8, 27, 3)),
    "pvt_v2_b5": dict(_B1, depths=(3, 6, 40, 3), mlp_ratios=(4.0, 4.0, 4.0, 4.0)),
    "pvt_v2_b2_li": dict(_B1, depths=(3, 4, 6, 3), linear=True),
}

# Published sizes at 224 (PVT repository README / timm 1.0.31's benchmark table).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "pvt_v2_b0": (3.67, 0.57), "pvt_v2_b1": (14.01, 2.12), "pvt_v2_b2": (25.36, 4.05), "pvt_v2_b3": (45.24, 6.92),
    "pvt_v2_b4": (62.56, 10.14), "pvt_v2_b5": (81.96, 11.76), "pvt_v2_b2_li": (22.55, 3.91),
}


def reduced_config(cfg: Any) -> dict[str, Any]:
    """Overrides that shrink a PVT v1 / PVTv2 preset for tests: its stages at widths 16, 32, 32, ..., 2 blocks
    and 2 heads each, on 64 px (maps 16 -> 2: every sr_ratio reduces); the rest (``linear``, the class token,
    ``sr_ratios``, MLP ratios) kept."""
    n = len(cfg.depths)
    return dict(embed_dims=(16,) + (32,) * (n - 1), depths=(2,) * n, num_heads=(2,) * n, img_size=64)


register_family("pvt_v2", PyramidVisionTransformerV2, PvtV2Config, _PRESETS,
                meta=published_meta(_PUBLISHED, "timm benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv (infer_gmacs); "
                                                "params: PVT README / timm"), reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.9)
PRETRAINED = pretrained_tags({
    "pvt_v2_b0.in1k": _224,
    "pvt_v2_b1.in1k": _224,
    "pvt_v2_b2.in1k": _224,
    "pvt_v2_b2_li.in1k": _224,
    "pvt_v2_b3.in1k": _224,
    "pvt_v2_b4.in1k": _224,
    "pvt_v2_b5.in1k": _224,
}, license="apache-2.0")
