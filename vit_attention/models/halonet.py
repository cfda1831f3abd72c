"""HaloNet (Vaswani et al. 2021, "Scaling Local Self-Attention for Parameter Efficient Visual Backbones")
as timm builds it: ResNet-style ByobNet backbones whose self-attention blocks hold the ``halo`` mechanism.

Config dataclass -> :class:`HaloNet` -> presets registered as data (timm's names: ``halonet_h1``,
``halonet26t``, ``sehalonet33ts``, ``halonet50ts``, ``haloregnetz_b``). A stem (``tiered``: three
3x3 convs, ``7x7`` or ``3x3``; with or without a 3x3 max pool), then stages of blocks, each block
one letter of the stage's pattern in ``block_types``:

* ``b``: bottleneck ``conv1_1x1 -> conv2_kxk (3x3, stride, groups) -> [SE] -> conv3_1x1`` + shortcut;
* ``a``: self-attention bottleneck ``conv1_1x1 -> self_attn -> post_attn (BN + act) -> conv3_1x1`` + shortcut,
  the mechanism strided itself (``halo``: strided queries) or followed by a 2x2 average pool.

Any registered mechanism can replace ``halo`` (``attn_layer``). Layout: NCHW maps ``[B, C, H, W]``
through the convolutions, channels-last ``[B, H, W, C]`` inside the mechanism. State-dict keys are
timm's ``ByobNet`` (``stem.conv1.conv`` / ``stem.conv``, ``stages.{i}.{j}.{shortcut, conv1_1x1,
conv2_kxk, attn.fc1, self_attn.{q, kv, pos_embed.height_rel, pos_embed.width_rel}, post_attn,
conv3_1x1}``, ``final_conv``, ``head.fc``): timm checkpoints load as they are.

``halo`` needs each attention map to be a multiple of its block size in timm (an assert); here
other sizes are zero-padded (see :class:`~vit_attention.attention.halo.HaloAttention`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import Tensor, nn

from ..attention import create_attention
from ..functional.linear import act_fresh
from ..functional.sizes import make_divisible
from ..layers import ClassifierHead, accepted_kwargs, resolve_indices
from ..layers.activation import get_act_layer
from ..layers.convnet import ConvStagesMixin
from ..layers.drop_path import DropPath
from ..layers.layout_adapter import apply_attention
from ..layers.mbconv import ConvNormAct
from ..layers.stage import drop_path_schedule
from ._config import ConfigMixin, check_attn_layer, check_choice, check_common, check_float, check_int, check_int_seq
from .backbone import StagedBackbone
from .pretrained_tags import INCEPTION_MEAN, INCEPTION_STD, data_cfg, pretrained_tags
from .registry import register_family

__all__ = ["HaloNetConfig", "HaloNet", "BottleneckBlock", "SelfAttnBlock", "SqueezeExcite", "reduced_config"]


@dataclass
class HaloNetConfig(ConfigMixin):
    """Everything a :class:`HaloNet` is built from (JSON-serialisable).

    Stage ``i`` has one block per letter of ``block_types[i]`` (``"b"`` bottleneck, ``"a"``
    self-attention), ``channels[i]`` out, the first block strided by ``strides[i]``, hidden width
    ``make_divisible(channels[i] · bottle_ratios[i])`` (of the input width with ``bottle_in``),
    3x3 convs in groups of ``group_sizes[i]`` channels (0 = one group), ``num_heads[i]`` heads.
    ``se_ratio > 0`` adds squeeze-excitation to the bottlenecks; ``downsample=""`` drops the
    projection shortcut where the shape changes (no residual there); ``linear_out`` drops the
    activation after the residual; ``num_features > 0`` adds a final 1x1 conv-BN-act.
    """

    img_size: int | tuple[int, int] = 256
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    stem_type: Literal["tiered", "7x7", "3x3"] = "tiered"
    stem_chs: int = 64
    stem_pool: bool = True
    block_types: tuple[str, ...] = ("bb", "bb", "ba", "aa")
    channels: tuple[int, ...] = (256, 512, 1024, 2048)
    strides: tuple[int, ...] = (1, 2, 2, 2)
    bottle_ratios: tuple[float, ...] = (0.25, 0.25, 0.25, 0.25)
    group_sizes: tuple[int, ...] = (0, 0, 0, 0)
    num_heads: tuple[int, ...] = (8, 8, 8, 8)
    act_layer: Literal["relu", "silu"] = "relu"
    se_ratio: float = 0.0
    downsample: Literal["conv1x1", ""] = "conv1x1"
    bottle_in: bool = False
    linear_out: bool = False
    num_features: int = 0
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    attn_layer: str = "halo"
    attn_kwargs: dict[str, Any] = field(default_factory=lambda: {"block_size": 8, "halo_size": 2})

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self)
        check_choice(self.stem_type, "stem_type", ("tiered", "7x7", "3x3"))
        check_int(self.stem_chs, "stem_chs")
        check_choice(self.stem_pool, "stem_pool", (True, False))
        if not isinstance(self.block_types, (tuple, list)) or not self.block_types or not all(
                isinstance(t, str) and t and set(t) <= {"a", "b"} for t in self.block_types):
            raise ValueError(f"block_types must be a non-empty sequence of non-empty strings of 'a' (self-attention) "
                             f"and 'b' (bottleneck), one per stage; got {self.block_types!r}")
        n = len(self.block_types)
        check_int_seq(self.channels, "channels", length=n)
        for s in check_int_seq(self.strides, "strides", length=n):
            check_choice(s, "strides", (1, 2))
        if not isinstance(self.bottle_ratios, (tuple, list)) or len(self.bottle_ratios) != n:
            raise ValueError(f"bottle_ratios must hold {n} positive floats, got {self.bottle_ratios!r}")
        for r in self.bottle_ratios:
            check_float(r, "bottle_ratios", low_open=True)
        check_int_seq(self.group_sizes, "group_sizes", length=n, min_value=0)
        check_int_seq(self.num_heads, "num_heads", length=n)
        check_choice(self.act_layer, "act_layer", ("relu", "silu"))
        check_float(self.se_ratio, "se_ratio", high=1.0)
        check_choice(self.downsample, "downsample", ("conv1x1", ""))
        check_choice(self.bottle_in, "bottle_in", (True, False))
        check_choice(self.linear_out, "linear_out", (True, False))
        check_int(self.num_features, "num_features", min_value=0)
        check_attn_layer(self.attn_layer, self.attn_kwargs)


class SqueezeExcite(nn.Module):
    """timm's ``SEModule``: ``x · sigmoid(fc2(relu(fc1(mean_HW x))))``, ``[B, C, H, W] -> [B, C, H, W]``.

    Hidden width ``make_divisible(C · rd_ratio, 8, round_limit=0)``; keys ``fc1``, ``fc2`` (1x1 convs).
    """

    def __init__(self, channels: int, rd_ratio: float = 1 / 16) -> None:
        super().__init__()
        rd = make_divisible(channels * rd_ratio, 8, round_limit=0.0)
        self.fc1 = nn.Conv2d(channels, rd, 1)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(rd, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W] -> [B, C, H, W]``."""
        return x * self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True)))).sigmoid()


