"""XCiT (El-Nouby et al., NeurIPS 2021, "XCiT: Cross-Covariance Image Transformers").

Config dataclass -> :class:`Xcit` -> presets registered as data (timm 1.0.31's names, ``timm/models/xcit.py``,
which is facebookresearch/xcit ``xcit.py`` up to key renames).

* Convolutional patch embedding (:class:`ConvPatchEmbed`): ``log2(patch)`` stride-2 3x3 convolutions without
  bias, each followed by BatchNorm, GELU between them (not after the last): ``3 -> C/8 -> C/4 -> C/2 -> C``
  for patch 16, ``3 -> C/4 -> C/2 -> C`` for patch 8. Each convolution halves the map with ceil, so any image
  size works (``H/p`` for multiples).
* Fourier position encoding (:class:`PositionalEncodingFourier`), recomputed for every grid: sine / cosine
  features of the normalised row and column coordinates (32 each, row first) through a 1x1 convolution to
  ``C``, added once to the patch tokens.
* ``depth`` XCA blocks over the patch tokens alone (no class token): the one
  :class:`~vit_attention.layers.Block` with ``attn_layer="xca"`` (:mod:`vit_attention.attention.xca`) and
  LayerScale, its ``pos2`` the local patch interaction (:class:`LPIBranch`) between the attention and the MLP
  branch: ``x + γ1·XCA(LN1 x)``, ``x + γ3·LPI(LN3 x)``, ``x + γ2·MLP(LN2 x)``, where LPI is a depthwise 3x3
  conv, GELU, BatchNorm and a depthwise 3x3 conv on the token grid.
* ``cls_attn_layers`` (2) class-attention blocks (:class:`XcitClassAttentionBlock`, CaiT's ``class_attn``
  mechanism) over ``[cls; patches]``, with XCiT's own residual rule: the patch tokens are updated too
  (the block's docstring).
* Final LayerNorm over all tokens; the head reads the class token (``global_pool="token"``) or the patch mean.

``_dist`` weights (timm's ``fb_dist_in1k`` tags) are the same architecture trained with DeiT's hard
distillation through the one head: there is no distillation token and no second head (the official model
returns the same logits twice while training). The ``_384`` presets are the same architectures at 384.

State-dict keys are timm's except inside the blocks: LayerScale is ``ls1.gamma`` / ``ls2.gamma`` (timm
``gamma1`` / ``gamma2``) and the LPI branch is ``pos2.{norm, lpi.*, ls.gamma}`` (timm ``norm3``,
``local_mp.*``, ``gamma3``); :mod:`vit_attention.weights.xcit` renames them, and the original repository's
``pos_embeder`` and packed class-attention ``qkv`` (``load_weights``, tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..attention import create_attention
from ..attention.base import AttentionCall
from ..functional.batch_norm import conv_bn
from ..layers import Block, stage_feature_info
from ..layers.drop_path import DropPath
from ..layers.head import init_linear_weights
from ..layers.layer_scale import LayerScale
from ..layers.layout_adapter import apply_attention
from ..layers.mlp import Mlp
from ..layers.stage import run_blocks_with_taps
from ._config import (
    ConfigMixin,
    check_attn_layer,
    check_choice,
    check_common,
    check_float,
    check_int,
    check_width_heads,
)
from .backbone import ClassAttentionBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["XcitConfig", "Xcit", "ConvPatchEmbed", "PositionalEncodingFourier", "LPIBranch",
           "XcitClassAttentionBlock", "fourier_features", "reduced_config"]

_POOLS = ("token", "avg", "")
_PATCH_SIZES = (8, 16)


# ---------------------------------------------------------------------------- embedding
class ConvPatchEmbed(nn.Module):
    """XCiT's convolutional patch embedding, images ``[B, Cin, H, W]`` -> ``(tokens [B, H'·W', C], (H', W'))``.

    ``log2(patch_size)`` stages of a 3x3 stride-2 convolution (padding 1, no bias) and BatchNorm, a GELU between
    stages; widths ``C / 2^(s-1-i)`` (patch 16: ``C/8, C/4, C/2, C``; patch 8: ``C/4, C/2, C``). Each stage maps
    a side ``L`` to ``ceil(L / 2)``. Keys (timm's): ``proj.{2i}.0`` (conv), ``proj.{2i}.1`` (BatchNorm), the odd
    indices the GELUs. At inference each BatchNorm is folded into its convolution (same numbers).
    """

    def __init__(self, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768) -> None:
        super().__init__()
        if patch_size not in _PATCH_SIZES:
            raise ValueError(f"patch_size must be 8 or 16 (XCiT's convolutional stems), got {patch_size!r}")
        stages = int(math.log2(patch_size))
        dims = [in_chans] + [embed_dim >> (stages - 1 - i) for i in range(stages)]
        layers: list[nn.Module] = []
        for i in range(stages):
            if i:
                layers.append(nn.GELU())
            layers.append(nn.Sequential(nn.Conv2d(dims[i], dims[i + 1], 3, stride=2, padding=1, bias=False),
                                        nn.BatchNorm2d(dims[i + 1])))
        self.proj = nn.Sequential(*layers)
        self.patch_size = patch_size

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """``[B, Cin, H, W]`` -> ``(tokens [B, H'·W', C], (H', W'))``, ``H' = ceil(H / patch)`` (stage by stage)."""
        for layer in self.proj:
            x = conv_bn(layer[0], layer[1], x) if isinstance(layer, nn.Sequential) else layer(x)
        H, W = x.shape[-2:]
        return x.flatten(2).transpose(1, 2), (H, W)  # [B, H'·W', C]


def fourier_features(height: int, width: int, hidden_dim: int = 32, temperature: float = 10000.0, *,
                     device: torch.device | str | None = None) -> Tensor:
    """XCiT's Fourier features of a ``height x width`` grid -> ``[height·width, 2·hidden_dim]`` (float32, row-major).

    Coordinates normalised to ``(0, 2π]``: ``y_i = i / (H + 1e-6) · 2π`` (``i = 1..H``), ``x_j`` likewise;
    ``d_k = temperature^(2⌊k/2⌋ / hidden_dim)``; feature ``k`` of a coordinate ``t`` is ``sin(t / d_k)`` for even
    ``k`` and ``cos(t / d_k)`` for odd ``k``; the row features come first, then the column features. The
    arithmetic follows timm 1.0.31's ``PositionalEncodingFourier`` step by step (float32).
    """
    eps, scale = 1e-6, 2 * math.pi
    y = torch.arange(1, height + 1, device=device).to(torch.float32)
    x = torch.arange(1, width + 1, device=device).to(torch.float32)
    y = y / (y[-1:] + eps) * scale  # [H]
    x = x / (x[-1:] + eps) * scale  # [W]
    dim_t = torch.arange(hidden_dim, device=device).to(torch.float32)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / hidden_dim)  # [hidden]

    def code(t: Tensor) -> Tensor:  # [L] -> [L, hidden]: sin / cos interleaved per pair
        p = t[:, None] / dim_t
        return torch.stack([p[:, 0::2].sin(), p[:, 1::2].cos()], dim=2).flatten(1)

    cy, cx = code(y), code(x)
    return torch.cat([cy[:, None, :].expand(height, width, hidden_dim),
                      cx[None, :, :].expand(height, width, hidden_dim)], dim=-1).reshape(height * width, -1)


