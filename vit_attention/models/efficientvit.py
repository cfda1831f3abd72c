"""EfficientViT-MIT (Cai et al., "EfficientViT: Lightweight Multi-Scale Attention for High-Resolution Dense
Prediction", ICCV 2023): a MobileNet-style CNN whose last stages add ReLU linear attention (``lite_mla``).

Config dataclass -> :class:`EfficientViT` -> presets registered as data (timm's names ``efficientvit_b0..b3``,
``efficientvit_l1..l3``). As timm 1.0.31 (``timm/models/efficientvit_mit.py``) and the original
(mit-han-lab/efficientvit ``models/efficientvit/backbone.py``, ``cls.py``):

* stem: a stride-2 3x3 conv-BN-act, then ``depths[0]`` residual local blocks (B: DSConv, depthwise 3x3 then
  1x1; L: ConvBlock, two 3x3 convs);
* stage ``i`` (4 of them, stride ``2^(i+2)``): a stride-2 local block without a shortcut, then residual blocks.
  B: stages 0-1 hold MBConvs (1x1 expand, depthwise 3x3, 1x1), stages 2-3 EfficientViT blocks. L: stages 0-1
  hold FusedMBConvs (3x3 expand, 1x1), stage 2 MBConvs, stage 3 EfficientViT blocks; its downsampling blocks
  expand 16x (24x into the attention stage);
* EfficientViT block: ``x + LiteMLA(x)`` (the context module, any registered mechanism: ``attn_layer``) then
  ``x + MBConv(x)`` (the local module). In the attention stages the MBConvs are "fewer-norm": the expand and
  depthwise convs have biases and no BatchNorm, only the last conv has one;
* head: a 1x1 conv-BN-act to ``head_widths[0]``, average pool, ``Linear`` (no bias) to ``head_widths[1]``,
  LayerNorm, act, dropout, the classifier.

B-series: Hardswish, every norm eps 1e-5, MBConv expansion 4. L-series: tanh-GELU, norm eps 1e-7 (the head's
BatchNorm keeps 1e-5, as timm builds it).

Layout: NCHW maps ``[B, C, H, W]`` through the convolutions (on the CPU held in channels-last memory from the
stem's first unit on: oneDNN's native layout, where a 1x1 conv unit is a GEMM on the channels with its hardswish
or the block's shortcut inside); each EfficientViT block hands its mechanism the
channels-last view ``[B, H, W, C]`` (a permute, no copy) and takes its output back the same way. State-dict
keys are timm's (``stem.in_conv``, ``stem.res{j}.main``, ``stages.{i}.blocks.{j}.main``, ``conv`` / ``norm`` in
every conv unit, ``head.in_conv``) except inside the EfficientViT blocks (``attn`` for timm's
``context_module.main``, whose 1x1 convolutions are ``Linear`` layers) and the head's classifier (``head.hidden``,
``head.norm``, ``head.fc`` for timm's ``head.classifier.{0,1,4}``); the timm converter
(:mod:`vit_attention.weights.efficientvit`) maps them.

No positional parameters and every convolution is padded: the model runs at any input size (the presets at
256 / 288 / 320 / 384 px are separately fine-tuned weights, not resized ones).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import AttentionCall, create_attention
from ..attention.base import VersionCache
from ..functional.batch_norm import can_fold_batch_norm
from ..functional.conv_act import channels_last_on_cpu, conv2d_act
from ..functional.linear import act_fresh, hookless, linear
from ..functional.runtime import capturing
from ..layers import accepted_kwargs
from ..layers.convnet import ConvStagesMixin
from ..layers.drop_path import DropPath
from ..layers.layout_adapter import apply_attention
from ..layers.stage import drop_path_schedule
from ._config import ConfigMixin, check_attn_layer, check_common, check_float, check_int, check_int_seq
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["EfficientViTConfig", "EfficientViT", "EfficientViTBlock", "reduced_config"]

_ACTS: dict[str, Callable[[], nn.Module]] = {"hardswish": nn.Hardswish, "gelu_tanh": lambda: nn.GELU("tanh")}


@dataclass
class EfficientViTConfig(ConfigMixin):
    """Everything an :class:`EfficientViT` is built from (JSON-serialisable).

    ``widths[0]`` / ``depths[0]``: the stem's width and residual blocks; ``widths[1:]`` / ``depths[1:]``: the
    four stages'. ``large``: the L-series layout (fused MBConvs in stages 0-1, attention in stage 3 only,
    16x / 24x downsampling expansion). ``head_dim``: the mechanism's head width (heads = width / head_dim).
    ``head_widths``: the head's 1x1 conv and hidden ``Linear`` widths. ``expand_ratio``: the B-series MBConv
    expansion (the L-series has its own: 16 / 24 downsampling, 4 in the stages, 6 in the EfficientViT blocks).
    ``act_layer``: ``"hardswish"`` (B) or
    ``"gelu_tanh"`` (L). ``norm_eps``: every BatchNorm's and the head LayerNorm's eps (the head's BatchNorm:
    ``head_bn_eps``). ``drop_path_rate``: stochastic depth on the stages' residual branches, rising linearly over
    their blocks (0 in timm and the original). ``attn_layer``: the EfficientViT blocks' mechanism (``lite_mla``;
    ``attn_scales``: its aggregation kernels; ``attn_eps``: its division's eps, timm 1.0.31's 1e-5, the original
    repository's 1e-15; both reach a mechanism only where it takes them).
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg"] = "avg"
    widths: tuple[int, ...] = (8, 16, 32, 64, 128)
    depths: tuple[int, ...] = (1, 2, 2, 2, 2)
    head_dim: int = 16
    head_widths: tuple[int, ...] = (1024, 1280)
    large: bool = False
    expand_ratio: float = 4.0
    act_layer: Literal["hardswish", "gelu_tanh"] = "hardswish"
    norm_eps: float = 1e-5
    head_bn_eps: float = 1e-5
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    attn_layer: str = "lite_mla"
    attn_scales: tuple[int, ...] = (5,)
    attn_eps: float = 1e-5
    attn_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self, pools=("avg",))
        check_int_seq(self.widths, "widths", length=5)
        check_int_seq(self.depths, "depths", length=5, min_value=1)
        check_int(self.head_dim, "head_dim")
        for i in self.attention_stages():
            if self.widths[i + 1] % self.head_dim:
                raise ValueError(f"widths[{i + 1}]={self.widths[i + 1]} (stage {i}, attention) is not divisible by "
                                 f"head_dim={self.head_dim}")
        check_int_seq(self.head_widths, "head_widths", length=2)
        if not isinstance(self.large, bool):
            raise TypeError(f"large must be a bool, got {self.large!r}")
        check_float(self.expand_ratio, "expand_ratio", low_open=True)
        if self.act_layer not in _ACTS:
            raise ValueError(f"act_layer must be one of {', '.join(map(repr, _ACTS))}; got {self.act_layer!r}")
        check_float(self.norm_eps, "norm_eps", low_open=True)
        check_float(self.head_bn_eps, "head_bn_eps", low_open=True)
        check_float(self.attn_eps, "attn_eps")
        if self.attn_scales:
            check_int_seq(self.attn_scales, "attn_scales")
        check_attn_layer(self.attn_layer, self.attn_kwargs, layout=None)

    def attention_stages(self) -> tuple[int, ...]:
        """The stages (0-3) made of EfficientViT blocks: B 2-3, L 3."""
        return (3,) if self.large else (2, 3)


