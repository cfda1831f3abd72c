"""MViTv2 (Li et al., "MViTv2: Improved Multiscale Vision Transformers for Classification and Detection", CVPR
2022, arXiv 2112.01526): the ImageNet classifiers.

Config dataclass -> :class:`MViTv2` -> presets registered as data (timm 1.0.31's names and configs,
``timm/models/mvitv2.py``, ported from facebookresearch/mvit):

* patch embedding: conv 7x7 stride 4 padding 3 (``3 -> C_0``, with bias) -> tokens on the ``H/4 x W/4`` grid; the
  ``*_cls`` presets put a class token in front (no absolute position embedding in any preset);
* four stages of :class:`MultiScaleBlock` on the ``pooling`` mechanism (:mod:`vit_attention.attention.pooling`:
  conv-pooled q / k / v, decomposed relative positions on the pooled grids, the pooled query added back). Widths
  and heads double per stage (``C_0``, ``2·C_0``, ...; ``nh_0``, ``2·nh_0``, ...). The first block of stages 1-3
  pools its queries with stride 2 (the grid halves: 56 -> 28 -> 14 -> 7 at 224 px) and its shortcut with a 3x3
  stride-2 max pool; keys and values are pooled with stride 4, 2, 1, 1 (the adaptive rule: 4 divided by every
  query stride so far). The width changes in the attention of each stage's first block (``expand_attn``: its qkv
  projects to the new width, the shortcut is ``Linear(LN1(x))``) or, in ``mvitv2_large``, in the MLP of each
  stage's last block (the shortcut ``Linear(LN2(x))``); an unprojected shortcut is ``x`` itself, not normalised;
* head: LayerNorm, then the mean of the grid tokens (or the class token, ``*_cls``), dropout, linear.

Layout: channels-last maps ``[B, H, W, C]`` between the stages (tokens with the class token in front,
:class:`~vit_attention.layers.Tokens`, for the ``*_cls`` presets); state-dict keys are timm's
(``patch_embed.proj``, ``stages.{s}.blocks.{j}.{norm1, attn.*, shortcut_proj_attn, norm2, mlp.fc1, mlp.fc2,
shortcut_proj_mlp}``, ``norm``, ``head.fc``, ``cls_token``). timm's ``mode="conv"``, ``pool_first=False``,
``use_abs_pos=False`` and ``rel_pos_type="spatial"`` are the only choices (those of every preset).

Sizes: each block's relative-position tables are built for the grid of ``img_size`` (timm's floor-divided
grids: ``2·max(H // s_q, H // s_kv) - 1`` rows); another input size reads them resized linearly and
:meth:`MViTv2.set_input_size` resizes them for good (timm's checkpoint-filter rule). Non-square sizes build one
table per axis (timm builds square only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..attention.base import AttentionCall
from ..attention.pooling import PoolingAttention, PoolingAttentionTransition
from ..layers import DropPath, Tokens, drop_path_schedule, stage_feature_info
from ..layers.head import ClassifierHead
from ..layers.mlp import Mlp
from ._config import ConfigMixin, check_common, check_float, check_int, check_int_seq, check_size
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["MViTv2Config", "MViTv2", "MultiScaleBlock", "MViTv2Stage", "block_schedule", "reduced_config"]


@dataclass
class MViTv2Config(ConfigMixin):
    """Everything an :class:`MViTv2` is built from (JSON-serialisable; timm's ``MultiScaleVitCfg`` fields).

    ``embed_dim`` / ``num_heads``: an int (doubled per stage) or one entry per stage; ``depths``: blocks per stage;
    ``stride_q``: the query stride of each stage's first block; ``stride_kv_adaptive``: the key / value stride of
    the first stage, divided by each stage's query stride; ``kernel_qkv``: the pooling convs' kernel.
    ``expand_attn``: the width changes in the attention of a stage's first block (False: in the MLP of its last
    block). ``use_cls_token``: a class token in front (its pooling: ``global_pool="token"``).
    ``residual_cls``: the residual pooling adds the pooled query to the class row too (timm; False: the original
    repository and torchvision leave it out).
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", "token", ""] = "avg"
    depths: tuple[int, ...] = (2, 3, 16, 3)
    embed_dim: int | tuple[int, ...] = 96
    num_heads: int | tuple[int, ...] = 1
    mlp_ratio: float = 4.0
    expand_attn: bool = True
    qkv_bias: bool = True
    use_cls_token: bool = False
    residual_pooling: bool = True
    residual_cls: bool = True
    kernel_qkv: int = 3
    stride_q: tuple[int, ...] = (1, 2, 2, 2)
    stride_kv_adaptive: int = 4
    patch_kernel: int = 7
    patch_stride: int = 4
    patch_padding: int = 3
    norm_eps: float = 1e-6
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self, ("avg", "token", ""))
        depths = check_int_seq(self.depths, "depths", min_value=1)
        n = len(depths)
        for name in ("embed_dim", "num_heads"):
            value = getattr(self, name)
            if isinstance(value, (tuple, list)):
                check_int_seq(value, name, length=n)
            else:
                check_int(value, name)
        check_int_seq(self.stride_q, "stride_q", length=n)
        dims, heads = stage_dims(self), stage_heads(self)
        for i in range(n):
            att = dims[i] if self.expand_attn else (dims[i - 1] if i else dims[0])
            for width in {att, dims[i]}:
                if width % heads[i]:
                    raise ValueError(f"stage {i}: width {width} must be divisible by num_heads {heads[i]}")
        for name in ("kernel_qkv", "stride_kv_adaptive", "patch_kernel", "patch_stride"):
            check_int(getattr(self, name), name)
        check_int(self.patch_padding, "patch_padding", min_value=0)
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_float(self.norm_eps, "norm_eps", low_open=True)
        for name in ("expand_attn", "qkv_bias", "use_cls_token", "residual_pooling", "residual_cls"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.global_pool == "token" and not self.use_cls_token:
            raise ValueError("global_pool='token' needs the class token (use_cls_token=True)")


def stage_dims(cfg: MViTv2Config) -> tuple[int, ...]:
    """``embed_dim`` per stage (an int doubles per stage, timm's rule)."""
    n = len(cfg.depths)
    e = cfg.embed_dim
    return tuple(e) if isinstance(e, (tuple, list)) else tuple(e * 2 ** i for i in range(n))


def stage_heads(cfg: MViTv2Config) -> tuple[int, ...]:
    """``num_heads`` per stage (an int doubles per stage)."""
    n = len(cfg.depths)
    h = cfg.num_heads
    return tuple(h) if isinstance(h, (tuple, list)) else tuple(h * 2 ** i for i in range(n))


def stage_out_dims(cfg: MViTv2Config) -> tuple[int, ...]:
    """The width each stage outputs: ``embed_dim[i]`` (``expand_attn``), else ``embed_dim[i + 1]`` (the last
    stage keeps its own)."""
    dims = stage_dims(cfg)
    n = len(dims)
    return dims if cfg.expand_attn else tuple(dims[min(i + 1, n - 1)] for i in range(n))


def kv_strides(cfg: MViTv2Config) -> tuple[int, ...]:
    """Key / value stride per stage: ``stride_kv_adaptive`` divided by each query stride so far (min 1)."""
    s, out = cfg.stride_kv_adaptive, []
    for sq in cfg.stride_q:
        if sq > 1:
            s = max(s // sq, 1)
        out.append(s)
    return tuple(out)


def block_schedule(cfg: MViTv2Config, img_size: Any = None) -> list[list[dict[str, Any]]]:
    """Per stage, per block: ``dim``, ``dim_out``, ``att_dim``, ``num_heads``, ``stride_q``, ``stride_kv`` and the
    ``input_size`` grid its tables are built for (timm's floor-divided grids of ``img_size``, default the config's)."""
    h, w = check_size(cfg.img_size if img_size is None else img_size, "img_size")
    grid = (h // cfg.patch_stride, w // cfg.patch_stride)
    dims, heads, outs, kvs = stage_dims(cfg), stage_heads(cfg), stage_out_dims(cfg), kv_strides(cfg)
    dim = dims[0]
    stages = []
    for i, depth in enumerate(cfg.depths):
        out_dims = (outs[i],) * depth if cfg.expand_attn else (dim,) * (depth - 1) + (outs[i],)
        blocks = []
        for j in range(depth):
            sq = cfg.stride_q[i] if j == 0 else 1
            blocks.append(dict(dim=dim, dim_out=out_dims[j], att_dim=out_dims[j] if cfg.expand_attn else dim,
                               num_heads=heads[i], stride_q=sq, stride_kv=kvs[i], input_size=grid))
            dim = out_dims[j]
            if j == 0:
                grid = (grid[0] // sq, grid[1] // sq)
        stages.append(blocks)
    return stages


def _map_pool(x: Tensor, pool: nn.Module, grid: tuple[int, int], P: int) -> Tensor:
    """``pool`` on the grid tokens of ``x [B, P + H·W, C]`` (prefix tokens kept): ``[B, P + h·w, C]``."""
    B, _, C = x.shape
    m = x[:, P:].reshape(B, grid[0], grid[1], C).permute(0, 3, 1, 2)  # [B, C, H, W]
    m = pool(m)
    m = m.flatten(2).transpose(1, 2)  # [B, h·w, C]
    return torch.cat([x[:, :P], m], dim=1) if P else m


class MultiScaleBlock(nn.Module):
    """One MViTv2 block on tokens ``[B, P + H·W, C_in] -> [B, P + h·w, C_out]`` (``h = ceil(H / s_q)``).

    ``x = shortcut + attn(LN1(x))``, the shortcut ``x`` (or ``Linear(LN1(x))`` when the attention widens), max-pooled
    3x3 stride ``s_q`` when the queries are strided; then ``x = (x or Linear(LN2(x))) + mlp(LN2(x))``. ``attn``: the
    registered ``pooling`` mechanism where the block keeps the grid and the width, else
    :class:`~vit_attention.attention.pooling.PoolingAttentionTransition`. Keys: timm's ``MultiScaleBlock``.
    """

    def __init__(self, dim: int, dim_out: int, num_heads: int, *, att_dim: int, input_size: tuple[int, int],
                 stride_q: int = 1, stride_kv: int = 1, kernel_size: int = 3, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, residual_pooling: bool = True, residual_cls: bool = True,
                 norm_eps: float = 1e-6, drop_path: float = 0.0) -> None:
        super().__init__()
        self.dim, self.dim_out, self.stride_q = dim, dim_out, stride_q
        expand = att_dim != dim
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.shortcut_proj_attn = nn.Linear(dim, dim_out) if expand and dim != dim_out else None
        self.shortcut_pool_attn = nn.MaxPool2d(stride_q + 1, stride_q, (stride_q + 1) // 2) if stride_q > 1 \
            else None
        common = dict(stride_kv=stride_kv, kernel_size=kernel_size, input_size=input_size, qkv_bias=qkv_bias,
                      residual_pooling=residual_pooling, residual_cls=residual_cls, norm_eps=norm_eps)
        if stride_q == 1 and att_dim == dim:
            self.attn: nn.Module = PoolingAttention(dim, num_heads, **common)
        else:
            self.attn = PoolingAttentionTransition(dim, att_dim, num_heads, stride_q=stride_q, **common)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(att_dim, eps=norm_eps)
        self.shortcut_proj_mlp = nn.Linear(dim, dim_out) if not expand and dim != dim_out else None
        self.mlp = Mlp(att_dim, int(att_dim * mlp_ratio), dim_out)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, grid: tuple[int, int], num_prefix_tokens: int = 0) -> tuple[Tensor, tuple[int, int]]:
        """``x [B, P + H·W, C_in]`` on ``grid`` -> ``([B, P + h·w, C_out], (h, w))``."""
        P = num_prefix_tokens
        u = self.norm1(x)
        shortcut = x if self.shortcut_proj_attn is None else self.shortcut_proj_attn(u)
        if self.shortcut_pool_attn is not None:
            shortcut = _map_pool(shortcut, self.shortcut_pool_attn, grid, P)
        call = AttentionCall(grid, num_prefix_tokens=P)
        if isinstance(self.drop_path1, nn.Identity):
            x = self.attn(u, AttentionCall(grid, num_prefix_tokens=P, residual=shortcut))  # the add fused
        else:
            x = shortcut + self.drop_path1(self.attn(u, call))
        grid = self.attn.q_grid(grid)  # type: ignore[operator]
        u = self.norm2(x)
        shortcut = x if self.shortcut_proj_mlp is None else self.shortcut_proj_mlp(u)
        return shortcut + self.drop_path2(self.mlp(u)), grid


class MViTv2Stage(nn.Module):
    """The blocks of one stage: a map ``[B, H, W, C]`` (or :class:`~vit_attention.layers.Tokens` with the class
    token) -> the same kind on the stage's output grid. Keys ``blocks.{j}.*`` (timm's ``MultiScaleVitStage``)."""

    def __init__(self, blocks: Sequence[MultiScaleBlock]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.grad_checkpointing = False

    def forward(self, x: Tensor | Tokens) -> Tensor | Tokens:
        """``[B, H, W, C] -> [B, h, w, C']``, or :class:`Tokens` -> :class:`Tokens`."""
        if isinstance(x, Tokens):
            t, grid, P = x.x, tuple(x.feat_size), x.num_prefix_tokens
        else:
            B, H, W, C = x.shape
            t, grid, P = x.reshape(B, H * W, C), (H, W), 0
        for blk in self.blocks:
            if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
                t, grid = torch.utils.checkpoint.checkpoint(blk, t, grid, P, use_reentrant=False)
            else:
                t, grid = blk(t, grid, P)
        if isinstance(x, Tokens):
            return Tokens(t, (int(grid[0]), int(grid[1])), P)
        return t.reshape(t.shape[0], grid[0], grid[1], t.shape[-1])


class PatchEmbed(nn.Module):
    """Conv ``k x k`` stride ``s`` padding ``p`` (with bias): ``[B, Cin, H, W] -> [B, H', W', C]`` (key ``proj``)."""

    def __init__(self, in_chans: int, dim: int, kernel: int = 7, stride: int = 4, padding: int = 3) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel, stride, padding)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, H', W', C]`` (channels-last)."""
        return self.proj(x).permute(0, 2, 3, 1)


class MViTv2(StagedBackbone):
    """MViTv2 backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the normalised last stage: a map ``[B, H/32, W/32, C]``, or tokens
    ``[B, 1 + H/32·W/32, C]`` with the class token (``*_cls``); ``forward_intermediates`` each stage's map
    (strides 4, 8, 16, 32).
    """

    family = "mvitv2"
    config_cls = MViTv2Config
    pools = ("avg", "token", "")
    no_weight_decay_keys = ("rel_pos_h", "rel_pos_w", "cls_token")
    token_merging_note = ("its attention pools queries, keys and values by convolutions over the token grid and reads "
                          "relative positions by each token's grid cell: merged tokens have neither")

    def __init__(self, cfg: MViTv2Config | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        dims = stage_dims(cfg)
        self.global_pool = cfg.global_pool
        self.patch_embed = PatchEmbed(cfg.in_chans, dims[0], cfg.patch_kernel, cfg.patch_stride, cfg.patch_padding)
        self.num_prefix_tokens = 1 if cfg.use_cls_token else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dims[0])) if cfg.use_cls_token else None
        rates = drop_path_schedule(cfg.drop_path_rate, cfg.depths)
        stages = []
        for i, sched in enumerate(block_schedule(cfg)):
            stages.append(MViTv2Stage([
                MultiScaleBlock(b["dim"], b["dim_out"], b["num_heads"], att_dim=b["att_dim"],
                                input_size=b["input_size"], stride_q=b["stride_q"], stride_kv=b["stride_kv"],
                                kernel_size=cfg.kernel_qkv, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                                residual_pooling=cfg.residual_pooling, residual_cls=cfg.residual_cls,
                                norm_eps=cfg.norm_eps, drop_path=rates[i][j]) for j, b in enumerate(sched)]))
        self.stages = nn.Sequential(*stages)
        outs = stage_out_dims(cfg)
        reductions, r = [], cfg.patch_stride
        for s in cfg.stride_q:
            r *= s
            reductions.append(r)
        self.feature_info = stage_feature_info(outs, reductions, "stages")
        self.num_features = outs[-1]
        self.norm = nn.LayerNorm(outs[-1], eps=cfg.norm_eps)
        self.head = ClassifierHead(outs[-1], cfg.num_classes, global_pool="", drop=cfg.drop_rate)
        self._init_weights()

    def _init_weights(self) -> None:
        """timm's init: every linear layer truncated normal (std 0.02) with zero bias, the class token too."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def _embed(self, x: Tensor) -> Tensor | Tokens:
        """Images ``[B, Cin, H, W]`` -> the first stage's map ``[B, H/4, W/4, C_0]``, or :class:`Tokens` with the
        class token in front."""
        self.check_channels(x)
        m = self.patch_embed(x)  # [B, H', W', C]
        if self.cls_token is None:
            return m
        B, H, W, C = m.shape
        t = torch.cat([self.cls_token.expand(B, -1, -1).to(m.dtype), m.reshape(B, H * W, C)], dim=1)
        return Tokens(t, (H, W), 1)

    # ------------------------------------------------------------------ input size
    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Change the nominal input size permanently, in place: every block's tables are resized linearly to the
        lengths of the new grids (timm's checkpoint-filter rule) and ``cfg.img_size`` records the size. Without
        it, another size still runs (the tables are read resized on each call)."""
        if img_size is None:
            return
        img = check_size(img_size, "img_size")
        for stage, sched in zip(self.stages, block_schedule(self.cfg, img)):
            for blk, b in zip(stage.blocks, sched):
                blk.attn.set_input_size(b["input_size"])
        self.cfg.img_size = img[0] if img[0] == img[1] else img


# ---------------------------------------------------------------------------- presets (data)
_PRESETS: dict[str, dict[str, Any]] = {
    "mvitv2_tiny": dict(depths=(1, 2, 5, 2)),
    "mvitv2_small": dict(depths=(1, 2, 11, 2)),
    "mvitv2_base": dict(depths=(2, 3, 16, 3)),
    "mvitv2_large": dict(depths=(2, 6, 36, 4), embed_dim=144, num_heads=2, expand_attn=False),
    "mvitv2_small_cls": dict(depths=(1, 2, 11, 2), use_cls_token=True, global_pool="token"),
    "mvitv2_base_cls": dict(depths=(2, 3, 16, 3), use_cls_token=True, global_pool="token"),
    "mvitv2_large_cls": dict(depths=(2, 6, 36, 4), embed_dim=144, num_heads=2, use_cls_token=True,
                             global_pool="token"),
    "mvitv2_huge_cls": dict(depths=(4, 8, 60, 8), embed_dim=192, num_heads=3, use_cls_token=True,
                            global_pool="token"),
}

# timm 1.0.31 parameters on the meta device (the default tag's head: 1000 classes, 19168 for the *_cls in21k tags,
# 1000 for the untrained mvitv2_small_cls), and GMACs at 224 px from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs)
_PUBLISHED: dict[str, tuple[float, float | None]] = {
    "mvitv2_tiny": (24.173, 4.70), "mvitv2_small": (34.870, 7.00), "mvitv2_base": (51.473, 10.16),
    "mvitv2_large": (217.993, 43.87), "mvitv2_small_cls": (34.870, 7.04), "mvitv2_base_cls": (65.444, 10.23),
    "mvitv2_large_cls": (234.583, 42.17), "mvitv2_huge_cls": (694.804, 120.67)}
_META = published_meta(_PUBLISHED, "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs",
                       meta_device=_PUBLISHED)


def reduced_config(cfg: MViTv2Config) -> dict[str, Any]:
    """Overrides that shrink an MViTv2 preset for tests: widths 16 / 32 / 64 / 128 (``mvitv2_large``'s layout: the
    widening MLP; heads 1 / 2 / 4 / 8 or the preset's ratio), one block per stage (two in the first, so a block keeps
    the grid with strided keys), 64 px (grids 16, 8, 4, 2); class token, pooling and the schedule are the preset's."""
    heads = stage_heads(cfg)[0]
    return dict(embed_dim=16 * heads, depths=(2, 1, 1, 1) if cfg.expand_attn else (2, 2, 1, 2), img_size=64)


register_family("mvitv2", MViTv2, MViTv2Config, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.9)
PRETRAINED = pretrained_tags({
    "mvitv2_base.fb_in1k": _224,
    "mvitv2_base_cls.fb_inw21k": dict(_224, num_classes=19168),
    "mvitv2_huge_cls.fb_inw21k": dict(_224, num_classes=19168),
    "mvitv2_large.fb_in1k": _224,
    "mvitv2_large_cls.fb_inw21k": dict(_224, num_classes=19168),
    "mvitv2_small.fb_in1k": _224,
    "mvitv2_small_cls.untrained": dict(_224, hf_hub_id=None),
    "mvitv2_tiny.fb_in1k": _224,
}, license="apache-2.0")