class PositionalEncodingFourier(nn.Module):
    """XCiT's position encoding: :func:`fourier_features` of the grid through a 1x1 convolution, ``-> [1, H·W, C]``.

    Recomputed for the grid of every call, so any image size has its encoding (a position's code depends on the
    grid size: the coordinates are fractions of the map). Keys (timm's): ``token_projection.{weight [C, 64, 1, 1],
    bias}``.
    """

    def __init__(self, dim: int, hidden_dim: int = 32, temperature: float = 10000.0) -> None:
        super().__init__()
        self.token_projection = nn.Conv2d(hidden_dim * 2, dim, kernel_size=1)
        self.hidden_dim, self.temperature, self.dim = hidden_dim, temperature, dim

    def forward(self, feat_size: tuple[int, int]) -> Tensor:
        """``(H, W)`` -> the encoding ``[1, H·W, C]`` in the projection's dtype."""
        H, W = int(feat_size[0]), int(feat_size[1])
        w = self.token_projection.weight
        feats = fourier_features(H, W, self.hidden_dim, self.temperature, device=w.device).to(w.dtype)  # [H·W, 64]
        pos = self.token_projection(feats.t().reshape(1, -1, H, W))  # [1, C, H, W] (the module: FLOPs see it)
        return pos.flatten(2).transpose(1, 2)  # [1, H·W, C]


