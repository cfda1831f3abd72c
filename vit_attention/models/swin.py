"""Swin Transformer (Liu et al. 2021): hierarchical backbone of (shifted) window attention stages.

Config dataclass -> :class:`SwinTransformer` -> presets registered as data. The state-dict layout
is timm's: ``patch_embed.{proj,norm}``, stages ``layers.N`` holding ``downsample`` (PatchMerging,
at the START of stage N for N > 0) and ``blocks.M``, final ``norm``, classifier ``head.fc``.
Other layouts (torchvision, Hugging Face, the original microsoft repository) are converted by
``vit_attention.weights.swin``.

SwinV2 (``models/swinv2.py``) is this same class with three switches of the config: the
attention mechanism (``cosine_window``), res-post-norm blocks and norm-after-reduction
PatchMerging. Both live on one backbone because everything else (stages, padding, the window
clamp, intermediates, the head) is identical, and two copies would drift.

The stages are the shared scaffold (``layers/stage.py``: :class:`~vit_attention.layers.Stage`,
drop-path schedule, ``forward_intermediates``, checkpointing) and the blocks the one
:class:`~vit_attention.layers.Block` (``style="pre"``, or ``"res_post"`` for v2) around any
spatial mechanism (``attn_layer``; ``window`` and ``cosine_window`` are Swin's own). What is
Swin's here: the config, the window clamp per stage, the alternating shift, the stem.

Layout: channels-last ``[B, H, W, C]`` from the patch embedding to the final norm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..attention.base import AttentionModule
from ..functional import resample_abs_pos_embed
from ..functional.window import fit_window, to_pair
from ..layers import (
    Block,
    ClassifierHead,
    PatchEmbed,
    PatchMerging,
    Stage,
    accepted_kwargs,
    drop_path_schedule,
    stage_feature_info,
)
from ..layers.head import init_linear_weights
from ._config import (
    ConfigMixin,
    check_attn_layer,
    check_choice,
    check_common,
    check_float,
    check_int,
    check_int_seq,
    check_size,
)
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import register_family, with_published_gmacs

__all__ = ["SwinTransformerConfig", "SwinTransformer", "PatchMerging", "ClassifierHead", "reduced_config"]


@dataclass
class SwinTransformerConfig(ConfigMixin):
    """Everything a :class:`SwinTransformer` is built from (JSON-serialisable).

    ``pad_mode`` (only matters on maps that are not window multiples; all three agree otherwise):
    ``"swin"`` (default): windows clamped to stages smaller than them (then unshifted) as in timm,
    Hugging Face and the original repository, so their checkpoints behave identically; blocks pad
    BEFORE the cyclic shift, so the region mask always separates tokens that wrapped around.
    ``"timm"``: timm exactly (roll, then pad: at odd sizes edge tokens can see wrapped-around ones).
    ``"torchvision"``: torchvision exactly (no clamp; pad, then roll; axes that fit in one window
    are not shifted).
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["avg", ""] = "avg"
    embed_dim: int = 96
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int | tuple[int, int] = 7
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    ape: bool = False  # absolute position embedding [1, N, C] added after the patch embedding
    patch_norm: bool = True
    norm_eps: float = 1e-5
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.1
    strict_img_size: bool = True  # False: any input size (maps padded to the window per block)
    pad_mode: Literal["swin", "timm", "torchvision"] = "swin"
    always_partition: bool = False  # never clamp windows to small stages (timm option)
    attn_layer: str = "window"  # any registered spatial mechanism ([B, H, W, C])
    attn_kwargs: dict[str, Any] = field(default_factory=dict)  # given to every block's mechanism as they are
    # SwinV2 switches
    res_post_norm: bool = False  # x + norm(attn(x)) instead of x + attn(norm(x))
    merge_norm_after: bool = False  # PatchMerging: reduction then norm(2C) instead of norm(4C) then reduction
    pretrained_window_sizes: tuple[int, ...] | None = None  # SwinV2 CPB normalisation per stage (0 = own)

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        img = check_common(self)
        patch = (check_int(self.patch_size, "patch_size"),) * 2  # an int: stage strides are patch_size * 2^i
        dim = check_int(self.embed_dim, "embed_dim")
        depths = check_int_seq(self.depths, "depths", min_value=0)
        n = len(depths)
        if isinstance(self.num_heads, Sequence) and not isinstance(self.num_heads, str) and len(self.num_heads) != n:
            raise ValueError(f"depths {self.depths} and num_heads {self.num_heads} must be non-empty and equally "
                             f"long (one entry per stage)")
        heads = check_int_seq(self.num_heads, "num_heads", length=n)
        for i, h in enumerate(heads):
            if (dim * 2 ** i) % h:
                raise ValueError(f"stage {i} width {dim * 2 ** i} (embed_dim={dim} * 2^{i}) "
                                 f"is not divisible by num_heads={h} (num_heads[{i}])")
        check_size(self.window_size, "window_size")
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_float(self.norm_eps, "norm_eps")
        check_choice(self.pad_mode, "pad_mode", ("swin", "timm", "torchvision"))
        check_attn_layer(self.attn_layer, self.attn_kwargs, layout="spatial")
        if self.pretrained_window_sizes is not None:
            pws = self.pretrained_window_sizes
            if isinstance(pws, str) or not isinstance(pws, Sequence) or len(pws) != n:
                raise ValueError(f"pretrained_window_sizes {pws!r} needs one entry per stage ({n}): "
                                 f"a window size, or 0 for the stage's own window")
            for i, w in enumerate(pws):
                check_size(w, f"pretrained_window_sizes[{i}]", min_value=0)
        if self.strict_img_size or self.pad_mode == "torchvision":
            if img[0] % patch[0] or img[1] % patch[1]:
                raise ValueError(f"img_size={self.img_size!r} is not divisible by patch_size={self.patch_size!r}; "
                                 f"use a multiple of the patch size"
                                 + ("" if self.pad_mode == "torchvision" else
                                    ", or strict_img_size=False to pad inputs of any size"))


