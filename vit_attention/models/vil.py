"""ViL, the Multi-Scale Vision Longformer (Zhang et al. 2021, ``microsoft/vision-longformer`` ``MsViT``).

Four stages; each embeds its input with its own patch embedding (conv ``p x p`` stride ``p`` + LN),
prepends its own ``G`` global tokens and adds its own absolute position embedding (a row table and a
column table of ``C/2`` each, concatenated, plus one row per global token), then runs pre-norm blocks.
Stages marked sparse use ``longformer2d`` (3x3 chunks of ``w x w`` + globals); the others global
attention (``mhsa``, the original's ``Attention`` with packed ``qkv``). Global tokens are dropped
between stages; the head reads the mean of the last stage's tokens (ViL's last stage has no global
token; with one, ``global_pool="token"`` reads it as the original does).

Layout (ours, hierarchical): ``stages.{i}.downsample.{proj, norm, cls_token, cls_pos_embed, x_pos_embed,
y_pos_embed}``, ``stages.{i}.blocks.{j}.{norm1, attn.*, norm2, mlp.{fc1, fc2}}``, ``norm``, ``head.fc``.
``vit_attention.weights.vil`` converts the original's ``layer{i}.{k}`` Sequential layout (a patch
embedding, then alternating ``AttnBlock`` / ``MlpBlock`` modules).

LayerNorm eps 1e-6 everywhere (the original's ``LN_EPS`` option never reaches its layers: the
model builds them from the ``norm_layer`` argument, whose eps is 1e-6).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import Block, ClassifierHead, Stage, Tokens, drop_path_schedule, stage_feature_info
from ..layers.block import accepted_kwargs
from ..layers.conv_embed import ConvEmbed
from ._config import ConfigMixin, check_attn_layer, check_choice, check_common, check_float, check_int_seq, check_size
from .backbone import StagedBackbone
from .pvt_v2 import init_pyramid_weights
from .registry import register_family

__all__ = ["VilConfig", "VisionLongformer", "VilEmbed", "reduced_config"]


class VilEmbed(ConvEmbed):
    """ViL's per-stage embedding: ``[B, Cin, H, W]`` (or channels-last) -> ``([B, G + H'·W', C], (H', W'))``.

    ``conv (kernel = stride = patch) -> LN``, then ``G`` global tokens in front and the absolute
    position embedding: token ``(r, c)`` gets ``[x_pos_embed[r] | y_pos_embed[c]]`` (``C/2`` each),
    global ``g`` gets ``cls_pos_embed[g]``. ``grid``: the tables' size; another input size resamples
    the row / column tables linearly (the original accepts its training size only).
    Keys: ``proj``, ``norm``, ``cls_token``, ``cls_pos_embed``, ``x_pos_embed``, ``y_pos_embed``.
    """

    def __init__(self, in_chans: int, embed_dim: int, *, patch_size: int, grid: tuple[int, int],
                 num_global_tokens: int = 1, norm_eps: float = 1e-6, drop: float = 0.0,
                 channels_last_input: bool = False) -> None:
        super().__init__(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, norm_eps=norm_eps,
                         channels_last_input=channels_last_input)
        if embed_dim % 2:
            raise ValueError(f"embed_dim must be even (row and column tables of C/2), got {embed_dim}")
        self.grid = (int(grid[0]), int(grid[1]))
        self.num_prefix_tokens = G = int(num_global_tokens)
        self.cls_token = nn.Parameter(torch.zeros(1, G, embed_dim)) if G else None
        self.cls_pos_embed = nn.Parameter(torch.zeros(1, G, embed_dim)) if G else None
        self.x_pos_embed = nn.Parameter(torch.zeros(1, self.grid[0], embed_dim // 2))
        self.y_pos_embed = nn.Parameter(torch.zeros(1, self.grid[1], embed_dim // 2))
        self.pos_drop = nn.Dropout(drop)
        for p in (self.cls_token, self.cls_pos_embed, self.x_pos_embed, self.y_pos_embed):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)

    @staticmethod
    def _table(t: Tensor, n: int) -> Tensor:
        """``[1, L, C/2]`` -> ``[1, n, C/2]`` (linear resampling when ``n != L``)."""
        if t.shape[1] == n:
            return t
        return F.interpolate(t.transpose(1, 2), size=n, mode="linear", align_corners=False).transpose(1, 2)

    def forward(self, x: Tensor) -> Tokens:  # type: ignore[override]
        """``-> Tokens([B, G + H'·W', C], (H', W'), G)`` (the stage's blocks take them as they are)."""
        x = super().forward(x)  # [B, H', W', C]
        H, W = x.shape[1], x.shape[2]
        rows = self._table(self.x_pos_embed, H)[:, :, None].expand(-1, -1, W, -1)  # [1, H, W, C/2]
        cols = self._table(self.y_pos_embed, W)[:, None].expand(-1, H, -1, -1)  # [1, H, W, C/2]
        x = (x + torch.cat([rows, cols], dim=-1)).flatten(1, 2)  # [B, H·W, C]
        if self.cls_token is not None:
            like = x[:, :1].expand(-1, self.num_prefix_tokens, -1)  # [B, G, C] (batch-size-agnostic in exports)
            glob = (self.cls_token + self.cls_pos_embed).expand_as(like)  # [B, G, C]
            x = torch.cat([glob, x], dim=1)  # [B, G + H·W, C]
        return Tokens(self.pos_drop(x), (H, W), self.num_prefix_tokens)


@dataclass
class VilConfig(ConfigMixin):
    """Everything a :class:`VisionLongformer` is built from (JSON-serialisable); the original's arch string
    ``l{i},h{heads},d{dim},n{depth},s{sparse},g{globals},p{patch},f{window}`` per stage, as fields.

    ``attn_layer``: the mechanism of the sparse stages (``longformer2d`` gets ``window_size``,
    ``share_weights``, ``num_global_tokens`` where it takes them); the other stages use ``mhsa``.
    ``global_pool``: ``"avg"`` (mean of the last stage's tokens), ``"token"`` (its first global token)
    or ``""``.
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", "token", ""] = "avg"
    embed_dims: tuple[int, ...] = (48, 96, 192, 384)
    depths: tuple[int, ...] = (1, 1, 9, 1)
    num_heads: tuple[int, ...] = (1, 3, 3, 6)
    patch_sizes: tuple[int, ...] = (4, 2, 2, 2)
    num_global_tokens: tuple[int, ...] = (1, 1, 1, 0)
    sparse: tuple[bool, ...] = (True, True, False, False)
    window_sizes: tuple[int, ...] = (7, 7, 7, 7)
    share_weights: bool = True
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    attn_layer: str = "longformer2d"
    attn_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field."""
        img = check_common(self, pools=None)
        depths = check_int_seq(self.depths, "depths", min_value=0)
        n = len(depths)
        dims = check_int_seq(self.embed_dims, "embed_dims", length=n)
        heads = check_int_seq(self.num_heads, "num_heads", length=n)
        patches = check_int_seq(self.patch_sizes, "patch_sizes", length=n)
        check_int_seq(self.num_global_tokens, "num_global_tokens", min_value=0, length=n)
        check_int_seq(self.window_sizes, "window_sizes", length=n)
        if len(self.sparse) != n or not all(isinstance(s, bool) for s in self.sparse):
            raise ValueError(f"sparse must be {n} bools (one per stage), got {self.sparse!r}")
        for i, (d, h) in enumerate(zip(dims, heads)):
            if d % h or d % 2:
                raise ValueError(f"stage {i} width embed_dims[{i}]={d} must be even and divisible by "
                                 f"num_heads[{i}]={h}")
        stride = 1
        for p in patches:
            stride *= p
        if img[0] % stride or img[1] % stride:
            raise ValueError(f"img_size={self.img_size!r} must be divisible by the total stride {stride}")
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_float(self.norm_eps, "norm_eps", low_open=True)
        check_choice(self.global_pool, "global_pool", ("avg", "token", ""))
        if self.global_pool == "token" and not self.num_global_tokens[-1]:
            raise ValueError("global_pool='token' needs a global token in the last stage (num_global_tokens[-1] > 0)")
        check_attn_layer(self.attn_layer, self.attn_kwargs)


class VisionLongformer(StagedBackbone):
    """ViL backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the last stage's normalised tokens ``[B, G4 + H/32·W/32, C4]`` (globals first),
    ``forward_intermediates`` every stage's map (globals left out; ``NCHW`` by default, stride
    ``prod(patch_sizes[:i+1])``), ``forward_head`` the pooled logits.
    """

    family = "vil"
    config_cls = VilConfig
    no_weight_decay_keys = ("cls_token", "pos_embed")  # global tokens and position tables, as the original
    pools = ("avg", "token", "")
    avg_pool_prefix = True  # "avg": the mean of every token, globals included, as the original

    def __init__(self, cfg: VilConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        dims = cfg.embed_dims
        img = check_size(cfg.img_size, "img_size")
        self.global_pool, self.num_features = cfg.global_pool, dims[-1]
        self.num_global = tuple(int(g) for g in cfg.num_global_tokens)
        self.num_prefix_tokens = self.num_global[-1]
        strides = self._strides()
        norm = partial(nn.LayerNorm, eps=cfg.norm_eps)
        stages = []
        for i, dpr in enumerate(drop_path_schedule(cfg.drop_path_rate, cfg.depths)):
            embed = VilEmbed(cfg.in_chans if i == 0 else dims[i - 1], dims[i], patch_size=cfg.patch_sizes[i],
                             grid=(img[0] // strides[i], img[1] // strides[i]), num_global_tokens=self.num_global[i],
                             norm_eps=cfg.norm_eps, drop=cfg.drop_rate, channels_last_input=i > 0)
            layer = cfg.attn_layer if cfg.sparse[i] else "mhsa"
            kw: dict[str, Any] = {}
            if cfg.sparse[i]:
                kw = {**accepted_kwargs(layer, dict(window_size=cfg.window_sizes[i], share_weights=cfg.share_weights,
                                                    num_global_tokens=self.num_global[i])), **cfg.attn_kwargs}
            blocks = [Block(dims[i], cfg.num_heads[i], mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                            drop=cfg.drop_rate, attn_drop=cfg.attn_drop_rate, drop_path=dp, norm_layer=norm,
                            attn_layer=layer, attn_kwargs=kw, depth_index=sum(cfg.depths[:i]) + j)
                      for j, dp in enumerate(dpr)]
            stages.append(Stage(blocks, embed))
        self.stages = nn.Sequential(*stages)
        self.feature_info = stage_feature_info(dims, strides, "stages")
        self.norm = norm(dims[-1])
        self.head = ClassifierHead(dims[-1], cfg.num_classes, global_pool="")
        init_pyramid_weights(self)
        for m in self.modules():  # LayerNorm weight 1 / bias 0 is torch's default; tables trunc-normal(0.02)
            if isinstance(m, VilEmbed):
                for p in (m.cls_token, m.cls_pos_embed, m.x_pos_embed, m.y_pos_embed):
                    if p is not None:
                        nn.init.trunc_normal_(p, std=0.02)

    def _strides(self) -> list[int]:
        """Each stage's total stride ``prod(patch_sizes[:i+1])``."""
        strides, s = [], 1
        for p in self.cfg.patch_sizes:
            s *= p
            strides.append(s)
        return strides

    def _check_img_size(self, img_size: tuple[int, int]) -> None:
        """The config's rule: ``img_size`` divisible by the total stride (every stage's grid whole)."""
        stride = self._strides()[-1]
        if img_size[0] % stride or img_size[1] % stride:
            size = img_size[0] if img_size[0] == img_size[1] else img_size
            raise ValueError(f"img_size={size!r} must be divisible by the total stride {stride}")

    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Change the nominal input size for good: each stage's row / column position tables
        ``x_pos_embed [1, H_i, C_i/2]`` / ``y_pos_embed [1, W_i, C_i/2]`` are resampled to the new grid
        ``img_size / stride_i`` by the rule the forward uses at another size (linear, as
        :meth:`VilEmbed._table`); the global tokens' rows do not depend on the size, and the windows
        (Longformer chunks, padded bottom / right) take any map. ``cfg.img_size`` records the size.
        An ``img_size`` not divisible by the total stride raises ``ValueError`` naming it, before
        anything changes."""
        if img_size is None:
            return
        img = check_size(img_size, "img_size")
        self._check_img_size(img)
        with torch.no_grad():
            for stage, stride in zip(self.stages, self._strides(), strict=True):
                embed = stage.downsample
                grid = (img[0] // stride, img[1] // stride)
                for name, n in (("x_pos_embed", grid[0]), ("y_pos_embed", grid[1])):
                    old = getattr(embed, name)
                    table = VilEmbed._table(old.detach(), n).clone().contiguous()
                    setattr(embed, name, nn.Parameter(table, requires_grad=old.requires_grad))
                embed.grid = grid
        self.cfg.img_size = img[0] if img[0] == img[1] else img

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` as they are: every stage embeds its own input (the first one the images)."""
        return x


# ---------------------------------------------------------------------------- presets (data)
# The original's arch strings (vision-longformer README); base models at 384 with windows (6|8, 8, 7, 7).
_PRESETS: dict[str, dict[str, Any]] = {
    "vil_tiny": dict(embed_dims=(48, 96, 192, 384), depths=(1, 1, 9, 1), num_heads=(1, 3, 3, 6)),
    "vil_small": dict(embed_dims=(96, 192, 384, 768), depths=(1, 2, 8, 1), num_heads=(3, 3, 6, 12)),
    "vil_medium_deep": dict(embed_dims=(96, 192, 384, 768), depths=(1, 4, 16, 1), num_heads=(3, 3, 6, 12)),
    "vil_medium_wide": dict(embed_dims=(192, 384, 512, 768), depths=(1, 2, 8, 1), num_heads=(3, 6, 8, 12)),
    "vil_base_deep": dict(img_size=384, embed_dims=(96, 192, 384, 768), depths=(1, 8, 24, 1),
                          num_heads=(3, 3, 6, 12), window_sizes=(6, 8, 7, 7)),
    "vil_base_wide": dict(img_size=384, embed_dims=(192, 384, 768, 1024), depths=(1, 2, 8, 1),
                          num_heads=(3, 6, 12, 16), window_sizes=(8, 8, 7, 7)),
}

# Published sizes (vision-longformer README): params (M), GMACs (224; base: 384).
_PUBLISHED: dict[str, tuple[float, float]] = {
    "vil_tiny": (6.7, 1.43), "vil_small": (24.6, 5.12), "vil_medium_deep": (39.7, 9.1), "vil_medium_wide": (39.8, 11.3),
    "vil_base_deep": (55.7, 45.3), "vil_base_wide": (79.0, 55.8),
}
_SOURCE = "vision-longformer README (the original's compute_macs hooks)"
# The original's own MAC hook undercounts the attention slightly (it mixes token and channel counts), so at
# 384 base-wide measures 56.9 GMACs (2.0% over 55.8): its figure is kept as a note, not as a tested value.
_UNMATCHED_GMACS = {"vil_base_wide"}


def _meta(name: str) -> dict[str, Any]:
    params, gmacs = _PUBLISHED[name]
    if name in _UNMATCHED_GMACS:
        return {"published_params_m": params, "paper_gmacs": gmacs, "paper_gmacs_source": _SOURCE}
    return {"published_params_m": params, "published_gmacs": gmacs, "published_gmacs_source": _SOURCE}


def reduced_config(cfg: VilConfig) -> dict[str, Any]:
    """Overrides that shrink a ViL preset for tests: 4 stages of width 16-32, depths 1-2, 2 heads, 64 px (maps
    16 -> 2); windows of 3, so the Longformer stages (16x16, 8x8) have chunks beyond the 3x3 block and bottom /
    right padding; the globals per stage kept."""
    n = len(cfg.depths)
    return dict(embed_dims=(16,) + (32,) * (n - 1), depths=(1, 2) + (1,) * (n - 2), num_heads=(2,) * n,
                window_sizes=(3,) * n, img_size=64)


register_family("vil", VisionLongformer, VilConfig, _PRESETS, meta={k: _meta(k) for k in _PUBLISHED},
                reduced=reduced_config)
