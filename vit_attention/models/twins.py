"""Twins (Chu et al. 2021, "Twins: Revisiting the Design of Spatial Attention in Vision Transformers").

Two pyramids of four stages, each stage a non-overlapping patch embedding (conv k = s = 4, then
2, + LayerNorm eps 1e-5), pre-norm blocks (LayerNorm eps 1e-6), and a PEG (CPVT's conditional
position encoding, :class:`~vit_attention.layers.pos_embed.PosConv`) after the first block of
the stage; no position table, no class token; the final LayerNorm on the last stage, then the
mean over its tokens and a linear head.

* **PCPVT**: global sub-sampled attention (GSA = PVT's ``sra``, ``sr_ratio`` 8, 4, 2, 1) in every block.
* **SVT** (ALTGVT): blocks alternate locally-grouped attention (``lsa``, 7x7 groups, even block
  index) and GSA (odd index).

Built on the shared scaffold: :class:`~vit_attention.layers.Stage` (``downsample`` = the stage's
patch embedding, ``blocks``, ``pos`` = the PEG after block 0), :class:`~vit_attention.layers.Block`,
:class:`~vit_attention.models.backbone.Backbone` (config, forward API, pooling, classifier reset,
checkpointing, weight decay) and PVT's ``min_input_size`` (:class:`~vit_attention.models.pvt_v2.MinInputSizeMixin`).
Layout: channels-last maps ``[B, H, W, C]`` from the first patch embedding to the final norm.

Keys: ``stages.{i}.downsample.{proj,norm}``, ``stages.{i}.blocks.{j}.{norm1,attn,norm2,mlp}``,
``stages.{i}.pos.proj.0``, ``norm``, ``head.fc``. timm's layout (``patch_embeds.{i}``,
``blocks.{i}.{j}``, ``pos_block.{i}``, ``head``) and the original Meituan-AutoML/Twins layout are
renamed onto it by ``vit_attention.weights.twins`` (a tested table); ``attn.*`` names are timm's
(``qkv``/``proj`` for LSA, ``q``/``kv``/``sr``/``norm``/``proj`` for GSA).

Padding: LSA pads maps that are not multiples of the group with zero tokens that take part in
the softmax (``lsa_pad_mask=False``, timm and the checkpoints) or are masked (``True``); GSA's
strided conv and the patch embeddings drop the last rows / columns that do not fill a window, as
timm's convolutions do. At 224 every stage map (56, 28, 14, 7) is a multiple of 7.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from torch import Tensor, nn

from ..layers import Block, ClassifierHead, PosConv, Stage, drop_path_schedule, stage_feature_info
from ..layers.head import init_linear_weights
from ._config import ConfigMixin, check_common, check_float, check_int, check_int_seq, check_size
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .pvt_v2 import MinInputSizeMixin
from .registry import register_family

__all__ = ["TwinsConfig", "Twins", "TwinsPatchEmbed", "TwinsPosConv", "reduced_config"]


@dataclass
class TwinsConfig(ConfigMixin):
    """Everything a :class:`Twins` is built from (JSON-serialisable).

    ``wss`` (group sizes per stage) makes it SVT: blocks with an even index use ``lsa`` with that
    group, odd ones GSA; ``None`` is PCPVT (GSA everywhere).
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    embed_dims: tuple[int, ...] = (64, 128, 256, 512)
    num_heads: tuple[int, ...] = (1, 2, 4, 8)
    mlp_ratios: tuple[float, ...] = (4, 4, 4, 4)
    depths: tuple[int, ...] = (3, 4, 6, 3)
    sr_ratios: tuple[int, ...] = (8, 4, 2, 1)
    wss: tuple[int, ...] | None = None
    qkv_bias: bool = True
    norm_eps: float = 1e-6  # blocks and the final norm
    patch_norm_eps: float = 1e-5  # patch embeddings
    sr_norm_eps: float = 1e-5  # GSA's reduction norm
    lsa_pad_mask: bool = False  # False: timm's unmasked zero padding in LSA groups
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self)
        check_int(self.patch_size, "patch_size")
        dims = check_int_seq(self.embed_dims, "embed_dims")
        n = len(dims)
        heads = check_int_seq(self.num_heads, "num_heads", length=n)
        check_int_seq(self.depths, "depths", length=n)
        check_int_seq(self.sr_ratios, "sr_ratios", length=n)
        if self.wss is not None:
            check_int_seq(self.wss, "wss", length=n)
        if isinstance(self.mlp_ratios, (str, bytes)) or not isinstance(self.mlp_ratios, Sequence) \
                or len(self.mlp_ratios) != n:
            raise ValueError(f"mlp_ratios must be a sequence of {n} positive numbers (one per stage), "
                             f"got {self.mlp_ratios!r}")
        for i, r in enumerate(self.mlp_ratios):
            check_float(r, f"mlp_ratios[{i}]", low_open=True)
        for i, (d, h) in enumerate(zip(dims, heads)):
            if d % h:
                raise ValueError(f"embed_dims[{i}]={d} is not divisible by num_heads[{i}]={h}")
        for eps in ("norm_eps", "patch_norm_eps", "sr_norm_eps"):
            check_float(getattr(self, eps), eps, low_open=True)
        if not isinstance(self.lsa_pad_mask, bool):
            raise TypeError(f"lsa_pad_mask must be a bool, got {self.lsa_pad_mask!r}")


