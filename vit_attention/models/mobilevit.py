"""MobileViT v1 (Mehta & Rastegari 2022) and v2 (separable attention, 2022b): mobile CNN + transformer hybrids.

Config dataclass -> :class:`MobileViT` -> presets registered as data (timm's names). A MobileNetV2
backbone (stem, inverted residuals with BatchNorm) whose last three stages end in a MobileViT
block: a local ``kxk`` conv and a ``1x1`` projection to ``d`` channels, a stack of the one
:class:`~vit_attention.layers.Block` on the channels-last map with a global mechanism (v1: ``unfold``,
attention across unfolded ``p x p`` patches; v2: ``separable``, linear-cost separable attention),
a norm, and a ``1x1`` projection back (v1 then fuses the block input in with a ``kxk`` conv).
Any registered mechanism can replace the block's (``attn_layer``).

Resizing at sizes that are not patch multiples (done once per MobileViT block, as the references):
v1 bilinear ``align_corners=False`` up before the transformer and back down after it (timm, HF,
ml-cvnets); v2 bilinear ``align_corners=True`` up before the local conv, never back (timm,
ml-cvnets; HF v2 instead silently zeroes the border rows: not copied).

Layout: NCHW maps ``[B, C, H, W]`` through the convolutions, channels-last ``[B, H, W, d]`` inside
the transformer. State-dict keys are timm's (``stem``, ``stages.{i}.{j}``, ``conv_kxk``, ``conv_1x1``,
``transformer.{k}``, ``norm``, ``conv_proj``, ``conv_fusion``, ``final_conv``, ``head.fc``) except that
v2's 1x1 convolutions inside the transformer are ``Linear`` layers (the timm converter reshapes them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.sizes import make_divisible
from ..layers import Block, ClassifierHead, accepted_kwargs, run_blocks
from ..layers.convnet import ConvStagesMixin
from ..layers.group_norm import GroupNorm1
from ..layers.head import init_linear_weights
from ..layers.mbconv import ConvNormAct, InvertedResidual
from ._config import ConfigMixin, check_attn_layer, check_choice, check_common, check_float, check_int, check_int_seq
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["MobileViTConfig", "MobileViT", "MobileViTBlock", "MobileViTV2Block", "reduced_config"]

BlockType = Literal["v1", "v2", "v3_v1", "v3_v2"]
_V1_LIKE = ("v1", "v3_v1")


@dataclass
class MobileViTConfig(ConfigMixin):
    """Everything a :class:`MobileViT` is built from (JSON-serialisable).

    Stage ``i`` (stride ``2^(i+1)``) holds ``depths[i]`` inverted residuals to ``channels[i]``
    (the first one strided when ``i > 0``), then, when ``transformer_dims[i] > 0``, one MobileViT
    block with ``transformer_depths[i]`` transformer blocks of width ``transformer_dims[i]``.
    ``num_features > 0`` adds timm's final ``1x1`` conv-BN-SiLU (v1). ``attn_layer``: the
    transformer's mechanism (default: ``unfold`` for v1, ``separable`` for v2).
    """

    img_size: int | tuple[int, int] = 256
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    block_type: BlockType = "v1"
    stem_chs: int = 16
    channels: tuple[int, ...] = (32, 64, 96, 128, 160)
    depths: tuple[int, ...] = (1, 3, 1, 1, 1)
    expand_ratio: float = 4.0
    transformer_dims: tuple[int, ...] = (0, 0, 144, 192, 240)
    transformer_depths: tuple[int, ...] = (0, 0, 2, 4, 3)
    num_heads: int = 4
    mlp_ratio: float = 2.0
    patch_size: int = 2
    kernel_size: int = 3
    num_features: int = 640
    norm_eps: float = 1e-5
    bn_eps: float = 1e-5
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    attn_layer: str = ""  # "" = the block type's own: "unfold" (v1) / "separable" (v2)
    attn_kwargs: dict[str, Any] = field(default_factory=dict)

    def mechanism(self) -> str:
        """The transformer's registered mechanism."""
        return self.attn_layer or ("unfold" if self.block_type in _V1_LIKE else "separable")

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self)
        check_choice(self.block_type, "block_type", ("v1", "v2", "v3_v1", "v3_v2"))
        check_int(self.stem_chs, "stem_chs")
        n = len(check_int_seq(self.channels, "channels"))
        check_int_seq(self.depths, "depths", length=n, min_value=1)
        check_int_seq(self.transformer_dims, "transformer_dims", length=n, min_value=0)
        depths = check_int_seq(self.transformer_depths, "transformer_depths", length=n, min_value=0)
        for i, (d, k) in enumerate(zip(self.transformer_dims, depths)):
            if (d > 0) != (k > 0):
                raise ValueError(f"stage {i}: transformer_dims[{i}]={d} and transformer_depths[{i}]={k} must both be "
                                 "0 (no MobileViT block) or both positive")
            if d and d % check_int(self.num_heads, "num_heads"):
                raise ValueError(f"transformer_dims[{i}]={d} is not divisible by num_heads={self.num_heads}")
        check_float(self.expand_ratio, "expand_ratio", low_open=True)
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_int(self.patch_size, "patch_size")
        if check_int(self.kernel_size, "kernel_size") % 2 == 0:
            raise ValueError(f"kernel_size must be odd (same padding), got {self.kernel_size}")
        check_int(self.num_features, "num_features", min_value=0)
        check_float(self.norm_eps, "norm_eps", low_open=True)
        check_float(self.bn_eps, "bn_eps", low_open=True)
        check_attn_layer(self.mechanism(), self.attn_kwargs)