class ConvNormAct(nn.Module):
    """``Conv2d`` (``k // 2`` padding, optional bias) -> optional ``BatchNorm2d`` -> optional act (timm's
    EfficientViT ``ConvNormAct``, keys ``conv`` / ``norm``): ``[B, Cin, H, W] -> [B, Cout, H / stride, W / stride]``.

    At inference (eval mode, no hooks) the BatchNorm runs folded into the convolution, its folded weight and bias
    kept while the tensors are unchanged (:class:`~vit_attention.attention.base.VersionCache`), and a hardswish
    overwrites the convolution's fresh output in place: one map-sized buffer fewer to allocate (and fault in)
    per layer, the same numbers. ``channels_last`` (the stem's first unit): on the CPU the input enters in
    channels-last memory (:func:`~vit_attention.functional.conv_act.channels_last_on_cpu`), so every convolution of
    the network runs on oneDNN's native NHWC layout, each keeping its input's (measured: EfficientViT-B0 1.6x
    faster on one thread); shapes and values are unchanged.
    """

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 1, *, stride: int = 1, groups: int = 1,
                 bias: bool = False, norm: bool = True, act: Callable[[], nn.Module] | None = None,
                 eps: float = 1e-5, channels_last: bool = False) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride=stride, padding=kernel_size // 2, groups=groups,
                              bias=bias)
        self.norm = nn.BatchNorm2d(out_chs, eps=eps) if norm else nn.Identity()
        self.act = act() if act is not None else nn.Identity()
        self._folded = VersionCache()

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``residual + act(norm(conv(x)))``: ``[B, Cin, H, W] -> [B, Cout, H', W']`` (``residual``: None or
        ``[B, Cout, H', W']``, added last)."""
        conv, norm, act = self.conv, self.norm, self.act
        if self.channels_last:
            x = channels_last_on_cpu(x)
        wb = self._weights() if hookless(conv, norm, act) and not capturing() else None
        if wb is None:  # the modules as they are (hooks see each output; training statistics)
            y = act(norm(conv(x)))
            return y if residual is None else residual + y
        weight, bias = wb
        plain = isinstance(act, nn.Identity)
        fused = "hardswish" if type(act) is nn.Hardswish else None  # into the kernel (oneDNN post-op) where it can
        if (conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.groups == 1 and x.device.type == "cpu"
                and x.permute(0, 2, 3, 1).is_contiguous()):  # channels-last memory: a GEMM on the channels
            res = residual.permute(0, 2, 3, 1) if residual is not None and plain else None
            y = linear(x.permute(0, 2, 3, 1), weight.flatten(1), bias, act=fused, residual=res).permute(0, 3, 1, 2)
            if res is not None or fused is not None:
                return y if res is not None or residual is None else residual + y
        elif fused is not None and conv.dilation == (1, 1) and len(set(conv.stride)) == 1 and len(
                set(conv.padding)) == 1:  # square stride and padding: the fused convolution's arguments
            y = conv2d_act(x, weight, bias, stride=conv.stride[0], padding=int(conv.padding[0]), groups=conv.groups,
                           act=fused)
            return y if residual is None else residual + y
        else:
            y = F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups)
        y = act_fresh(act, y)  # in place on this layer's own fresh output where that is safe
        return y if residual is None else residual + y

    def _weights(self) -> tuple[Tensor, Tensor | None] | None:
        """The convolution's ``(weight, bias)`` with an eval-mode BatchNorm folded in (kept while the tensors are
        unchanged), or None where the BatchNorm must run as a module (training, no running statistics) or the
        convolution pads otherwise than with zeros."""
        conv, norm = self.conv, self.norm
        if conv.padding_mode != "zeros":
            return None
        if not isinstance(norm, nn.BatchNorm2d):
            return (conv.weight, conv.bias) if isinstance(norm, nn.Identity) else None
        if not can_fold_batch_norm(conv, norm):
            return None
        return self._folded.fold(conv, norm)


class Residual(nn.Module):
    """``x + drop_path(main(x))`` (``shortcut``) or ``main(x)`` (a downsampling block): timm's ``ResidualBlock``,
    key ``main``."""

    def __init__(self, main: nn.Module, shortcut: bool = True, drop_path: float = 0.0) -> None:
        super().__init__()
        self.main = main
        self.shortcut = shortcut
        self.drop_path = DropPath(drop_path) if drop_path > 0 and shortcut else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, C', H', W']``. Without stochastic depth at work and without hooks on ``main`` or
        its last unit, the shortcut is added by that unit (into its 1x1 convolution's GEMM at CPU inference)."""
        main = self.main
        if self.shortcut and not (self.training and isinstance(self.drop_path, DropPath)) and isinstance(
                main, nn.Sequential) and len(main) and isinstance(main[-1], ConvNormAct) and hookless(main, main[-1]):
            out = x
            for unit in list(main)[:-1]:
                out = unit(out)
            return main[-1](out, residual=x)
        out = main(x)
        return x + self.drop_path(out) if self.shortcut else out