def stage_windows(res: tuple[int, int], window: tuple[int, int], shift: tuple[int, int], clamp: bool
                  ) -> tuple[tuple[int, int], tuple[int, int]]:
    """A stage's window and shift at resolution ``res``: :func:`~vit_attention.functional.window.fit_window`
    (timm's per-axis clamp) when ``clamp``, else as configured."""
    return fit_window(res, window, shift) if clamp else (window, shift)


def _stage_pairs(value: Any, n: int, name: str) -> tuple[tuple[int, int], ...]:
    """``value``: an int or ``(h, w)`` for all ``n`` stages, or one of those per stage -> ``n`` positive pairs.

    As timm: a sequence of two ints is always one ``(h, w)``, never two stages.
    """
    def pair(v: Any, where: str) -> tuple[int, int]:
        items = [v] * 2 if not isinstance(v, Sequence) or isinstance(v, str) else list(v)
        if len(items) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in items):
            raise TypeError(f"{where} must be an int or an (h, w) pair of ints, got {v!r}")
        if min(items) <= 0:
            raise ValueError(f"{where} must be positive, got {v!r}")
        return items[0], items[1]
    if not isinstance(value, Sequence) or isinstance(value, str) or (
            len(value) == 2 and not isinstance(value[0], Sequence)):
        return (pair(value, name),) * n
    if len(value) != n:
        raise ValueError(f"{name}={value!r} needs one entry per stage ({n}), or one int / (h, w) for all")
    return tuple(pair(v, f"{name}[{i}]") for i, v in enumerate(value))


def _stage_ints(value: Any, n: int, name: str) -> tuple[int, ...]:
    """``value``: a positive int for all ``n`` stages or one per stage."""
    vals = [value] * n if not isinstance(value, Sequence) or isinstance(value, str) else list(value)
    if len(vals) != n:
        raise ValueError(f"{name}={value!r} needs one entry per stage ({n}) or a single int")
    for i, v in enumerate(vals):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} entries must be ints, got {v!r} at stage {i}")
        if v <= 0:
            raise ValueError(f"{name} must be positive, got {v!r} at stage {i}")
    return tuple(vals)


