"""CvT (Wu et al., 2021): convolutional token embeddings + convolutional projection attention.

Config dataclass -> :class:`Cvt` -> presets registered as data. Three stages; each starts with a
convolutional token embedding (``Conv2d`` with overlap + LayerNorm: kernels 7/3/3, strides
4/2/2) and runs pre-norm :class:`~vit_attention.layers.Block` s around the ``conv_proj``
mechanism (depthwise conv + BatchNorm per q / k / v, strided keys; any registered token mechanism
can replace it through ``attn_layer``). There is no position embedding. A class token joins the
last stage only (after its embedding); the final LayerNorm and the classifier read it (or, with
``cls_token=False``, the mean of the normalised tokens).

State-dict keys follow the original microsoft/CvT layout with ``stage{i}`` -> ``stages.{i}``:
``stages.{i}.patch_embed.{proj,norm}``, ``stages.{i}.cls_token``, ``stages.{i}.blocks.{j}.{norm1,
attn.conv_proj_{q,k,v}.{conv,bn}, attn.proj_{q,k,v}, attn.proj, norm2, mlp.fc1, mlp.fc2}``, ``norm``,
``head``. Hugging Face's ``CvtForImageClassification`` and the original checkpoints are converted by
``vit_attention.weights.cvt``.

Activation: the original trains with QuickGELU (``act_layer="quick_gelu"``, the default here, so
the original checkpoints reproduce); Hugging Face's port uses exact GELU (``act_layer="gelu"``).

Layout: a stage takes a channels-last map ``[B, H, W, C_in]`` and gives tokens
``[B, P + H'·W', C]`` with its grid; ``forward_features`` gives the last stage's normalised tokens
(class token first), ``forward_intermediates`` each stage's map.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..layers import Block, Stage, Tokens, accepted_kwargs, as_map, stage_feature_info
from ..layers.activation import ACT_LAYERS, get_act_layer
from ..layers.conv_embed import ConvEmbed
from ..layers.head import init_linear_weights
from ._config import ConfigMixin, check_attn_layer, check_choice, check_common, check_float, check_int, check_int_seq
from .backbone import StagedBackbone
from .registry import register_family

__all__ = ["CvtConfig", "Cvt", "CvtStage", "reduced_config"]


@dataclass
class CvtConfig(ConfigMixin):
    """Everything a :class:`Cvt` is built from (JSON-serialisable).

    Per-stage tuples (one entry per stage): ``embed_dims``, ``depths``, ``num_heads`` and the
    token embedding's ``patch_sizes`` / ``patch_strides`` / ``patch_paddings``. ``kernel_size``,
    ``stride_kv`` and ``proj_method`` configure ``conv_proj`` (given where ``attn_layer`` takes them).
    ``drop_path_rate``: the last stage's rate, rising linearly over its blocks (the original's
    per-stage rule; its configs use 0 for the first two stages).
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    embed_dims: tuple[int, ...] = (64, 192, 384)
    depths: tuple[int, ...] = (1, 2, 10)
    num_heads: tuple[int, ...] = (1, 3, 6)
    patch_sizes: tuple[int, ...] = (7, 3, 3)
    patch_strides: tuple[int, ...] = (4, 2, 2)
    patch_paddings: tuple[int, ...] = (2, 1, 1)
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    kernel_size: int = 3
    stride_kv: int = 2
    proj_method: Literal["dw_bn", "avg", "linear"] = "dw_bn"
    cls_token: bool = True  # a class token in the last stage (False: the head averages the tokens)
    global_pool: Literal["token", "avg", ""] | None = None  # None: "token" with a class token, else "avg"
    act_layer: str = "quick_gelu"  # the original's; Hugging Face's port uses "gelu"
    norm_eps: float = 1e-5
    bn_eps: float = 1e-5
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.1
    attn_layer: str = "conv_proj"  # any registered token mechanism
    attn_kwargs: dict[str, Any] = field(default_factory=dict)  # given to every block's mechanism as they are

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self, pools=None)
        dims = check_int_seq(self.embed_dims, "embed_dims")
        n = len(dims)
        check_int_seq(self.depths, "depths", min_value=1, length=n)
        heads = check_int_seq(self.num_heads, "num_heads", length=n)
        for i, (d, h) in enumerate(zip(dims, heads)):
            if d % h:
                raise ValueError(f"embed_dims[{i}]={d} is not divisible by num_heads[{i}]={h}")
        check_int_seq(self.patch_sizes, "patch_sizes", length=n)
        check_int_seq(self.patch_strides, "patch_strides", length=n)
        check_int_seq(self.patch_paddings, "patch_paddings", min_value=0, length=n)
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_int(self.kernel_size, "kernel_size")
        check_int(self.stride_kv, "stride_kv")
        check_choice(self.proj_method, "proj_method", ("dw_bn", "avg", "linear"))
        check_choice(self.act_layer, "act_layer", tuple(ACT_LAYERS))
        check_float(self.norm_eps, "norm_eps", low_open=True)
        check_float(self.bn_eps, "bn_eps", low_open=True)
        check_attn_layer(self.attn_layer, self.attn_kwargs, layout="tokens")
        if self.global_pool is not None:
            check_choice(self.global_pool, "global_pool", ("token", "avg", ""))
            if self.global_pool == "token" and not self.cls_token:
                raise ValueError("global_pool='token' needs cls_token=True")