# ---------------------------------------------------------------------------- blocks
class LPIBranch(nn.Module):
    """The local patch interaction branch of an XCA block: ``x + drop_path(γ3 · LPI(LN3 x))`` on the token grid.

    ``LPI`` = depthwise 3x3 conv (bias) -> GELU -> BatchNorm -> depthwise 3x3 conv (bias), zero padding, on the
    ``H x W`` map of the grid tokens. The block's ``pos_mlp_layer`` (called between the attention and the MLP
    branches as ``pos2(x, feat_size, num_prefix_tokens)``); prefix tokens, if any, pass unchanged.
    ``[B, P + H·W, C] -> [B, P + H·W, C]``. Keys: ``norm`` (timm ``norm3``), ``lpi.{conv1, bn, conv2}`` (timm
    ``local_mp``), ``ls.gamma`` (timm ``gamma3``). Cost ``18·H·W·C`` multiply-adds.
    """

    def __init__(self, dim: int, *, init_values: float = 1.0, norm_eps: float = 1e-6, drop_path: float = 0.0,
                 kernel_size: int = 3) -> None:
        super().__init__()
        pad = kernel_size // 2
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.lpi = nn.Module()
        self.lpi.conv1 = nn.Conv2d(dim, dim, kernel_size, padding=pad, groups=dim)
        self.lpi.act = nn.GELU()
        self.lpi.bn = nn.BatchNorm2d(dim)
        self.lpi.conv2 = nn.Conv2d(dim, dim, kernel_size, padding=pad, groups=dim)
        self.ls = LayerScale(dim, init_values)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def local(self, x: Tensor, feat_size: tuple[int, int]) -> Tensor:
        """``LPI`` alone: grid tokens ``[B, H·W, C]`` -> ``[B, H·W, C]``."""
        B, N, C = x.shape
        H, W = feat_size
        m = x.transpose(1, 2).reshape(B, C, H, W)
        lpi = self.lpi
        m = lpi.conv2(lpi.bn(lpi.act(lpi.conv1(m))))
        return m.reshape(B, C, N).transpose(1, 2)  # [B, H·W, C]

    def forward(self, x: Tensor, feat_size: tuple[int, int] | None = None, num_prefix_tokens: int = 0) -> Tensor:
        """Tokens ``[B, P + H·W, C]`` (grid ``feat_size``) -> same shape."""
        if feat_size is None:
            raise ValueError("XCiT's LPI needs the token grid feat_size=(H, W)")
        P = num_prefix_tokens
        H, W = int(feat_size[0]), int(feat_size[1])
        if x.dim() != 3 or x.shape[1] - P != H * W:
            raise ValueError(f"LPI: expected tokens [B, {P} + {H}·{W}, C] for feat_size={tuple(feat_size)}, "
                             f"got {tuple(x.shape)}")
        grid = x[:, P:]
        y = self.local(self.norm(grid), (H, W))
        if P:
            y = torch.cat([y.new_zeros(y.shape[0], P, y.shape[-1]), y], dim=1)
        return x + self.drop_path(self.ls(y))


