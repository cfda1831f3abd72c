"""PVT v1 (Wang et al. 2021): pyramid of spatial-reduction attention stages with learned position embeddings.

Config dataclass -> :class:`PyramidVisionTransformer` -> presets registered as data. timm has no
PVT v1, so the layout is ours, PVTv2's (timm) plus what v1 adds: ``patch_embed.{proj,norm,pos_embed}``
(stem: conv 4x4 stride 4 + LN), ``stages.{i}.downsample.{proj,norm,pos_embed}`` (conv 2x2 stride 2 +
LN, i > 0), ``stages.3.downsample.cls_token`` (the class token joins in stage 4),
``stages.{i}.blocks.{j}.{norm1, attn.{q,kv,sr,norm,proj}, norm2, mlp.{fc1,fc2}}``, the final
``norm`` and ``head.fc``. ``vit_attention.weights.pvt`` converts the original whai362/PVT and the
Hugging Face ``Pvt*`` layouts.

Each stage embeds its input (:class:`PvtEmbed`: conv + LN + its own position table, resampled
bilinearly for other input sizes, from 32 px up with the default ``sr_ratios``: ``model.min_input_size``),
then runs plain-MLP pre-norm blocks of the ``sra`` mechanism
(any registered mechanism can replace it). The last stage prepends the class token: it attends and
is attended (``sr_ratio`` is 1 there), and the head reads it after the final norm.

LayerNorm eps: ``norm_eps`` (blocks, final norm: 1e-6 in the original) and ``embed_norm_eps``
(patch embeddings and the SRA reduction norm: 1e-5 in the original; Hugging Face uses 1e-6 for all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..functional import resample_abs_pos_embed
from ..layers import ClassifierHead, Stage, Tokens, drop_path_schedule, stage_feature_info
from ..layers.conv_embed import ConvEmbed
from ._config import ConfigMixin, check_choice, check_int, check_size
from .backbone import StagedBackbone
from .pvt_v2 import MinInputSizeMixin, check_pyramid, init_pyramid_weights, pyramid_blocks, reduced_config
from .registry import published_meta, register_family

__all__ = ["PvtConfig", "PyramidVisionTransformer", "PvtEmbed"]


class PvtEmbed(ConvEmbed):
    """Patch embedding with a learned position table: ``[B, Cin, H, W]`` / ``[B, H, W, Cin]`` -> ``[B, H', W', C]``.

    ``conv (kernel = stride = patch) -> LN -> + pos_embed -> dropout``. ``grid``: the table's size
    (``img_size / stride`` of the stage); other sizes resample it bilinearly (``align_corners=False``,
    no antialias, as the original). ``class_token``: a learned token is prepended (the
    embedding then gives :class:`~vit_attention.layers.Tokens`) and the table has its row first.
    Keys: ``proj``, ``norm``, ``pos_embed``, ``cls_token``.
    """

    def __init__(self, in_chans: int, embed_dim: int, *, patch_size: int, grid: tuple[int, int],
                 class_token: bool = False, norm_eps: float = 1e-5, drop: float = 0.0,
                 channels_last_input: bool = False) -> None:
        super().__init__(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, norm_eps=norm_eps,
                         channels_last_input=channels_last_input)
        self.grid = (int(grid[0]), int(grid[1]))
        self.num_prefix_tokens = int(class_token)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + self.grid[0] * self.grid[1], embed_dim))
        self.pos_drop = nn.Dropout(drop)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def _pos(self, grid: tuple[int, int]) -> Tensor:
        """The table for ``grid``: ``[1, P + H·W, C]``."""
        return resample_abs_pos_embed(self.pos_embed, grid, self.grid, num_prefix_tokens=self.num_prefix_tokens,
                                      interpolation="bilinear", antialias=False)

    def forward(self, x: Tensor) -> Tensor | Tokens:  # type: ignore[override]
        """``-> [B, H', W', C]`` with the position table added; with a class token
        ``Tokens([B, 1 + H'·W', C], (H', W'), 1)`` (the class token first)."""
        if self.cls_token is not None:
            tokens, grid = self.forward_tokens(x)
            return Tokens(tokens, grid, self.num_prefix_tokens)
        x = super().forward(x)  # [B, H', W', C]
        B, H, W, C = x.shape
        return self.pos_drop(x + self._pos((H, W)).view(1, H, W, C))

    def forward_tokens(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """``-> ([B, P + H'·W', C], (H', W'))``: the class token first, the position table added."""
        x = super().forward(x)  # [B, H', W', C]
        B, H, W, C = x.shape
        x = x.reshape(B, H * W, C)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)  # [B, 1 + H·W, C]
        return self.pos_drop(x + self._pos((H, W))), (H, W)


@dataclass
class PvtConfig(ConfigMixin):
    """Everything a :class:`PyramidVisionTransformer` is built from (JSON-serialisable).

    ``img_size`` sizes the position tables (other sizes resample them). ``global_pool``: ``"token"``
    (the class token, default), ``"avg"`` (mean of the last map) or ``""`` (no pooling).
    ``attn_layer``: any registered mechanism (``sra`` gets ``sr_ratio`` and ``norm_eps =
    embed_norm_eps`` per stage where it takes them).
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["token", "avg", ""] = "token"
    class_token: bool = True
    embed_dims: tuple[int, ...] = (64, 128, 320, 512)
    depths: tuple[int, ...] = (2, 2, 2, 2)
    num_heads: tuple[int, ...] = (1, 2, 5, 8)
    mlp_ratios: tuple[float, ...] = (8.0, 8.0, 4.0, 4.0)
    sr_ratios: tuple[int, ...] = (8, 4, 2, 1)
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    embed_norm_eps: float = 1e-5
    drop_rate: float = 0.0  # after the position embeddings, the attention projection and in the MLP
    proj_drop_rate: float = 0.0  # before the classifier
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    attn_layer: str = "sra"
    attn_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field."""
        n = check_pyramid(self)
        img = check_size(self.img_size, "img_size")
        patch = check_int(self.patch_size, "patch_size")
        stride = patch * 2 ** (n - 1)
        if img[0] % stride or img[1] % stride:
            raise ValueError(f"img_size={self.img_size!r} must be divisible by patch_size * 2^{n - 1} = {stride} "
                             "(the position tables of every stage)")
        check_choice(self.global_pool, "global_pool", ("token", "avg", ""))
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg'")


class PyramidVisionTransformer(MinInputSizeMixin, StagedBackbone):
    """PVT v1 backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the normalised last-stage tokens ``[B, 1 + H/32·W/32, C4]`` (class
    token first; the map ``[B, H/32, W/32, C4]`` without a class token), ``forward_intermediates``
    every stage's map (``NCHW`` by default, stride ``patch·2^i``), ``forward_head`` the class token's
    (or the mean map's) logits.
    """

    family = "pvt"
    config_cls = PvtConfig
    no_weight_decay_keys = ("cls_token",)  # as the original
    pools = ("token", "avg", "")

    def __init__(self, cfg: PvtConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        dims, n = cfg.embed_dims, len(cfg.embed_dims)
        img = check_size(cfg.img_size, "img_size")
        self.global_pool = cfg.global_pool
        self.num_features = dims[-1]
        self.num_prefix_tokens = int(cfg.class_token)
        strides = [cfg.patch_size * 2 ** i for i in range(n)]

        def embed(i: int) -> PvtEmbed:
            return PvtEmbed(cfg.in_chans if i == 0 else dims[i - 1], dims[i], patch_size=cfg.patch_size if i == 0
                            else 2, grid=(img[0] // strides[i], img[1] // strides[i]),
                            class_token=cfg.class_token and i == n - 1, norm_eps=cfg.embed_norm_eps,
                            drop=cfg.drop_rate, channels_last_input=i > 0)

        self.patch_embed = embed(0)
        self.stages = nn.Sequential(*[Stage(pyramid_blocks(cfg, i, dpr), embed(i) if i > 0 else None)
                                      for i, dpr in enumerate(drop_path_schedule(cfg.drop_path_rate, cfg.depths))])
        self.feature_info = stage_feature_info(dims, strides, "stages")
        self.norm = nn.LayerNorm(dims[-1], eps=cfg.norm_eps)
        self.head = ClassifierHead(dims[-1], cfg.num_classes, global_pool="", drop=cfg.proj_drop_rate)
        init_pyramid_weights(self)
        for m in self.modules():  # the position tables and the class token: trunc-normal(0.02) as the original
            if isinstance(m, PvtEmbed):
                nn.init.trunc_normal_(m.pos_embed, std=0.02)
                if m.cls_token is not None:
                    nn.init.trunc_normal_(m.cls_token, std=0.02)
        self._set_min_input(self.stages, strides, img)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Change the input size for good: every stage's position table ``[1, P + H_i·W_i, C_i]`` is resampled
        to the new grid ``img_size / stride_i`` as the forward resamples it for another size (bilinear,
        no antialias: PVT's rule), and ``cfg.img_size`` records the size. ``img_size`` below
        :attr:`min_input_size` raises ``ValueError`` naming it, before anything changes."""
        if img_size is None:
            return
        img = check_size(img_size, "img_size")
        self._check_img_size(img)
        embeds = [self.patch_embed] + [st.downsample for st in self.stages if isinstance(st.downsample, PvtEmbed)]
        strides = [info["reduction"] for info in self.feature_info]
        with torch.no_grad():
            for embed, stride in zip(embeds, strides, strict=True):
                grid = (img[0] // stride, img[1] // stride)
                table = embed._pos(grid).detach().contiguous()  # [1, P + H_i·W_i, C_i]
                embed.pos_embed = nn.Parameter(table, requires_grad=embed.pos_embed.requires_grad)
                embed.grid = grid
        self.cfg.img_size = img[0] if img[0] == img[1] else img

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> ``[B, H/p, W/p, C1]`` (conv + LN + position table).

        An input below :attr:`min_input_size` raises ``ValueError`` saying the minimum.
        """
        self._check_input(x)
        return self.patch_embed(x)


# ---------------------------------------------------------------------------- presets (data)
_DEPTHS = {"tiny": (2, 2, 2, 2), "small": (3, 4, 6, 3), "medium": (3, 4, 18, 3), "large": (3, 8, 27, 3)}
_PRESETS: dict[str, dict[str, Any]] = {f"pvt_{k}": dict(depths=d) for k, d in _DEPTHS.items()}

# Published sizes at 224: params from the PVT README, GMACs measured on HF PvtModel (transformers 5.23.0).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "pvt_tiny": (13.23, 1.93), "pvt_small": (24.49, 3.82), "pvt_medium": (44.21, 6.66), "pvt_large": (61.37, 9.81),
}

register_family("pvt", PyramidVisionTransformer, PvtConfig, _PRESETS,
                meta=published_meta(_PUBLISHED, "PVT README (params); HF PvtModel on the meta device with "
                                                "FlopCounterMode (GMACs), transformers 5.23.0"),
                reduced=reduced_config)  # PVTv2's rule: 4 stages of width 16-32, 2 blocks each, 64 px
