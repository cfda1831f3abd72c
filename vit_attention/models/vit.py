"""Vision Transformer family: ViT, DeiT (incl. distilled), DeiT III, ViT with a conv stem,
ViT-22B-style parallel blocks, and the giant configs (ViT-g, ViT-G, ViT-e, ViT-22B).

Config dataclass -> :class:`VisionTransformer` -> presets registered as data. The state-dict
layout is timm's (``cls_token``, ``pos_embed``, ``patch_embed.proj``, ``blocks.N.attn.qkv``, ...),
so timm checkpoints load directly and the other layouts are converted in ``vit_attention.weights``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..attention import get_attention_spec, list_attention
from ..functional import resample_abs_pos_embed, sincos_2d_pos_embed
from ..functional.pos_embed import POS_EMBED_RESIZE_RULES
from ..layers import (
    BLOCK_STYLES,
    AttentionPoolHead,
    Block,
    ConvStemPatchEmbed,
    GluMlp,
    Mlp,
    PatchEmbed,
    PosConv,
    SwiGLU,
    drop_path_schedule,
    run_blocks_with_taps,
    stage_feature_info,
)
from ..layers.activation import ACT_LAYERS
from ..layers.head import init_linear_weights
from ..layers.parallel_scaling import ParallelScalingBlock
from ._config import (
    ConfigMixin,
    check_attn_layer,
    check_choice,
    check_common,
    check_float,
    check_int,
    check_int_seq,
    check_size,
    check_width_heads,
)
from .backbone import IsotropicBackbone, isotropic_taps, tokens_to_intermediates
from .pretrained_tags import INCEPTION_MEAN, INCEPTION_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, data_cfg, pretrained_tags
from .registry import register_family, with_published_gmacs
from .token_merging import TokenMergingMixin

__all__ = ["VisionTransformerConfig", "VisionTransformer", "AttentionPoolHead", "reduced_config"]

_ACTS = ACT_LAYERS  # gelu, gelu_tanh (SigLIP), quick_gelu (OpenAI CLIP), relu, silu (the SwiGLU gates)
_MLPS = ("mlp", "glu", "swiglu")
_BLOCKS = (*BLOCK_STYLES, "parallel_scaling")  # Block's styles, and ParallelScalingBlock (timm's vit_pwee / dpwee)


@dataclass
class VisionTransformerConfig(ConfigMixin):
    """Everything a :class:`VisionTransformer` is built from (JSON-serialisable)."""

    img_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16  # a pair (h, w) for a non-square kernel
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["token", "avg", "map", ""] = "token"
    pool_include_prefix: bool = False  # "avg" / "map" pool the prefix (class, register) tokens too (timm's option)
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    mlp_dim: int | None = None  # overrides mlp_ratio when set (ViT-G/e/22B publish a width)
    mlp_layer: Literal["mlp", "glu", "swiglu"] = "mlp"  # glu: packed fc1 (both halves = hidden); swiglu: fc1_g/fc1_x
    mlp_norm: bool = False  # swiglu: LayerNorm over the hidden width before fc2 (EVA-02 B / L sub-LN)
    qkv_bias: bool | Literal["qv"] = True  # "qv": q and v biases, none on k (EVA-02, DINOv3; keys attn.q_bias/v_bias)
    qk_norm: bool = False
    attn_norm: bool = False  # LayerNorm after attention, before proj (EVA-CLIP; timm scale_attn_inner, key attn.norm)
    proj_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True
    norm_eps: float = 1e-6
    act: str = "gelu"
    init_values: float | None = None  # LayerScale init (DeiT III, CaiT); None = no LayerScale
    class_token: bool = True
    distilled: bool = False  # DeiT distillation token + second head
    reg_tokens: int = 0  # register tokens after the class token (Darcet et al. 2024); no position embedding
    # when no_embed_class; left out of pooling and of the grid features (key reg_token [1, R, C])
    no_embed_class: bool = False  # prefix tokens carry no position embedding (DeiT III)
    pos_embed: Literal["learn", "sincos", "none"] = "learn"
    # how a learned table is resized to another grid (dynamic_img_size forwards, set_input_size); MODERN A.2:
    # "timm" (size=, bicubic, antialias), "dinov2" (original plain DINOv2: scale (n + 0.1) / g, bicubic, no
    # antialias), "bicubic" (size=, no antialias: HF interpolate_pos_encoding of ViT / CLIP / SigLIP / Dinov2Model)
    pos_embed_resize: Literal["timm", "dinov2", "bicubic"] = "timm"
    peg_after: tuple[int, ...] = ()  # blocks whose output passes a PEG (PosConv, key pos_block.N); CPVT: (0,)
    # the Block style; "parallel_scaling": ParallelScalingBlock (one LayerScale and one output bias over the branches)
    block: Literal["pre", "post", "res_post", "parallel", "parallel_scaling"] = "pre"
    pre_norm: bool = False  # LayerNorm after the embeddings (CLIP)
    final_norm: bool = True
    fc_norm: bool | None = None  # norm after pooling; None = True for avg pooling
    representation_size: int | None = None  # Linear + Tanh pre-logits layer (original ViT)
    conv_stem: tuple[int, ...] | None = None  # widths of an early conv stem (Xiao et al. 2021)
    attn_layer: str = "mhsa"
    attn_kwargs: dict[str, Any] = field(default_factory=dict)
    rope: Literal["axial", "mixed"] | None = None  # 2-D rotary positions in every block's attention
    rope_kwargs: dict[str, Any] = field(default_factory=dict)  # RotaryEmbedding options (convention, theta, ...)
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    dynamic_img_size: bool = False
    dynamic_img_pad: bool = False

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        img = check_common(self, ("token", "avg", "map", ""))
        patch = check_size(self.patch_size, "patch_size")
        if not isinstance(self.pool_include_prefix, bool):
            raise TypeError(f"pool_include_prefix must be a bool, got {self.pool_include_prefix!r}")
        dim, heads = check_width_heads(self)
        check_int(self.depth, "depth", min_value=0)
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        if self.mlp_dim is not None:
            check_int(self.mlp_dim, "mlp_dim")
        check_float(self.norm_eps, "norm_eps")
        check_choice(self.act, "act", sorted(_ACTS))
        check_choice(self.mlp_layer, "mlp_layer", _MLPS)
        if self.mlp_norm and self.mlp_layer != "swiglu":
            raise ValueError(f"mlp_norm=True is the sub-LN of mlp_layer='swiglu'; got mlp_layer={self.mlp_layer!r}")
        check_choice(self.qkv_bias, "qkv_bias", (True, False, "qv"))
        if self.qkv_bias == "qv" and self.attn_layer != "mhsa":
            raise ValueError(f"qkv_bias='qv' is an option of attn_layer='mhsa'; got attn_layer={self.attn_layer!r}")
        if self.attn_norm and self.attn_layer != "mhsa":
            raise ValueError(f"attn_norm=True is an option of attn_layer='mhsa'; got attn_layer={self.attn_layer!r}")
        if self.attn_norm and "inner_norm" in self.attn_kwargs:
            raise ValueError("the inner attention norm is given twice: attn_norm and attn_kwargs['inner_norm']")
        check_int(self.reg_tokens, "reg_tokens", min_value=0)
        if self.rope is not None:
            check_choice(self.rope, "rope", ("axial", "mixed"))
            if "rope" in self.attn_kwargs:
                raise ValueError("rope is given twice: as a config field and in attn_kwargs; keep the field")
            rotary = [n for n in list_attention() if "rope" in get_attention_spec(n).init_kwargs]
            if self.attn_layer in list_attention() and self.attn_layer not in rotary:
                raise ValueError(f"rope={self.rope!r} rotates the attention's queries and keys, but "
                                 f"attn_layer={self.attn_layer!r} has no rotary embedding: set rope=None (with "
                                 f"pos_embed='learn' for positions) or attn_layer={' / '.join(map(repr, rotary))}")
        elif self.rope_kwargs:
            raise ValueError("rope_kwargs given without rope; set rope='axial' or 'mixed'")
        if self.init_values is not None:
            check_float(self.init_values, "init_values", low=-math.inf)
        check_choice(self.pos_embed, "pos_embed", ("learn", "sincos", "none"))
        check_choice(self.pos_embed_resize, "pos_embed_resize", POS_EMBED_RESIZE_RULES)
        check_choice(self.block, "block", _BLOCKS)
        if self.peg_after:
            for i in check_int_seq(self.peg_after, "peg_after", min_value=0):
                if i >= self.depth:
                    raise ValueError(f"peg_after={tuple(self.peg_after)} names block {i}; depth={self.depth} "
                                     f"has blocks 0..{self.depth - 1}")
        if self.representation_size is not None:
            check_int(self.representation_size, "representation_size", min_value=0)
        if self.conv_stem is not None:
            check_int_seq(self.conv_stem, "conv_stem")
        check_attn_layer(self.attn_layer, self.attn_kwargs)
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        if self.distilled and not self.class_token:
            raise ValueError("distilled=True needs class_token=True")
        if not self.dynamic_img_pad and (img[0] % patch[0] or img[1] % patch[1]):
            raise ValueError(f"img_size={self.img_size!r} is not divisible by patch_size={self.patch_size!r}; "
                             f"use a multiple of the patch size, or dynamic_img_pad=True to pad the images")


class VisionTransformer(TokenMergingMixin, IsotropicBackbone):
    """ViT / DeiT backbone with a classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives tokens ``[B, P + N, C]`` (``P`` prefix tokens: class, distillation),
    ``forward_head`` pools and classifies. Distilled models return ``(cls_logits, dist_logits)``
    in training and their mean in eval (DeiT). One stage of ``blocks`` (an isotropic
    :class:`~vit_attention.models.backbone.Backbone`); the head is a bare ``Linear`` (key ``head``).
    """

    family = "vit"
    config_cls = VisionTransformerConfig
    no_weight_decay_keys = ("pos_embed", "cls_token", "dist_token", "reg_token", "rope.freqs")
    pools = ("token", "avg", "map", "")
    head_fc = None

    def __init__(self, cfg: VisionTransformerConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        C = cfg.embed_dim
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps, bias=cfg.norm_bias)
        act_layer = _ACTS[cfg.act]
        self.global_pool = cfg.global_pool
        self.embed_dim = C
        self.num_prefix_tokens = int(cfg.class_token) + int(cfg.distilled) + cfg.reg_tokens
        self.num_reg_tokens = cfg.reg_tokens
        self.dynamic_img_size = cfg.dynamic_img_size
        self.grad_checkpointing = False

        embed_kwargs = dict(bias=not cfg.pre_norm, strict_img_size=not cfg.dynamic_img_size,
                            dynamic_img_pad=cfg.dynamic_img_pad,
                            size_options=("dynamic_img_size=True", "dynamic_img_pad=True"))
        if cfg.conv_stem:
            self.patch_embed: PatchEmbed = ConvStemPatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, C,
                                                              stem_chs=cfg.conv_stem, **embed_kwargs)
        else:
            self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, C, **embed_kwargs)
        assert self.patch_embed.grid_size is not None
        self.grid_size = self.patch_embed.grid_size

        self.cls_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, C)) if cfg.reg_tokens else None
        n_pos = self.grid_size[0] * self.grid_size[1] + (0 if cfg.no_embed_class else self.num_prefix_tokens)
        if cfg.pos_embed == "learn":
            self.pos_embed: nn.Parameter | None = nn.Parameter(torch.randn(1, n_pos, C) * 0.02)
        else:
            self.pos_embed = None
            if cfg.pos_embed == "sincos":
                self.register_buffer("sincos", sincos_2d_pos_embed(C, self.grid_size)[None], persistent=False)
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)
        self.norm_pre = norm_layer(C) if cfg.pre_norm else nn.Identity()

        dpr = drop_path_schedule(cfg.drop_path_rate, (cfg.depth,))[0]
        mlp_ratio = cfg.mlp_dim / C if cfg.mlp_dim else cfg.mlp_ratio
        mlp_layer: Any = {"mlp": Mlp, "glu": GluMlp,
                          "swiglu": partial(SwiGLU, norm_layer=norm_layer if cfg.mlp_norm else None)}[cfg.mlp_layer]
        attn_kwargs = {**self._grid_attn_kwargs(), **cfg.attn_kwargs}  # the config's keywords win
        if cfg.rope is not None:
            attn_kwargs.update(rope=cfg.rope, rope_kwargs=dict(cfg.rope_kwargs))
        if cfg.attn_norm:
            attn_kwargs.update(inner_norm=True, norm_eps=cfg.norm_eps)
        # one entry per block: every block keeps the patch grid (stride = patch size)
        self.feature_info = stage_feature_info((C,) * cfg.depth, (max(self.patch_embed.patch_size),) * cfg.depth,
                                               "blocks")
        block_fn: Any = ParallelScalingBlock if cfg.block == "parallel_scaling" else partial(Block, style=cfg.block)
        self.blocks = nn.Sequential(*[
            block_fn(C, cfg.num_heads, mlp_ratio=mlp_ratio, qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm,
                         proj_bias=cfg.proj_bias, mlp_bias=cfg.mlp_bias, drop=cfg.proj_drop_rate,
                         attn_drop=cfg.attn_drop_rate, drop_path=dpr[i], init_values=cfg.init_values,
                         norm_layer=norm_layer, act_layer=act_layer, attn_layer=cfg.attn_layer,
                         attn_kwargs=attn_kwargs, mlp_layer=mlp_layer, depth_index=i)
            for i in range(cfg.depth)
        ])
        # conditional position encodings (CPVT's PEG) on the output of blocks cfg.peg_after
        self.pos_block = nn.ModuleDict({str(i): PosConv(C) for i in sorted(set(cfg.peg_after))}) \
            if cfg.peg_after else None
        use_fc_norm = cfg.global_pool == "avg" if cfg.fc_norm is None else cfg.fc_norm
        self.norm = norm_layer(C) if cfg.final_norm and not use_fc_norm else nn.Identity()
        self.attn_pool = (AttentionPoolHead(C, cfg.num_heads, int(C * mlp_ratio), norm_layer=norm_layer,
                                            act_layer=act_layer) if cfg.global_pool == "map" else None)
        self.fc_norm = norm_layer(C) if cfg.final_norm and use_fc_norm else nn.Identity()
        if cfg.representation_size:
            self.pre_logits: nn.Module = nn.Sequential()
            self.pre_logits.add_module("fc", nn.Linear(C, cfg.representation_size))
            self.pre_logits.add_module("act", nn.Tanh())
            self.num_features = cfg.representation_size
        else:
            self.pre_logits = nn.Identity()
            self.num_features = C
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.head_dist = (nn.Linear(self.num_features, cfg.num_classes) if cfg.distilled and cfg.num_classes > 0
                          else (nn.Identity() if cfg.distilled else None))
        self._init_weights()

    # ------------------------------------------------------------------ construction
    def _grid_attn_kwargs(self) -> dict[str, Any]:
        """Keywords the blocks' mechanism takes from the token grid ``self.grid_size`` (none here; BEiT: the grid
        its relative-position table is built for)."""
        return {}

    def _init_weights(self) -> None:
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for tok in (self.cls_token, self.dist_token, self.reg_token):
            if tok is not None:
                nn.init.normal_(tok, std=1e-6)
        proj = getattr(getattr(self, "patch_embed", None), "proj", None)
        if isinstance(proj, nn.Conv2d):  # the patch convolution, as a linear map (first in module order)
            nn.init.trunc_normal_(proj.weight.view(proj.weight.shape[0], -1), std=0.02)
        init_linear_weights(self)

    # ------------------------------------------------------------------ API
    def _pin_pooling_choices(self) -> None:
        """``fc_norm=None`` means "the pooling decides" (``"avg"``: ``fc_norm`` after pooling, no final norm):
        pinned to what this model was built with before ``global_pool`` changes."""
        if self.cfg.fc_norm is None:
            self.cfg.fc_norm = self.cfg.global_pool == "avg"

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the classifier(s) with fresh ones for ``num_classes`` (0 = no head); ``global_pool``:
        one of ``pools`` (None = keep). The base's reset, plus a fresh distillation head (DeiT)."""
        super().reset_classifier(num_classes, global_pool)
        if self.head_dist is not None:
            device = next(self.parameters()).device
            self.head_dist = (nn.Linear(self.num_features, num_classes, device=device) if num_classes > 0
                              else nn.Identity())

    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None, *, interpolation: str = "bicubic",
                       antialias: bool = True) -> None:
        """Change the input resolution and / or the patch size permanently, in place (timm's ``set_input_size``).

        ``img_size`` (None = keep) must be a multiple of the patch size unless ``dynamic_img_pad``;
        ``patch_size`` (None = keep) rebuilds ``patch_embed.proj`` with its kernel resampled by
        :func:`~vit_attention.functional.resample_patch_embed` (FlexiViT's pseudo-inverse, so a
        resized image gives the same tokens). The learned ``pos_embed`` ``[1, P' + gh·gw, C]`` is
        replaced by its resampling to the new grid (:func:`~vit_attention.functional.resample_abs_pos_embed`,
        the prefix rows kept as they are unless ``no_embed_class``); a sin-cos table is recomputed.
        ``interpolation`` / ``antialias`` apply to both (timm: bicubic, anti-aliased); the table follows
        ``cfg.pos_embed_resize`` (``"timm"``: these two; ``"dinov2"`` / ``"bicubic"``: that rule's fixed call).
        ``grid_size``, ``feat_size``, ``cfg.img_size`` / ``cfg.patch_size`` and the ``reduction`` of ``feature_info``
        follow; RoPE and PEGs read the grid on every forward. Every argument is checked before anything
        changes (an error names it); a conv stem's patch size cannot change.
        """
        prev_grid = self.grid_size
        self.patch_embed.set_input_size(img_size, patch_size, interpolation=interpolation, antialias=antialias)
        assert self.patch_embed.grid_size is not None and self.patch_embed.img_size is not None
        grid = self.patch_embed.grid_size
        if self.pos_embed is not None and grid != prev_grid:
            n_prefix = 0 if self.cfg.no_embed_class else self.num_prefix_tokens
            with torch.no_grad():
                pos = resample_abs_pos_embed(self.pos_embed.detach(), grid, prev_grid, num_prefix_tokens=n_prefix,
                                             interpolation=interpolation, antialias=antialias,
                                             rule=self.cfg.pos_embed_resize)
            self.pos_embed = nn.Parameter(pos.contiguous(), requires_grad=self.pos_embed.requires_grad)
        elif self.cfg.pos_embed == "sincos" and grid != prev_grid:
            old = self.sincos
            self.register_buffer("sincos", sincos_2d_pos_embed(self.embed_dim, grid, dtype=old.dtype,
                                                               device=old.device)[None], persistent=False)
        self._record_patch_embed_size()  # grid_size, cfg sizes, feature reductions

    def feat_size(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Token grid for an image of size ``hw``."""
        return self.patch_embed.dynamic_feat_size(hw) if self.dynamic_img_size else self.grid_size

    def _pos_embed(self, x: Tensor, feat_size: tuple[int, int]) -> Tensor:
        """Add prefix tokens and position embeddings: ``[B, N, C] -> [B, P + N, C]``."""
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if self.pos_embed is None:
            if self.cfg.pos_embed == "sincos":
                pos = self.sincos if tuple(feat_size) == self.grid_size else sincos_2d_pos_embed(
                    self.embed_dim, feat_size, dtype=x.dtype, device=x.device)[None]
                x = x + pos.to(x.dtype)
            return torch.cat(prefix + [x], dim=1) if prefix else x
        pos = self.pos_embed
        if tuple(feat_size) != self.grid_size:
            pos = resample_abs_pos_embed(pos, feat_size, self.grid_size, rule=self.cfg.pos_embed_resize,
                                         num_prefix_tokens=0 if self.cfg.no_embed_class else self.num_prefix_tokens)
        if self.cfg.no_embed_class:
            x = x + pos
            return torch.cat(prefix + [x], dim=1) if prefix else x
        x = torch.cat(prefix + [x], dim=1) if prefix else x
        return x + pos  # [B, P + N, C]

    def _merging_obstacle(self) -> str | None:
        """A PEG between blocks (CPVT) needs the token grid (:class:`~.token_merging.TokenMergingMixin`)."""
        if self.pos_block is not None:
            return f"{type(self).__name__} runs position convolutions (PEG) between blocks, which need the token grid"
        return None

    def _run_blocks(self, x: Tensor, feat_size: tuple[int, int], indices: set[int] | None = None, *,
                    stop: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Tokens ``[B, P + N, C]`` through the blocks (the PEGs after blocks ``peg_after``):
        ``-> (tokens [B, P + N, C], [outputs of blocks indices])``; ``stop``: none after the last of ``indices``."""
        if self.token_merging is not None:
            return self._run_blocks_merging(x, feat_size, indices, rope_grid=self.cfg.rope is not None, stop=stop)
        after = {int(i): peg for i, peg in self.pos_block.items()} if self.pos_block is not None else None
        return run_blocks_with_taps(self.blocks, x, feat_size, self.num_prefix_tokens,
                                    checkpoint=self.grad_checkpointing and self.training, taps=indices, after=after,
                                    stop_at_last_tap=stop)

    def _embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:  # type: ignore[override]
        """Images ``[B, Cin, H, W]`` -> the blocks' input ``[B, P + N, C]`` (prefix tokens, positions) and the grid."""
        feat_size = self.feat_size(tuple(x.shape[-2:]))
        x = self.patch_embed(x)  # [B, N, C]
        return self.norm_pre(self.pos_drop(self._pos_embed(x, feat_size))), feat_size  # [B, P + N, C]

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> normalised tokens ``[B, P + N, C]``."""
        x, feat_size = self._embed(x)
        x, _ = self._run_blocks(x, feat_size)
        return self.norm(x)

    def pool(self, x: Tensor) -> Tensor:
        """Tokens ``[B, P + N, C]`` -> pooled ``[B, C]`` per ``global_pool`` (the base's rule; distilled
        with ``"token"``: both prefix tokens, ``[B, 2, C]``)."""
        if self.dist_token is not None and self.global_pool == "token":
            return x[:, :2]
        return super().pool(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Tokens ``[B, P + N, C]`` -> logits ``[B, num_classes]`` (or features ``[B, num_features]``)."""
        x = self.pool(x)
        if self.dist_token is not None and self.global_pool == "token":
            cls, dist = self.fc_norm(x[:, 0]), self.fc_norm(x[:, 1])
            cls, dist = self.pre_logits(cls), self.pre_logits(dist)
            if pre_logits:
                return (cls + dist) / 2
            assert self.head_dist is not None
            logits, logits_dist = self.head(self.head_drop(cls)), self.head_dist(self.head_drop(dist))
            if self.training and not torch.jit.is_scripting():
                return logits, logits_dist
            return (logits + logits_dist) / 2
        x = self.pre_logits(self.fc_norm(x))
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward_intermediates(
        self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
        output_fmt: Literal["NCHW", "NLC"] = "NCHW", return_prefix_tokens: bool = False,
        intermediates_only: bool = False, stop_early: bool = False,
    ) -> Any:
        """Final tokens plus the outputs of chosen blocks.

        ``indices``: an int ``n`` = the last ``n`` blocks, or explicit block indices (negative
        allowed); default all. Intermediates are ``[B, C, H', W']`` (``NCHW``) or ``[B, N, C]``
        (``NLC``), through the final norm when ``norm``; with ``return_prefix_tokens`` each is a pair
        ``(grid, prefix [B, P, C])``. Returns ``(final [B, P + N, C], [intermediates])`` or only the list.
        ``stop_early`` (timm): no block after the last chosen one runs, and the final output is that block's
        (through the final norm); ``intermediates_only`` always stops there.
        """
        take = isotropic_taps(indices, len(self.blocks), output_fmt)
        x, feat_size = self._embed(x)
        x, saved = self._run_blocks(x, feat_size, set(take), stop=intermediates_only or stop_early)
        outs = tokens_to_intermediates(saved, feat_size, self.num_prefix_tokens, norm=self.norm if norm else None,
                                       output_fmt=output_fmt, return_prefix_tokens=return_prefix_tokens)
        if intermediates_only:
            return outs
        return self.norm(x), outs


# ---------------------------------------------------------------------------- presets (data)
_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "medium": dict(embed_dim=512, depth=12, num_heads=8),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
    "huge": dict(embed_dim=1280, depth=32, num_heads=16),
}