def _conv_seq(**convs: nn.Module) -> nn.Sequential:
    """Named conv units in order (timm's ``DSConv`` / ``ConvBlock`` / ``MBConv`` / ``FusedMBConv`` keys)."""
    seq = nn.Sequential()
    for name, m in convs.items():
        seq.add_module(name, m)
    return seq


def local_block(in_chs: int, out_chs: int, *, stride: int, expand_ratio: float, act: Callable[[], nn.Module],
                eps: float, fewer_norm: bool = False, kind: Literal["default", "large", "fused"] = "default"
                ) -> nn.Sequential:
    """timm's ``build_local_block``: ``[B, Cin, H, W] -> [B, Cout, H / stride, W / stride]``.

    Expansion 1: DSConv (``depth_conv`` dw 3x3 + act, ``point_conv`` 1x1) or, ``kind`` large / fused, ConvBlock
    (``conv1`` 3x3 + act, ``conv2`` 3x3). Otherwise MBConv (``inverted_conv`` 1x1 + act, ``depth_conv`` dw 3x3 +
    act, ``point_conv`` 1x1) or, ``kind="fused"``, FusedMBConv (``spatial_conv`` 3x3 + act, ``point_conv`` 1x1),
    hidden width ``round(Cin · expand_ratio)``. ``fewer_norm``: every conv but the last has a bias and no norm.
    """
    def unit(i: int, o: int, k: int, *, s: int = 1, g: int = 1, last: bool = False) -> ConvNormAct:
        norm = last or not fewer_norm
        return ConvNormAct(i, o, k, stride=s, groups=g, bias=not norm, norm=norm, act=None if last else act, eps=eps)

    if expand_ratio == 1:
        if kind == "default":
            return _conv_seq(depth_conv=unit(in_chs, in_chs, 3, s=stride, g=in_chs),
                             point_conv=unit(in_chs, out_chs, 1, last=True))
        return _conv_seq(conv1=unit(in_chs, in_chs, 3, s=stride), conv2=unit(in_chs, out_chs, 3, last=True))
    mid = round(in_chs * expand_ratio)
    if kind == "fused":
        return _conv_seq(spatial_conv=unit(in_chs, mid, 3, s=stride), point_conv=unit(mid, out_chs, 1, last=True))
    return _conv_seq(inverted_conv=unit(in_chs, mid, 1), depth_conv=unit(mid, mid, 3, s=stride, g=mid),
                     point_conv=unit(mid, out_chs, 1, last=True))


