"""LeViT (Graham et al., "LeViT: a Vision Transformer in ConvNet's Clothing for Faster Inference", ICCV 2021).

Config dataclass -> :class:`Levit` -> presets registered as data (timm 1.0.31's names and configs,
``timm/models/levit.py``; facebookresearch/LeViT ``levit.py``):

* stem: four conv 3x3 stride 2 + BatchNorm layers, ``3 -> C/8 -> C/4 -> C/2 -> C`` with a hardswish between them
  (``stem_type="s16"``; ``"s8"``: three, ``C/4 -> C/2 -> C``);
* three stages of residual blocks on the token grid (14 -> 7 -> 4 at 224 px): ``x + attn(x)`` with the
  ``attention_bias`` mechanism (:mod:`vit_attention.attention.attention_bias`: a learned bias per head and
  ``(|Δy|, |Δx|)``, queries / keys ``key_dim`` wide, values ``attn_ratio · key_dim``), then ``x + mlp(x)``;
  every linear layer is followed by a BatchNorm over the tokens
  (:class:`~vit_attention.attention.attention_bias.LinearNorm`);
* stages 1 and 2 open with a shrink block (timm's ``LevitDownsample``): the shrink attention (queries every second
  grid point, ``in_dim / key_dim`` heads, values ``4 · key_dim``, no residual) and a residual MLP;
* head: the tokens' mean, then BatchNorm + linear (:class:`NormLinear`), twice when distilled (``head``,
  ``head_dist``): the average of the two in eval mode, both while training with :meth:`Levit.set_distilled_training`.

Layout: channels-last maps ``[B, H, W, C]`` between the stages (the blocks flatten them to tokens);
``forward_features`` gives the last stage's map ``[B, H/64, W/64, C_2]``, ``forward_intermediates`` each stage's.
timm's ``levit_conv_*`` models run the same layers as 1x1 convolutions on NCHW maps (the same numbers); their
checkpoints differ only in the 46 weights ``[O, I, 1, 1]`` instead of ``[O, I]``, so they load into these models
through a converter (:mod:`vit_attention.weights.levit`) and the ``levit_conv_*`` names are these models with the
conv files' pretrained tags. State-dict keys are timm's.

BatchNorm folding: :meth:`Levit.fuse` folds every BatchNorm into the layer beside it in place (timm's
``fuse()`` / ``reparameterize_model``): the same outputs in eval mode, fewer layers and parameters. Without it,
eval mode runs every pair folded anyway, the folded weights kept while their tensors are unchanged.

CPU inference: the stem runs on channels-last memory (oneDNN's layout; its tokens are then the map's own rows),
its hardswish inside each convolution and the MLP's inside its first GEMM, each residual add inside the last
projection's GEMM, the attention bias gathered once while its table is unchanged, and the attention itself on the
core's explicit path (values wider than keys: torch's fused CPU kernel would take its math path).

Sizes: the bias tables belong to the grids of ``img_size`` (``(r - 1) // 2 + 1`` per stride-2 step). Another input
size reads them resampled (bicubic with antialiasing, timm's ``resize_rel_pos_bias_table_levit`` rule) and
:meth:`Levit.set_input_size` resamples them for good; timm 1.0.31 itself refuses other sizes (``fixed_input_size``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.attention_bias import (
    AttentionBias,
    AttentionBiasShrink,
    LinearNorm,
    levit_act,
    norm_rows,
)
from ..attention.base import AttentionCall, VersionCache
from ..functional.attention_bias import fold_norm_linear
from ..functional.batch_norm import can_fold_batch_norm, fold_batch_norm
from ..functional.conv_act import channels_last_on_cpu, conv2d_act
from ..functional.fast_paths import activation
from ..functional.linear import act_fresh, hookless
from ..functional.runtime import capturing
from ..layers import DropPath, Stage, stage_feature_info
from ._config import ConfigMixin, check_choice, check_common, check_float, check_int, check_int_seq, check_size
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["LevitConfig", "Levit", "LevitBlock", "LevitDownsample", "LevitMlp", "ConvNorm", "NormLinear",
           "reduced_config"]

_STEM_STRIDES = {"s16": 4, "s8": 3}  # stride-2 convolutions of each stem


@dataclass
class LevitConfig(ConfigMixin):
    """Everything a :class:`Levit` is built from (JSON-serialisable).

    ``embed_dim`` / ``num_heads`` / ``depth``: one entry per stage; ``key_dim``: the query / key width of every
    head (the shrink attentions have ``embed_dim[i-1] / key_dim`` heads); ``attn_ratio`` / ``mlp_ratio``: the
    blocks' value width over ``key_dim`` and hidden width over the width (the shrink blocks: 4 and 2, timm's).
    ``act_layer``: stem, MLPs and (unless ``attn_act_layer``) attention
    (:data:`~vit_attention.attention.attention_bias.LEVIT_ACTIVATIONS`).
    ``distilled``: two heads (``head``, ``head_dist``) as the published models.
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    embed_dim: tuple[int, ...] = (128, 256, 384)
    key_dim: int = 16
    num_heads: tuple[int, ...] = (4, 6, 8)
    depth: tuple[int, ...] = (2, 3, 4)
    attn_ratio: float = 2.0
    mlp_ratio: float = 2.0
    down_attn_ratio: float = 4.0
    down_mlp_ratio: float = 2.0
    stem_type: Literal["s16", "s8"] = "s16"
    act_layer: str = "hard_swish"
    attn_act_layer: str | None = None
    distilled: bool = True
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self)
        depth = check_int_seq(self.depth, "depth", min_value=0)
        n = len(depth)
        for name in ("embed_dim", "num_heads"):
            value = getattr(self, name)
            if isinstance(value, (tuple, list)) and len(value) != n:
                raise ValueError(f"{name} {value} must have one entry per stage like depth {self.depth}")
        dims = check_int_seq(self.embed_dim, "embed_dim", length=n)
        check_int_seq(self.num_heads, "num_heads", length=n)
        key_dim = check_int(self.key_dim, "key_dim")
        for i in range(1, n):
            if dims[i - 1] % key_dim:
                raise ValueError(f"embed_dim[{i - 1}]={dims[i - 1]} must be divisible by key_dim={key_dim}: the shrink "
                                 f"attention opening stage {i} has embed_dim[{i - 1}] / key_dim heads")
        if dims[0] % (2 ** _STEM_STRIDES.get(self.stem_type, 4) // 2):
            raise ValueError(f"embed_dim[0]={dims[0]} must be divisible by {2 ** _STEM_STRIDES[self.stem_type] // 2}: "
                             f"the {self.stem_type} stem's convolutions have embed_dim[0] / 8 ... channels")
        for name in ("attn_ratio", "mlp_ratio", "down_attn_ratio", "down_mlp_ratio"):
            check_float(getattr(self, name), name, low_open=True)
        check_choice(self.stem_type, "stem_type", tuple(_STEM_STRIDES))
        levit_act(self.act_layer, "act_layer")
        if self.attn_act_layer is not None:
            levit_act(self.attn_act_layer, "attn_act_layer")
        if not isinstance(self.distilled, bool):
            raise TypeError(f"distilled must be a bool, got {self.distilled!r}")


def stage_grids(cfg: LevitConfig, img_size: Any = None) -> list[tuple[int, int]]:
    """The token grid ``(H, W)`` of each stage for ``img_size`` (default the config's): the stem's stride-2
    convolutions (``(r - 1) // 2 + 1`` each, padding 1), then one stride-2 step per later stage."""
    h, w = check_size(cfg.img_size if img_size is None else img_size, "img_size")
    for _ in range(_STEM_STRIDES[cfg.stem_type]):
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    grids = [(h, w)]
    for _ in range(1, len(cfg.depth)):
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        grids.append((h, w))
    return grids


class ConvNorm(nn.Module):
    """Conv (no bias) + BatchNorm2d on NCHW maps: ``[B, Cin, H, W] -> [B, Cout, H', W']`` (keys ``linear``, ``bn``,
    timm's ``ConvNorm``). At inference the BatchNorm runs folded into the convolution (one pass), the folded weight
    and bias kept while the tensors are unchanged (:class:`~vit_attention.attention.base.VersionCache`);
    :meth:`fuse` folds it for good."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 3, stride: int = 2, padding: int = 1) -> None:
        super().__init__()
        self.linear = nn.Conv2d(in_chs, out_chs, kernel_size, stride, padding, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(out_chs)
        self._folded = VersionCache()

    def forward(self, x: Tensor, *, act: str | None = None) -> Tensor:
        """``act(BN(conv(x)))``: ``[B, Cin, H, W] -> [B, Cout, H', W']`` (``act``: None or a name of
        :data:`~vit_attention.functional.fast_paths.ACTIVATIONS`, inside oneDNN's convolution on channels-last
        CPU inference)."""
        c, bn = self.linear, self.bn
        if isinstance(bn, nn.Identity):
            return activation(c(x), act)
        if c.padding_mode != "zeros" or not can_fold_batch_norm(c, bn):
            return activation(bn(c(x)), act)
        weight, bias = self._folded.fold(c, bn)
        if act is not None and c.dilation == (1, 1) and len(set(c.stride)) == 1 and len(set(c.padding)) == 1:
            return conv2d_act(x, weight, bias, stride=c.stride[0], padding=int(c.padding[0]), groups=c.groups,
                              act=act)
        return activation(F.conv2d(x, weight, bias, c.stride, c.padding, c.dilation, c.groups), act)

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm into the convolution in place (its running statistics; eval-mode numbers)."""
        if isinstance(self.bn, nn.Identity):
            return
        weight, bias = fold_batch_norm(self.linear, self.bn)  # type: ignore[arg-type]
        c = self.linear
        conv = nn.Conv2d(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding, device=weight.device,
                         dtype=weight.dtype)
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)  # type: ignore[union-attr]
        self.linear, self.bn = conv, nn.Identity()
        self._folded.clear()