_PRESETS: dict[str, dict[str, Any]] = {}
for _size in ("tiny", "small", "base", "large", "huge"):
    for _patch in (14, 16, 32):
        for _img in (224, 384) if _patch != 14 else (224, 336):  # 384 is no multiple of 14; CLIP uses 336
            _PRESETS[f"vit_{_size}_patch{_patch}_{_img}"] = dict(_SIZES[_size], patch_size=_patch, img_size=_img)
# Original ViT (Dosovitskiy et al.) ImageNet-21k models with the Linear + Tanh representation layer.
for _size, _patch in (("base", 16), ("base", 32), ("large", 16), ("large", 32), ("huge", 14)):
    _PRESETS[f"vit_{_size}_patch{_patch}_224_in21k"] = dict(
        _SIZES[_size], patch_size=_patch, num_classes=21843, representation_size=_SIZES[_size]["embed_dim"])
_PRESETS.update({
    # DeiT (Touvron et al. 2021): ViT architecture, distilled variants add a distillation token.
    "deit_tiny_patch16_224": dict(_SIZES["tiny"]),
    "deit_small_patch16_224": dict(_SIZES["small"]),
    "deit_base_patch16_224": dict(_SIZES["base"]),
    "deit_base_patch16_384": dict(_SIZES["base"], img_size=384),
    "deit_tiny_distilled_patch16_224": dict(_SIZES["tiny"], distilled=True),
    "deit_small_distilled_patch16_224": dict(_SIZES["small"], distilled=True),
    "deit_base_distilled_patch16_224": dict(_SIZES["base"], distilled=True),
    "deit_base_distilled_patch16_384": dict(_SIZES["base"], distilled=True, img_size=384),
    # ViT with mean pooling, post-norm and sin-cos variants ("Simple ViT", original Transformer block).
    "vit_small_patch16_224_gap": dict(_SIZES["small"], class_token=False, global_pool="avg"),
    "vit_base_patch16_224_gap": dict(_SIZES["base"], class_token=False, global_pool="avg"),
    "vit_small_patch16_224_sincos": dict(_SIZES["small"], class_token=False, global_pool="avg", pos_embed="sincos"),
    "vit_base_patch16_224_postnorm": dict(_SIZES["base"], block="post", final_norm=False),
    # ViT with an early convolutional stem (Xiao et al. 2021): 4 stride-2 3x3 convs + 1x1, one block fewer.
    "vitc_1gf_patch16_224": dict(embed_dim=192, depth=11, num_heads=3, conv_stem=(24, 48, 96, 192)),
    "vitc_4gf_patch16_224": dict(embed_dim=384, depth=11, num_heads=6, conv_stem=(48, 96, 192, 384)),
    "vitc_18gf_patch16_224": dict(embed_dim=768, depth=11, num_heads=12, conv_stem=(64, 128, 256, 512)),
    # Giant configs: build these on the meta device (with torch.device("meta"): ...).
    "vit_giant_patch14_224": dict(embed_dim=1408, depth=40, num_heads=16, mlp_dim=6144, patch_size=14),
    "vit_gigantic_patch14_224": dict(embed_dim=1664, depth=48, num_heads=16, mlp_dim=8192, patch_size=14),
    "vit_enormous_patch14_224": dict(embed_dim=1792, depth=56, num_heads=16, mlp_dim=15360, patch_size=14,
                                     class_token=False, global_pool="map"),
    # ViT-22B (Dehghani et al. 2023): parallel blocks, QK-norm, no qkv / LayerNorm biases, MAP head.
    "vit_22b_patch14_224": dict(embed_dim=6144, depth=48, num_heads=48, mlp_dim=24576, patch_size=14,
                                block="parallel", qk_norm=True, qkv_bias=False, norm_bias=False,
                                class_token=False, global_pool="map"),
    # A small 22B-style model that trains on a laptop.
    "vit_small_parallel_qknorm_patch16_224": dict(_SIZES["small"], block="parallel", qk_norm=True,
                                                  qkv_bias=False, norm_bias=False),
})
for _name, _size, _img in (("deit3_small_patch16_224", "small", 224), ("deit3_small_patch16_384", "small", 384),
                           ("deit3_medium_patch16_224", "medium", 224), ("deit3_base_patch16_224", "base", 224),
                           ("deit3_base_patch16_384", "base", 384), ("deit3_large_patch16_224", "large", 224),
                           ("deit3_large_patch16_384", "large", 384)):
    _PRESETS[_name] = dict(_SIZES[_size], img_size=_img, no_embed_class=True, init_values=1e-6)