def _transformer(cfg: MobileViTConfig, dim: int, depth: int, drop_path: Sequence[float],
                 first_index: int = 0) -> nn.Sequential:
    """``depth`` pre-norm :class:`Block` s on a channels-last ``[B, H, W, dim]`` map (MLP ratio, SiLU); the first
    is the model's transformer block ``first_index`` (each block's ``depth_index``)."""
    v1 = cfg.block_type in _V1_LIKE
    name = cfg.mechanism()
    own = accepted_kwargs(name, dict(patch_size=cfg.patch_size))  # given where the mechanism takes them
    norm = partial(nn.LayerNorm, eps=cfg.norm_eps) if v1 else partial(GroupNorm1, eps=cfg.norm_eps)
    return nn.Sequential(*[
        Block(dim, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, drop=cfg.proj_drop_rate, attn_drop=cfg.attn_drop_rate,
              drop_path=drop_path[k], norm_layer=norm, act_layer=nn.SiLU, attn_layer=name,
              attn_kwargs={**own, **cfg.attn_kwargs}, depth_index=first_index + k)
        for k in range(depth)])


def _resize(x: Tensor, size: tuple[int, int], align_corners: bool) -> Tensor:
    """Bilinear resize of ``[B, C, H, W]`` to ``size`` (a no-op at that size)."""
    if tuple(x.shape[-2:]) == size:
        return x
    return F.interpolate(x, size=size, mode="bilinear", align_corners=align_corners)


def _patch_multiple(x: Tensor, p: int) -> tuple[int, int]:
    H, W = x.shape[-2:]
    return (H + p - 1) // p * p, (W + p - 1) // p * p  # positive operands: ONNX divides by truncation


