"""MaxViT (Tu et al., ECCV 2022, arXiv 2204.01697): MBConv + block attention + grid attention in every block.

Config dataclass -> :class:`MaxViT` -> presets registered as data: timm 1.0.31's ``maxvit_*_tf_*`` (the port of
google-research/maxvit; ``timm/models/maxxvit.py``), timm's own ``maxvit_{pico,nano,tiny}_rw_*`` and
``maxvit_rmlp_*_rw_*`` (the relative-position bias an MLP of the offsets) and torchvision 0.29's ``maxvit_t``; their
differences are config fields (:class:`MaxViTConfig`). Four stages of MaxViT blocks;
block 0 of each stage has stride 2. One block (the TF form), ``[B, C_in, H, W] -> [B, C, H', W']``:

* MBConv (:class:`MaxViTMBConv`): pre-norm BatchNorm (no activation) -> 1x1 to ``M = 4·C`` -> BN + GELU -> 3x3
  depthwise (stride 2 in block 0) -> BN + GELU -> squeeze-excitation (SiLU, ``0.25·C`` wide) -> 1x1 to ``C`` (bias);
  the shortcut takes the un-normalised input: identity, or 2x2 average pooling (+ a 1x1 conv with bias when the
  width changes);
* on the channels-last map, the one :class:`~vit_attention.layers.Block` twice (pre-norm attention + MLP
  ``C -> 4C -> C``): ``block`` attention over ``P x P`` windows, then ``grid`` attention over ``G x G`` strided
  groups (:mod:`vit_attention.attention.multi_axis`), each with its own TF relative-position table.

Stem: conv 3x3 stride 2 (bias) -> BN + GELU -> conv 3x3 (bias). Head (timm's ``NormMlpClassifierHead``): average
pool -> LayerNorm -> Linear + tanh -> Linear. The TF port's details are kept: TF ``'same'`` padding of the stride-2
convolutions and pooling (bottom / right at even sizes: ``(0, 1)``; ``(1, 1)`` at odd sizes, timm's
``Conv2dSame`` / ``AvgPool2dSame``, the pooling counting the padded zeros), GELU's tanh approximation in the MBConv
and the MLP, BatchNorm eps 1e-3, LayerNorm eps 1e-5, ``hd = 32``.

Sizes (timm's rule): the partition sides are ``img_size // partition_ratio`` (32) at build unless ``window_size`` /
``grid_size`` are given; every stage's map must be a multiple of them (224: 56, 28, 14, 7 with P = G = 7). A size
that breaks the rule is refused naming it (``allow_padding=True`` pads the maps instead, the padded keys masked: a
library option, not a reference behaviour). ``set_input_size`` recomputes the sides by the rule and resamples the
tables like timm (``resize_rel_pos_bias_table``).

State-dict layout: timm's (``stem.{conv1,norm1,conv2}``, ``stages.{s}.blocks.{b}.conv.*``,
``...attn_block.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}``, ``...attn_grid.*``,
``head.{norm,pre_logits.fc,fc}``; ``norm`` for the ``rw`` map norm) except that the tables are
``attn.relative_position_bias_table`` in the TF layout (timm: ``attn.rel_pos.relative_position_bias_table``, Swin
layout in ``rw`` files; :mod:`vit_attention.weights.maxvit` converts them, and torchvision's files).
Layout: NCHW maps through the convolutions, channels-last inside the attention blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from ..attention.base import AttentionModule
from ..functional.batch_norm import conv_bn
from ..functional.sizes import make_divisible
from ..layers import Block, accepted_kwargs
from ..layers.convnet import ConvStagesMixin
from ..layers.drop_path import DropPath
from ..layers.head import init_linear_weights
from ..layers.norm import LayerNorm2d
from ._config import ConfigMixin, check_attn_layer, check_choice, check_common, check_float, check_int, check_int_seq
from .backbone import StagedBackbone
from .pretrained_tags import INCEPTION_MEAN, INCEPTION_STD, data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["MaxViTConfig", "MaxViT", "MaxViTStem", "MaxViTMBConv", "MaxViTBlock", "MaxViTStage", "MaxViTHead",
           "reduced_config", "same_pad"]

Act = Literal["gelu_tanh", "gelu", "silu"]
HeadNorm = Literal["pooled", "map"]
Padding = Literal["same", "symmetric"]
Shortcut = Literal["avg2", "avg3_conv"]


@dataclass
class MaxViTConfig(ConfigMixin):
    """Everything a :class:`MaxViT` is built from (JSON-serialisable).

    * ``embed_dims`` / ``depths``: per stage; ``stem_width``: the stem's channels (an int, or a pair: conv1's and
      conv2's); ``dim_head``: the attention head width (``nh = C / dim_head``).
    * ``window_size`` / ``grid_size``: the block and grid partition sides (None: ``img_size // partition_ratio``);
      ``allow_padding``: maps the partitions do not tile are padded (masked) instead of refused.
    * ``act_layer``: the stem's and the MBConv's activation, ``"gelu_tanh"`` (TF), ``"gelu"`` (exact) or ``"silu"``
      (timm's ``rw``); ``mlp_act_layer``: the attention blocks' MLP's (None: ``act_layer``).
    * ``expand_output``: the MBConv's width ``expand_ratio·C_out`` (TF) or ``expand_ratio·C_in`` (``rw``);
      ``se_ratio`` of ``C_out`` (TF) or, with ``expand_output=False``, of the MBConv's width; ``conv_bias``: the
      MBConv's output and shortcut convs' biases.
    * ``padding`` of the stride-2 convolutions: ``"same"`` (TF, bottom / right first) or ``"symmetric"``
      (``k // 2``: torchvision, timm ``rw``). ``shortcut`` of a strided MBConv: ``"avg2"`` (2x2 pooling, a 1x1 conv
      when the width changes: TF, timm) or ``"avg3_conv"`` (3x3 stride-2 pooling padded 1, counting the zeros, then
      a 1x1 conv always: torchvision). ``stem_bias``: the stem convs' biases (one bool for both, or a pair).
    * ``head_norm``: the final LayerNorm on the pooled features (``"pooled"``, TF) or on the map before pooling
      (``"map"``, ``rw``: ``forward_features`` returns the normalised map); ``head_hidden_size``: the head's tanh
      layer (0: none); ``head_bias``: the classifier's bias.
    * ``rel_pos``: the attention's relative-position bias, a learned TF table (``"table"``) or timm's MLP of the
      log-spaced offsets (``"mlp"``, ``rel_pos_dim`` hidden units: the ``rmlp`` presets); ``init_values``: LayerScale
      in the attention blocks (None: none).
    * ``block_attn_layer`` / ``grid_attn_layer``: any registered spatial mechanism for the two attention blocks
      (their ``*_attn_kwargs`` given as they are).
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    embed_dims: tuple[int, ...] = (64, 128, 256, 512)
    depths: tuple[int, ...] = (2, 2, 5, 2)
    stem_width: int | tuple[int, int] = 64
    stem_bias: bool | tuple[bool, bool] = True
    head_bias: bool = True
    padding: Padding = "same"
    shortcut: Shortcut = "avg2"
    dim_head: int = 32
    mlp_ratio: float = 4.0
    expand_ratio: float = 4.0
    se_ratio: float = 0.25
    expand_output: bool = True
    conv_bias: bool = True
    head_hidden_size: int = 512
    bn_eps: float = 1e-3
    norm_eps: float = 1e-5
    act_layer: Act = "gelu_tanh"
    mlp_act_layer: Act | None = None
    head_norm: HeadNorm = "pooled"
    window_size: int | tuple[int, int] | None = None
    grid_size: int | tuple[int, int] | None = None
    partition_ratio: int = 32
    allow_padding: bool = False
    rel_pos: Literal["table", "mlp"] = "table"
    rel_pos_dim: int = 512
    init_values: float | None = None
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    block_attn_layer: str = "block"
    block_attn_kwargs: dict[str, Any] = field(default_factory=dict)
    grid_attn_layer: str = "grid"
    grid_attn_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        img = check_common(self)
        depths = check_int_seq(self.depths, "depths")
        dims = check_int_seq(self.embed_dims, "embed_dims", length=len(depths))
        check_int(self.dim_head, "dim_head")
        for i, d in enumerate(dims):
            if d % self.dim_head:
                raise ValueError(f"embed_dims[{i}]={d} is not divisible by dim_head={self.dim_head}")
        if isinstance(self.stem_width, (tuple, list)):
            check_int_seq(self.stem_width, "stem_width", length=2)
        else:
            check_int(self.stem_width, "stem_width")
        check_int(self.head_hidden_size, "head_hidden_size", min_value=0)
        check_int(self.partition_ratio, "partition_ratio")
        for name in ("mlp_ratio", "expand_ratio", "se_ratio", "bn_eps", "norm_eps"):
            check_float(getattr(self, name), name, low_open=True)
        check_choice(self.act_layer, "act_layer", ("gelu_tanh", "gelu", "silu"))
        if self.mlp_act_layer is not None:
            check_choice(self.mlp_act_layer, "mlp_act_layer", ("gelu_tanh", "gelu", "silu"))
        check_choice(self.head_norm, "head_norm", ("pooled", "map"))
        check_choice(self.rel_pos, "rel_pos", ("table", "mlp"))
        check_int(self.rel_pos_dim, "rel_pos_dim")
        if self.init_values is not None:
            check_float(self.init_values, "init_values", low_open=True)
        check_choice(self.padding, "padding", ("same", "symmetric"))
        check_choice(self.shortcut, "shortcut", ("avg2", "avg3_conv"))
        for name in ("head_bias", "allow_padding", "expand_output", "conv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        stem_bias = self.stem_bias
        if not (isinstance(stem_bias, bool) or (isinstance(stem_bias, (tuple, list)) and len(stem_bias) == 2
                                                and all(isinstance(b, bool) for b in stem_bias))):
            raise TypeError(f"stem_bias must be a bool or a pair of bools (conv1, conv2), got {stem_bias!r}")
        for name in ("window_size", "grid_size"):
            value = getattr(self, name)
            if value is not None:
                _pair(value, name)
        check_attn_layer(self.block_attn_layer, self.block_attn_kwargs, layout="spatial")
        check_attn_layer(self.grid_attn_layer, self.grid_attn_kwargs, layout="spatial")
        check_partitions(self, img)

    def partitions(self, img_size: tuple[int, int] | None = None) -> tuple[tuple[int, int], tuple[int, int]]:
        """The block and grid partition sides ``((Ph, Pw), (Gh, Gw))``: given, else ``img_size // partition_ratio``
        per axis (at least 1)."""
        h, w = img_size or _pair(self.img_size, "img_size")
        rule = (max(1, h // self.partition_ratio), max(1, w // self.partition_ratio))
        window = _pair(self.window_size, "window_size") if self.window_size is not None else rule
        grid = _pair(self.grid_size, "grid_size") if self.grid_size is not None else window if (
            self.window_size is not None) else rule
        return window, grid


def _pair(value: Any, name: str) -> tuple[int, int]:
    """An int or a pair of positive ints as ``(h, w)``; else raises naming ``name``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return (value, value)
    if (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"{name} must be a positive int or a pair of positive ints, got {value!r}")


def stage_sizes(img_size: tuple[int, int], num_stages: int) -> list[tuple[int, int]]:
    """Each stage's map for an image ``(H, W)``: the stem halves it, every stage halves it again (``ceil``, TF
    ``'same'``)."""
    h, w = math.ceil(img_size[0] / 2), math.ceil(img_size[1] / 2)
    out = []
    for _ in range(num_stages):
        h, w = math.ceil(h / 2), math.ceil(w / 2)
        out.append((h, w))
    return out


def check_partitions(cfg: MaxViTConfig, img_size: tuple[int, int]) -> None:
    """Raise ``ValueError`` naming ``img_size`` when a stage's map is not a multiple of the partition sides
    (MaxViT's rule; skipped with ``allow_padding`` or other mechanisms than block / grid)."""
    if cfg.allow_padding:
        return
    window, grid = cfg.partitions(img_size)
    for kind, side, layer in (("window", window, cfg.block_attn_layer), ("grid", grid, cfg.grid_attn_layer)):
        if layer not in ("block", "grid"):
            continue
        for i, (h, w) in enumerate(stage_sizes(img_size, len(cfg.depths))):
            ph, pw = min(side[0], h), min(side[1], w)
            if h % ph or w % pw:
                raise ValueError(
                    f"img_size={tuple(img_size)} gives stage {i} a {h}x{w} map, not a multiple of the {kind} "
                    f"partition {side} (MaxViT's rule: every stage's map a multiple of window_size and grid_size, "
                    f"by default img_size // {cfg.partition_ratio}); choose another img_size, window_size / "
                    "grid_size, or allow_padding=True")


def same_pad(x: Tensor, kernel_size: int, stride: int) -> Tensor:
    """TF ``'same'`` padding of ``[B, C, H, W]`` for a ``kernel_size`` / ``stride`` window: ``total = max((ceil(n /
    s) - 1)·s + k - n, 0)`` per axis, ``total // 2`` before and the rest after (timm's ``pad_same``)."""
    H, W = x.shape[-2:]
    ph = max((math.ceil(H / stride) - 1) * stride + kernel_size - H, 0)
    pw = max((math.ceil(W / stride) - 1) * stride + kernel_size - W, 0)
    if ph or pw:
        x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
    return x


def _act(name: str) -> nn.Module:
    """``"gelu_tanh"`` / ``"gelu"`` / ``"silu"`` -> the module."""
    if name == "silu":
        return nn.SiLU()
    return nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")


class MaxViTStem(nn.Module):
    """Conv 3x3 stride 2 -> BN + act -> conv 3x3: ``[B, Cin, H, W] -> [B, S, ceil(H/2), ceil(W/2)]``.

    ``padding`` of the strided conv: ``"same"`` (TF) or ``"symmetric"`` (1 each side); ``bias``: of both convs, or a
    pair ``(conv1, conv2)``. Keys (timm): ``conv1``, ``norm1``, ``conv2``.
    """

    def __init__(self, in_chans: int, out_chs: int | tuple[int, int], *, bias: bool | tuple[bool, bool] = True,
                 eps: float = 1e-3, act_layer: str = "gelu_tanh", padding: str = "same") -> None:
        super().__init__()
        b1, b2 = (bias, bias) if isinstance(bias, bool) else bias
        c1, c2 = (out_chs, out_chs) if isinstance(out_chs, int) else out_chs
        self.same = padding == "same"
        self.conv1 = nn.Conv2d(in_chans, c1, 3, stride=2, padding=0 if self.same else 1, bias=b1)
        self.norm1 = nn.BatchNorm2d(c1, eps=eps)
        self.act = _act(act_layer)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1, bias=b2)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, S, ceil(H/2), ceil(W/2)]``."""
        if x.dim() != 4 or x.shape[1] != self.conv1.in_channels:
            raise ValueError(f"expected images [B, {self.conv1.in_channels}, H, W], got {tuple(x.shape)}")
        if self.same:
            x = same_pad(x, 3, 2)
        return self.conv2(self.act(conv_bn(self.conv1, self.norm1, x)))


class SqueezeExcite(nn.Module):
    """``x · σ(fc2(SiLU(fc1(mean_hw(x)))))`` on ``[B, C, H, W]`` (timm's ``SEModule``; keys ``fc1``, ``fc2``)."""

    def __init__(self, chs: int, rd_chs: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(chs, rd_chs, 1)
        self.act = nn.SiLU()
        self.fc2 = nn.Conv2d(rd_chs, chs, 1)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, C, H, W]``."""
        return x * self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True)))).sigmoid()


class Downsample(nn.Module):
    """The stride-2 shortcut, ``[B, C_in, H, W] -> [B, C, ceil(H/2), ceil(W/2)]``; key ``expand``.

    ``"avg2"``: 2x2 average pooling (TF ``'same'``, padded zeros counted) + a 1x1 conv (bias) when the width
    changes; ``"avg3_conv"`` (torchvision): 3x3 stride-2 average pooling padded 1 (zeros counted) + a 1x1 conv.
    """

    def __init__(self, in_chs: int, out_chs: int, kind: str = "avg2", bias: bool = True) -> None:
        super().__init__()
        self.kind = kind
        conv = in_chs != out_chs or kind == "avg3_conv"
        self.expand = nn.Conv2d(in_chs, out_chs, 1, bias=bias) if conv else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C_in, H, W] -> [B, C, ceil(H/2), ceil(W/2)]``."""
        if self.kind == "avg3_conv":
            return self.expand(F.avg_pool2d(x, 3, 2, 1))
        return self.expand(F.avg_pool2d(same_pad(x, 2, 2), 2))


class MaxViTMBConv(nn.Module):
    """MaxViT's pre-norm MBConv with squeeze-excitation, ``[B, C_in, H, W] -> [B, C, H / s, W / s]`` (module
    docstring). Keys (timm ``MbConvBlock``): ``shortcut.expand``, ``pre_norm``, ``conv1_1x1``, ``norm1``,
    ``conv2_kxk``, ``norm2``, ``se.fc1`` / ``se.fc2``, ``conv3_1x1``."""

    def __init__(self, in_chs: int, out_chs: int, *, stride: int = 1, expand_ratio: float = 4.0,
                 se_ratio: float = 0.25, eps: float = 1e-3, act_layer: str = "gelu_tanh",
                 drop_path: float = 0.0, padding: str = "same", shortcut: str = "avg2", expand_output: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride!r}")
        mid = make_divisible((out_chs if expand_output else in_chs) * expand_ratio)
        self.stride = stride
        self.same = padding == "same"
        self.shortcut = Downsample(in_chs, out_chs, shortcut, bias) if stride == 2 else nn.Identity()
        self.pre_norm = nn.BatchNorm2d(in_chs, eps=eps)
        self.conv1_1x1 = nn.Conv2d(in_chs, mid, 1, bias=False)
        self.norm1 = nn.BatchNorm2d(mid, eps=eps)
        self.act1 = _act(act_layer)
        self.conv2_kxk = nn.Conv2d(mid, mid, 3, stride=stride, padding=0 if stride == 2 and self.same else 1,
                                   groups=mid, bias=False)
        self.norm2 = nn.BatchNorm2d(mid, eps=eps)
        self.act2 = _act(act_layer)
        self.se = SqueezeExcite(mid, int(se_ratio * (out_chs if expand_output else mid)))
        self.conv3_1x1 = nn.Conv2d(mid, out_chs, 1, bias=bias)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C_in, H, W] -> [B, C, ceil(H / s), ceil(W / s)]``."""
        shortcut = self.shortcut(x)
        y = self.act1(conv_bn(self.conv1_1x1, self.norm1, self.pre_norm(x)))
        if self.stride == 2 and self.same:
            y = same_pad(y, 3, 2)
        y = self.se(self.act2(conv_bn(self.conv2_kxk, self.norm2, y)))
        return self.drop_path(self.conv3_1x1(y)) + shortcut


class MaxViTBlock(nn.Module):
    """MBConv, then block attention + MLP and grid attention + MLP on the channels-last map:
    ``[B, C_in, H, W] -> [B, C, H', W']``. Keys: ``conv``, ``attn_block``, ``attn_grid`` (timm)."""

    def __init__(self, cfg: MaxViTConfig, in_chs: int, out_chs: int, *, stride: int, drop_path: float,
                 window: tuple[int, int], grid: tuple[int, int], depth_index: int = 0) -> None:
        super().__init__()
        self.conv = MaxViTMBConv(in_chs, out_chs, stride=stride, expand_ratio=cfg.expand_ratio,
                                 se_ratio=cfg.se_ratio, eps=cfg.bn_eps, act_layer=cfg.act_layer, drop_path=drop_path,
                                 padding=cfg.padding, shortcut=cfg.shortcut, expand_output=cfg.expand_output,
                                 bias=cfg.conv_bias)
        block = partial(Block, out_chs, out_chs // cfg.dim_head, style="pre", mlp_ratio=cfg.mlp_ratio,
                        drop=cfg.proj_drop_rate, attn_drop=cfg.attn_drop_rate, drop_path=drop_path,
                        init_values=cfg.init_values,
                        norm_layer=partial(nn.LayerNorm, eps=cfg.norm_eps),
                        act_layer=partial(_act, cfg.mlp_act_layer or cfg.act_layer))
        kw = dict(allow_padding=cfg.allow_padding, rel_pos=cfg.rel_pos, rel_pos_dim=cfg.rel_pos_dim)
        self.attn_block = block(attn_layer=cfg.block_attn_layer, depth_index=2 * depth_index, attn_kwargs={
            **accepted_kwargs(cfg.block_attn_layer, dict(window_size=window, **kw)), **cfg.block_attn_kwargs})
        self.attn_grid = block(attn_layer=cfg.grid_attn_layer, depth_index=2 * depth_index + 1, attn_kwargs={
            **accepted_kwargs(cfg.grid_attn_layer, dict(window_size=grid, **kw)), **cfg.grid_attn_kwargs})

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C_in, H, W] -> [B, C, H', W']``."""
        y = self.conv(x).permute(0, 2, 3, 1)  # [B, H', W', C]
        y = self.attn_grid(self.attn_block(y))
        return y.permute(0, 3, 1, 2)  # [B, C, H', W']


class MaxViTStage(nn.Module):
    """A stage: ``blocks`` (block 0 strided), recomputed in backward with ``grad_checkpointing`` (training)."""

    def __init__(self, blocks: Sequence[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.grad_checkpointing = False

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C_in, H, W] -> [B, C, H/2, W/2]``."""
        for blk in self.blocks:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return x


class MaxViTHead(nn.Module):
    """timm's ``NormMlpClassifierHead`` on pooled features: LayerNorm -> (Linear + tanh) -> dropout -> fc,
    ``[B, C] -> [B, num_classes]`` (a channels-last map per position with ``global_pool=""``); without ``norm`` and
    ``hidden_size`` timm's ``ClassifierHead`` (dropout -> fc). Keys: ``norm``, ``pre_logits.fc``, ``fc``."""

    def __init__(self, in_features: int, num_classes: int, *, hidden_size: int = 0, drop: float = 0.0,
                 eps: float = 1e-5, bias: bool = True, norm: bool = True) -> None:
        super().__init__()
        self.global_pool = ""  # the model pools (Backbone.pool)
        self.norm = nn.LayerNorm(in_features, eps=eps) if norm else nn.Identity()
        self.pre_logits = nn.Sequential()
        if hidden_size:
            self.pre_logits.add_module("fc", nn.Linear(in_features, hidden_size))
            self.pre_logits.add_module("act", nn.Tanh())
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(hidden_size or in_features, num_classes, bias=bias) if num_classes > 0 else nn.Identity()

    def forward(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """``[..., C] -> [..., num_classes]`` (the ``[..., hidden]`` features with ``pre_logits``)."""
        x = self.drop(self.pre_logits(self.norm(x)))
        return x if pre_logits else self.fc(x)


class MaxViT(ConvStagesMixin, StagedBackbone):
    """MaxViT backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last stage's map ``[B, C_3, H/32, W/32]`` (NCHW; normalised by ``norm`` with
    ``head_norm="map"``, else the head normalises), ``forward_intermediates`` each stage's map (strides 4 ... 32),
    ``forward_head`` pools and classifies.
    """

    family = "maxvit"
    config_cls = MaxViTConfig
    no_weight_decay_keys = ("relative_position_bias_table",)

    def __init__(self, cfg: MaxViTConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        dims = list(cfg.embed_dims)
        self.global_pool = cfg.global_pool
        self.num_features = dims[-1]
        window, grid = cfg.partitions()
        self.stem = MaxViTStem(cfg.in_chans, cfg.stem_width, bias=cfg.stem_bias, eps=cfg.bn_eps,
                               act_layer=cfg.act_layer, padding=cfg.padding)
        total = sum(cfg.depths)
        rates = [cfg.drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        stem_out = cfg.stem_width if isinstance(cfg.stem_width, int) else cfg.stem_width[-1]
        stages, prev, k = [], stem_out, 0
        for dim, depth in zip(dims, cfg.depths):
            blocks = []
            for j in range(depth):
                blocks.append(MaxViTBlock(cfg, prev, dim, stride=2 if j == 0 else 1, drop_path=rates[k],
                                          window=window, grid=grid, depth_index=k))
                prev, k = dim, k + 1
            stages.append(MaxViTStage(blocks))
        self.stages = nn.Sequential(*stages)
        self.norm = LayerNorm2d(dims[-1], eps=cfg.norm_eps) if cfg.head_norm == "map" else nn.Identity()
        self.feature_info = [dict(num_chs=d, reduction=2 ** (i + 2), module=f"stages.{i}") for i, d in enumerate(dims)]
        self.head = MaxViTHead(self.num_features, cfg.num_classes, hidden_size=cfg.head_hidden_size,
                               drop=cfg.drop_rate, eps=cfg.norm_eps, bias=cfg.head_bias,
                               norm=cfg.head_norm == "pooled")
        self._init_weights()

    @property
    def final_conv(self) -> nn.Module:
        """The layer after the last stage (``ConvStagesMixin``'s slot): the map's LayerNorm ``norm`` (``head_norm=
        "map"``) or the identity."""
        return self.norm

    @final_conv.setter
    def final_conv(self, module: nn.Module) -> None:
        self.norm = module

    def _init_weights(self) -> None:
        init_linear_weights(self)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for m in self.modules():  # the tables keep their own init (normal, std 0.02)
            if isinstance(m, AttentionModule) and hasattr(m, "relative_position_bias_table"):
                nn.init.normal_(m.relative_position_bias_table, std=0.02)

    def _check_img_size(self, img_size: tuple[int, int]) -> None:
        """MaxViT's rule for another input: every stage's map a multiple of the partitions that ``img_size`` gives
        (:func:`check_partitions`)."""
        check_partitions(self.cfg, img_size)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Another input size in place (timm's ``set_input_size``): the partition sides follow the rule
        (``img_size // partition_ratio`` unless ``window_size`` / ``grid_size`` are set) and every block / grid table
        is resampled to them like timm (:meth:`~vit_attention.attention.multi_axis.MultiAxisAttention.set_window_size`).
        A size the rule refuses raises ``ValueError`` naming ``img_size`` before anything changes."""
        super().set_input_size(img_size)  # checks (check_partitions) and records cfg.img_size
        window, grid = self.cfg.partitions()
        for stage in self.stages:
            for blk in stage.blocks:
                for attn, side in ((blk.attn_block.attn, window), (blk.attn_grid.attn, grid)):
                    if isinstance(attn, AttentionModule) and attn.provides("set_window_size"):
                        attn.set_window_size(side)

    # API: forward_features / forward_head / forward_intermediates from ConvStagesMixin (levels: the four stages);
    # forward, reset_classifier, pooling, set_grad_checkpointing and no_weight_decay from Backbone.


# ---------------------------------------------------------------------------- presets (data)
_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(embed_dims=(64, 128, 256, 512), depths=(2, 2, 5, 2), stem_width=64, head_hidden_size=512),
    "small": dict(embed_dims=(96, 192, 384, 768), depths=(2, 2, 5, 2), stem_width=64, head_hidden_size=768),
    "base": dict(embed_dims=(96, 192, 384, 768), depths=(2, 6, 14, 2), stem_width=64, head_hidden_size=768),
    "large": dict(embed_dims=(128, 256, 512, 1024), depths=(2, 6, 14, 2), stem_width=128, head_hidden_size=1024),
    "xlarge": dict(embed_dims=(192, 384, 768, 1536), depths=(2, 6, 14, 2), stem_width=192, head_hidden_size=1536),
}
_PRESETS: dict[str, dict[str, Any]] = {
    f"maxvit_{size}_tf_{res}": dict(cfg, img_size=res) for size, cfg in _SIZES.items() for res in (224, 384, 512)}
_PRESETS["maxvit_xlarge_tf_224"]["num_classes"] = 21843  # its only weights: ImageNet-21k (timm builds that head)
# timm's own MaxViT configs (maxxvit.py _rw_max_cfg, trained before the TF release): SiLU in the stem and MBConv,
# exact GELU in the MLP, BN eps 1e-5 / LN eps 1e-6, symmetric padding, MBConv width 4·C_in with SE at 1/16 of it
# and no output / shortcut conv bias, a two-width stem without biases, LayerNorm on the map then pool + fc; their
# Swin-layout tables and per-head qkv rows load through the timm converter
_RW = dict(act_layer="silu", mlp_act_layer="gelu", bn_eps=1e-5, norm_eps=1e-6, padding="symmetric",
           expand_output=False, se_ratio=1 / 16, conv_bias=False, stem_bias=False, head_hidden_size=0, head_norm="map")
_PRESETS.update({
    "maxvit_pico_rw_256": dict(_RW, embed_dims=(32, 64, 128, 256), depths=(2, 2, 5, 2), stem_width=(24, 32),
                               img_size=256),
    "maxvit_nano_rw_256": dict(_RW, embed_dims=(64, 128, 256, 512), depths=(1, 2, 3, 1), stem_width=(32, 64),
                               img_size=256),
    "maxvit_tiny_rw_224": dict(_RW, embed_dims=(64, 128, 256, 512), depths=(2, 2, 5, 2), stem_width=(32, 64),
                               img_size=224),
    "maxvit_tiny_rw_256": dict(_RW, embed_dims=(64, 128, 256, 512), depths=(2, 2, 5, 2), stem_width=(32, 64),
                               img_size=256),
})
# the rmlp presets: the rw settings with the relative-position MLP (rmlp_small: LayerScale 1e-6; rmlp_base: the
# NormMlp head, LayerNorm after pooling and a 768-wide tanh layer)
_RMLP = dict(_RW, rel_pos="mlp")
_PRESETS.update({
    "maxvit_rmlp_pico_rw_256": dict(_RMLP, embed_dims=(32, 64, 128, 256), depths=(2, 2, 5, 2), stem_width=(24, 32),
                                    img_size=256),
    "maxvit_rmlp_nano_rw_256": dict(_RMLP, embed_dims=(64, 128, 256, 512), depths=(1, 2, 3, 1), stem_width=(32, 64),
                                    img_size=256),
    "maxvit_rmlp_tiny_rw_256": dict(_RMLP, embed_dims=(64, 128, 256, 512), depths=(2, 2, 5, 2), stem_width=(32, 64),
                                    img_size=256),
    **{f"maxvit_rmlp_small_rw_{r}": dict(_RMLP, embed_dims=(96, 192, 384, 768), depths=(2, 2, 5, 2),
                                         stem_width=(32, 64), init_values=1e-6, img_size=r) for r in (224, 256)},
    **{f"maxvit_rmlp_base_rw_{r}": dict(_RMLP, embed_dims=(96, 192, 384, 768), depths=(2, 6, 14, 2),
                                        stem_width=(32, 64), head_hidden_size=768, head_norm="pooled", img_size=r)
       for r in (224, 384)},
})
# torchvision 0.29's maxvit_t (torchvision/models/maxvit.py): the tiny sizes with symmetric padding, exact GELU, the
# 3x3-pooled shortcut with its conv at every stride, no stem conv1 bias and no classifier bias (its weights load
# through vit_attention.weights.maxvit's torchvision converter)
_PRESETS["maxvit_t"] = dict(_SIZES["tiny"], img_size=224, act_layer="gelu", padding="symmetric", shortcut="avg3_conv",
                            stem_bias=(False, True), head_bias=False)

# timm 1.0.31: param_count on the meta device (the default tag's head), infer_gmacs from
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv.
_PUBLISHED: dict[str, tuple[float, float]] = {
    "maxvit_tiny_tf_224": (30.917, 5.60), "maxvit_tiny_tf_384": (30.977, 17.53),
    "maxvit_tiny_tf_512": (31.050, 33.49),
    "maxvit_small_tf_224": (68.928, 11.66), "maxvit_small_tf_384": (69.019, 35.87),
    "maxvit_small_tf_512": (69.128, 67.26),
    "maxvit_base_tf_224": (119.468, 24.04), "maxvit_base_tf_384": (119.653, 73.80),
    "maxvit_base_tf_512": (119.876, 138.02),
    "maxvit_large_tf_224": (211.786, 43.68), "maxvit_large_tf_384": (212.033, 132.55),
    "maxvit_large_tf_512": (212.330, 244.75),
    "maxvit_xlarge_tf_224": (506.988, 97.52), "maxvit_xlarge_tf_384": (475.323, 292.78),
    "maxvit_xlarge_tf_512": (475.769, 534.14),
    "maxvit_pico_rw_256": (7.458, 1.83), "maxvit_nano_rw_256": (15.451, 4.46), "maxvit_tiny_rw_224": (29.057, 5.11),
    "maxvit_tiny_rw_256": (29.067, 6.74),
    "maxvit_rmlp_pico_rw_256": (7.516, 1.85), "maxvit_rmlp_nano_rw_256": (15.501, 4.47),
    "maxvit_rmlp_tiny_rw_256": (29.149, 6.77), "maxvit_rmlp_small_rw_224": (64.895, 10.75),
    "maxvit_rmlp_small_rw_256": (64.895, 14.15), "maxvit_rmlp_base_rw_224": (116.136, 23.15),
    "maxvit_rmlp_base_rw_384": (116.136, 70.97),
}
_META = published_meta(_PUBLISHED, "timm results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs)",
                       meta_device=_PUBLISHED)
_META["maxvit_t"] = dict(published_params_m=30.920, published_gmacs=5.558,
                        published_gmacs_source="torchvision 0.29 MaxVit_T_Weights.IMAGENET1K_V1 meta (_ops)")


def reduced_config(cfg: MaxViTConfig) -> dict[str, Any]:
    """Overrides that shrink a MaxViT preset for tests: two stages of 16 / 32 channels (``hd = 8``: 2 and 4 heads),
    one and two blocks, stem 16 (stage 0's first block keeps its width: the pooled shortcut without a conv; stage
    1's changes it; a two-width stem stays two widths, 8 and 16), partitions 4 on 64 px (16x16 and 8x8 maps: several
    windows and grid groups, then one of each). The activation, norms, head form (a hidden layer or none) and
    mechanisms are the preset's."""
    return dict(embed_dims=(16, 32), depths=(1, 2), stem_width=16 if isinstance(cfg.stem_width, int) else (8, 16),
                dim_head=8, head_hidden_size=32 if cfg.head_hidden_size else 0, img_size=64, window_size=4,
                grid_size=4)


register_family("maxvit", MaxViT, MaxViTConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
# The TF 224 px in1k weights use ImageNet's mean / std, the others 0.5 / 0.5.
_224_IMAGENET = data_cfg(224, 0.95)
_224_INCEPTION_C95 = data_cfg(224, 0.95, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_224_INCEPTION_C90 = data_cfg(224, 0.9, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_256 = data_cfg(256, 0.95, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_384 = data_cfg(384, 1.0, mean=INCEPTION_MEAN, std=INCEPTION_STD, crop_mode="squash")
_512 = data_cfg(512, 1.0, mean=INCEPTION_MEAN, std=INCEPTION_STD, crop_mode="squash")
PRETRAINED = pretrained_tags({
    "maxvit_base_tf_224.in1k": _224_IMAGENET,
    "maxvit_base_tf_224.in21k": dict(_224_INCEPTION_C95, num_classes=21843),
    "maxvit_base_tf_384.in1k": _384,
    "maxvit_base_tf_384.in21k_ft_in1k": _384,
    "maxvit_base_tf_512.in1k": _512,
    "maxvit_base_tf_512.in21k_ft_in1k": _512,
    "maxvit_large_tf_224.in1k": _224_IMAGENET,
    "maxvit_large_tf_224.in21k": dict(_224_INCEPTION_C95, num_classes=21843),
    "maxvit_large_tf_384.in1k": _384,
    "maxvit_large_tf_384.in21k_ft_in1k": _384,
    "maxvit_large_tf_512.in1k": _512,
    "maxvit_large_tf_512.in21k_ft_in1k": _512,
    "maxvit_nano_rw_256.sw_in1k": _256,
    "maxvit_pico_rw_256.untrained": dict(_256, hf_hub_id=None),
    "maxvit_rmlp_base_rw_224.sw_in12k_ft_in1k": _224_INCEPTION_C95,
    "maxvit_rmlp_base_rw_224.sw_in12k": dict(_224_INCEPTION_C95, num_classes=11821),
    "maxvit_rmlp_base_rw_384.sw_in12k_ft_in1k": _384,
    "maxvit_rmlp_nano_rw_256.sw_in1k": _256,
    "maxvit_rmlp_pico_rw_256.sw_in1k": _256,
    "maxvit_rmlp_small_rw_224.sw_in1k": _224_INCEPTION_C90,
    "maxvit_rmlp_small_rw_256.untrained": dict(_256, hf_hub_id=None),
    "maxvit_rmlp_tiny_rw_256.sw_in1k": _256,
    "maxvit_small_tf_224.in1k": _224_IMAGENET,
    "maxvit_small_tf_384.in1k": _384,
    "maxvit_small_tf_512.in1k": _512,
    "maxvit_tiny_rw_224.sw_in1k": _224_INCEPTION_C95,
    "maxvit_tiny_rw_256.untrained": dict(_256, hf_hub_id=None),
    "maxvit_tiny_tf_224.in1k": _224_IMAGENET,
    "maxvit_tiny_tf_384.in1k": _384,
    "maxvit_tiny_tf_512.in1k": _512,
    "maxvit_xlarge_tf_224.in21k": dict(_224_INCEPTION_C95, num_classes=21843),
    "maxvit_xlarge_tf_384.in21k_ft_in1k": _384,
    "maxvit_xlarge_tf_512.in21k_ft_in1k": _512,
}, license="apache-2.0")