_PRESETS["deit3_huge_patch14_224"] = dict(_SIZES["huge"], patch_size=14, no_embed_class=True, init_values=1e-6)

# timm's "searching for better ViT baselines" (SBB) models with register tokens (Darcet et al. 2024): no class
# token, the registers carry no position embedding, the patch tokens are averaged (registers left out).
_SBB = dict(patch_size=16, img_size=256, class_token=False, no_embed_class=True, global_pool="avg")
_PRESETS.update({
    "vit_wee_patch16_reg1_gap_256": dict(_SBB, embed_dim=256, depth=14, num_heads=4, mlp_ratio=5.0,
                                         init_values=1e-5, reg_tokens=1),
    "vit_little_patch16_reg1_gap_256": dict(_SBB, embed_dim=320, depth=14, num_heads=5, mlp_ratio=5.6,
                                            init_values=1e-5, reg_tokens=1),
    "vit_medium_patch16_reg1_gap_256": dict(_SBB, **_SIZES["medium"], init_values=1e-5, reg_tokens=1),
    "vit_medium_patch16_reg4_gap_256": dict(_SBB, **_SIZES["medium"], init_values=1e-5, reg_tokens=4),
    "vit_mediumd_patch16_reg4_gap_256": dict(_SBB, embed_dim=512, depth=20, num_heads=8, init_values=1e-5,
                                             reg_tokens=4),
    "vit_betwixt_patch16_reg1_gap_256": dict(_SBB, embed_dim=640, depth=12, num_heads=10, init_values=1e-5,
                                             reg_tokens=1),
    "vit_betwixt_patch16_reg4_gap_256": dict(_SBB, embed_dim=640, depth=12, num_heads=10, init_values=1e-5,
                                             reg_tokens=4),
    "vit_base_patch16_reg4_gap_256": dict(_SBB, **_SIZES["base"], reg_tokens=4),
    # differential attention (Ye et al., ICLR 2025) in the wee / little SBB models (timm 1.0.31's vit_dwee /
    # vit_dlittle: its Block with attn_layer='diff', each block's index setting its lambda_init)
    "vit_dwee_patch16_reg1_gap_256": dict(_SBB, embed_dim=256, depth=14, num_heads=4, mlp_ratio=5.0,
                                          init_values=1e-5, reg_tokens=1, attn_layer="diff"),
    "vit_dlittle_patch16_reg1_gap_256": dict(_SBB, embed_dim=320, depth=14, num_heads=5, mlp_ratio=5.6,
                                             init_values=1e-5, reg_tokens=1, attn_layer="diff"),
    # timm's vit_dpwee: its DiffParallelScalingBlock (fused in_proj / out_proj; weights/parallel_scaling.py)
    "vit_dpwee_patch16_reg1_gap_256": dict(_SBB, embed_dim=256, depth=16, num_heads=4, mlp_ratio=5.0,
                                           init_values=1e-5, reg_tokens=1, attn_layer="diff",
                                           block="parallel_scaling"),
})