class MobileViTBlock(nn.Module):
    """MobileViT v1 block, ``[B, C, H, W] -> [B, C, H, W]``.

    ``conv_kxk`` (conv-BN-SiLU) -> ``conv_1x1`` (to ``d``) -> [resize to a patch multiple] ->
    ``transformer`` (channels-last) -> ``norm`` -> [resize back] -> ``conv_proj`` (1x1 conv-BN-SiLU, to ``C``)
    -> ``conv_fusion`` (kxk conv-BN-SiLU on ``cat(input, x)``).

    MobileViT v3 (``block_type="v3_v1"``, Wadekar & Chaurasia 2022): depthwise ``conv_kxk``; ``conv_fusion``
    is a 1x1 conv-BN-SiLU on ``cat(local, x)`` (``local``: the ``conv_1x1`` output, ``d + C`` channels in),
    and the block input is added back.
    """

    def __init__(self, cfg: MobileViTConfig, chs: int, dim: int, depth: int, drop_path: Sequence[float],
                 first_index: int = 0) -> None:
        super().__init__()
        k, eps = cfg.kernel_size, cfg.bn_eps
        self.patch_size = cfg.patch_size
        self.v3 = cfg.block_type == "v3_v1"
        self.conv_kxk = ConvNormAct(chs, chs, k, groups=chs if self.v3 else 1, eps=eps)
        self.conv_1x1 = nn.Conv2d(chs, dim, 1, bias=False)
        self.transformer = _transformer(cfg, dim, depth, drop_path, first_index)
        self.norm = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.conv_proj = ConvNormAct(dim, chs, 1, eps=eps)
        self.conv_fusion = (ConvNormAct(dim + chs, chs, 1, eps=eps) if self.v3 else
                            ConvNormAct(2 * chs, chs, k, eps=eps))
        self.grad_checkpointing = False

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, C, H, W]``."""
        shortcut = x
        local = self.conv_1x1(self.conv_kxk(x))  # [B, d, H, W]
        size = tuple(local.shape[-2:])
        x = _resize(local, _patch_multiple(local, self.patch_size), align_corners=False)  # [B, d, Hp, Wp]
        x = run_blocks(self.transformer, x.permute(0, 2, 3, 1),
                       checkpoint=self.grad_checkpointing and self.training)  # [B, Hp, Wp, d]
        x = self.conv_proj(_resize(self.norm(x).permute(0, 3, 1, 2), size, align_corners=False))  # [B, C, H, W]
        if self.v3:
            return shortcut + self.conv_fusion(torch.cat((local, x), dim=1))  # [B, C, H, W]
        return self.conv_fusion(torch.cat((shortcut, x), dim=1))  # [B, C, H, W]


class MobileViTV2Block(nn.Module):
    """MobileViT v2 block, ``[B, C, H, W] -> [B, C, Hp, Wp]`` (``Hp, Wp``: ``H, W`` up to patch multiples).

    [resize, ``align_corners=True``] -> ``conv_kxk`` (depthwise conv-BN-SiLU) -> ``conv_1x1`` (to ``d``)
    -> ``transformer`` (GroupNorm(1) pre-norm blocks) -> ``norm`` -> ``conv_proj`` (1x1 conv-BN, to ``C``).

    MobileViT v3 (``block_type="v3_v2"``): ``conv_proj`` takes ``cat(x, local)`` (global first, ``2d``
    channels in; ``local``: the ``conv_1x1`` output) and the (resized) block input is added back.
    """

    def __init__(self, cfg: MobileViTConfig, chs: int, dim: int, depth: int, drop_path: Sequence[float],
                 first_index: int = 0) -> None:
        super().__init__()
        k, eps = cfg.kernel_size, cfg.bn_eps
        self.patch_size = cfg.patch_size
        self.conv_kxk = ConvNormAct(chs, chs, k, groups=chs, eps=eps)
        self.conv_1x1 = nn.Conv2d(chs, dim, 1, bias=False)
        self.transformer = _transformer(cfg, dim, depth, drop_path, first_index)
        self.norm = GroupNorm1(dim, eps=cfg.norm_eps)
        self.v3 = cfg.block_type == "v3_v2"
        self.conv_proj = ConvNormAct(2 * dim if self.v3 else dim, chs, 1, act_layer=None, eps=eps)
        self.grad_checkpointing = False

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, C, Hp, Wp]``."""
        x = _resize(x, _patch_multiple(x, self.patch_size), align_corners=True)  # [B, C, Hp, Wp]
        local = self.conv_1x1(self.conv_kxk(x))  # [B, d, Hp, Wp]
        y = run_blocks(self.transformer, local.permute(0, 2, 3, 1),
                       checkpoint=self.grad_checkpointing and self.training)  # [B, Hp, Wp, d]
        y = self.norm(y).permute(0, 3, 1, 2)  # [B, d, Hp, Wp]
        if self.v3:
            return x + self.conv_proj(torch.cat((y, local), dim=1))  # [B, C, Hp, Wp]
        return self.conv_proj(y)  # [B, C, Hp, Wp]


