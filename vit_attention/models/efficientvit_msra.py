"""EfficientViT-MSRA (Liu et al., "EfficientViT: Memory Efficient Vision Transformer with Cascaded Group Attention",
CVPR 2023).

Config dataclass -> :class:`EfficientVitMsra` -> presets registered as data (timm 1.0.31's names and configs,
``timm/models/efficientvit_msra.py``; microsoft/Cream ``EfficientViT/classification/model/efficientvit.py``):

* patch embedding: four conv 3x3 stride 2 + BatchNorm layers with a ReLU between them,
  ``3 -> C/8 -> C/4 -> C/2 -> C`` (stride 16);
* three stages of EfficientViT blocks (the sandwich ``x + dw0(x)``, ``x + ffn0(x)``, ``x + mixer(x)``,
  ``x + dw1(x)``, ``x + ffn1(x)``: depthwise 3x3 conv-BN, a 1x1 conv-BN FFN of ratio 2 with a ReLU, and the
  ``cascaded_group`` mechanism (:mod:`vit_attention.attention.cascaded_group`) in ``min(7, resolution)`` windows);
* stages 1 and 2 open with a subsample block: ``x + dw(x)``, ``x + ffn(x)`` at the old width, a patch merging
  (1x1 conv x4, ReLU, depthwise 3x3 stride 2, ReLU, squeeze-excite 0.25, 1x1 conv to the new width), then
  ``x + dw(x)``, ``x + ffn(x)`` at the new width;
* head: the map's mean, then BatchNorm + linear (LeViT's :class:`~vit_attention.models.levit.NormLinear`).

Layout: channels-last maps ``[B, H, W, C]`` everywhere, from the patch embedding on (timm runs ``NCHW``; the
numbers are the same): a 1x1 convolution is a linear layer on the channels, the 3x3 and depthwise ones run on the
channels-last view (:class:`~vit_attention.attention.cascaded_group.ConvNorm`); at inference each residual add and
ReLU is fused into the layer before it where the kernel allows. ``forward_features`` gives the last stage's map.
State-dict keys are timm's.

BatchNorm folding: :meth:`EfficientVitMsra.fuse` folds every BatchNorm into the convolution before it (and the
head's into its linear layer) in place, as timm's ``reparameterize_model``: the same outputs in eval mode.

Sizes: the windows and their bias tables follow timm's rule: the resolution is ``min(img_size) // 16``, then
``(r - 1) // 2 + 1`` per subsample stage, and each stage's window ``min(window_size, resolution)``. Another input
size runs with the built windows (maps zero-padded to them, as timm); :meth:`EfficientVitMsra.set_input_size`
recomputes the windows for a new size and resamples every table whose window changes (bicubic, antialiased:
timm's ``resize_rel_pos_bias_table_levit``), as timm's ``set_input_size`` does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..attention.base import AttentionCall
from ..attention.cascaded_group import CascadedGroupAttention, ConvNorm
from ..functional.linear import fusable_activation
from ..layers import DropPath, Stage, stage_feature_info
from ._config import ConfigMixin, check_choice, check_common, check_int, check_int_seq, check_size
from .backbone import StagedBackbone
from .halonet import SqueezeExcite
from .levit import NormLinear
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["EfficientVitMsraConfig", "EfficientVitMsra", "EfficientVitMsraBlock", "ResidualDrop", "ConvMlp",
           "PatchMerging", "reduced_config", "stage_windows"]

_PATCH = 16  # the patch embedding's stride (four stride-2 convolutions)


@dataclass
class EfficientVitMsraConfig(ConfigMixin):
    """Everything an :class:`EfficientVitMsra` is built from (JSON-serialisable).

    ``embed_dim`` / ``key_dim`` / ``depth`` / ``num_heads`` / ``window_size``: one entry per stage (every head of
    stage ``i`` reads ``embed_dim[i] / num_heads[i]`` channels and has queries / keys ``key_dim[i]`` wide);
    ``kernels``: the depthwise kernel on each head's queries (at least ``max(num_heads)`` odd sizes). Stages after
    the first open with a stride-2 subsample block.
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    embed_dim: tuple[int, ...] = (64, 128, 192)
    key_dim: tuple[int, ...] = (16, 16, 16)
    depth: tuple[int, ...] = (1, 2, 3)
    num_heads: tuple[int, ...] = (4, 4, 4)
    window_size: tuple[int, ...] = (7, 7, 7)
    kernels: tuple[int, ...] = (5, 5, 5, 5)
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        img = check_common(self)
        depth = check_int_seq(self.depth, "depth", min_value=0)
        n = len(depth)
        for name in ("embed_dim", "key_dim", "num_heads", "window_size"):
            value = getattr(self, name)
            if isinstance(value, (tuple, list)) and len(value) != n:
                raise ValueError(f"{name} {value} must have one entry per stage like depth {self.depth}")
            check_int_seq(value, name, length=n)
        for i, (dim, heads) in enumerate(zip(self.embed_dim, self.num_heads)):
            if dim % heads:
                raise ValueError(f"embed_dim[{i}]={dim} must be divisible by num_heads[{i}]={heads}: each head reads "
                                 "embed_dim / num_heads channels and gives as many (the cascade adds them)")
        if self.embed_dim[0] % 8:
            raise ValueError(f"embed_dim[0]={self.embed_dim[0]} must be divisible by 8: the patch embedding's "
                             "convolutions have embed_dim[0] / 8, / 4, / 2 channels")
        kernels = check_int_seq(self.kernels, "kernels")
        if len(kernels) < max(self.num_heads) or not all(k % 2 for k in kernels):
            raise ValueError(f"kernels {self.kernels} must hold an odd size for each of the max(num_heads)="
                             f"{max(self.num_heads)} heads")
        if min(img) < _PATCH:
            raise ValueError(f"img_size {self.img_size} must be at least {_PATCH} on each side (the windows follow "
                             f"min(img_size) // {_PATCH})")