# Published parameter counts (millions, 1000 classes unless noted), checked by tests on the meta device.
PUBLISHED_PARAMS_M: dict[str, float] = {
    "vit_base_patch16_224": 86.6, "vit_large_patch16_224": 304.3, "vit_huge_patch14_224": 632.0,
    "deit_tiny_patch16_224": 5.7, "deit_small_patch16_224": 22.1, "deit_base_patch16_224": 86.6,
    "deit_tiny_distilled_patch16_224": 5.9, "deit_small_distilled_patch16_224": 22.4,
    "deit_base_distilled_patch16_224": 87.3,
    "vit_giant_patch14_224": 1011.0,  # ViT-g/14 (Zhai et al. 2022, Table 2)
    "vit_gigantic_patch14_224": 1843.0,  # ViT-G/14 (Zhai et al. 2022, Table 2)
    "vit_enormous_patch14_224": 3900.0,  # ViT-e (Chen et al. 2022, PaLI: "3.9B")
    "vit_22b_patch14_224": 21743.0,  # ViT-22B (Dehghani et al. 2023, Table 1: 21.743B)
    # timm 1.0.31's SBB register models (timm.create_model on the meta device, 1000 classes)
    "vit_wee_patch16_reg1_gap_256": 13.423, "vit_little_patch16_reg1_gap_256": 22.515,
    "vit_medium_patch16_reg1_gap_256": 38.880, "vit_medium_patch16_reg4_gap_256": 38.882,
    "vit_mediumd_patch16_reg4_gap_256": 64.109, "vit_betwixt_patch16_reg1_gap_256": 60.397,
    "vit_betwixt_patch16_reg4_gap_256": 60.398, "vit_base_patch16_reg4_gap_256": 86.615,
    "vit_dwee_patch16_reg1_gap_256": 13.425, "vit_dlittle_patch16_reg1_gap_256": 22.518,
    "vit_dpwee_patch16_reg1_gap_256": 15.252,
}