class MobileViT(ConvStagesMixin, StagedBackbone):
    """MobileViT v1 / v2 backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last map ``[B, num_features, H/32, W/32]`` (NCHW, after
    ``final_conv``), ``forward_intermediates`` the maps of the five strides 2 ... 32 (``feature_info``),
    ``forward_head`` pools and classifies. ``set_grad_checkpointing`` recomputes the MobileViT blocks'
    transformer activations in backward (training only).
    """

    family = "mobilevit"
    config_cls = MobileViTConfig
    no_weight_decay_keys = ()  # no position embeddings

    def __init__(self, cfg: MobileViTConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        self.global_pool = cfg.global_pool
        self.stem = ConvNormAct(cfg.in_chans, cfg.stem_chs, 3, stride=2, eps=cfg.bn_eps)
        counts = [d + (1 if t else 0) for d, t in zip(cfg.depths, cfg.transformer_depths)]
        total = sum(counts)
        rates = [cfg.drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        block_cls = MobileViTBlock if cfg.block_type in _V1_LIKE else MobileViTV2Block
        stages, prev, start = [], cfg.stem_chs, 0
        for i, chs in enumerate(cfg.channels):
            blocks: list[nn.Module] = []
            for j in range(cfg.depths[i]):
                blocks.append(InvertedResidual(prev, chs, stride=2 if i > 0 and j == 0 else 1,
                                               expand_ratio=cfg.expand_ratio, drop_path=rates[start + j],
                                               eps=cfg.bn_eps))
                prev = chs
            if cfg.transformer_dims[i]:
                rate = rates[start + cfg.depths[i]]
                blocks.append(block_cls(cfg, chs, cfg.transformer_dims[i], cfg.transformer_depths[i],
                                        [rate] * cfg.transformer_depths[i],
                                        first_index=sum(cfg.transformer_depths[:i])))
            start += counts[i]
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.final_conv = ConvNormAct(prev, cfg.num_features, 1, eps=cfg.bn_eps) if cfg.num_features else nn.Identity()
        self.num_features = cfg.num_features or prev
        n = len(cfg.channels)
        self.feature_info = [dict(num_chs=c, reduction=2 ** (i + 1), module=f"stages.{i}")
                             for i, c in enumerate(cfg.channels)]
        self.feature_info[-1] = dict(num_chs=self.num_features, reduction=2 ** n,
                                     module="final_conv" if cfg.num_features else f"stages.{n - 1}")
        self.head = ClassifierHead(self.num_features, cfg.num_classes, global_pool="", drop=cfg.drop_rate)
        self._init_weights()

    def _init_weights(self) -> None:
        init_linear_weights(self)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    # API: forward_features / forward_head / forward_intermediates from ConvStagesMixin (feature levels: strides
    # 2 ... 32, the last one after final_conv in v1, the last stage's output in v2); forward, reset_classifier,
    # pooling, set_grad_checkpointing (the MobileViT blocks' flags) and no_weight_decay from Backbone.


# ---------------------------------------------------------------------------- presets (data)
def _v1(stem: int, chs: tuple[int, ...], dims: tuple[int, int, int], expand: float, features: int) -> dict[str, Any]:
    return dict(block_type="v1", stem_chs=stem, channels=chs, expand_ratio=expand, transformer_dims=(0, 0, *dims),
                num_features=features)


def _v2(multiplier: float) -> dict[str, Any]:
    """timm ``_mobilevitv2_cfg``: widths ``int(c · m)``, transformer width ``make_divisible(C / 2)``."""
    chs = tuple(int(c * multiplier) for c in (64, 128, 256, 384, 512))
    return dict(block_type="v2", stem_chs=int(32 * multiplier), channels=chs, depths=(1, 2, 1, 1, 1),
                expand_ratio=2.0, transformer_dims=(0, 0, *(make_divisible(c * 0.5) for c in chs[2:])),
                num_heads=1, num_features=0)


def cvnets_v2_widths(multiplier: float, attn_dims: tuple[int, ...] = (128, 192, 256)) -> dict[str, Any]:
    """ml-cvnets' (and Hugging Face's, MobileViTv3-v2's) MobileViT v2 widths for a width ``multiplier``.

    Stem ``make_divisible(clip(32·m, 16, 64), 8, min 16)``, stage 0 ``make_divisible(64·m, 16)``, the
    others ``make_divisible(c·m, 8)``, transformer widths ``make_divisible(d·m, 8)``; timm's ``int(c·m)``
    (:func:`_v2`) agrees for the published multipliers 0.5 ... 2.0.
    """
    m = multiplier
    stem = make_divisible(min(max(32 * m, 16), 64), 8, min_value=16)
    chs = (make_divisible(64 * m, 16), *(make_divisible(c * m, 8) for c in (128, 256, 384, 512)))
    return dict(stem_chs=stem, channels=chs, transformer_dims=(0, 0, *(make_divisible(d * m, 8) for d in attn_dims)))


_PRESETS: dict[str, dict[str, Any]] = {
    "mobilevit_xxs": _v1(16, (16, 24, 48, 64, 80), (64, 80, 96), 2.0, 320),
    "mobilevit_xs": _v1(16, (32, 48, 64, 80, 96), (96, 120, 144), 4.0, 384),
    "mobilevit_s": _v1(16, (32, 64, 96, 128, 160), (144, 192, 240), 4.0, 640),
}
_V2_SIZES = {"050": 0.5, "075": 0.75, "100": 1.0, "125": 1.25, "150": 1.5, "175": 1.75, "200": 2.0}
for _tag, _m in _V2_SIZES.items():
    _PRESETS[f"mobilevitv2_{_tag}"] = _v2(_m)
# MobileViT v3 (micronDLA/MobileViTv3, configs *_v3): v1-based (wider stages, final conv min(4·C, 960)) ...
_PRESETS.update({
    "mobilevitv3_xxs": dict(_v1(16, (16, 24, 64, 80, 128), (64, 80, 96), 2.0, 512), block_type="v3_v1"),
    "mobilevitv3_xs": dict(_v1(16, (32, 48, 96, 160, 160), (96, 120, 144), 4.0, 640), block_type="v3_v1"),
    "mobilevitv3_s": dict(_v1(16, (32, 64, 128, 256, 320), (144, 192, 240), 4.0, 960), block_type="v3_v1"),
})
# ... and v2-based (the cvnets v2 widths)
for _tag, _m in {"050": 0.5, "075": 0.75, "100": 1.0}.items():
    _PRESETS[f"mobilevitv3_{_tag}"] = dict(_v2(_m), **cvnets_v2_widths(_m), block_type="v3_v2")

# Published sizes at 256 px (timm 1.0.31 benchmark table: param_count, infer_gmacs).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "mobilevit_xxs": (1.27, 0.42), "mobilevit_xs": (2.32, 1.05), "mobilevit_s": (5.58, 2.03),
    "mobilevitv2_050": (1.37, 0.48), "mobilevitv2_075": (2.87, 1.05), "mobilevitv2_100": (4.90, 1.84),
    "mobilevitv2_125": (7.48, 2.86), "mobilevitv2_150": (10.59, 4.09), "mobilevitv2_175": (14.25, 5.54),
    "mobilevitv2_200": (18.45, 7.22),
}
# MobileViT v3 at 256 px: micronDLA/MobileViTv3 README (params in M, "FLOPs (Million)" = MACs).
_PUBLISHED_V3: dict[str, tuple[float, float]] = {
    "mobilevitv3_xxs": (1.2, 0.289), "mobilevitv3_xs": (2.5, 0.927), "mobilevitv3_s": (5.8, 1.841),
    "mobilevitv3_050": (1.4, 0.481), "mobilevitv3_075": (3.0, 1.064), "mobilevitv3_100": (5.1, 1.876),
}
_META = published_meta(_PUBLISHED, "timm benchmark-infer-amp-nchw-pt240 (param_count, infer_gmacs) at 256 px")

for _name, (_p, _g) in _PUBLISHED_V3.items():
    # The README rounds to one decimal: ours (xxs 1.249M, 050 1.430M) round to its 1.2 / 1.4 but sit 4 % / 2 %
    # away, so those two keep the figure beside the 1 % check (the original repository's xxs model has exactly our
    # 1,249,448). Its MACs come from ml-cvnets' profiler (on the original xxs it gives the README's 288.5 M), which
    # counts differently from timm's table (ours: 0.356 / 1.029 / 1.908 / 0.515 / 1.115 / 1.944 G, the
    # convention that matches timm's v1 / v2 figures): recorded, not asserted.
    _META[_name] = {("published_params_m" if _name not in ("mobilevitv3_xxs", "mobilevitv3_050")
                     else "readme_params_m"): _p,
                    "readme_gmacs": _g, "readme_source": "micronDLA/MobileViTv3 README (params M, FLOPs = MACs)"}


def reduced_config(cfg: MobileViTConfig) -> dict[str, Any]:
    """Overrides that shrink a MobileViT v1 / v2 / v3 preset for tests: 5 stages of 8 ... 24 channels, MobileViT
    blocks of 2 / 1 / 1 transformer blocks; v1 on a 96 px image (the stride-32 map is 3x3: v1's resize up and
    back), v2 on 64 px (v2 resizes without coming back, which changes the strides: its resize is covered by the
    timm fixture). The block type, expansion ratio, heads and the presence of the final conv are kept."""
    return dict(stem_chs=8, channels=(8, 16, 16, 24, 24), depths=(1, 2, 1, 1, 1), transformer_dims=(0, 0, 16, 24, 24),
                transformer_depths=(0, 0, 2, 1, 1), num_features=32 if cfg.num_features else 0,
                img_size=96 if cfg.block_type in _V1_LIKE else 64)


register_family("mobilevit", MobileViT, MobileViTConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_256_C90 = data_cfg(256, 0.9, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
_256_C88_8 = data_cfg(256, 0.888, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
_384 = data_cfg(384, 1.0, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
PRETRAINED = pretrained_tags({
    "mobilevit_s.cvnets_in1k": _256_C90,
    "mobilevit_xs.cvnets_in1k": _256_C90,
    "mobilevit_xxs.cvnets_in1k": _256_C90,
    "mobilevitv2_050.cvnets_in1k": _256_C88_8,
    "mobilevitv2_075.cvnets_in1k": _256_C88_8,
    "mobilevitv2_100.cvnets_in1k": _256_C88_8,
    "mobilevitv2_125.cvnets_in1k": _256_C88_8,
    "mobilevitv2_150.cvnets_in1k": _256_C88_8,
    "mobilevitv2_150.cvnets_in22k_ft_in1k": _256_C88_8,
    "mobilevitv2_150.cvnets_in22k_ft_in1k_384": _384,
    "mobilevitv2_175.cvnets_in1k": _256_C88_8,
    "mobilevitv2_175.cvnets_in22k_ft_in1k": _256_C88_8,
    "mobilevitv2_175.cvnets_in22k_ft_in1k_384": _384,
    "mobilevitv2_200.cvnets_in1k": _256_C88_8,
    "mobilevitv2_200.cvnets_in22k_ft_in1k": _256_C88_8,
    "mobilevitv2_200.cvnets_in22k_ft_in1k_384": _384,
}, license="cvnets-license")