class NormLinear(nn.Module):
    """BatchNorm1d, dropout, linear: ``[..., C] -> [..., num_classes]`` (LeViT's classifier, keys ``bn``,
    ``linear``; timm's ``NormLinear``, linear weights truncated normal with std 0.02, bias 0). :meth:`fuse` folds
    the BatchNorm into the linear layer (:func:`~vit_attention.functional.attention_bias.fold_norm_linear`)."""

    def __init__(self, in_features: int, out_features: int, *, drop: float = 0.0) -> None:
        super().__init__()
        self.bn: nn.Module = nn.BatchNorm1d(in_features)
        self.drop = nn.Dropout(drop)
        self.linear = nn.Linear(in_features, out_features)
        nn.init.trunc_normal_(self.linear.weight, std=0.02)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``[..., C] -> [..., num_classes]``."""
        if not isinstance(self.bn, nn.Identity):
            x = norm_rows(self.bn, x)  # a batch of one while training: the running statistics
        return self.linear(self.drop(x))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm into the linear layer in place (eval-mode numbers)."""
        if isinstance(self.bn, nn.Identity):
            return
        weight, bias = fold_norm_linear(self.bn, self.linear)  # type: ignore[arg-type]
        self.linear.weight.copy_(weight)
        self.linear.bias.copy_(bias)
        self.bn = nn.Identity()