_ALIASES = {
    "vit_b_16": "vit_base_patch16_224", "vit_b_32": "vit_base_patch32_224",
    "vit_l_16": "vit_large_patch16_224", "vit_l_32": "vit_large_patch32_224",
    "vit_h_14": "vit_huge_patch14_224",
    "vit_22b": "vit_22b_patch14_224", "vit_e": "vit_enormous_patch14_224", "vit_G_14": "vit_gigantic_patch14_224",
}

# What each published figure counts, when it is not the whole model at 1000 classes.
PUBLISHED_PARAMS_EXCLUDE: dict[str, tuple[str, ...]] = {
    "vit_22b_patch14_224": ("attn_pool.", "head."),  # Table 1 counts the encoder only
}

# Published GMACs at the preset's input size (checked by tests/analysis/test_flops.py), with their source.
PUBLISHED_GMACS: dict[str, tuple[float, str]] = {
    "vit_small_patch16_224": (4.6, "timm model table (ViT-S/16, = DeiT-S architecture)"),
    "vit_base_patch16_224": (17.6, "timm model table; ViT-B/16 = DeiT-B architecture"),
    "vit_large_patch16_224": (61.6, "timm model table (ViT-L/16 at 224)"),
    "deit_tiny_patch16_224": (1.3, "DeiT (Touvron et al. 2021) / timm model table, one decimal (ours 1.258)"),
}