class SwinTransformer(StagedBackbone):
    """Swin Transformer backbone + classifier, ``[B, Cin, H, W] -> [B, num_classes]``.

    ``forward_features`` gives the normalised last map ``[B, H/32, W/32, 8C]`` (channels-last),
    ``forward_intermediates`` every stage's map (``NCHW`` by default), ``forward_head`` pools and
    classifies. Stage ``i`` outputs ``C·2^i`` channels at stride ``4·2^i``.
    """

    family = "swin"
    config_cls = SwinTransformerConfig
    stages_attr = "layers"  # timm's key layout: layers.{i}.downsample / layers.{i}.blocks.{j}
    no_weight_decay_keys = ("absolute_pos_embed", "relative_position_bias_table", "logit_scale", "cpb_mlp")

    def __init__(self, cfg: SwinTransformerConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        n = len(cfg.depths)
        self.global_pool = cfg.global_pool
        self.embed_dim = cfg.embed_dim
        dims = [cfg.embed_dim * 2 ** i for i in range(n)]
        self.num_features = dims[-1]
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, cfg.embed_dim, flatten=False,
                                      norm_layer=(lambda d: nn.LayerNorm(d, eps=cfg.norm_eps)) if cfg.patch_norm
                                      else None, strict_img_size=cfg.strict_img_size,
                                      dynamic_img_pad=not cfg.strict_img_size and cfg.pad_mode != "torchvision",
                                      size_options=("strict_img_size=False", None))
        assert self.patch_embed.grid_size is not None
        self.grid_size = self.patch_embed.grid_size
        self.absolute_pos_embed = (nn.Parameter(torch.zeros(1, self.grid_size[0] * self.grid_size[1], cfg.embed_dim))
                                   if cfg.ape else None)
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)

        window = to_pair(cfg.window_size, "window_size")
        # set_input_size() scales these with the patch grid (timm): per-stage windows and the grid they were set for
        self._ref_windows: tuple[tuple[int, int], ...] = (window,) * n
        self._ref_grid: tuple[int, int] = tuple(self.grid_size)  # type: ignore[assignment]
        self.window_sizes = self._ref_windows  # every stage's window before the clamp (set_input_size changes it)
        self._shifted_blocks = [[j % 2 == 1 and any(w // 2 for w in window) for j in range(d)] for d in cfg.depths]
        pws = cfg.pretrained_window_sizes or (0,) * n
        clamp = cfg.pad_mode != "torchvision" and not cfg.always_partition
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        res = self.grid_size
        stages = []
        for i, dpr in enumerate(drop_path_schedule(cfg.drop_path_rate, cfg.depths)):
            downsample = None
            if i > 0:
                downsample = PatchMerging(dims[i - 1], dims[i], norm_after=cfg.merge_norm_after, eps=cfg.norm_eps)
                res = ((res[0] + 1) // 2, (res[1] + 1) // 2)
            blocks = []
            for j in range(cfg.depths[i]):
                shift = (0, 0) if j % 2 == 0 else (window[0] // 2, window[1] // 2)
                win, sft = stage_windows(res, window, shift, clamp)
                swin_kwargs = dict(window_size=win, shift_size=sft, pad_first=cfg.pad_mode != "timm",
                                   pretrained_window_size=pws[i],  # given where the mechanism takes them
                                   clamp_window=False)  # the stage windows above follow the config's rule
                blocks.append(Block(
                    dims[i], cfg.num_heads[i], style="res_post" if cfg.res_post_norm else "pre",
                    mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, drop=cfg.proj_drop_rate,
                    attn_drop=cfg.attn_drop_rate, drop_path=dpr[j], norm_layer=norm_layer, attn_layer=cfg.attn_layer,
                    attn_kwargs={**accepted_kwargs(cfg.attn_layer, swin_kwargs), **cfg.attn_kwargs},
                    depth_index=sum(cfg.depths[:i]) + j))
            stages.append(Stage(blocks, downsample))
        self.layers = nn.Sequential(*stages)
        self.feature_info = stage_feature_info(dims, [cfg.patch_size * 2 ** i for i in range(n)], "layers")
        self.norm = nn.LayerNorm(self.num_features, eps=cfg.norm_eps)
        self.head = ClassifierHead(self.num_features, cfg.num_classes, global_pool="", drop=cfg.drop_rate)
        self._init_weights()

    # ------------------------------------------------------------------ construction
    def _init_weights(self) -> None:
        if self.absolute_pos_embed is not None:
            nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        init_linear_weights(self)
        if self.cfg.res_post_norm:  # SwinV2: residual branches start at zero
            for stage in self.layers:
                for blk in stage.blocks:
                    for norm in (blk.norm1, blk.norm2):
                        nn.init.zeros_(norm.weight)
                        nn.init.zeros_(norm.bias)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, *,
                       window_size: int | Sequence[int] | Sequence[int | Sequence[int]] | None = None,
                       window_ratio: int | Sequence[int] | None = None,
                       always_partition: bool | None = None) -> None:
        """Change the input resolution and / or the windows permanently, in place (timm's ``set_input_size``).

        ``img_size`` (None = keep) gives the new patch grid ``(Hg, Wg) = img_size / patch_size``;
        stage ``i`` runs on ``ceil(Hg / 2^i) x ceil(Wg / 2^i)``. Window of each stage:
        ``window_size`` (an int or ``(h, w)`` for all stages, or one per stage), else ``window_ratio``
        (``grid // ratio``, an int for all stages or one per stage: a pair is two stages, not
        ``(h, w)``), else the current windows scaled with the grid (``w·Hg_new // Hg_ref``; a call
        with no argument changes nothing). Explicit windows become the reference of later calls.
        Each block then takes the stage window (clamped to stages smaller than it unless
        ``always_partition``, None = keep) and, every second block, the shift ``window // 2``; the
        relative-position tables ``[(2Wh-1)(2Ww-1), nh]`` are resampled to the new windows like
        timm (:func:`~vit_attention.attention.window.resize_window_bias_table`), SwinV2's continuous
        position bias is read at the new window's coordinates (``pretrained_window_sizes`` kept), the
        shift masks are rebuilt, an absolute position embedding is resampled bicubically.
        ``grid_size``, ``cfg.img_size``, ``cfg.window_size`` (the first stage's window),
        ``cfg.always_partition`` follow; ``window_sizes`` holds every stage's. Every argument is
        checked before anything changes; an error names it.
        """
        n = len(self.layers)
        windows = ratios = None
        if window_size is not None:
            windows = _stage_pairs(window_size, n, "window_size")
        elif window_ratio is not None:
            ratios = _stage_ints(window_ratio, n, "window_ratio")
        if always_partition is not None and not isinstance(always_partition, bool):
            raise TypeError(f"always_partition must be a bool or None, got {always_partition!r}")
        attns = [blk.attn for stage in self.layers for blk in stage.blocks]
        if any(not isinstance(a, AttentionModule) or not a.provides("set_window_size") for a in attns):
            raise TypeError(f"attn_layer={self.cfg.attn_layer!r} has no window to resize (set_window_size)")
        prev_grid = self.grid_size
        self.patch_embed.set_input_size(img_size)  # checks img_size (patch multiple) before changing
        assert self.patch_embed.grid_size is not None and self.patch_embed.img_size is not None
        grid: tuple[int, int] = tuple(self.patch_embed.grid_size)  # type: ignore[assignment]
        if windows is None and ratios is not None:
            windows = tuple((max(1, grid[0] // r), max(1, grid[1] // r)) for r in ratios)
        if windows is None:
            windows = tuple((max(1, w[0] * grid[0] // self._ref_grid[0]), max(1, w[1] * grid[1] // self._ref_grid[1]))
                            for w in self._ref_windows)
        else:
            self._ref_windows, self._ref_grid = windows, grid
        if always_partition is not None:
            self.cfg.always_partition = always_partition
        clamp = self.cfg.pad_mode != "torchvision" and not self.cfg.always_partition
        res = grid
        for i, stage in enumerate(self.layers):
            if i > 0:
                res = ((res[0] + 1) // 2, (res[1] + 1) // 2)
            win = windows[i]
            for blk, shifted in zip(stage.blocks, self._shifted_blocks[i]):
                shift = (win[0] // 2, win[1] // 2) if shifted else (0, 0)
                blk.attn.set_window_size(*stage_windows(res, win, shift, clamp))
        if self.absolute_pos_embed is not None and grid != prev_grid:
            with torch.no_grad():
                pos = resample_abs_pos_embed(self.absolute_pos_embed.detach(), grid, prev_grid, num_prefix_tokens=0)
            grad = self.absolute_pos_embed.requires_grad
            self.absolute_pos_embed = nn.Parameter(pos.contiguous(), requires_grad=grad)
        self.grid_size = grid
        self.window_sizes = windows
        h, w = self.patch_embed.img_size
        self.cfg.img_size = h if h == w else (h, w)
        self.cfg.window_size = windows[0] if windows[0][0] != windows[0][1] else windows[0][0]

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> ``[B, H/p, W/p, C]`` (+ absolute position embedding).

        Sizes that are not patch multiples (``strict_img_size=False``): zero-padded bottom/right
        (timm mode, the original detection code's convention) or cropped like torchvision's strided
        convolution (``pad_mode="torchvision"``).
        """
        if self.cfg.pad_mode == "torchvision" and not self.cfg.strict_img_size and x.dim() == 4:
            ph, pw = self.patch_embed.patch_size
            x = x[..., : x.shape[-2] - x.shape[-2] % ph, : x.shape[-1] - x.shape[-1] % pw]  # conv floor
        x = self.patch_embed(x)  # [B, Hg, Wg, C]
        if self.absolute_pos_embed is not None:
            B, Hg, Wg, C = x.shape
            pos = self.absolute_pos_embed
            if (Hg, Wg) != self.grid_size:
                pos = resample_abs_pos_embed(pos, (Hg, Wg), self.grid_size, num_prefix_tokens=0)
            x = x + pos.view(1, Hg, Wg, C)
        return self.pos_drop(x)


# ---------------------------------------------------------------------------- presets (data)
_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    "small": dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    "base": dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    "large": dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
}

_PRESETS: dict[str, dict[str, Any]] = {}
for _size in ("tiny", "small", "base", "large"):
    _PRESETS[f"swin_{_size}_patch4_window7_224"] = dict(_SIZES[_size], window_size=7, img_size=224)
for _size in ("base", "large"):
    _PRESETS[f"swin_{_size}_patch4_window12_384"] = dict(_SIZES[_size], window_size=12, img_size=384)
_PRESETS["swin_tiny_patch4_window7_224"]["drop_path_rate"] = 0.2
_PRESETS["swin_small_patch4_window7_224"]["drop_path_rate"] = 0.3
_PRESETS["swin_base_patch4_window7_224"]["drop_path_rate"] = 0.5

# Published parameter counts (millions, 1000 classes; Liu et al. 2021, Table 1 / timm model cards).
PUBLISHED_PARAMS_M: dict[str, float] = {
    "swin_tiny_patch4_window7_224": 28.3, "swin_small_patch4_window7_224": 49.6,
    "swin_base_patch4_window7_224": 87.8, "swin_base_patch4_window12_384": 87.9,
    "swin_large_patch4_window7_224": 197.0, "swin_large_patch4_window12_384": 197.0,
}

_ALIASES = {"swin_t": "swin_tiny_patch4_window7_224", "swin_s": "swin_small_patch4_window7_224",
            "swin_b": "swin_base_patch4_window7_224"}

# Published GMACs at the preset's input size (checked by tests/analysis/test_flops.py), with their source.
PUBLISHED_GMACS: dict[str, tuple[float, str]] = {
    "swin_tiny_patch4_window7_224": (4.5, "Swin (Liu et al. 2021), Table 1, Swin-T"),
    "swin_small_patch4_window7_224": (8.7, "Swin (Liu et al. 2021), Table 1, Swin-S"),
    "swin_base_patch4_window7_224": (15.4, "Swin (Liu et al. 2021), Table 1, Swin-B"),
}

_META: dict[str, dict[str, Any]] = {k: {"published_params_m": v} for k, v in PUBLISHED_PARAMS_M.items()}
_META = with_published_gmacs(_META, PUBLISHED_GMACS)



def reduced_config(cfg: SwinTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a Swin / SwinV2 preset for tests: width 16, 2 blocks and 2 heads per stage,
    windows of 2 (4x4 windows at stage 1 down to a 2x2 map); SwinV2's pretrained windows kept as 2 or 0."""
    stages = len(cfg.depths)
    over: dict[str, Any] = dict(embed_dim=16, depths=(2,) * stages, num_heads=(2,) * stages, window_size=2,
                                img_size=cfg.patch_size * 2 ** stages * (1 if stages > 2 else 2))
    if cfg.pretrained_window_sizes and any(cfg.pretrained_window_sizes):
        over["pretrained_window_sizes"] = tuple(2 if w else 0 for w in cfg.pretrained_window_sizes)
    return over


register_family("swin", SwinTransformer, SwinTransformerConfig, _PRESETS, aliases=_ALIASES, meta=_META,
                reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.9)
_384 = data_cfg(384, 1.0)
PRETRAINED = pretrained_tags({
    "swin_base_patch4_window12_384.ms_in22k_ft_in1k": _384,
    "swin_base_patch4_window12_384.ms_in1k": _384,
    "swin_base_patch4_window12_384.ms_in22k": dict(_384, num_classes=21841),
    "swin_base_patch4_window7_224.ms_in22k_ft_in1k": _224,
    "swin_base_patch4_window7_224.ms_in1k": _224,
    "swin_base_patch4_window7_224.ms_in22k": dict(_224, num_classes=21841),
    "swin_large_patch4_window12_384.ms_in22k_ft_in1k": _384,
    "swin_large_patch4_window12_384.ms_in22k": dict(_384, num_classes=21841),
    "swin_large_patch4_window7_224.ms_in22k_ft_in1k": _224,
    "swin_large_patch4_window7_224.ms_in22k": dict(_224, num_classes=21841),
    "swin_small_patch4_window7_224.ms_in22k_ft_in1k": _224,
    "swin_small_patch4_window7_224.ms_in1k": _224,
    "swin_small_patch4_window7_224.ms_in22k": dict(_224, num_classes=21841),
    "swin_tiny_patch4_window7_224.ms_in1k": _224,
    "swin_tiny_patch4_window7_224.ms_in22k": dict(_224, num_classes=21841),
    "swin_tiny_patch4_window7_224.ms_in22k_ft_in1k": _224,
}, license="mit")