def _shortcut(cfg: HaloNetConfig, in_chs: int, out_chs: int, stride: int) -> nn.Module | None:
    """timm's ``create_shortcut``: identity, a 1x1 strided conv-BN, or none (``downsample=""``)."""
    if in_chs == out_chs and stride == 1:
        return nn.Identity()
    if not cfg.downsample:
        return None
    return ConvNormAct(in_chs, out_chs, 1, stride=stride, act_layer=None)


class _ResidualBlock(nn.Module):
    """Shared tail of both block kinds: ``drop_path(x) + shortcut(input)``, then the activation."""

    shortcut: nn.Module | None
    drop_path: nn.Module
    act: nn.Module

    def _residual(self, x: Tensor, shortcut: Tensor) -> Tensor:
        x = self.drop_path(x)
        if self.shortcut is not None:
            x = x + self.shortcut(shortcut)
        return act_fresh(self.act, x)  # in place at inference: x is this block's own tensor


class BottleneckBlock(_ResidualBlock):
    """ResNet bottleneck ``1x1 -> 3x3 (stride, groups) -> [SE] -> 1x1`` + shortcut,
    ``[B, Cin, H, W] -> [B, Cout, H/s, W/s]``."""

    def __init__(self, cfg: HaloNetConfig, in_chs: int, out_chs: int, *, stride: int, bottle_ratio: float,
                 group_size: int, drop_path: float) -> None:
        super().__init__()
        act = get_act_layer(cfg.act_layer)
        mid = make_divisible((in_chs if cfg.bottle_in else out_chs) * bottle_ratio)
        groups = mid // group_size if group_size else 1
        self.shortcut = _shortcut(cfg, in_chs, out_chs, stride)
        self.conv1_1x1 = ConvNormAct(in_chs, mid, 1, act_layer=act)
        self.conv2_kxk = ConvNormAct(mid, mid, 3, stride=stride, groups=groups, act_layer=act)
        self.attn = SqueezeExcite(mid, cfg.se_ratio) if cfg.se_ratio else nn.Identity()
        self.conv3_1x1 = ConvNormAct(mid, out_chs, 1, act_layer=None)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.act = nn.Identity() if cfg.linear_out else act()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, Cout, H/s, W/s]``."""
        return self._residual(self.conv3_1x1(self.attn(self.conv2_kxk(self.conv1_1x1(x)))), x)


class SelfAttnBlock(_ResidualBlock):
    """Self-attention bottleneck ``1x1 -> mechanism (stride) -> BN + act -> 1x1`` + shortcut,
    ``[B, Cin, H, W] -> [B, Cout, H/s, W/s]``.

    The mechanism runs on the channels-last map; ``halo`` strides its queries itself (timm), any other
    mechanism is followed by a 2x2 average pool when ``stride = 2``. ``depth_index``: the block's 0-based index
    among the model's self-attention blocks, handed to a mechanism that takes it (differential attention).
    """

    def __init__(self, cfg: HaloNetConfig, in_chs: int, out_chs: int, *, stride: int, bottle_ratio: float,
                 num_heads: int, drop_path: float, depth_index: int = 0) -> None:
        super().__init__()
        act = get_act_layer(cfg.act_layer)
        mid = make_divisible((in_chs if cfg.bottle_in else out_chs) * bottle_ratio)
        self.shortcut = _shortcut(cfg, in_chs, out_chs, stride)
        self.conv1_1x1 = ConvNormAct(in_chs, mid, 1, act_layer=act)
        offered = {"depth_index": depth_index, **cfg.attn_kwargs, "attn_drop": cfg.attn_drop_rate}
        if stride > 1:
            offered["stride"] = stride
        kwargs = accepted_kwargs(cfg.attn_layer, offered, neutral={"attn_drop": 0.0})
        self.self_attn = create_attention(cfg.attn_layer, mid, num_heads, **kwargs)
        self.pool = nn.AvgPool2d(2, 2) if stride > 1 and "stride" not in kwargs else nn.Identity()
        self.post_attn = nn.BatchNorm2d(mid)
        self.post_act = act()
        self.conv3_1x1 = ConvNormAct(mid, out_chs, 1, act_layer=None)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.act = nn.Identity() if cfg.linear_out else act()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, Cout, H/s, W/s]``."""
        y = self.conv1_1x1(x).permute(0, 2, 3, 1)  # [B, H, W, mid]
        y = apply_attention(self.self_attn, y).permute(0, 3, 1, 2).contiguous()  # [B, mid, H/s, W/s], NCHW memory
        y = act_fresh(self.post_act, self.post_attn(self.pool(y)))
        return self._residual(self.conv3_1x1(y), x)