class XcitClassAttentionBlock(nn.Module):
    """XCiT's class-attention block (timm ``ClassAttentionBlock``): ``[B, 1 + N, C] -> [B, 1 + N, C]``.

    With ``u = LN1(x)`` and ``a = class_attn(u[:, :1], context=u)`` (the class token queries all tokens):

        x = x + drop_path(γ1 · [a ; u_patches])          # the patches receive γ1 · LN1(x)
        x = LN2(x)   (tokens_norm)   or   [LN2(x_cls) ; x_patches]
        x = x + drop_path([γ2 · MLP(x_cls) ; x_patches])  # the patches are doubled

    The patch-token updates are the reference's (they change the keys and values of the next class-attention
    block), unlike CaiT's, which leaves the patches unchanged. Keys: ``norm1``, ``attn.{q,k,v,proj}``,
    ``ls1.gamma``, ``norm2``, ``mlp.{fc1,fc2}``, ``ls2.gamma`` (timm ``gamma1`` / ``gamma2``).
    """

    def __init__(self, dim: int, num_heads: int, *, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0, init_values: float = 1.0,
                 norm_eps: float = 1e-6, tokens_norm: bool = True, attn_layer: str = "class_attn") -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = create_attention(attn_layer, dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop,
                                     proj_drop=drop)
        self.ls1 = LayerScale(dim, init_values)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=drop)
        self.ls2 = LayerScale(dim, init_values)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.tokens_norm = bool(tokens_norm)

    def forward(self, x: Tensor, feat_size: tuple[int, int] | None = None) -> Tensor:
        """``[B, 1 + N, C]`` (class token first; ``feat_size``: the patches' grid, for recorded maps) -> same."""
        u = self.norm1(x)
        call = AttentionCall(feat_size, num_prefix_tokens=1, context=u)  # keys / values from all of u
        a = apply_attention(self.attn, u[:, :1], call)  # [B, 1, C]
        x = x + self.drop_path1(self.ls1(torch.cat([a, u[:, 1:]], dim=1)))
        x = self.norm2(x) if self.tokens_norm else torch.cat([self.norm2(x[:, :1]), x[:, 1:]], dim=1)
        cls = self.ls2(self.mlp(x[:, :1]))  # [B, 1, C]
        return x + self.drop_path2(torch.cat([cls, x[:, 1:]], dim=1))

    def extra_repr(self) -> str:
        return f"tokens_norm={self.tokens_norm}"


# ---------------------------------------------------------------------------- config and model
@dataclass
class XcitConfig(ConfigMixin):
    """Everything an :class:`Xcit` is built from (JSON-serialisable)."""

    img_size: int | tuple[int, int] = 224  # the nominal size (data config, FLOPs); any size runs
    patch_size: int = 16  # 8 or 16: the convolutional stem's depth
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["token", "avg", ""] = "token"
    embed_dim: int = 768
    depth: int = 12  # XCA blocks
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    eta: float = 1.0  # LayerScale init of every block (1.0 for the 12-layer presets, 1e-5 for the 24-layer ones)
    tokens_norm: bool = False  # the class-attention blocks normalise every token (True) or the class token only
    cls_attn_layers: int = 2
    use_pos_embed: bool = True
    attn_layer: str = "xca"  # the XCA blocks' mechanism
    attn_kwargs: dict[str, Any] = field(default_factory=dict)
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    drop_path_rate: float = 0.0  # the same rate in every XCA block (as the reference)

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self, _POOLS)
        check_choice(self.patch_size, "patch_size", _PATCH_SIZES)
        dim, _ = check_width_heads(self)
        stages = int(math.log2(self.patch_size))
        if dim % (1 << (stages - 1)):
            raise ValueError(f"embed_dim={dim} must be divisible by {1 << (stages - 1)} (the stem's first width "
                             f"is embed_dim / {1 << (stages - 1)} for patch_size={self.patch_size})")
        check_int(self.depth, "depth", min_value=0)
        check_int(self.cls_attn_layers, "cls_attn_layers", min_value=0)
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_float(self.norm_eps, "norm_eps")
        check_float(self.eta, "eta", low=-math.inf)
        check_attn_layer(self.attn_layer, self.attn_kwargs, layout="tokens")
        if self.global_pool == "token" and not self.cls_attn_layers:
            raise ValueError("global_pool='token' needs the class token, which cls_attn_layers=0 leaves out")


