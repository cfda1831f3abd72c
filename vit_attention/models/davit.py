"""DaViT (Ding et al. 2022): hierarchical backbone alternating spatial window and channel group attention.

Config dataclass -> :class:`DaVit` -> presets registered as data (timm's names and configs).
Each depth unit of a stage is a PAIR of the one :class:`~vit_attention.layers.Block`:

* ``.0`` spatial: window attention (ws = 7, or 12 for the Florence-2 towers) with no relative
  position bias and no shift; maps that are not window multiples are zero-padded and the padded
  tokens take part in the softmax (the references' unmasked padding). That is exactly the
  ``lsa`` mechanism (Twins' locally-grouped attention, ``pad_mask=False``), used here as it is;
* ``.1`` channel: the ``channel`` mechanism (``attention/channel.py``), DaViT's form or
  Florence-2's (``channel_form="florence2"``: scale ``N^-1/2``).

Both blocks are pre-norm with a depthwise 3x3 position layer (ConvPosEnc, ``x + DWConv(x)``)
before the attention branch (``pos``, timm ``cpe1``) and another before the MLP branch
(``pos2``, timm ``cpe2``). Stem: conv 7x7 stride 4 (input zero-padded bottom / right to a
multiple of 4) + LayerNorm; downsampling at the start of stages 1..3: LayerNorm + conv 2x2
stride 2 (3x3 stride 2 padding 1 for Florence-2). Head: average pool -> LayerNorm -> fc (the
pool is :class:`~vit_attention.models.backbone.Backbone`'s, the rest the shared
:class:`~vit_attention.layers.ClassifierHead` with a norm).

State-dict layout: timm's, except the block's position layers: ``stem.{conv,norm}``,
``stages.N.downsample.{norm,conv}``, ``stages.N.blocks.M.{0,1}.{pos,norm1,attn.qkv,attn.proj,pos2,
norm2,mlp.fc1,mlp.fc2}``, ``head.{norm,fc}``; ``vit_attention.weights.davit`` renames timm's
``cpe1``/``cpe2`` (and Florence-2's ``spatial_block``/``channel_block``, the original
repository's names, Hugging Face's Florence-2 vision tower) to these.

Layout: channels-last ``[B, H, W, C]`` from the stem to the head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..attention.channel import CHANNEL_FORMS
from ..layers import Block, ClassifierHead, PosConv, Stage, accepted_kwargs, drop_path_schedule, stage_feature_info
from ..layers.head import init_linear_weights
from ._config import ConfigMixin, check_attn_layer, check_choice, check_common, check_float, check_int, check_int_seq
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import register_family

__all__ = ["DaVitConfig", "DaVit", "DaVitStem", "DaVitDownsample", "reduced_config"]


@dataclass
class DaVitConfig(ConfigMixin):
    """Everything a :class:`DaVit` is built from (JSON-serialisable).

    ``img_size`` is the nominal input (data config, FLOPs); any size runs (padded internally).
    ``channel_form``: ``"davit"`` (original) or ``"florence2"`` (the ``_fl`` towers).
    ``down_kernel_size``: 2 (conv 2x2, inputs padded to even sizes) or an odd ``k`` (padding ``k//2``).
    ``spatial_attn_layer`` / ``channel_attn_layer``: any registered spatial / token mechanism for the
    two block kinds (their ``*_attn_kwargs`` are given as they are).
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    depths: tuple[int, ...] = (1, 1, 3, 1)
    embed_dims: tuple[int, ...] = (96, 192, 384, 768)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 7
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_eps: float = 1e-5
    down_kernel_size: int = 2
    channel_form: Literal["davit", "florence2"] = "davit"
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    spatial_attn_layer: str = "lsa"  # window attention, no bias, no shift, unmasked padding
    spatial_attn_kwargs: dict[str, Any] = field(default_factory=dict)
    channel_attn_layer: str = "channel"
    channel_attn_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self)
        depths = check_int_seq(self.depths, "depths", min_value=0)
        n = len(depths)
        for name in ("embed_dims", "num_heads"):
            value = getattr(self, name)
            if isinstance(value, Sequence) and not isinstance(value, str) and len(value) != n:
                raise ValueError(f"{name} {value} must have one entry per stage like depths {self.depths}")
        dims = check_int_seq(self.embed_dims, "embed_dims", length=n)
        heads = check_int_seq(self.num_heads, "num_heads", length=n)
        for i, (d, h) in enumerate(zip(dims, heads)):
            if d % h:
                raise ValueError(f"embed_dims[{i}]={d} is not divisible by num_heads[{i}]={h}")
        check_int(self.window_size, "window_size")
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_float(self.norm_eps, "norm_eps")
        check_int(self.down_kernel_size, "down_kernel_size", min_value=2)
        if self.down_kernel_size != 2 and self.down_kernel_size % 2 == 0:
            raise ValueError(f"down_kernel_size must be 2 or odd (padding k//2), got {self.down_kernel_size}")
        check_choice(self.channel_form, "channel_form", CHANNEL_FORMS)
        check_attn_layer(self.spatial_attn_layer, self.spatial_attn_kwargs, layout="spatial")
        check_attn_layer(self.channel_attn_layer, self.channel_attn_kwargs)


