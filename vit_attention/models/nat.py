"""NAT (Hassani et al. 2023) and DiNAT (Hassani & Shi 2022): hierarchical neighbourhood-attention backbones.

Config dataclass -> :class:`NAT` -> presets registered as data (``nat_*``: dilation 1 everywhere;
``dinat_*``: the original's per-block dilation schedules, alternating 1 and a large dilation).
Layout: channels-last ``[B, H, W, C]`` from the tokenizer to the final norm. Any input size: the
mechanism pads levels smaller than ``K·d`` (the references' rule).

State-dict layout (ours): ``patch_embed.proj.{0,1}`` (two 3x3 stride-2 convolutions, no
activation), ``patch_embed.norm``, ``levels.N.downsample.{reduction,norm}`` (3x3 stride-2 conv
without bias + LayerNorm, at the START of level N > 0), ``levels.N.blocks.M.{norm1, attn.qkv,
attn.rpb, attn.proj, norm2, mlp.fc1, mlp.fc2, ls1.gamma, ls2.gamma}``, ``norm``, ``head.fc``.
The original SHI-Labs layout (downsampler at the END of level N, ``gamma1`` / ``gamma2``,
``head``) is converted by ``vit_attention.weights.nat``.

Stages are the shared scaffold (:class:`~vit_attention.layers.Stage`, drop-path schedule) and
the model a :class:`~vit_attention.models.backbone.Backbone` (config, forward API, intermediates,
average pooling, classifier reset, checkpointing, weight decay); blocks the one
:class:`~vit_attention.layers.Block` (pre-norm, optional LayerScale) around ``neighborhood`` (or
any spatial mechanism, ``attn_layer``). What is NAT's here: the config, the convolutional
tokenizer and downsampler, the dilation schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from torch import Tensor, nn

from ..layers import Block, ClassifierHead, Stage, accepted_kwargs, drop_path_schedule
from ..layers.head import init_linear_weights
from ..layers.stage import stage_feature_info
from ._config import ConfigMixin, check_attn_layer, check_common, check_float, check_int, check_int_seq
from .backbone import StagedBackbone
from .registry import register_family

__all__ = ["NATConfig", "NAT", "ConvTokenizer", "ConvDownsampler", "reduced_config"]


@dataclass
class NATConfig(ConfigMixin):
    """Everything a :class:`NAT` is built from (JSON-serialisable).

    ``dilations``: per level, a pattern of dilations repeated over its blocks (DiNAT's
    ``((1, 8), (1, 4), (1, 2), (1,))``: blocks alternate 1 and 8 in level 0, ...); None = 1 everywhere (NAT).
    ``layer_scale``: LayerScale init value (NAT-Small / Base: 1e-5), None = no LayerScale.
    """

    img_size: int | tuple[int, int] = 224  # the data config's input size; any size runs
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 64
    depths: tuple[int, ...] = (3, 4, 6, 5)
    num_heads: tuple[int, ...] = (2, 4, 8, 16)
    mlp_ratio: float = 3.0
    kernel_size: int = 7
    dilations: tuple[tuple[int, ...], ...] | None = None
    qkv_bias: bool = True
    layer_scale: float | None = None
    norm_eps: float = 1e-5
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.2
    attn_layer: str = "neighborhood"  # any registered spatial mechanism ([B, H, W, C])
    attn_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.dilations, (list, tuple)):  # JSON gives lists of lists
            self.dilations = tuple(tuple(d) if isinstance(d, (list, tuple)) else d for d in self.dilations)
        super().__post_init__()  # the checks run on construction, as in every family config

    def block_dilation(self, level: int, block: int) -> int:
        """The dilation of block ``block`` of level ``level``."""
        if self.dilations is None:
            return 1
        pattern = self.dilations[level]
        return int(pattern[block % len(pattern)])

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field."""
        check_common(self, pools=None)
        dim = check_int(self.embed_dim, "embed_dim")
        if dim % 2:
            raise ValueError(f"embed_dim={dim} must be even (the tokenizer's first conv has embed_dim // 2 channels)")
        depths = check_int_seq(self.depths, "depths", min_value=0)
        heads = check_int_seq(self.num_heads, "num_heads", length=len(depths))
        for i, h in enumerate(heads):
            if (dim * 2 ** i) % h:
                raise ValueError(f"level {i} width {dim * 2 ** i} is not divisible by num_heads[{i}]={h}")
        k = check_int(self.kernel_size, "kernel_size")
        if k % 2 == 0:
            raise ValueError(f"kernel_size must be odd (the neighbourhood is centred), got {k}")
        if self.dilations is not None:
            if len(self.dilations) != len(depths) or any(not isinstance(d, tuple) or not d for d in self.dilations):
                raise ValueError(f"dilations must give a non-empty pattern of dilations per level ({len(depths)} "
                                 f"levels), got {self.dilations!r}")
            for i, d in enumerate(self.dilations):
                check_int_seq(d, f"dilations[{i}]", min_value=1)
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        if self.layer_scale is not None:
            check_float(self.layer_scale, "layer_scale", low_open=True)
        check_attn_layer(self.attn_layer, self.attn_kwargs, layout="spatial")