_META: dict[str, dict[str, Any]] = {
    k: {"published_params_m": v, "published_params_exclude": PUBLISHED_PARAMS_EXCLUDE.get(k, ())}
    for k, v in PUBLISHED_PARAMS_M.items()}
_META = with_published_gmacs(_META, PUBLISHED_GMACS)


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a ViT / DeiT preset for tests, every code path it selects kept (its tokens,
    pooling, position embedding, block style, stem, norms): width 32, 2 heads, 2 blocks, the published
    MLP width dropped (``mlp_ratio`` applies), and a 3x3 patch grid for small patches (at most 48 px) or
    2x2 for patches of 16 and more; presets with other than 3 input channels keep their image size."""
    p = cfg.patch_size if isinstance(cfg.patch_size, int) else cfg.patch_size[0]
    over: dict[str, Any] = dict(embed_dim=32, num_heads=2, depth=2, img_size=min(p * 3, 48) if p < 16 else p * 2,
                                mlp_dim=None)
    if cfg.in_chans != 3:
        over.pop("img_size")
    return over


register_family("vit", VisionTransformer, VisionTransformerConfig, _PRESETS, aliases=_ALIASES, meta=_META,
                reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224_IMAGENET_C100 = data_cfg(224, 1.0)
_224_CLIP = data_cfg(224, 1.0, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
_224_SQUASH_BILINEAR = data_cfg(224, 1.0, mean=INCEPTION_MEAN, std=INCEPTION_STD, interpolation="bilinear",
                                crop_mode="squash")
_224_IMAGENET_C90 = data_cfg(224, 0.9)
_224_INCEPTION = data_cfg(224, 0.9, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_256_C95 = data_cfg(256, 0.95, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_256_C90 = data_cfg(256, 0.9, mean=INCEPTION_MEAN, std=INCEPTION_STD)
_384_IMAGENET = data_cfg(384, 1.0)
_384_INCEPTION = data_cfg(384, 1.0, mean=INCEPTION_MEAN, std=INCEPTION_STD)
PRETRAINED = pretrained_tags({
    "deit3_base_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "deit3_base_patch16_224.fb_in22k_ft_in1k": _224_IMAGENET_C100,
    "deit3_base_patch16_384.fb_in1k": _384_IMAGENET,
    "deit3_base_patch16_384.fb_in22k_ft_in1k": _384_IMAGENET,
    "deit3_huge_patch14_224.fb_in1k": _224_IMAGENET_C90,
    "deit3_huge_patch14_224.fb_in22k_ft_in1k": _224_IMAGENET_C100,
    "deit3_large_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "deit3_large_patch16_224.fb_in22k_ft_in1k": _224_IMAGENET_C100,
    "deit3_large_patch16_384.fb_in1k": _384_IMAGENET,
    "deit3_large_patch16_384.fb_in22k_ft_in1k": _384_IMAGENET,
    "deit3_medium_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "deit3_medium_patch16_224.fb_in22k_ft_in1k": _224_IMAGENET_C100,
    "deit3_small_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "deit3_small_patch16_224.fb_in22k_ft_in1k": _224_IMAGENET_C100,
    "deit3_small_patch16_384.fb_in1k": _384_IMAGENET,
    "deit3_small_patch16_384.fb_in22k_ft_in1k": _384_IMAGENET,
    "deit_base_distilled_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "deit_base_distilled_patch16_384.fb_in1k": _384_IMAGENET,
    "deit_base_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "deit_base_patch16_384.fb_in1k": _384_IMAGENET,
    "deit_small_distilled_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "deit_small_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "deit_tiny_distilled_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "deit_tiny_patch16_224.fb_in1k": _224_IMAGENET_C90,
    "vit_base_patch16_224.augreg2_in21k_ft_in1k": _224_INCEPTION,
    "vit_base_patch16_224.augreg_in21k_ft_in1k": _224_INCEPTION,
    "vit_base_patch16_224.orig_in21k_ft_in1k": _224_INCEPTION,
    "vit_base_patch16_224.augreg_in1k": _224_INCEPTION,
    "vit_base_patch16_224.orig_in21k": dict(_224_INCEPTION, num_classes=0),
    "vit_base_patch16_224.augreg_in21k": dict(_224_INCEPTION, num_classes=21843),
    "vit_base_patch16_224.sam_in1k": _224_INCEPTION,
    "vit_base_patch16_224.bamboo": dict(_224_CLIP, num_classes=115217, license=None),
    "vit_base_patch16_224.dino": dict(_224_IMAGENET_C90, num_classes=0),
    "vit_base_patch16_224.mae": dict(_224_IMAGENET_C90, num_classes=0, license="cc-by-nc-4.0"),
    "vit_base_patch16_224_in21k.orig_in21k": dict(_224_SQUASH_BILINEAR, hf_hub_id="google/vit-base-patch16-224-in21k",
                                                  num_classes=0),
    "vit_base_patch16_384.augreg_in21k_ft_in1k": _384_INCEPTION,
    "vit_base_patch16_384.orig_in21k_ft_in1k": _384_INCEPTION,
    "vit_base_patch16_384.augreg_in1k": _384_INCEPTION,
    "vit_base_patch16_reg4_gap_256.untrained": dict(_256_C90, hf_hub_id=None),
    "vit_base_patch32_224.augreg_in21k_ft_in1k": _224_INCEPTION,
    "vit_base_patch32_224.augreg_in1k": _224_INCEPTION,
    "vit_base_patch32_224.orig_in21k": dict(_224_INCEPTION, num_classes=0),
    "vit_base_patch32_224.augreg_in21k": dict(_224_INCEPTION, num_classes=21843),
    "vit_base_patch32_224.sam_in1k": _224_INCEPTION,
    "vit_base_patch32_224_in21k.orig_in21k": dict(_224_SQUASH_BILINEAR, hf_hub_id="google/vit-base-patch32-224-in21k",
                                                  num_classes=0),
    "vit_base_patch32_384.augreg_in21k_ft_in1k": _384_INCEPTION,
    "vit_base_patch32_384.augreg_in1k": _384_INCEPTION,
    "vit_betwixt_patch16_reg1_gap_256.sbb_in1k": _256_C95,
    "vit_betwixt_patch16_reg4_gap_256.sbb2_e200_in12k_ft_in1k": _256_C95,
    "vit_betwixt_patch16_reg4_gap_256.sbb_in12k_ft_in1k": _256_C95,
    "vit_betwixt_patch16_reg4_gap_256.sbb_in1k": _256_C95,
    "vit_betwixt_patch16_reg4_gap_256.sbb2_e200_in12k": dict(_256_C95, num_classes=11821),
    "vit_betwixt_patch16_reg4_gap_256.sbb_in12k": dict(_256_C95, num_classes=11821),
    "vit_dlittle_patch16_reg1_gap_256.sbb_nadamuon_in1k": _256_C95,
    "vit_dpwee_patch16_reg1_gap_256.sbb_nadamuon_in1k": _256_C95,
    "vit_dpwee_patch16_reg1_gap_256.sbb_in1k": _256_C95,
    "vit_dwee_patch16_reg1_gap_256.sbb_nadamuon_in1k": _256_C95,
    "vit_dwee_patch16_reg1_gap_256.sbb_in1k": _256_C95,
    "vit_giant_patch14_224.untrained": dict(_224_INCEPTION, hf_hub_id=None),
    "vit_gigantic_patch14_224.untrained": dict(_224_INCEPTION, hf_hub_id=None),
    "vit_huge_patch14_224.orig_in21k": dict(_224_INCEPTION, num_classes=0),
    "vit_huge_patch14_224.mae": dict(_224_IMAGENET_C90, num_classes=0, license="cc-by-nc-4.0"),
    "vit_huge_patch14_224_in21k.orig_in21k": dict(_224_SQUASH_BILINEAR, hf_hub_id="google/vit-huge-patch14-224-in21k",
                                                  num_classes=0),
    "vit_large_patch14_224.untrained": dict(_224_INCEPTION, hf_hub_id=None),
    "vit_large_patch16_224.augreg_in21k_ft_in1k": _224_INCEPTION,
    "vit_large_patch16_224.orig_in21k": dict(_224_INCEPTION, num_classes=0),
    "vit_large_patch16_224.augreg_in21k": dict(_224_INCEPTION, num_classes=21843),
    "vit_large_patch16_224.mae": dict(_224_IMAGENET_C90, num_classes=0, license="cc-by-nc-4.0"),
    "vit_large_patch16_224_in21k.orig_in21k": dict(_224_SQUASH_BILINEAR, hf_hub_id="google/vit-large-patch16-224-in21k",
                                                   num_classes=0),
    "vit_large_patch16_384.augreg_in21k_ft_in1k": _384_INCEPTION,
    "vit_large_patch32_224.orig_in21k": dict(_224_INCEPTION, num_classes=0),
    "vit_large_patch32_224_in21k.orig_in21k": dict(_224_SQUASH_BILINEAR, hf_hub_id="google/vit-large-patch32-224-in21k",
                                                   num_classes=0),
    "vit_large_patch32_384.orig_in21k_ft_in1k": _384_INCEPTION,
    "vit_little_patch16_reg1_gap_256.sbb_in12k_ft_in1k": _256_C95,
    "vit_little_patch16_reg1_gap_256.sbb_in12k": dict(_256_C95, num_classes=11821),
    "vit_medium_patch16_reg1_gap_256.sbb_in1k": _256_C95,
    "vit_medium_patch16_reg4_gap_256.sbb_in12k_ft_in1k": _256_C95,
    "vit_medium_patch16_reg4_gap_256.sbb_in1k": _256_C95,
    "vit_medium_patch16_reg4_gap_256.sbb_in12k": dict(_256_C95, num_classes=11821),
    "vit_mediumd_patch16_reg4_gap_256.sbb2_e200_in12k_ft_in1k": _256_C95,
    "vit_mediumd_patch16_reg4_gap_256.sbb_in12k_ft_in1k": _256_C95,
    "vit_mediumd_patch16_reg4_gap_256.sbb2_e200_in12k": dict(_256_C95, num_classes=11821),
    "vit_mediumd_patch16_reg4_gap_256.sbb_in12k": dict(_256_C95, num_classes=11821),
    "vit_small_patch16_224.augreg_in21k_ft_in1k": _224_INCEPTION,
    "vit_small_patch16_224.augreg_in1k": _224_INCEPTION,
    "vit_small_patch16_224.augreg_in21k": dict(_224_INCEPTION, num_classes=21843),
    "vit_small_patch16_224.dino": dict(_224_IMAGENET_C90, num_classes=0),
    "vit_small_patch16_384.augreg_in21k_ft_in1k": _384_INCEPTION,
    "vit_small_patch16_384.augreg_in1k": _384_INCEPTION,
    "vit_small_patch32_224.augreg_in21k_ft_in1k": _224_INCEPTION,
    "vit_small_patch32_224.augreg_in21k": dict(_224_INCEPTION, num_classes=21843),
    "vit_small_patch32_384.augreg_in21k_ft_in1k": _384_INCEPTION,
    "vit_tiny_patch16_224.augreg_in21k_ft_in1k": _224_INCEPTION,
    "vit_tiny_patch16_224.augreg_in21k": dict(_224_INCEPTION, num_classes=21843),
    "vit_tiny_patch16_384.augreg_in21k_ft_in1k": _384_INCEPTION,
    "vit_wee_patch16_reg1_gap_256.sbb_in1k": _256_C95,
}, license="apache-2.0")