class LevitMlp(nn.Module):
    """LinearNorm, activation, dropout, LinearNorm: ``[B, N, C] -> [B, N, C_out]`` (timm's ``LevitMlp``, keys
    ``ln1``, ``ln2``); the second BatchNorm starts at scale 0 (the residual branch starts at zero)."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None, *,
                 act_layer: str = "hard_swish", drop: float = 0.0) -> None:
        super().__init__()
        self.ln1 = LinearNorm(in_features, hidden_features)
        self.act = levit_act(act_layer)()
        self.drop = nn.Dropout(drop)
        self.ln2 = LinearNorm(hidden_features, out_features or in_features, bn_weight_init=0.0)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``[B, N, C] -> [B, N, C_out]`` (``residual [B, N, C_out]``: added last). At inference (no hooks on the
        layers, dropout off) the activation overwrites ``ln1``'s fresh output and the residual is added inside
        ``ln2``'s GEMM."""
        ln1, ln2 = self.ln1, self.ln2
        if hookless(ln1, ln1.linear, ln1.bn, ln2) and not (self.training and self.drop.p > 0):
            if type(self.act) is nn.Hardswish and hookless(self.act):  # the activation inside ln1's GEMM
                return ln2(ln1(x, act="hardswish"), residual=residual)
            return ln2(act_fresh(self.act, ln1(x)), residual=residual)
        y = ln2(self.drop(self.act(ln1(x))))
        return y if residual is None else residual + y