class _Stem(nn.Module):
    """timm's ``Stem`` / stem conv: ``[B, Cin, H, W] -> [B, C, H/r, W/r]`` (``r`` = 4, or 2 for ``3x3`` without pool).

    ``tiered``: 3x3 convs to ``3C/8, C/2, C`` (stride 2, 1, 1, the last strided instead when there is no pool);
    ``7x7``: one 7x7 stride-2 conv; ``3x3`` without pool: one 3x3 stride-2 conv named ``conv`` (timm's
    ``ConvNormAct`` stem). Then an optional 3x3 stride-2 max pool.
    """

    def __init__(self, cfg: HaloNetConfig) -> None:
        super().__init__()
        act = get_act_layer(cfg.act_layer)
        c = cfg.stem_chs
        self.single = cfg.stem_type == "3x3" and not cfg.stem_pool
        if self.single:  # timm's stem is then a ConvNormAct itself: keys stem.conv, stem.bn
            cna = ConvNormAct(cfg.in_chans, c, 3, stride=2, act_layer=act)
            self.conv, self.bn, self.act = cna.conv, cna.bn, cna.act
            self.convs: list[str] = []
        else:
            if cfg.stem_type == "tiered":
                chs, k = (3 * c // 8, c // 2, c), 3
            else:
                chs, k = (c,), (7 if cfg.stem_type == "7x7" else 3)
            strides = [2] + [1] * (len(chs) - 1)
            if not cfg.stem_pool:
                strides[-1] = 2
            prev, self.convs = cfg.in_chans, []
            for i, (ch, s) in enumerate(zip(chs, strides)):
                self.add_module(f"conv{i + 1}", ConvNormAct(prev, ch, k, stride=s, act_layer=act))
                self.convs.append(f"conv{i + 1}")
                prev = ch
        self.pool = nn.MaxPool2d(3, 2, 1) if cfg.stem_pool else nn.Identity()
        # the stride-2 tap timm reports as its first feature: the map before the second stride
        if cfg.stem_pool:
            self.tap = self.convs[-1]
        elif len(self.convs) > 1:
            self.tap = self.convs[-2]
        else:
            self.tap = ""
        self.reduction = 2 if self.single else 4

    def forward_tap(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """``[B, Cin, H, W] -> ([B, C, H/r, W/r], the stride-2 map or None)``."""
        if self.single:
            return self.act(self.bn(self.conv(x))), None
        tap = None
        for name in self.convs:
            x = getattr(self, name)(x)
            if name == self.tap:
                tap = x
        return self.pool(x), tap

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, C, H/r, W/r]``."""
        return self.forward_tap(x)[0]


class HaloNet(ConvStagesMixin, StagedBackbone):
    """HaloNet / ByobNet backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last map ``[B, num_features, H/32, W/32]`` (NCHW, after
    ``final_conv``), ``forward_intermediates`` the maps of ``feature_info`` (timm's: the stride-2 stem
    map, then each stage's output before a stride, the last one after ``final_conv``).
    ``set_grad_checkpointing`` only sets the model's ``grad_checkpointing`` flag (CNN blocks: nothing
    is recomputed; kept for API compatibility).
    """

    family = "halonet"
    config_cls = HaloNetConfig
    no_weight_decay_keys = ("height_rel", "width_rel")  # the relative-position tables

    def __init__(self, cfg: HaloNetConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        self.global_pool = cfg.global_pool
        self.grad_checkpointing = False  # a flag only (set_grad_checkpointing): nothing reads it
        self.stem = _Stem(cfg)
        depths = [len(t) for t in cfg.block_types]
        rates = drop_path_schedule(cfg.drop_path_rate, depths)
        stages, prev = [], cfg.stem_chs
        reduction = self.stem.reduction
        info: list[dict[str, Any]] = []
        if self.stem.tap:
            info.append(dict(num_chs=getattr(self.stem, self.stem.tap).conv.out_channels, reduction=2,
                             module=f"stem.{self.stem.tap}"))
        prev_info = dict(num_chs=prev, reduction=reduction, module="stem")
        num_attn = 0  # the self-attention blocks so far: the next one's depth_index
        for i, types in enumerate(cfg.block_types):
            if cfg.strides[i] > 1:  # timm: the map before each stride is a feature level
                info.append(prev_info)
            reduction *= cfg.strides[i]
            blocks: list[nn.Module] = []
            for j, kind in enumerate(types):
                common = dict(stride=cfg.strides[i] if j == 0 else 1, bottle_ratio=cfg.bottle_ratios[i],
                              drop_path=rates[i][j])
                if kind == "b":
                    blocks.append(BottleneckBlock(cfg, prev, cfg.channels[i], group_size=cfg.group_sizes[i], **common))
                else:
                    blocks.append(SelfAttnBlock(cfg, prev, cfg.channels[i], num_heads=cfg.num_heads[i],
                                                depth_index=num_attn, **common))
                    num_attn += 1
                prev = cfg.channels[i]
            stages.append(nn.Sequential(*blocks))
            prev_info = dict(num_chs=prev, reduction=reduction, module=f"stages.{i}")
        self.stages = nn.Sequential(*stages)
        act = get_act_layer(cfg.act_layer)
        self.final_conv = ConvNormAct(prev, cfg.num_features, 1, act_layer=act) if cfg.num_features else nn.Identity()
        self.num_features = cfg.num_features or prev
        info.append(dict(num_chs=self.num_features, reduction=reduction, module="final_conv"))
        self.feature_info = info
        self._taps = [d["module"] for d in info]
        self.head = ClassifierHead(self.num_features, cfg.num_classes, global_pool="", drop=cfg.drop_rate)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.01)
                if m.bias is not None:  # a plugged mechanism may build its projections without bias
                    nn.init.zeros_(m.bias)
        for m in self.modules():
            if hasattr(m, "reset_parameters") and getattr(m, "attention_name", None) is not None:
                m.reset_parameters()  # the mechanism's own init (halo: timm's)

    # ------------------------------------------------------------------ API
    # forward_features / forward_head: ConvStagesMixin; forward / reset_classifier / pooling / checkpointing /
    # no_weight_decay: Backbone. The feature levels are timm's (stem taps, the maps before each stride).
    def _num_levels(self) -> int:
        return len(self._taps)

    def _prune_after(self, last: int) -> None:
        """Keep what feature level ``last`` needs (``prune_intermediate_layers``): the stem, the stages up to
        the one it taps, ``final_conv`` only for the last level."""
        tap = self._taps[last]
        if tap == "final_conv":
            return
        if tap.startswith("stem."):  # a tap inside the stem (stem.convN): the stem's later convs go too
            later = self.stem.convs[self.stem.convs.index(tap.split(".")[1]) + 1:]
            for name in later:
                setattr(self.stem, name, nn.Identity())
        keep = int(tap.split(".")[1]) + 1 if tap.startswith("stages.") else 0
        self.stages = self.stages[:keep]
        self.final_conv = nn.Identity()

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
                              output_fmt: Literal["NCHW", "NHWC"] = "NCHW", intermediates_only: bool = False,
                              stop_early: bool = False) -> Any:
        """Final map plus the map of each chosen ``feature_info`` level.

        ``indices``: an int ``n`` = the last ``n`` levels, or level indices (negative allowed); default
        all. ``norm`` has no effect (no final norm). ``[B, C_i, H_i, W_i]`` (``NCHW``) or channels-last
        (``NHWC``). Returns ``(final [B, C, H', W'], [maps])`` or only the list. ``stop_early`` (timm): no
        stage after the last chosen level runs, and ``final`` is the last run stage's map (``final_conv`` only
        when every stage ran); ``intermediates_only`` always stops there.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        take = {self._taps[i] for i in resolve_indices(indices, len(self._taps), "feature level")}
        maps: dict[str, Tensor] = {}
        x, tap = self.stem.forward_tap(x)
        if tap is not None:
            maps[f"stem.{self.stem.tap}"] = tap
        maps["stem"] = x
        for i, stage in enumerate(self.stages):
            if (intermediates_only or stop_early) and take <= maps.keys():
                break  # the stages after the last chosen level are not needed
            x = maps[f"stages.{i}"] = stage(x)
        else:
            x = maps["final_conv"] = self.final_conv(x)
        outs = [maps[m] if output_fmt == "NCHW" else maps[m].permute(0, 2, 3, 1) for m in self._taps if m in take]
        if intermediates_only:
            return outs
        return x, outs