class ConvTokenizer(nn.Module):
    """Two 3x3 stride-2 convolutions (no activation between) + LayerNorm: ``[B, Cin, H, W] -> [B, H/4, W/4, C]``."""

    def __init__(self, in_chans: int, embed_dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Conv2d(in_chans, embed_dim // 2, 3, stride=2, padding=1),
                                  nn.Conv2d(embed_dim // 2, embed_dim, 3, stride=2, padding=1))
        self.norm = nn.LayerNorm(embed_dim, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, ceil(H/4), ceil(W/4), C]``."""
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


class ConvDownsampler(nn.Module):
    """3x3 stride-2 convolution (no bias) doubling the channels + LayerNorm: ``[B, H, W, C] -> [B, H/2, W/2, 2C]``."""

    def __init__(self, dim: int, out_dim: int | None = None, *, eps: float = 1e-5) -> None:
        super().__init__()
        out_dim = out_dim or 2 * dim
        self.reduction = nn.Conv2d(dim, out_dim, 3, stride=2, padding=1, bias=False)
        self.norm = nn.LayerNorm(out_dim, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), C']``."""
        return self.norm(self.reduction(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


class NAT(StagedBackbone):
    """NAT / DiNAT backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    Level ``i`` outputs ``C·2^i`` channels at stride ``4·2^i``; ``forward_features`` gives the
    normalised last map ``[B, H/32, W/32, 8C]`` (channels-last), ``forward_head`` averages and classifies
    (``global_pool`` is always ``"avg"``: the config has no such field).
    """

    family = "nat"
    config_cls = NATConfig
    stages_attr = "levels"
    no_weight_decay_keys = (".rpb",)  # the relative-position biases (``levels.N.blocks.M.attn.rpb``)
    pools = ("avg",)

    def __init__(self, cfg: NATConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        n = len(cfg.depths)
        dims = [cfg.embed_dim * 2 ** i for i in range(n)]
        self.global_pool = "avg"
        self.embed_dim = cfg.embed_dim
        self.num_features = dims[-1]
        self.patch_embed = ConvTokenizer(cfg.in_chans, cfg.embed_dim, eps=cfg.norm_eps)
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        levels = []
        for i, dpr in enumerate(drop_path_schedule(cfg.drop_path_rate, cfg.depths)):
            downsample = ConvDownsampler(dims[i - 1], dims[i], eps=cfg.norm_eps) if i > 0 else None
            blocks = [Block(dims[i], cfg.num_heads[i], mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                            drop=cfg.drop_rate, attn_drop=cfg.attn_drop_rate, drop_path=dpr[j],
                            init_values=cfg.layer_scale, norm_layer=norm_layer, attn_layer=cfg.attn_layer,
                            attn_kwargs={**accepted_kwargs(cfg.attn_layer, dict(kernel_size=cfg.kernel_size,
                                                                                dilation=cfg.block_dilation(i, j))),
                                         **cfg.attn_kwargs}, depth_index=sum(cfg.depths[:i]) + j)
                      for j in range(cfg.depths[i])]
            levels.append(Stage(blocks, downsample))
        self.levels = nn.Sequential(*levels)
        self.feature_info = stage_feature_info(dims, [4 * 2 ** i for i in range(n)], "levels")
        self.norm = nn.LayerNorm(self.num_features, eps=cfg.norm_eps)
        self.head = ClassifierHead(self.num_features, cfg.num_classes, global_pool="", drop=0.0)
        self._init_weights()

    def _init_weights(self) -> None:
        init_linear_weights(self)

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> ``[B, H/4, W/4, C]``."""
        if x.dim() != 4 or x.shape[1] != self.cfg.in_chans:
            raise ValueError(f"NAT expects images [B, {self.cfg.in_chans}, H, W], got shape {tuple(x.shape)}")
        return self.pos_drop(self.patch_embed(x))


# ---------------------------------------------------------------------------- presets (data)
_SIZES: dict[str, dict[str, Any]] = {
    "mini": dict(embed_dim=64, depths=(3, 4, 6, 5), num_heads=(2, 4, 8, 16), mlp_ratio=3.0, drop_path_rate=0.2),
    "tiny": dict(embed_dim=64, depths=(3, 4, 18, 5), num_heads=(2, 4, 8, 16), mlp_ratio=3.0, drop_path_rate=0.2),
    "small": dict(embed_dim=96, depths=(3, 4, 18, 5), num_heads=(3, 6, 12, 24), mlp_ratio=2.0, drop_path_rate=0.3),
    "base": dict(embed_dim=128, depths=(3, 4, 18, 5), num_heads=(4, 8, 16, 32), mlp_ratio=2.0, drop_path_rate=0.5),
    # the original dinat.py: DiNAT-L keeps DiNAT-B's heads at width 192 (head dim 48)
    "large": dict(embed_dim=192, depths=(3, 4, 18, 5), num_heads=(4, 8, 16, 32), mlp_ratio=2.0, drop_path_rate=0.35),
}


# The original schedule at 224 (dinat.py): levels 0-2 alternate 1 and 8 / 4 / 2, level 3 all 1.
_DINAT_DILATIONS = ((1, 8), (1, 4), (1, 2), (1,))

_PRESETS: dict[str, dict[str, Any]] = {}
for _size in ("mini", "tiny", "small", "base"):
    _PRESETS[f"nat_{_size}"] = dict(_SIZES[_size], layer_scale=1e-5 if _size in ("small", "base") else None)
for _size in ("mini", "tiny", "small", "base", "large"):
    _PRESETS[f"dinat_{_size}"] = dict(_SIZES[_size], dilations=_DINAT_DILATIONS)

# Published sizes (the NAT / DiNAT READMEs: params M, GMACs at 224). The GMACs are the
# paper's count (each query times its K² keys); ``neighborhood``'s default tiles compute some logits
# twice (their cost, reported by our FLOPs, is 5-7 % above at 224), so the figure is checked with
# ``tile_size=1`` (exactly the paper's work) in tests/models/test_nat.py; meta "published_gmacs_tile1".
PUBLISHED: dict[str, tuple[float, float]] = {
    "nat_mini": (20.0, 2.7), "nat_tiny": (28.0, 4.3), "nat_small": (51.0, 7.8), "nat_base": (90.0, 13.7),
    "dinat_mini": (20.0, 2.7), "dinat_tiny": (28.0, 4.3), "dinat_small": (51.0, 7.8), "dinat_base": (90.0, 13.7),
    "dinat_large": (200.0, 30.6),
}


def reduced_config(cfg: NATConfig) -> dict[str, Any]:
    """Overrides that shrink a NAT / DiNAT preset for tests: 4 levels of width 16-128, 2 blocks and 2 heads each,
    kernel 3 (DiNAT: dilations 1, 2 alternating in every level) on 64 px (maps 16 -> 2: levels 2-3 are smaller
    than K·d and get padded); LayerScale and the MLP ratio kept."""
    over: dict[str, Any] = dict(embed_dim=16, depths=(2, 2, 2, 2), num_heads=(2, 2, 2, 2), kernel_size=3, img_size=64)
    if cfg.dilations is not None:
        over["dilations"] = ((1, 2),) * 4
    return over


register_family("nat", NAT, NATConfig, _PRESETS, meta={
    name: {"published_params_m": p, "published_gmacs_tile1": g} for name, (p, g) in PUBLISHED.items()},
    reduced=reduced_config)