class CvtStage(Stage):
    """A :class:`~vit_attention.layers.Stage` whose embedding is CvT's: convolutional token embedding,
    optional class token, dropout; map ``[B, H, W, Cin]`` -> :class:`~vit_attention.layers.Tokens`
    ``([B, P + H'·W', C], (H', W'), P)``.

    Blocks, checkpointing and CPU batch chunking are the shared Stage's. Keys ``patch_embed.*``,
    ``cls_token`` (``[1, 1, C]``, only with a class token), ``blocks.{j}.*`` (the original's layout).
    """

    def __init__(self, embed: ConvEmbed, blocks: Sequence[nn.Module], dim: int, *, cls_token: bool = False,
                 drop: float = 0.0) -> None:
        super().__init__(blocks)
        self.patch_embed = embed
        # parameter order as the original's (and as optimizer states saved before): the embedding, then the blocks
        rest = {k: m for k, m in self._modules.items() if k != "patch_embed"}
        self._modules.clear()
        self._modules.update(patch_embed=embed, **rest)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if cls_token else None
        self.pos_drop = nn.Dropout(drop)

    @property
    def num_prefix_tokens(self) -> int:
        """``P``: 1 with a class token, else 0."""
        return 0 if self.cls_token is None else 1

    def embed(self, x: Tensor | Tokens) -> Tokens:
        """``[B, H, W, Cin]`` (or the previous stage's :class:`Tokens`) ->
        ``Tokens([B, P + H'·W', C], (H', W'), P)``."""
        x = self.patch_embed(as_map(x))  # [B, H', W', C]
        B, H, W, C = x.shape
        x = x.reshape(B, H * W, C)  # [B, H'·W', C]
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)  # [B, 1 + H'·W', C]
        return Tokens(self.pos_drop(x), (H, W), self.num_prefix_tokens)