def _to_nchw(x: Tensor) -> Tensor:
    return rearrange(x, "b h w c -> b c h w")


def _to_nhwc(x: Tensor) -> Tensor:
    return rearrange(x, "b c h w -> b h w c")


class DaVitStem(nn.Module):
    """Conv 7x7 stride 4 (padding 3) + LayerNorm: images ``[B, Cin, H, W] -> [B, ceil(H/4), ceil(W/4), C]``.

    Inputs that are not multiples of 4 are zero-padded bottom / right first (timm). Keys: ``conv``, ``norm``.
    """

    def __init__(self, in_chans: int, out_chs: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_chans, out_chs, kernel_size=7, stride=4, padding=3)
        self.norm = nn.LayerNorm(out_chs, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, ceil(H/4), ceil(W/4), C]``."""
        if x.dim() != 4 or x.shape[1] != self.conv.in_channels:
            raise ValueError(f"expected images [B, {self.conv.in_channels}, H, W], got {tuple(x.shape)}")
        H, W = x.shape[-2:]
        if H % 4 or W % 4:
            x = F.pad(x, (0, (-W) % 4, 0, (-H) % 4))  # [B, Cin, 4⌈H/4⌉, 4⌈W/4⌉]
        return self.norm(_to_nhwc(self.conv(x)))  # [B, H/4, W/4, C]


class DaVitDownsample(nn.Module):
    """LayerNorm + strided conv: ``[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), C']``.

    ``kernel_size=2``: conv 2x2 stride 2, odd sizes zero-padded bottom / right (after the norm, as
    timm); odd ``k``: conv ``k x k`` stride 2 padding ``k // 2`` (Florence-2). Keys: ``norm``, ``conv``.
    """

    def __init__(self, dim: int, out_dim: int, *, kernel_size: int = 2, eps: float = 1e-5) -> None:
        super().__init__()
        self.even = kernel_size % 2 == 0
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.conv = nn.Conv2d(dim, out_dim, kernel_size, stride=2, padding=0 if self.even else kernel_size // 2)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, H', W', C']``."""
        x = _to_nchw(self.norm(x))  # [B, C, H, W]
        if self.even:
            kh, kw = self.conv.kernel_size
            H, W = x.shape[-2:]
            if H % kh or W % kw:
                x = F.pad(x, (0, (-W) % kw, 0, (-H) % kh))
        return _to_nhwc(self.conv(x))  # [B, H', W', C']