class TwinsPatchEmbed(nn.Module):
    """Non-overlapping patch embedding on a channels-last map, ``[B, H, W, Cin] -> [B, H/p, W/p, C]``.

    Conv (kernel = stride = ``p``) then LayerNorm. Like timm's convolution, rows / columns that
    do not fill a patch are dropped (``floor(H/p)``). Keys: ``proj``, ``norm`` (timm's).
    """

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int, *, eps: float = 1e-5, drop: float = 0.0) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim, eps=eps)
        self.drop = nn.Dropout(drop)  # timm's pos_drops (no parameters)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, Cin] -> [B, H // p, W // p, C]``."""
        if x.dim() != 4 or x.shape[-1] != self.proj.in_channels:
            raise ValueError(f"expected a channels-last map [B, H, W, {self.proj.in_channels}], got {tuple(x.shape)}")
        if min(x.shape[1:3]) < self.patch_size:
            raise ValueError(f"map {tuple(x.shape[1:3])} is smaller than the patch {self.patch_size}: "
                             "the input image is too small for this model")
        x = self.proj(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # [B, H', W', C] (channels-last memory)
        return self.drop(self.norm(x))


class TwinsPosConv(PosConv):
    """The PEG with Twins' key layout ``proj.0.{weight,bias}`` (timm ``PosConv``): same math as :class:`PosConv`."""

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__(dim, kernel_size)
        self.proj = nn.Sequential(self.proj)  # type: ignore[assignment]


class Twins(MinInputSizeMixin, StagedBackbone):
    """Twins PCPVT / SVT backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the normalised last map ``[B, H/32, W/32, C4]`` (channels-last),
    ``forward_intermediates`` every stage's map (``NCHW`` by default), ``forward_head`` averages
    and classifies. Stage ``i`` has ``embed_dims[i]`` channels at stride ``4·2^i``.
    """

    family = "twins"
    config_cls = TwinsConfig
    no_weight_decay_keys = (".pos.",)  # the PEGs (timm's and the original's choice)

    def __init__(self, cfg: TwinsConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        self.global_pool = cfg.global_pool
        dims = list(cfg.embed_dims)
        self.num_features = dims[-1]
        self.in_chans = cfg.in_chans
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        stages, prev, patch = [], cfg.in_chans, cfg.patch_size
        for i, dpr in enumerate(drop_path_schedule(cfg.drop_path_rate, cfg.depths)):
            blocks = []
            for j in range(cfg.depths[i]):
                if cfg.wss is not None and j % 2 == 0:  # SVT: LSA on even blocks
                    attn_layer, attn_kwargs = "lsa", dict(window_size=cfg.wss[i], pad_mask=cfg.lsa_pad_mask,
                                                         clamp_window=False)  # pads small maps, as timm
                else:  # GSA
                    attn_layer, attn_kwargs = "sra", dict(sr_ratio=cfg.sr_ratios[i], norm_eps=cfg.sr_norm_eps)
                blocks.append(Block(dims[i], cfg.num_heads[i], mlp_ratio=cfg.mlp_ratios[i], qkv_bias=cfg.qkv_bias,
                                    drop=cfg.proj_drop_rate, attn_drop=cfg.attn_drop_rate, drop_path=dpr[j],
                                    norm_layer=norm_layer, attn_layer=attn_layer, attn_kwargs=attn_kwargs))
            embed = TwinsPatchEmbed(prev, dims[i], patch, eps=cfg.patch_norm_eps, drop=cfg.pos_drop_rate)
            stages.append(Stage(blocks, embed, pos=TwinsPosConv(dims[i]), pos_index=0))
            prev, patch = dims[i], 2
        self.stages = nn.Sequential(*stages)
        strides = [cfg.patch_size * 2 ** i for i in range(len(dims))]
        self.feature_info = stage_feature_info(dims, strides, "stages")
        self.norm = norm_layer(self.num_features)
        self.head = ClassifierHead(self.num_features, cfg.num_classes, global_pool="", drop=cfg.drop_rate)
        self._init_weights()
        self._set_min_input(self.stages, strides, check_size(cfg.img_size, "img_size"))

    def _init_weights(self) -> None:
        init_linear_weights(self)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # timm / the original: normal(0, sqrt(2 / fan_out))
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                nn.init.normal_(m.weight, 0.0, (2.0 / fan_out) ** 0.5)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> channels-last ``[B, H, W, Cin]`` (stage 0's patch embedding takes it)."""
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected images [B, {self.in_chans}, H, W], got {tuple(x.shape)}")
        self._check_input(x)  # below min_input_size: ValueError saying the minimum
        return x.permute(0, 2, 3, 1)


# ---------------------------------------------------------------------------- presets (data)
_PCPVT = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4), sr_ratios=(8, 4, 2, 1))
_SVT = dict(mlp_ratios=(4, 4, 4, 4), sr_ratios=(8, 4, 2, 1), wss=(7, 7, 7, 7))
_PRESETS: dict[str, dict[str, Any]] = {
    "twins_pcpvt_small": dict(_PCPVT, depths=(3, 4, 6, 3)),
    "twins_pcpvt_base": dict(_PCPVT, depths=(3, 4, 18, 3)),
    "twins_pcpvt_large": dict(_PCPVT, depths=(3, 8, 27, 3)),
    "twins_svt_small": dict(_SVT, embed_dims=(64, 128, 256, 512), num_heads=(2, 4, 8, 16), depths=(2, 2, 10, 4)),
    "twins_svt_base": dict(_SVT, embed_dims=(96, 192, 384, 768), num_heads=(3, 6, 12, 24), depths=(2, 2, 18, 2)),
    "twins_svt_large": dict(_SVT, embed_dims=(128, 256, 512, 1024), num_heads=(4, 8, 16, 32), depths=(2, 2, 18, 2)),
}

# timm 1.0.31's benchmark table (params, GMACs at 224); the README's figures are
# 24.1 / 43.8 / 60.9M, 3.7 / 6.4 / 9.5 G (PCPVT) and 24 / 56 / 99.2M, 2.8 / 8.3 / 14.8 G (SVT).
_PUBLISHED = {
    "twins_pcpvt_small": (24.11, 3.83), "twins_pcpvt_base": (43.83, 6.68), "twins_pcpvt_large": (60.99, 9.84),
    "twins_svt_small": (24.06, 2.94), "twins_svt_base": (56.07, 8.59), "twins_svt_large": (99.27, 15.15),
}


def reduced_config(cfg: TwinsConfig) -> dict[str, Any]:
    """Overrides that shrink a Twins preset for tests: 4 stages of widths 16, 32, 32, 32, 2 blocks (SVT: one LSA
    + one GSA) and 2 heads each, on 64 px (maps 16, 8, 4, 2: every sr_ratio reduces to 2x2); SVT's groups of 3
    pad in every stage. The preset's ``sr_ratios`` and MLP ratios are kept."""
    over: dict[str, Any] = dict(embed_dims=(16, 32, 32, 32), num_heads=(2,) * 4, depths=(2,) * 4, img_size=64)
    if cfg.wss is not None:
        over["wss"] = (3,) * 4
    return over


register_family("twins", Twins, TwinsConfig, _PRESETS,
                meta={k: {"published_params_m": p, "published_gmacs": g,
                          "published_gmacs_source": "timm 1.0.31 benchmark table (infer_gmacs, 224)"}
                      for k, (p, g) in _PUBLISHED.items()}, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.9)
PRETRAINED = pretrained_tags({
    "twins_pcpvt_base.in1k": _224,
    "twins_pcpvt_large.in1k": _224,
    "twins_pcpvt_small.in1k": _224,
    "twins_svt_base.in1k": _224,
    "twins_svt_large.in1k": _224,
    "twins_svt_small.in1k": _224,
}, license="apache-2.0")