def _map_call(x: Tensor, fn: Any) -> Tensor:
    """``fn`` on the tokens of a map: ``[B, H, W, C] -> [B, H·W, C] -> fn -> [B, H, W, C']``."""
    B, H, W, C = x.shape
    y = fn(x.reshape(B, H * W, C), (H, W))
    return y.reshape(B, H, W, y.shape[-1])


class LevitBlock(nn.Module):
    """``x + attn(x)``, then ``x + mlp(x)`` on a map ``[B, H, W, C] -> [B, H, W, C]`` (its ``H·W`` tokens).

    ``attn``: the ``attention_bias`` mechanism (its output BatchNorm starts at scale 0, LeViT's init); keys
    ``attn.*``, ``mlp.ln1`` / ``mlp.ln2`` (timm's ``LevitBlock``).
    """

    def __init__(self, dim: int, key_dim: int, num_heads: int, *, attn_ratio: float, mlp_ratio: float,
                 resolution: tuple[int, int], act_layer: str, attn_act_layer: str, drop_path: float = 0.0) -> None:
        super().__init__()
        self.attn = AttentionBias(dim, num_heads, key_dim=key_dim, attn_ratio=attn_ratio, resolution=resolution,
                                  act_layer=attn_act_layer)
        nn.init.zeros_(self.attn.proj.ln.bn.weight)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.mlp = LevitMlp(dim, int(dim * mlp_ratio), act_layer=act_layer)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def _tokens(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        if isinstance(self.drop_path1, nn.Identity):
            x = self.attn(x, AttentionCall(grid, residual=x))  # the add fused into the mechanism
        else:
            x = x + self.drop_path1(self.attn(x, AttentionCall(grid)))
        if isinstance(self.drop_path2, nn.Identity) and hookless(self.mlp):
            return self.mlp(x, residual=x)  # the add inside the MLP's last GEMM
        return x + self.drop_path2(self.mlp(x))

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``."""
        return _map_call(x, self._tokens)


class LevitDownsample(nn.Module):
    """The shrink block opening a stage: ``x = attn_downsample(x)``, then ``x + mlp(x)``:
    ``[B, H, W, Cin] -> [B, ceil(H/2), ceil(W/2), Cout]`` (timm's ``LevitDownsample``; keys ``attn_downsample.*``,
    ``mlp.*``)."""

    def __init__(self, in_dim: int, out_dim: int, key_dim: int, *, attn_ratio: float, mlp_ratio: float,
                 resolution: tuple[int, int], act_layer: str, attn_act_layer: str, drop_path: float = 0.0) -> None:
        super().__init__()
        self.attn_downsample = AttentionBiasShrink(in_dim, out_dim, key_dim, in_dim // key_dim, attn_ratio=attn_ratio,
                                                   resolution=resolution, act_layer=attn_act_layer)
        self.mlp = LevitMlp(out_dim, int(out_dim * mlp_ratio), act_layer=act_layer)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, Cin] -> [B, ceil(H/2), ceil(W/2), Cout]``."""
        x = self.attn_downsample(x)
        if isinstance(self.drop_path, nn.Identity) and hookless(self.mlp):
            return _map_call(x, lambda t, grid: self.mlp(t, residual=t))  # the add inside the MLP's last GEMM
        return _map_call(x, lambda t, grid: t + self.drop_path(self.mlp(t)))


class LevitStem(nn.Sequential):
    """Conv 3x3 stride 2 + BatchNorm layers with an activation between them: ``[B, Cin, H, W] -> [B, C, H', W']``
    (timm's ``Stem16`` / ``Stem8``; keys ``conv{i}.linear``, ``conv{i}.bn``)."""

    def __init__(self, in_chans: int, out_chs: int, *, num_convs: int = 4, act_layer: str = "hard_swish") -> None:
        chs = [in_chans] + [out_chs // 2 ** (num_convs - 1 - i) for i in range(num_convs)]
        layers: list[tuple[str, nn.Module]] = []
        for i in range(num_convs):
            layers.append((f"conv{i + 1}", ConvNorm(chs[i], chs[i + 1])))
            if i < num_convs - 1:
                layers.append((f"act{i + 1}", levit_act(act_layer)()))
        super().__init__(OrderedDict(layers))
        self.stride = 2 ** num_convs

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, C, H', W']``. On the CPU the images enter in channels-last memory
        (:func:`~vit_attention.functional.conv_act.channels_last_on_cpu`: oneDNN's native layout, and the tokens
        the stages read are then the output's own memory order). At inference (no autograd, no hooks, no graph
        capture) a hardswish / ReLU / SiLU overwrites the convolution's fresh output in place: one map-sized buffer
        fewer per layer (the stem's maps are the model's largest), the same numbers."""
        x = channels_last_on_cpu(x)
        inplace = not capturing() and hookless(*self.modules())
        mods = list(self)
        i = 0
        while i < len(mods):
            m = mods[i]
            if inplace and isinstance(m, ConvNorm) and i + 1 < len(mods) and type(mods[i + 1]) is nn.Hardswish:
                x = m(x, act="hardswish")  # inside the convolution (oneDNN post-op)
                i += 2
                continue
            x = act_fresh(m, x) if inplace else m(x)  # in place on the previous layer's fresh output
            i += 1
        return x


class Levit(StagedBackbone):
    """LeViT backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last stage's map ``[B, H', W', C_2]`` (channels-last, no final norm),
    ``forward_intermediates`` each stage's (``NCHW`` by default), ``forward_head`` averages the tokens and
    classifies (distilled: the mean of ``head`` and ``head_dist`` in eval mode). Stage ``i`` outputs
    ``embed_dim[i]`` channels at stride ``16·2^i`` (``8·2^i`` with the ``s8`` stem).
    """

    family = "levit"
    config_cls = LevitConfig
    no_weight_decay_keys = ("attention_biases",)
    token_merging_note = ("its attention reads a bias table by each token's place on the grid, and its shrink "
                          "attention subsamples that grid: merged tokens have neither")

    def __init__(self, cfg: LevitConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        dims = list(cfg.embed_dim)
        act, attn_act = cfg.act_layer, cfg.attn_act_layer or cfg.act_layer
        self.global_pool = cfg.global_pool
        self.num_features = dims[-1]
        self.distilled_training = False
        self.stem = LevitStem(cfg.in_chans, dims[0], num_convs=_STEM_STRIDES[cfg.stem_type], act_layer=act)
        grids = stage_grids(cfg)
        stages = []
        rate = cfg.drop_path_rate  # timm: the same rate in every block
        for i in range(len(dims)):
            downsample = None if i == 0 else LevitDownsample(
                dims[i - 1], dims[i], cfg.key_dim, attn_ratio=cfg.down_attn_ratio, mlp_ratio=cfg.down_mlp_ratio,
                resolution=grids[i - 1], act_layer=act, attn_act_layer=attn_act, drop_path=rate)
            blocks = [LevitBlock(dims[i], cfg.key_dim, cfg.num_heads[i], attn_ratio=cfg.attn_ratio,
                                 mlp_ratio=cfg.mlp_ratio, resolution=grids[i], act_layer=act,
                                 attn_act_layer=attn_act, drop_path=rate) for _ in range(cfg.depth[i])]
            stages.append(Stage(blocks, downsample))
        self.stages = nn.Sequential(*stages)
        stride = self.stem.stride
        self.feature_info = stage_feature_info(dims, [stride * 2 ** i for i in range(len(dims))], "stages")
        self.norm = nn.Identity()  # LeViT normalises in the head, after pooling
        self.head = self._new_head(cfg.num_classes)
        self.head_dist = self._new_head(cfg.num_classes) if cfg.distilled else None

    def _new_head(self, num_classes: int) -> nn.Module:
        return NormLinear(self.num_features, num_classes, drop=self.cfg.drop_rate) if num_classes > 0 \
            else nn.Identity()

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> the first stage's map ``[B, H/16, W/16, C_0]`` (channels-last)."""
        self.check_channels(x)
        # contiguous tokens: a permuted view would reach every projection of the first stage as strided rows (a
        # batched matmul per layer instead of one GEMM) and make each residual add keep that layout
        return self.stem(x).permute(0, 2, 3, 1).contiguous()

    # ------------------------------------------------------------------ head
    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Map ``[B, H, W, C]`` -> logits ``[B, num_classes]`` (the pooled ``[B, C]`` with ``pre_logits``).

        Distilled: ``(head(x) + head_dist(x)) / 2``, or both while training after
        :meth:`set_distilled_training` (timm's ``LevitDistilled``).
        """
        x = self.pool(x)
        if pre_logits:
            return x
        if self.head_dist is None:
            return self.head(x)
        out, dist = self.head(x), self.head_dist(x)
        if self.distilled_training and self.training and not torch.jit.is_scripting():
            return out, dist
        return (out + dist) / 2

    def set_distilled_training(self, enable: bool = True) -> None:
        """Return both heads' logits while training (distillation); otherwise their mean (timm's switch)."""
        if self.head_dist is None:
            raise ValueError("set_distilled_training needs a distilled model (distilled=True: head and head_dist)")
        self.distilled_training = bool(enable)

    def get_classifier(self) -> nn.Module:
        """The final linear classifier ``head.linear`` (``Identity`` with ``num_classes=0``); a distilled model's
        second one is ``head_dist.linear``."""
        return self.head.linear if isinstance(self.head, NormLinear) else self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Fresh classifier(s) (``head`` and, distilled, ``head_dist``: BatchNorm + linear) for ``num_classes``
        (0 = none); ``global_pool``: ``"avg"`` or ``""`` (None = keep). Arguments are checked before anything
        changes."""
        check_int(num_classes, "num_classes", min_value=0)
        if global_pool is not None:
            check_choice(global_pool, "global_pool", self.pools)
            self.global_pool = self.cfg.global_pool = global_pool
        self.num_classes = self.cfg.num_classes = num_classes
        device = next(self.parameters()).device
        self.head = self._new_head(num_classes).to(device).train(self.training)
        if self.head_dist is not None:
            self.head_dist = self._new_head(num_classes).to(device).train(self.training)

    # ------------------------------------------------------------------ inference transforms
    @torch.no_grad()
    def fuse(self) -> Levit:
        """Fold every BatchNorm into the layer beside it, in place (timm's ``fuse()``): the stem's convolutions,
        each :class:`~vit_attention.attention.attention_bias.LinearNorm` and the heads' BatchNorm -> linear. The
        same outputs in eval mode with fewer layers; training afterwards no longer normalises (BatchNorms gone).
        Returns the model."""
        for m in self.modules():
            if isinstance(m, (LinearNorm, ConvNorm, NormLinear)):
                m.fuse()
        return self

    # ------------------------------------------------------------------ input size
    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Change the nominal input size permanently, in place: every bias table is resampled to its stage's new
        grid (bicubic, antialiased: timm's LeViT rule) and ``cfg.img_size`` records the size. Without it, another
        size still runs (the tables read resampled on each call)."""
        if img_size is None:
            return
        img = check_size(img_size, "img_size")
        grids = stage_grids(self.cfg, img)
        for i, stage in enumerate(self.stages):
            if isinstance(stage.downsample, LevitDownsample):
                stage.downsample.attn_downsample.set_window_size(grids[i - 1])
            for blk in stage.blocks:
                blk.attn.set_window_size(grids[i])
        self.cfg.img_size = img[0] if img[0] == img[1] else img


# ---------------------------------------------------------------------------- presets (data)
_PRESETS: dict[str, dict[str, Any]] = {
    "levit_128s": dict(embed_dim=(128, 256, 384), key_dim=16, num_heads=(4, 6, 8), depth=(2, 3, 4)),
    "levit_128": dict(embed_dim=(128, 256, 384), key_dim=16, num_heads=(4, 8, 12), depth=(4, 4, 4)),
    "levit_192": dict(embed_dim=(192, 288, 384), key_dim=32, num_heads=(3, 5, 6), depth=(4, 4, 4)),
    "levit_256": dict(embed_dim=(256, 384, 512), key_dim=32, num_heads=(4, 6, 8), depth=(4, 4, 4)),
    "levit_384": dict(embed_dim=(384, 512, 768), key_dim=32, num_heads=(6, 9, 12), depth=(4, 4, 4)),
}
# timm's levit_conv_* are the same models as 1x1 convolutions: here the same configs, whose conv checkpoints the
# converter reshapes (vit_attention/weights/levit.py)
_PRESETS.update({name.replace("levit_", "levit_conv_"): dict(p) for name, p in list(_PRESETS.items())})

# timm 1.0.31 parameters on the meta device (1000 classes, both heads), and GMACs at 224 px from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs, measured on the BatchNorm-folded model)
_GMACS = {"levit_128s": 0.30, "levit_128": 0.41, "levit_192": 0.66, "levit_256": 1.13, "levit_384": 2.35}
_PARAMS = {"levit_128s": 7.777, "levit_128": 9.214, "levit_192": 10.947, "levit_256": 18.894, "levit_384": 39.129}
_PUBLISHED: dict[str, tuple[float, float | None]] = {}
for _name in _PARAMS:
    _PUBLISHED[_name] = (_PARAMS[_name], _GMACS[_name])
    _PUBLISHED[_name.replace("levit_", "levit_conv_")] = (_PARAMS[_name], _GMACS[_name])
_META = published_meta(_PUBLISHED, "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs (the "
                       "BatchNorm-folded model)", meta_device=_PUBLISHED)


def reduced_config(cfg: LevitConfig) -> dict[str, Any]:
    """Overrides that shrink a LeViT preset for tests: widths 32 / 48 / 64 with ``key_dim`` 8 (2 / 3 / 4 heads),
    one block per stage, on 128 px (grids 8x8, 4x4, 2x2: square as the published checkpoints, whose tables load at
    another size resampled; non-square and odd grids are the timm fixtures'); the stem, activations, ratios and
    distillation are the preset's."""
    return dict(embed_dim=(32, 48, 64), key_dim=8, num_heads=(2, 3, 4), depth=(1, 1, 1), img_size=128)


register_family("levit", Levit, LevitConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.9)
PRETRAINED = pretrained_tags({
    "levit_128.fb_dist_in1k": _224,
    "levit_128s.fb_dist_in1k": _224,
    "levit_192.fb_dist_in1k": _224,
    "levit_256.fb_dist_in1k": _224,
    "levit_384.fb_dist_in1k": _224,
    "levit_conv_128.fb_dist_in1k": _224,
    "levit_conv_128s.fb_dist_in1k": _224,
    "levit_conv_192.fb_dist_in1k": _224,
    "levit_conv_256.fb_dist_in1k": _224,
    "levit_conv_384.fb_dist_in1k": _224,
}, license="apache-2.0")