class Cvt(StagedBackbone):
    """CvT backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last stage's normalised tokens ``[B, P + H'·W', C]`` (class
    token first), ``forward_head`` classifies the class token (or the mean token),
    ``forward_intermediates`` gives every stage's map (``NCHW`` by default). Stage ``i`` outputs
    ``embed_dims[i]`` channels at stride ``prod(patch_strides[:i+1])``.
    """

    family = "cvt"
    config_cls = CvtConfig
    no_weight_decay_keys = ("cls_token",)
    pools = ("token", "avg", "")
    head_fc = None  # a bare Linear ``head`` (the original's key)

    def __init__(self, cfg: CvtConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        n = len(cfg.depths)
        self.num_features = self.embed_dim = cfg.embed_dims[-1]
        self.num_prefix_tokens = 1 if cfg.cls_token else 0
        self.global_pool = cfg.global_pool if cfg.global_pool is not None else ("token" if cfg.cls_token else "avg")
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        act_layer = get_act_layer(cfg.act_layer)
        conv_kwargs = accepted_kwargs(cfg.attn_layer, dict(kernel_size=cfg.kernel_size, stride_kv=cfg.stride_kv,
                                                           method=cfg.proj_method, bn_eps=cfg.bn_eps))
        stages = []
        in_chans = cfg.in_chans
        for i in range(n):
            dim, depth = cfg.embed_dims[i], cfg.depths[i]
            rate = cfg.drop_path_rate if i == n - 1 else 0.0
            dpr = [rate * j / max(depth - 1, 1) for j in range(depth)]  # linspace(0, rate, depth) per stage
            blocks = [Block(dim, cfg.num_heads[i], style="pre", mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                            drop=cfg.drop_rate, attn_drop=cfg.attn_drop_rate, drop_path=dpr[j],
                            norm_layer=norm_layer, act_layer=act_layer, attn_layer=cfg.attn_layer,
                            attn_kwargs={**conv_kwargs, **cfg.attn_kwargs}, depth_index=sum(cfg.depths[:i]) + j)
                      for j in range(depth)]
            embed = ConvEmbed(in_chans, dim, kernel_size=cfg.patch_sizes[i], stride=cfg.patch_strides[i],
                                    padding=cfg.patch_paddings[i], norm_eps=cfg.norm_eps, channels_last_input=True)
            stages.append(CvtStage(embed, blocks, dim, cls_token=cfg.cls_token and i == n - 1, drop=cfg.drop_rate))
            in_chans = dim
        self.stages = nn.Sequential(*stages)
        reductions = [math.prod(cfg.patch_strides[: i + 1]) for i in range(n)]
        self.feature_info = stage_feature_info(cfg.embed_dims, reductions, "stages")
        self.norm = norm_layer(self.num_features)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        init_linear_weights(self)
        for stage in self.stages:
            if stage.cls_token is not None:
                nn.init.trunc_normal_(stage.cls_token, std=0.02)

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> the channels-last view ``[B, H, W, Cin]`` (the first stage embeds)."""
        self.check_channels(x)
        return x.permute(0, 2, 3, 1)


# ---------------------------------------------------------------------------- presets (data)
_SIZES: dict[str, dict[str, Any]] = {
    "13": dict(embed_dims=(64, 192, 384), depths=(1, 2, 10), num_heads=(1, 3, 6)),
    "21": dict(embed_dims=(64, 192, 384), depths=(1, 4, 16), num_heads=(1, 3, 6)),
    "w24": dict(embed_dims=(192, 768, 1024), depths=(2, 2, 20), num_heads=(3, 12, 16), drop_path_rate=0.3),
}

_PRESETS: dict[str, dict[str, Any]] = {
    "cvt_13_224": dict(_SIZES["13"], img_size=224),
    "cvt_21_224": dict(_SIZES["21"], img_size=224),
    "cvt_13_384": dict(_SIZES["13"], img_size=384),
    "cvt_21_384": dict(_SIZES["21"], img_size=384),
    "cvt_w24_384": dict(_SIZES["w24"], img_size=384),
}

# Params: the README's 20 / 32 / 277M; to two decimals the Hugging Face port's counts (transformers 5.23.0).
_README = "microsoft/CvT README (ImageNet results table)"
_META: dict[str, dict[str, Any]] = {
    # README 4.5; its own counter skips the norms. 4.57 = FlopCounterMode on HF's CvT-13 (transformers 5.23.0)
    "cvt_13_224": dict(published_params_m=20.0, published_gmacs=4.57,
                       published_gmacs_source="HF CvtForImageClassification measured (FlopCounterMode); README 4.5"),
    "cvt_21_224": dict(published_params_m=31.6, published_gmacs=7.1, published_gmacs_source=_README),
    "cvt_13_384": dict(published_params_m=20.0, published_gmacs=16.3, published_gmacs_source=_README),
    "cvt_21_384": dict(published_params_m=31.6, published_gmacs=24.9, published_gmacs_source=_README),
    "cvt_w24_384": dict(published_params_m=277.2, published_gmacs=193.2, published_gmacs_source=_README),
}



def reduced_config(cfg: CvtConfig) -> dict[str, Any]:
    """Overrides that shrink a CvT preset for tests: three stages of 16 / 32 / 32 channels (1, 1, 2 blocks; the
    class token kept in the last) on 64 px (224 presets: grids 16, 8, 4) or 80 px (384 presets: grids 20, 10,
    5, the last with an odd stride-2 key grid 3x3)."""
    size = cfg.img_size if isinstance(cfg.img_size, int) else cfg.img_size[0]
    return dict(embed_dims=(16, 32, 32), num_heads=(1, 2, 2), depths=(1, 1, 2), img_size=64 if size < 384 else 80)


register_family("cvt", Cvt, CvtConfig, _PRESETS, meta=_META, reduced=reduced_config)