# ---------------------------------------------------------------------------- presets (data, timm byoanet.py)
_PRESETS: dict[str, dict[str, Any]] = {
    "halonet_h1": dict(stem_type="7x7", block_types=("aaa", "aaa", "a" * 10, "aaa"), channels=(64, 128, 256, 512),
                       bottle_ratios=(1.0, 1.0, 1.0, 1.0), attn_kwargs={"block_size": 8, "halo_size": 3}),
    "halonet26t": dict(attn_kwargs={"block_size": 8, "halo_size": 2}),
    "sehalonet33ts": dict(stem_pool=False, block_types=("bb", "bba", "bba", "aa"), channels=(256, 512, 1024, 1536),
                          bottle_ratios=(0.25, 0.25, 0.25, 0.333), act_layer="silu", num_features=1280,
                          se_ratio=1 / 16, attn_kwargs={"block_size": 8, "halo_size": 3}),
    "halonet50ts": dict(block_types=("bbb", "bbba", "bababa", "bab"), num_heads=(8, 4, 8, 8), act_layer="silu",
                        attn_kwargs={"block_size": 8, "halo_size": 3}),
    "haloregnetz_b": dict(img_size=224, stem_type="3x3", stem_chs=32, stem_pool=False,
                          block_types=("bb", "b" * 6, "bbba" * 3, "aa"), channels=(48, 96, 192, 288),
                          strides=(2, 2, 2, 2), bottle_ratios=(3.0, 3.0, 3.0, 3.0), group_sizes=(16, 16, 16, 16),
                          act_layer="silu", se_ratio=0.25, downsample="", bottle_in=True, linear_out=True,
                          num_features=1536, attn_kwargs={"block_size": 7, "halo_size": 2, "qk_ratio": 0.33}),
}