class DaVit(StagedBackbone):
    """DaViT backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last stage's map ``[B, H/32, W/32, C_3]`` (channels-last; DaViT
    has no final norm before the head), ``forward_intermediates`` every stage's map (``NCHW`` by
    default), ``forward_head`` pools, normalises and classifies. Stage ``i`` outputs
    ``embed_dims[i]`` channels at stride ``4·2^i``.
    """

    family = "davit"
    config_cls = DaVitConfig
    no_weight_decay_keys = ()  # no position tables or temperatures

    def __init__(self, cfg: DaVitConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        dims = list(cfg.embed_dims)
        self.global_pool = cfg.global_pool
        self.num_features = dims[-1]
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        self.stem = DaVitStem(cfg.in_chans, dims[0], eps=cfg.norm_eps)
        spatial_kw = {**accepted_kwargs(cfg.spatial_attn_layer, dict(window_size=cfg.window_size, clamp_window=False)),
                      **cfg.spatial_attn_kwargs}
        channel_kw = {**accepted_kwargs(cfg.channel_attn_layer, dict(form=cfg.channel_form)), **cfg.channel_attn_kwargs}
        block = partial(Block, style="pre", mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, drop=cfg.proj_drop_rate,
                        attn_drop=cfg.attn_drop_rate, norm_layer=norm_layer, pos_layer=PosConv, pos_mlp_layer=PosConv)
        stages = []
        for i, dpr in enumerate(drop_path_schedule(cfg.drop_path_rate, cfg.depths)):
            downsample = None if i == 0 else DaVitDownsample(dims[i - 1], dims[i], kernel_size=cfg.down_kernel_size,
                                                             eps=cfg.norm_eps)
            pairs = [nn.Sequential(
                block(dims[i], cfg.num_heads[i], drop_path=dpr[j], attn_layer=cfg.spatial_attn_layer,
                      attn_kwargs=spatial_kw),
                block(dims[i], cfg.num_heads[i], drop_path=dpr[j], attn_layer=cfg.channel_attn_layer,
                      attn_kwargs=channel_kw)) for j in range(cfg.depths[i])]
            stages.append(Stage(pairs, downsample))
        self.stages = nn.Sequential(*stages)
        self.feature_info = stage_feature_info(dims, [4 * 2 ** i for i in range(len(dims))], "stages")
        self.norm = nn.Identity()  # DaViT normalises in the head, after pooling
        self.head = ClassifierHead(self.num_features, cfg.num_classes, global_pool="", drop=cfg.drop_rate,
                                   norm_layer=norm_layer)
        self._init_weights()

    def _init_weights(self) -> None:
        init_linear_weights(self)

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> the first stage's map ``[B, ceil(H/4), ceil(W/4), C_0]``."""
        return self.stem(x)


# ---------------------------------------------------------------------------- presets (data)
_FL = dict(window_size=12, down_kernel_size=3, channel_form="florence2", img_size=768)  # Florence-2 runs at 768
_PRESETS: dict[str, dict[str, Any]] = {
    "davit_tiny": dict(depths=(1, 1, 3, 1), embed_dims=(96, 192, 384, 768), num_heads=(3, 6, 12, 24)),
    "davit_small": dict(depths=(1, 1, 9, 1), embed_dims=(96, 192, 384, 768), num_heads=(3, 6, 12, 24)),
    "davit_base": dict(depths=(1, 1, 9, 1), embed_dims=(128, 256, 512, 1024), num_heads=(4, 8, 16, 32)),
    "davit_large": dict(depths=(1, 1, 9, 1), embed_dims=(192, 384, 768, 1536), num_heads=(6, 12, 24, 48)),
    "davit_huge": dict(depths=(1, 1, 9, 1), embed_dims=(256, 512, 1024, 2048), num_heads=(8, 16, 32, 64)),
    "davit_giant": dict(depths=(1, 1, 12, 3), embed_dims=(384, 768, 1536, 3072), num_heads=(12, 24, 48, 96)),
    "davit_base_fl": dict(depths=(1, 1, 9, 1), embed_dims=(128, 256, 512, 1024), num_heads=(4, 8, 16, 32), **_FL),
    "davit_huge_fl": dict(depths=(1, 1, 9, 1), embed_dims=(256, 512, 1024, 2048), num_heads=(8, 16, 32, 64), **_FL),
}

_TIMM = "timm results/benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv (param_count, infer_gmacs)"
_META: dict[str, dict[str, Any]] = {
    "davit_tiny": dict(published_params_m=28.36, published_gmacs=4.54, published_gmacs_source=_TIMM),
    "davit_small": dict(published_params_m=49.75, published_gmacs=8.80, published_gmacs_source=_TIMM),
    "davit_base": dict(published_params_m=87.95, published_gmacs=15.51, published_gmacs_source=_TIMM),
    "davit_large": dict(published_params_m=196.81, published_gmacs=34.60, published_gmacs_source=_TIMM),
    "davit_huge": dict(published_params_m=348.92, published_gmacs=61.23, published_gmacs_source=_TIMM),
    "davit_giant": dict(published_params_m=1406.47, published_gmacs=192.92, published_gmacs_source=_TIMM),
    # no published row for the Florence-2 towers: timm's davit_*_fl at its default num_classes=0 (the default
    # tag msft_florence2 has no classifier; 91.40 / 362.69 with a 1000-class head, timm 1.0.31)
    "davit_base_fl": dict(published_params_m=90.37),
    "davit_huge_fl": dict(published_params_m=360.64),
}


def reduced_config(cfg: DaVitConfig) -> dict[str, Any]:
    """Overrides that shrink a DaViT preset for tests: 2 stages of 16 / 32 channels, one spatial + channel pair
    each, window 3 on 40 px (10x10 and 5x5 maps: both padded to windows); the preset's downsample kernel and
    channel form are kept."""
    return dict(embed_dims=(16, 32), num_heads=(2, 2), depths=(1, 1), window_size=3, img_size=40)


register_family("davit", DaVit, DaVitConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.95)
_768 = data_cfg(768, 0.95)
PRETRAINED = pretrained_tags({
    "davit_base.msft_in1k": _224,
    "davit_base_fl.msft_florence2": dict(_768, hf_hub_id="microsoft/Florence-2-base", num_classes=0),
    "davit_giant.untrained": dict(_224, hf_hub_id=None),
    "davit_huge.untrained": dict(_224, hf_hub_id=None),
    "davit_huge_fl.msft_florence2": dict(_768, hf_hub_id="microsoft/Florence-2-large", num_classes=0),
    "davit_large.untrained": dict(_224, hf_hub_id=None),
    "davit_small.msft_in1k": _224,
    "davit_tiny.msft_in1k": _224,
}, license="apache-2.0")