class EfficientViTBlock(nn.Module):
    """``x + attn(x)`` then ``x + MBConv(x)`` (fewer-norm), ``[B, C, H, W] -> [B, C, H, W]``.

    ``attn``: the context module, any registered mechanism (``lite_mla`` by default), run on the channels-last
    view ``[B, H, W, C]`` through the layout adapter with the residual fused where it takes one.
    ``local_module``: timm's ``local_module`` (key ``local_module.main``).
    """

    def __init__(self, cfg: EfficientViTConfig, dim: int, expand_ratio: float, depth_index: int = 0,
                 drop_path: float = 0.0) -> None:
        super().__init__()
        act, eps = _ACTS[cfg.act_layer], cfg.norm_eps
        own = accepted_kwargs(cfg.attn_layer, dict(scales=cfg.attn_scales, bn_eps=eps, eps=cfg.attn_eps,
                                                   depth_index=depth_index))
        self.attn = create_attention(cfg.attn_layer, dim, dim // cfg.head_dim, **{**own, **cfg.attn_kwargs})
        self.local_module = Residual(local_block(dim, dim, stride=1, expand_ratio=expand_ratio, act=act, eps=eps,
                                                 fewer_norm=True), drop_path=drop_path)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, C, H, W]``."""
        t = x.permute(0, 2, 3, 1)  # [B, H, W, C] view
        call = AttentionCall(feat_size=(t.shape[1], t.shape[2]))
        if isinstance(self.drop_path, DropPath) and self.training:
            t = t + self.drop_path(apply_attention(self.attn, t, call))
        else:  # the residual add fused into the mechanism's output projection where it takes one
            t = apply_attention(self.attn, t, dataclasses.replace(call, residual=t))
        return self.local_module(t.permute(0, 3, 1, 2))  # [B, C, H, W]


class EfficientViTHead(nn.Module):
    """timm's EfficientViT ``ClassifierHead``: ``[B, C, H, W] -> [B, num_classes]``.

    ``in_conv`` (1x1 conv-BN-act to ``widths[0]``), average pool, ``hidden`` (``Linear``, no bias, to
    ``widths[1]``), ``norm`` (LayerNorm), act, dropout (``pre_logits`` stops here), ``fc``.
    """

    def __init__(self, in_chs: int, widths: tuple[int, ...], num_classes: int, *, act: Callable[[], nn.Module],
                 drop: float = 0.0, norm_eps: float = 1e-5, bn_eps: float = 1e-5) -> None:
        super().__init__()
        self.in_conv = ConvNormAct(in_chs, widths[0], 1, act=act, eps=bn_eps)
        self.hidden = nn.Linear(widths[0], widths[1], bias=False)
        self.norm = nn.LayerNorm(widths[1], eps=norm_eps)
        self.act = act()
        self.drop = nn.Dropout(drop)
        self.fc: nn.Module = nn.Linear(widths[1], num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """``[B, C, H, W] -> [B, num_classes]`` (``[B, widths[1]]`` with ``pre_logits``)."""
        x = self.in_conv(x).mean(dim=(2, 3))  # [B, widths[0]]
        x = self.drop(self.act(self.norm(self.hidden(x))))  # [B, widths[1]]
        return x if pre_logits else self.fc(x)


class EfficientViT(ConvStagesMixin, StagedBackbone):
    """EfficientViT-MIT B / L backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last stage's map ``[B, widths[4], H/32, W/32]`` (NCHW),
    ``forward_intermediates`` the maps of the four stages (strides 4 ... 32, ``feature_info``),
    ``forward_head`` the head (its 1x1 conv, pooling, hidden layer and classifier); ``num_features`` is the
    width the classifier reads, ``head_widths[1]`` (the pre-logits, timm's ``head_hidden_size``).
    ``set_grad_checkpointing`` recomputes each stage's activations in backward (training only).
    """

    family = "efficientvit"
    config_cls = EfficientViTConfig
    no_weight_decay_keys = ()  # no position embeddings
    pools: ClassVar[tuple[str, ...]] = ("avg",)  # the head pools (timm: 'Cannot disable pooling')
    token_merging_note: ClassVar[str] = (
        "its attention runs inside convolution stages whose depthwise and aggregation convolutions need every "
        "pixel of the map; merged tokens have no place on it")

    def __init__(self, cfg: EfficientViTConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        act, eps = _ACTS[cfg.act_layer], cfg.norm_eps
        self.global_pool = cfg.global_pool
        w0 = cfg.widths[0]
        stem = nn.Sequential()
        stem.add_module("in_conv", ConvNormAct(cfg.in_chans, w0, 3, stride=2, act=act, eps=eps, channels_last=True))
        for j in range(cfg.depths[0]):
            stem.add_module(f"res{j}", Residual(local_block(w0, w0, stride=1, expand_ratio=1, act=act, eps=eps,
                                                            kind="large" if cfg.large else "default")))
        self.stem = stem
        attention = cfg.attention_stages()
        counts = [d if (i in attention or cfg.large) else d - 1 for i, d in enumerate(cfg.depths[1:])]
        rates = drop_path_schedule(cfg.drop_path_rate, counts)
        stages, prev, index = [], w0, 0
        for i, (w, d) in enumerate(zip(cfg.widths[1:], cfg.depths[1:])):
            vit = i in attention
            if cfg.large:
                fewer = i >= 2
                kind: Literal["default", "fused"] = "default" if fewer else "fused"
                down = local_block(prev, w, stride=2, expand_ratio=24 if vit else 16, act=act, eps=eps,
                                   fewer_norm=fewer or vit, kind=kind)
                inner_expand, count = (6.0 if vit else 4.0), d
            else:
                fewer, kind = vit, "default"
                down = local_block(prev, w, stride=2, expand_ratio=cfg.expand_ratio, act=act, eps=eps,
                                   fewer_norm=vit)
                inner_expand, count = cfg.expand_ratio, (d if vit else d - 1)
            blocks: list[nn.Module] = [Residual(down, shortcut=False)]
            for j in range(count):
                if vit:
                    blocks.append(EfficientViTBlock(cfg, w, inner_expand, depth_index=index, drop_path=rates[i][j]))
                    index += 1
                else:
                    blocks.append(Residual(local_block(w, w, stride=1, expand_ratio=inner_expand, act=act, eps=eps,
                                                       fewer_norm=fewer, kind=kind), drop_path=rates[i][j]))
            stages.append(_Stage(blocks))
            prev = w
        self.stages = nn.Sequential(*stages)
        self.final_conv = nn.Identity()
        self.num_features = cfg.head_widths[1]  # what the classifier reads (pre-logits), after the head's hidden layer
        self.feature_info = [dict(num_chs=c, reduction=2 ** (i + 2), module=f"stages.{i}")
                             for i, c in enumerate(cfg.widths[1:])]
        self.head = EfficientViTHead(prev, tuple(cfg.head_widths), cfg.num_classes, act=act, drop=cfg.drop_rate,
                                     norm_eps=eps, bn_eps=cfg.head_bn_eps)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Map ``[B, C, H', W']`` -> logits ``[B, num_classes]`` (``[B, head_widths[1]]`` with ``pre_logits``;
        after the head is pruned, the pooled ``[B, C]``)."""
        if isinstance(self.head, EfficientViTHead):
            return self.head(x, pre_logits=pre_logits)
        return x.mean(dim=(2, 3))

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh classifier ``Linear(head_widths[1], num_classes)`` (0 = none) after the head's hidden layer;
        ``global_pool``: ``"avg"`` or None (the head always pools, as timm)."""
        check_int(num_classes, "num_classes", min_value=0)
        if global_pool not in (None, "avg"):
            raise ValueError(f"global_pool must be one of 'avg' (the head always pools); got {global_pool!r}")
        self.num_classes = self.cfg.num_classes = num_classes
        head = self.head
        if isinstance(head, EfficientViTHead):
            device = head.hidden.weight.device
            head.fc = nn.Linear(head.hidden.out_features, num_classes, device=device) if num_classes else nn.Identity()

    def _prune_head(self) -> None:
        """No classifier and no head layers (``forward_head`` then pools the last kept stage's map, whose width
        ``num_features`` becomes): timm's ``reset_other``."""
        self.reset_classifier(0)
        self.head = nn.Identity()
        self.num_features = int(self.cfg.widths[len(self.stages)])  # stage i has widths[i + 1]

    def get_classifier(self) -> nn.Module:
        """The classifier ``Linear`` (``head.fc``)."""
        return self.head.fc if isinstance(self.head, EfficientViTHead) else nn.Identity()


class _Stage(nn.Module):
    """One stage: its downsampling block then its residual blocks, as ``blocks`` (timm's ``stages.{i}.blocks.{j}``);
    ``[B, Cin, H, W] -> [B, C, H / 2, W / 2]``, each block recomputed in backward when checkpointing."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.grad_checkpointing = False

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, C, H', W']``."""
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            for blk in self.blocks:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            return x
        return self.blocks(x)


# ---------------------------------------------------------------------------- presets (data)
def _b(widths: tuple[int, ...], depths: tuple[int, ...], head_dim: int, head: tuple[int, int]) -> dict[str, Any]:
    return dict(widths=widths, depths=depths, head_dim=head_dim, head_widths=head)


def _l(widths: tuple[int, ...], depths: tuple[int, ...], head: tuple[int, int]) -> dict[str, Any]:
    return dict(widths=widths, depths=depths, head_dim=32, head_widths=head, large=True, act_layer="gelu_tanh",
                norm_eps=1e-7)


_PRESETS: dict[str, dict[str, Any]] = {
    "efficientvit_b0": _b((8, 16, 32, 64, 128), (1, 2, 2, 2, 2), 16, (1024, 1280)),
    "efficientvit_b1": _b((16, 32, 64, 128, 256), (1, 2, 3, 3, 4), 16, (1536, 1600)),
    "efficientvit_b2": _b((24, 48, 96, 192, 384), (1, 3, 4, 4, 6), 32, (2304, 2560)),
    "efficientvit_b3": _b((32, 64, 128, 256, 512), (1, 4, 6, 6, 9), 32, (2304, 2560)),
    "efficientvit_l1": _l((32, 64, 128, 256, 512), (1, 1, 1, 6, 6), (3072, 3200)),
    "efficientvit_l2": _l((32, 64, 128, 256, 512), (1, 2, 2, 8, 8), (3072, 3200)),
    "efficientvit_l3": _l((64, 128, 256, 512, 1024), (1, 2, 2, 8, 8), (6144, 6400)),
}

# Published sizes at 224 px: parameters counted by timm 1.0.31 on the meta device (its benchmark table rounds them
# to 3.41 / 9.10 / ...), GMACs from timm's benchmark-infer-amp-nchw-pt291-cu128-4090 (infer_gmacs). Ours, by
# vit_attention.analysis.flops (BatchNorm at fvcore's 5 per element, unfolded): 0.110 / 0.541 / 1.629 / 4.032 /
# 5.290 / 6.990 / 27.666; counting convolutions and matrix products only: 0.100 / 0.519 / 1.585 / 3.954 / 5.258 /
# 6.950 / 27.587 (the benchmark's own counter folds or leaves out what ours counts differently).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "efficientvit_b0": (3.410, 0.10), "efficientvit_b1": (9.102, 0.53), "efficientvit_b2": (24.331, 1.60),
    "efficientvit_b3": (48.646, 3.99), "efficientvit_l1": (52.654, 5.27), "efficientvit_l2": (63.707, 6.97),
    "efficientvit_l3": (246.037, 27.62),
}
_META = published_meta(_PUBLISHED, "timm benchmark-infer-amp-nchw-pt291-cu128-4090 (infer_gmacs) at 224 px",
                       meta_device=_PUBLISHED)