def stage_windows(cfg: EfficientVitMsraConfig, img_size: Any = None) -> list[tuple[int, int]]:
    """Each stage's ``(resolution, window)`` for ``img_size`` (default the config's), timm's rule: ``min(img_size)
    // 16``, then ``(r - 1) // 2 + 1`` per subsample stage; the window is ``min(window_size[i], resolution)``."""
    res = min(check_size(cfg.img_size if img_size is None else img_size, "img_size")) // _PATCH
    out = []
    for i, ws in enumerate(cfg.window_size):
        if i:
            res = (res - 1) // 2 + 1
        out.append((res, min(ws, res)))
    return out


class ResidualDrop(nn.Module):
    """``x + drop_path(m(x))`` on channels-last maps (timm's ``ResidualDrop``, key ``m.*``): ``[B, H, W, C] -> same``.

    Without a dropped path (inference, or rate 0) ``m`` adds the residual itself (``m(x, residual=x)``: fused into
    its last layer where it can)."""

    def __init__(self, m: nn.Module, drop_path: float = 0.0) -> None:
        super().__init__()
        self.m = m
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``."""
        if not self.training or isinstance(self.drop_path, nn.Identity):
            return self.m(x, residual=x)
        return x + self.drop_path(self.m(x))


class ConvMlp(nn.Module):
    """1x1 conv-BN, ReLU, 1x1 conv-BN (its BatchNorm at scale 0): ``[B, H, W, C] -> [B, H, W, C]`` (keys ``pw1``,
    ``pw2``; timm's ``ConvMlp``)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.pw1 = ConvNorm(dim, hidden)
        self.act = nn.ReLU()
        self.pw2 = ConvNorm(hidden, dim, bn_weight_init=0.0)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]`` (plus ``residual``)."""
        act = fusable_activation(self.act)
        h = self.pw1(x, act=act) if act is not None else self.act(self.pw1(x))
        return self.pw2(h, residual=residual)


class PatchMerging(nn.Module):
    """1x1 conv-BN to ``4·C``, ReLU, depthwise 3x3 stride 2 conv-BN, ReLU, squeeze-excite (0.25), 1x1 conv-BN to
    ``C_out``: ``[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), C_out]`` (timm's ``PatchMerging``; keys ``conv1``,
    ``conv2``, ``se.fc1`` / ``se.fc2``, ``conv3``)."""

    def __init__(self, dim: int, out_dim: int) -> None:
        super().__init__()
        hid = 4 * dim
        self.conv1 = ConvNorm(dim, hid)
        self.act = nn.ReLU()
        self.conv2 = ConvNorm(hid, hid, 3, 2, groups=hid)
        self.se = SqueezeExcite(hid, 0.25)
        self.conv3 = ConvNorm(hid, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), C_out]``."""
        act = fusable_activation(self.act)
        if act is None:
            x = self.act(self.conv2(self.act(self.conv1(x))))
        else:
            x = self.conv2(self.conv1(x, act=act), act=act)
        x = self.se(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # on the NCHW view: the product stays channels-last
        return self.conv3(x)


def _dw_ffn(dim: int, drop_path: float, *, dw_init: float = 1.0) -> list[ResidualDrop]:
    """``x + dw(x)``, ``x + ffn(x)``: a depthwise 3x3 conv-BN and a ratio-2 :class:`ConvMlp`, each residual."""
    return [ResidualDrop(ConvNorm(dim, dim, 3, groups=dim, bn_weight_init=dw_init), drop_path),
            ResidualDrop(ConvMlp(dim, 2 * dim), drop_path)]


class _WindowMixer(nn.Module):
    """The mechanism on the map: ``[B, H, W, C] -> [B, H, W, C]`` (plus ``residual``, which the mechanism adds in its
    output projection; key ``attn.*``, timm's ``LocalWindowAttention`` holding its ``CascadedGroupAttention``)."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``."""
        return self.attn(x, AttentionCall(residual=residual)) if residual is not None else self.attn(x)


class EfficientVitMsraBlock(nn.Module):
    """``dw0 -> ffn0 -> mixer -> dw1 -> ffn1``, each residual: ``[B, H, W, C] -> [B, H, W, C]``.

    ``mixer.m.attn``: the ``cascaded_group`` mechanism in ``window`` windows (its output BatchNorm starts at 0, as
    the depthwise ones: every branch starts at zero); keys timm's ``EfficientVitBlock``.
    """

    def __init__(self, dim: int, key_dim: int, num_heads: int, *, window: int, kernels: tuple[int, ...],
                 drop_path: float = 0.0) -> None:
        super().__init__()
        self.dw0, self.ffn0 = _dw_ffn(dim, drop_path, dw_init=0.0)
        attn = CascadedGroupAttention(dim, num_heads, key_dim=key_dim, window_size=window, kernels=kernels)
        nn.init.zeros_(attn.proj[1].bn.weight)
        self.mixer = ResidualDrop(_WindowMixer(attn), drop_path)
        self.dw1, self.ffn1 = _dw_ffn(dim, drop_path, dw_init=0.0)

    @property
    def attn(self) -> CascadedGroupAttention:
        """The block's mechanism (``mixer.m.attn``)."""
        return self.mixer.m.attn  # type: ignore[return-value]

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, C]``."""
        return self.ffn1(self.dw1(self.mixer(self.ffn0(self.dw0(x)))))


class _Subsample(nn.Sequential):
    """The subsample block opening a stage: ``res1`` (dw + ffn at ``C_in``), ``patchmerge``, ``res2`` (dw + ffn at
    ``C_out``): ``[B, H, W, C_in] -> [B, ceil(H/2), ceil(W/2), C_out]`` (timm's ``downsample`` keys)."""

    def __init__(self, in_dim: int, out_dim: int, drop_path: float = 0.0) -> None:
        super().__init__(OrderedDict([
            ("res1", nn.Sequential(*_dw_ffn(in_dim, drop_path))),
            ("patchmerge", PatchMerging(in_dim, out_dim)),
            ("res2", nn.Sequential(*_dw_ffn(out_dim, drop_path)))]))


class PatchEmbedding(nn.Sequential):
    """Four conv 3x3 stride 2 + BatchNorm layers with a ReLU between them, ``3 -> C/8 -> C/4 -> C/2 -> C``:
    ``[B, H, W, Cin] -> [B, H/16, W/16, C]`` channels-last (keys ``conv{i}.conv`` / ``conv{i}.bn``; timm's
    ``PatchEmbedding``); the images' ``NCHW`` order runs through it (no copy of the images), made channels-last
    at its end."""

    def __init__(self, in_chans: int, dim: int) -> None:
        chs = [in_chans, dim // 8, dim // 4, dim // 2, dim]
        layers: list[tuple[str, nn.Module]] = []
        for i in range(4):
            layers.append((f"conv{i + 1}", ConvNorm(chs[i], chs[i + 1], 3, 2)))
            if i < 3:
                layers.append((f"relu{i + 1}", nn.ReLU()))
        super().__init__(OrderedDict(layers))

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        """``[B, H, W, Cin] -> [B, H/16, W/16, C]`` (contiguous)."""
        for i in range(1, 5):
            conv, relu = getattr(self, f"conv{i}"), getattr(self, f"relu{i}", None)
            act = None if relu is None else fusable_activation(relu)
            x = conv(x, act=act) if act is not None or relu is None else relu(conv(x))
        return x.contiguous()  # the images' NCHW order reaches this far (no copy of them); the stages run channels-last


class EfficientVitMsra(StagedBackbone):
    """EfficientViT-MSRA backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last stage's map ``[B, H', W', C_2]`` (channels-last, no final norm),
    ``forward_intermediates`` each stage's (``NCHW`` by default), ``forward_head`` averages the map and classifies
    (BatchNorm + linear). Stage ``i`` outputs ``embed_dim[i]`` channels at stride ``16·2^i``.
    """

    family = "efficientvit_msra"
    config_cls = EfficientVitMsraConfig
    no_weight_decay_keys = ("attention_biases",)

    def __init__(self, cfg: EfficientVitMsraConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        dims = list(cfg.embed_dim)
        self.global_pool = cfg.global_pool
        self.num_features = dims[-1]
        self.patch_embed = PatchEmbedding(cfg.in_chans, dims[0])
        windows = stage_windows(cfg)
        rate = cfg.drop_path_rate  # timm's ResidualDrop rate, the same in every block
        stages = []
        for i, dim in enumerate(dims):
            blocks = [EfficientVitMsraBlock(dim, cfg.key_dim[i], cfg.num_heads[i], window=windows[i][1],
                                            kernels=tuple(cfg.kernels), drop_path=rate) for _ in range(cfg.depth[i])]
            stages.append(Stage(blocks, _Subsample(dims[i - 1], dim, rate) if i else None))
        self.stages = nn.Sequential(*stages)
        self.feature_info = stage_feature_info(dims, [_PATCH * 2 ** i for i in range(len(dims))], "stages")
        self.norm = nn.Identity()  # normalised in the head, after pooling
        self.head = self._new_head(cfg.num_classes)

    def _new_head(self, num_classes: int) -> nn.Module:
        return NormLinear(self.num_features, num_classes, drop=self.cfg.drop_rate) if num_classes > 0 \
            else nn.Identity()

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> the first stage's map ``[B, H/16, W/16, C_0]`` (channels-last)."""
        self.check_channels(x)
        return self.patch_embed(x.permute(0, 2, 3, 1))  # a view: no copy of the images

    # ------------------------------------------------------------------ head
    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Map ``[B, H, W, C]`` -> logits ``[B, num_classes]`` (the pooled ``[B, C]`` with ``pre_logits``)."""
        x = self.pool(x)
        return x if pre_logits else self.head(x)

    def get_classifier(self) -> nn.Module:
        """The final linear classifier ``head.linear`` (``Identity`` with ``num_classes=0``), timm's."""
        return self.head.linear if isinstance(self.head, NormLinear) else self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh classifier (BatchNorm + linear) for ``num_classes`` (0 = none); ``global_pool``: ``"avg"`` or
        ``""`` (None = keep). Arguments are checked before anything changes."""
        check_int(num_classes, "num_classes", min_value=0)
        if global_pool is not None:
            check_choice(global_pool, "global_pool", self.pools)
            self.global_pool = self.cfg.global_pool = global_pool
        self.num_classes = self.cfg.num_classes = num_classes
        device = next(self.parameters()).device
        self.head = self._new_head(num_classes).to(device).train(self.training)

    # ------------------------------------------------------------------ inference transforms
    @torch.no_grad()
    def fuse(self) -> EfficientVitMsra:
        """Fold every BatchNorm into the layer beside it, in place (timm's ``reparameterize_model``): each
        :class:`~vit_attention.attention.cascaded_group.ConvNorm` and the head's BatchNorm -> linear. The same
        outputs in eval mode with fewer layers; training afterwards no longer normalises. Returns the model."""
        for m in self.modules():
            if isinstance(m, (ConvNorm, NormLinear)):
                m.fuse()
        return self

    # ------------------------------------------------------------------ input size
    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Change the nominal input size permanently, in place (timm's ``set_input_size``): each stage's window
        becomes ``min(window_size, resolution)`` of the new size (:func:`stage_windows`) and every table whose
        window changes is resampled (bicubic, antialiased); ``cfg.img_size`` records the size."""
        if img_size is None:
            return
        img = check_size(img_size, "img_size")
        if min(img) < _PATCH:
            raise ValueError(f"img_size {img_size!r} must be at least {_PATCH} on each side")
        windows = stage_windows(self.cfg, img)
        for (_, ws), stage in zip(windows, self.stages):
            for blk in stage.blocks:
                blk.attn.set_window_size(ws)
        self.cfg.img_size = img[0] if img[0] == img[1] else img


# ---------------------------------------------------------------------------- presets (data)
_PRESETS: dict[str, dict[str, Any]] = {
    "efficientvit_m0": dict(embed_dim=(64, 128, 192), depth=(1, 2, 3), num_heads=(4, 4, 4), kernels=(5, 5, 5, 5)),
    "efficientvit_m1": dict(embed_dim=(128, 144, 192), depth=(1, 2, 3), num_heads=(2, 3, 3), kernels=(7, 5, 3, 3)),
    "efficientvit_m2": dict(embed_dim=(128, 192, 224), depth=(1, 2, 3), num_heads=(4, 3, 2), kernels=(7, 5, 3, 3)),
    "efficientvit_m3": dict(embed_dim=(128, 240, 320), depth=(1, 2, 3), num_heads=(4, 3, 4), kernels=(5, 5, 5, 5)),
    "efficientvit_m4": dict(embed_dim=(128, 256, 384), depth=(1, 2, 3), num_heads=(4, 4, 4), kernels=(7, 5, 3, 3)),
    "efficientvit_m5": dict(embed_dim=(192, 288, 384), depth=(1, 3, 4), num_heads=(3, 3, 4), kernels=(7, 5, 3, 3)),
}

# timm 1.0.31 parameters on the meta device (1000 classes), and GMACs at 224 px from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs, measured on the BatchNorm-folded model)
_PARAMS = {"efficientvit_m0": 2.349, "efficientvit_m1": 2.981, "efficientvit_m2": 4.188, "efficientvit_m3": 6.901,
           "efficientvit_m4": 8.804, "efficientvit_m5": 12.474}
_GMACS = {"efficientvit_m0": 0.08, "efficientvit_m1": 0.17, "efficientvit_m2": 0.20, "efficientvit_m3": 0.26,
          "efficientvit_m4": 0.30, "efficientvit_m5": 0.52}
_META = published_meta({n: (_PARAMS[n], _GMACS[n]) for n in _PARAMS},
                       "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs (the BatchNorm-folded "
                       "model)", meta_device=_PARAMS)


def reduced_config(cfg: EfficientVitMsraConfig) -> dict[str, Any]:
    """Overrides that shrink a preset for tests: widths 32 / 48 / 64 with 2 / 3 / 4 heads of ``key_dim`` 8, one
    block per stage, on 128 px (maps 8, 4, 2: windows 7, 4, 2, the first map zero-padded to four 7x7 windows; every
    stage's stride divides the image); the kernels are the preset's."""
    return dict(embed_dim=(32, 48, 64), key_dim=(8, 8, 8), num_heads=(2, 3, 4), depth=(1, 1, 1), img_size=128)


register_family("efficientvit_msra", EfficientVitMsra, EfficientVitMsraConfig, _PRESETS, meta=_META,
                reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.875)
PRETRAINED = pretrained_tags({
    "efficientvit_m0.r224_in1k": _224,
    "efficientvit_m1.r224_in1k": _224,
    "efficientvit_m2.r224_in1k": _224,
    "efficientvit_m3.r224_in1k": _224,
    "efficientvit_m4.r224_in1k": _224,
    "efficientvit_m5.r224_in1k": _224,
}, license="mit")