class Xcit(ClassAttentionBackbone):
    """XCiT backbone with a classifier, ``[B, Cin, H, W] -> [B, num_classes]`` (any ``H``, ``W``).

    ``forward_features`` gives normalised tokens ``[B, 1 + N, C]`` (class token first, ``N = H'·W'`` patches;
    ``[B, N, C]`` without class-attention blocks), ``forward_head`` the class token (or the patch mean,
    :meth:`Backbone.pool`) through the bare ``Linear`` head (key ``head``). A
    :class:`~vit_attention.models.backbone.ClassAttentionBackbone`: one run of XCA ``blocks``, then
    ``cls_attn_blocks``.
    """

    family = "xcit"
    class_blocks_attr = "cls_attn_blocks"
    config_cls = XcitConfig
    no_weight_decay_keys = ("pos_embed", "cls_token", "temperature")  # as the reference
    pools = _POOLS
    head_fc = None
    token_merging_note = ("XCA attends over channels (no token x token attention whose keys could pair tokens) "
                          "and LPI convolves the token grid, which merged tokens would no longer fill")

    def __init__(self, cfg: XcitConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        C = cfg.embed_dim
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        self.global_pool = cfg.global_pool
        self.embed_dim = self.num_features = C
        self.num_prefix_tokens = 1 if cfg.cls_attn_layers else 0
        self.grad_checkpointing = False

        self.patch_embed = ConvPatchEmbed(cfg.patch_size, cfg.in_chans, C)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.cls_attn_layers else None
        self.pos_embed = PositionalEncodingFourier(C) if cfg.use_pos_embed else None
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)

        lpi = partial(LPIBranch, init_values=cfg.eta, norm_eps=cfg.norm_eps, drop_path=cfg.drop_path_rate)
        self.blocks = nn.Sequential(*[
            Block(C, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, drop=cfg.proj_drop_rate,
                  attn_drop=cfg.attn_drop_rate, drop_path=cfg.drop_path_rate, init_values=cfg.eta,
                  norm_layer=norm_layer, act_layer=nn.GELU, attn_layer=cfg.attn_layer, attn_kwargs=cfg.attn_kwargs,
                  pos_mlp_layer=lpi, depth_index=i)
            for i in range(cfg.depth)])
        self.feature_info = stage_feature_info((C,) * cfg.depth, (cfg.patch_size,) * cfg.depth, "blocks")
        self.cls_attn_blocks = nn.ModuleList([
            XcitClassAttentionBlock(C, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                                    drop=cfg.proj_drop_rate, attn_drop=cfg.attn_drop_rate, init_values=cfg.eta,
                                    norm_eps=cfg.norm_eps, tokens_norm=cfg.tokens_norm)
            for _ in range(cfg.cls_attn_layers)])
        self.norm = norm_layer(C)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(C, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        init_linear_weights(self)

    # ------------------------------------------------------------------ forward
    def feat_size(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Token grid for an image of size ``hw``: each of the stem's stride-2 convolutions halves with ceil."""
        h, w = int(hw[0]), int(hw[1])
        for _ in range(int(math.log2(self.cfg.patch_size))):
            h, w = (h + 1) // 2, (w + 1) // 2
        return h, w

    def _embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Images ``[B, Cin, H, W]`` -> patch tokens ``[B, N, C]`` with the Fourier encoding, and the grid."""
        x, feat_size = self.patch_embed(x)  # [B, N, C]
        if self.pos_embed is not None:
            x = x + self.pos_embed(feat_size)
        return self.pos_drop(x), feat_size

    def _run_blocks(self, x: Tensor, feat_size: tuple[int, int], indices: set[int] | None = None, *,
                    stop: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Patch tokens ``[B, N, C]`` through the XCA blocks: ``-> (tokens, [outputs of blocks indices])``."""
        return run_blocks_with_taps(self.blocks, x, feat_size, 0, checkpoint=self.grad_checkpointing and self.training,
                                    taps=indices, stop_at_last_tap=stop)

    def forward_cls(self, x: Tensor, feat_size: tuple[int, int] | None = None) -> Tensor:
        """Class-attention stage: patch tokens ``[B, N, C]`` -> ``[B, 1 + N, C]`` (class token first).

        ``feat_size``: the patches' grid (recorded maps are placed on it). Without a class token (no
        class-attention blocks, or after ``prune_intermediate_layers(prune_head=True)``) ``x`` is returned.
        """
        if self.cls_token is None:
            return x
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # [B, 1 + N, C]
        for blk in self.cls_attn_blocks:
            if self.grad_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(blk, x, feat_size, use_reentrant=False)
            else:
                x = blk(x, feat_size)
        return x



# ---------------------------------------------------------------------------- presets (data)
# (embed_dim, depth, num_heads, eta, tokens_norm) per size (timm 1.0.31 xcit.py; facebookresearch/xcit README)
_SIZES: dict[str, dict[str, Any]] = {
    "nano_12": dict(embed_dim=128, depth=12, num_heads=4, eta=1.0, tokens_norm=False),
    "tiny_12": dict(embed_dim=192, depth=12, num_heads=4, eta=1.0, tokens_norm=True),
    "tiny_24": dict(embed_dim=192, depth=24, num_heads=4, eta=1e-5, tokens_norm=True),
    "small_12": dict(embed_dim=384, depth=12, num_heads=8, eta=1.0, tokens_norm=True),
    "small_24": dict(embed_dim=384, depth=24, num_heads=8, eta=1e-5, tokens_norm=True),
    "medium_24": dict(embed_dim=512, depth=24, num_heads=8, eta=1e-5, tokens_norm=True),
    "large_24": dict(embed_dim=768, depth=24, num_heads=16, eta=1e-5, tokens_norm=True),
}

# (size, patch) -> (parameters in millions, timm 1.0.31 on the meta device, 1000 classes; GMACs at 224; at 384):
# GMACs are timm's results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs; its param_count agrees to 0.01 M)
_PUBLISHED: dict[tuple[str, int], tuple[float, float, float]] = {
    ("nano_12", 16): (3.053, 0.56, 1.64), ("tiny_12", 16): (6.716, 1.24, 3.64),
    ("tiny_24", 16): (12.117, 2.34, 6.87), ("small_12", 16): (26.253, 4.82, 14.14),
    ("small_24", 16): (47.671, 9.10, 26.72), ("medium_24", 16): (84.396, 16.13, 47.39),
    ("large_24", 16): (189.096, 35.86, 105.35),
    ("nano_12", 8): (3.049, 2.16, 6.34), ("tiny_12", 8): (6.707, 4.81, 14.13),
    ("tiny_24", 8): (12.107, 9.21, 27.05), ("small_12", 8): (26.213, 18.69, 54.92),
    ("small_24", 8): (47.631, 35.81, 105.24), ("medium_24", 8): (84.324, 63.53, 186.67),
    ("large_24", 8): (188.933, 141.23, 415.0),
}
_SOURCE = ("timm results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv (infer_gmacs), "
           "huggingface/pytorch-image-models aa4b5850")

_PRESETS: dict[str, dict[str, Any]] = {}
_PUBLISHED_BY_NAME: dict[str, tuple[float, float]] = {}
for (_size, _patch), (_params, _g224, _g384) in _PUBLISHED.items():
    for _img, _gmacs in ((224, _g224), (384, _g384)):
        _name = f"xcit_{_size}_p{_patch}_{_img}"
        _PRESETS[_name] = dict(_SIZES[_size], patch_size=_patch, img_size=_img)
        _PUBLISHED_BY_NAME[_name] = (_params, _gmacs)
_META = published_meta(_PUBLISHED_BY_NAME, _SOURCE, meta_device=_PUBLISHED_BY_NAME)


def reduced_config(cfg: XcitConfig) -> dict[str, Any]:
    """Overrides that shrink an XCiT preset for tests: width 32, 2 heads, 2 XCA blocks and both class-attention
    blocks (patch size, LayerScale init and ``tokens_norm`` kept) on a 3x3 patch grid."""
    return dict(embed_dim=32, num_heads=2, depth=2, cls_attn_layers=2, img_size=cfg.patch_size * 3)


register_family("xcit", Xcit, XcitConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given. The fb_dist_in1k
# weights were trained with DeiT's hard distillation through the one head (no distillation token).
_224 = data_cfg(224, 1.0)
_384 = data_cfg(384, 1.0)
PRETRAINED = pretrained_tags({
    "xcit_large_24_p16_224.fb_in1k": _224,
    "xcit_large_24_p16_224.fb_dist_in1k": _224,
    "xcit_large_24_p16_384.fb_dist_in1k": _384,
    "xcit_large_24_p8_224.fb_in1k": _224,
    "xcit_large_24_p8_224.fb_dist_in1k": _224,
    "xcit_large_24_p8_384.fb_dist_in1k": _384,
    "xcit_medium_24_p16_224.fb_in1k": _224,
    "xcit_medium_24_p16_224.fb_dist_in1k": _224,
    "xcit_medium_24_p16_384.fb_dist_in1k": _384,
    "xcit_medium_24_p8_224.fb_in1k": _224,
    "xcit_medium_24_p8_224.fb_dist_in1k": _224,
    "xcit_medium_24_p8_384.fb_dist_in1k": _384,
    "xcit_nano_12_p16_224.fb_in1k": _224,
    "xcit_nano_12_p16_224.fb_dist_in1k": _224,
    "xcit_nano_12_p16_384.fb_dist_in1k": _384,
    "xcit_nano_12_p8_224.fb_in1k": _224,
    "xcit_nano_12_p8_224.fb_dist_in1k": _224,
    "xcit_nano_12_p8_384.fb_dist_in1k": _384,
    "xcit_small_12_p16_224.fb_in1k": _224,
    "xcit_small_12_p16_224.fb_dist_in1k": _224,
    "xcit_small_12_p16_384.fb_dist_in1k": _384,
    "xcit_small_12_p8_224.fb_in1k": _224,
    "xcit_small_12_p8_224.fb_dist_in1k": _224,
    "xcit_small_12_p8_384.fb_dist_in1k": _384,
    "xcit_small_24_p16_224.fb_in1k": _224,
    "xcit_small_24_p16_224.fb_dist_in1k": _224,
    "xcit_small_24_p16_384.fb_dist_in1k": _384,
    "xcit_small_24_p8_224.fb_in1k": _224,
    "xcit_small_24_p8_224.fb_dist_in1k": _224,
    "xcit_small_24_p8_384.fb_dist_in1k": _384,
    "xcit_tiny_12_p16_224.fb_in1k": _224,
    "xcit_tiny_12_p16_224.fb_dist_in1k": _224,
    "xcit_tiny_12_p16_384.fb_dist_in1k": _384,
    "xcit_tiny_12_p8_224.fb_in1k": _224,
    "xcit_tiny_12_p8_224.fb_dist_in1k": _224,
    "xcit_tiny_12_p8_384.fb_dist_in1k": _384,
    "xcit_tiny_24_p16_224.fb_in1k": _224,
    "xcit_tiny_24_p16_224.fb_dist_in1k": _224,
    "xcit_tiny_24_p16_384.fb_dist_in1k": _384,
    "xcit_tiny_24_p8_224.fb_in1k": _224,
    "xcit_tiny_24_p8_224.fb_dist_in1k": _224,
    "xcit_tiny_24_p8_384.fb_dist_in1k": _384,
}, license="apache-2.0")