# Published sizes (timm 1.0.31 benchmark table: param_count, infer_gmacs).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "halonet_h1": (8.10, 3.00), "halonet26t": (12.48, 3.19), "sehalonet33ts": (13.69, 3.55),
    "halonet50ts": (22.73, 5.30), "haloregnetz_b": (11.68, 1.97),
}
_META = {name: {"published_params_m": p, "published_gmacs": g,
                "published_gmacs_source": "timm benchmark-infer-amp-nchw-pt240 (param_count, infer_gmacs) at "
                                          f"{_PRESETS[name].get('img_size', 256)} px"}
         for name, (p, g) in _PUBLISHED.items()}


def reduced_config(cfg: HaloNetConfig) -> dict[str, Any]:
    """Overrides that shrink a HaloNet preset for tests: each stage's block pattern cut to one block of each kind it
    has (``"b"``, ``"a"``, ``"ba"``), widths 16-32, 2 heads, groups of at most 8 channels, 64 px; halo blocks of 2
    (odd presets: 3, the strided-pool path) with a halo of 1, so the stride-16 / 32 maps (4, 2) are padded to block
    multiples and the strided queries are covered. The stem, strides, SE, shortcut and activation are kept."""
    odd = cfg.attn_kwargs.get("block_size", 8) % 2
    n = len(cfg.block_types)
    return dict(stem_chs=16, block_types=tuple("".join(k for k in "ba" if k in t) for t in cfg.block_types),
                channels=(16,) + (32,) * (n - 1), num_heads=(2,) * n,
                group_sizes=tuple(min(g, 8) for g in cfg.group_sizes), num_features=32 if cfg.num_features else 0,
                attn_kwargs=dict(cfg.attn_kwargs, block_size=3 if odd else 2, halo_size=1), img_size=64)


register_family("halonet", HaloNet, HaloNetConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.94, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_256_C95 = data_cfg(256, 0.95)
_256_C94 = data_cfg(256, 0.94)
PRETRAINED = pretrained_tags({
    "halonet26t.a1h_in1k": _256_C95,
    "halonet50ts.a1h_in1k": _256_C94,
    "halonet_h1.untrained": dict(_256_C95, hf_hub_id=None),
    "haloregnetz_b.ra3_in1k": _224,
    "sehalonet33ts.ra2_in1k": _256_C94,
}, license="apache-2.0")