def reduced_config(cfg: EfficientViTConfig) -> dict[str, Any]:
    """Overrides that shrink an EfficientViT preset for tests: widths 8 ... 32, head_dim 8, a small head, on a 64 px
    image; the stem keeps one residual block and every stage at least one block after its downsampling (B: stage 1
    two), so each block kind of the series (DSConv / ConvBlock, MBConv, FusedMBConv, fewer-norm, EfficientViT
    block) stays. The series (B / L: activation, eps, expansions) is kept. LiteMLA's ``attn_eps`` is 1e-2 (timm's 1e-5):
    a query whose ReLU features barely clear zero makes the ratio as ill-conditioned as the eps allows, and with
    1e-5 one reduced model's outputs moved by 1.7e-5 of their maximum between one and two threads; 1e-2 keeps every
    reduced model within 1e-6, so its saved outputs reproduce on any thread count and CPU."""
    return dict(widths=(8, 8, 16, 16, 32), depths=(1, 2, 2, 1, 1), head_dim=8, head_widths=(32, 48), img_size=64,
                attn_eps=1e-2)


register_family("efficientvit", EfficientViT, EfficientViTConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224_C100 = data_cfg(224, 1.0)
_224_C95 = data_cfg(224, 0.95)
_256 = data_cfg(256, 1.0)
_288 = data_cfg(288, 1.0)
_320 = data_cfg(320, 1.0)
_384 = data_cfg(384, 1.0)
PRETRAINED = pretrained_tags({
    "efficientvit_b0.r224_in1k": _224_C95,
    "efficientvit_b1.r224_in1k": _224_C95,
    "efficientvit_b1.r256_in1k": _256,
    "efficientvit_b1.r288_in1k": _288,
    "efficientvit_b2.r224_in1k": _224_C95,
    "efficientvit_b2.r256_in1k": _256,
    "efficientvit_b2.r288_in1k": _288,
    "efficientvit_b3.r224_in1k": _224_C95,
    "efficientvit_b3.r256_in1k": _256,
    "efficientvit_b3.r288_in1k": _288,
    "efficientvit_l1.r224_in1k": _224_C100,
    "efficientvit_l2.r224_in1k": _224_C100,
    "efficientvit_l2.r256_in1k": _256,
    "efficientvit_l2.r288_in1k": _288,
    "efficientvit_l2.r384_in1k": _384,
    "efficientvit_l3.r224_in1k": _224_C100,
    "efficientvit_l3.r256_in1k": _256,
    "efficientvit_l3.r320_in1k": _320,
    "efficientvit_l3.r384_in1k": _384,
}, license="apache-2.0")

