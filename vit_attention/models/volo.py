"""VOLO (Yuan et al., "VOLO: Vision Outlooker for Visual Recognition", TPAMI 2022, arXiv 2106.13112): an outlooker
stage of outlook attention at stride 8, then transformer stages and class attention, with a token-labelling head.

Config dataclass -> :class:`Volo` -> presets registered as data (timm 1.0.31's names and configs,
``timm/models/volo.py``, itself sail-sg/volo's ``models/volo.py``). The flow, channels-last ``[B, H, W, C]`` up
to the class attention:

* ``patch_embed``: conv 7x7 stride 2 (``stem_hidden_dim`` channels), BN, ReLU, 2 x (conv 3x3, BN, ReLU), then
  ``proj``, a conv with kernel = stride = ``patch_size / 2``: stride ``patch_size`` in all;
* ``network.0``: the outlooker blocks, pre-norm :class:`~vit_attention.layers.Block` with the ``outlook``
  mechanism (kernel 3, stride 2; no drop path, as the references);
* ``network.1``: :class:`VoloDownsample`, a 2x2 stride-2 conv to the transformer width, then ``pos_embed``
  ``[1, h, w, C]`` (channels-last, no class slot) is added;
* ``network.2..``: transformer stages, pre-norm blocks with ``mhsa`` (no qkv bias) on the map;
* ``post_network``: class-attention blocks (``class_attn`` in the one Block's context flow, as CaiT): only the
  class token, concatenated here, is updated; no LayerScale;
* ``norm`` over ``[cls; tokens]``; ``head`` on the class token plus, at inference as in training's evaluation,
  ``0.5 · max`` over the tokens of the token-labelling ``aux_head`` (timm's ``forward_head``). Training with
  token labelling / MixToken (timm's ``forward_train``) is not part of this model: its forward is timm's ``forward``.

State-dict layout: timm's (= the original repository's), except the class blocks' fused ``attn.kv``, held here as
``attn.k`` and ``attn.v`` (``vit_attention.weights.volo`` splits and joins it).

The position embedding ties the model to its grid (``img_size / patch_size / 2`` per side, from the convolutions'
arithmetic); another input size raises naming ``set_input_size``, which resamples ``pos_embed`` with the original
repository's rule (bicubic, no antialias: sail-sg/volo ``utils/utils.py`` ``load_pretrained_weights``; timm has no
resize for VOLO).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ..attention import get_attention_spec
from ..attention.outlook import OutlookAttention
from ..functional import resample_abs_pos_embed
from ..layers import Block, accepted_kwargs
from ..layers.head import init_linear_weights
from ..layers.stage import resolve_indices, run_blocks
from ._config import ConfigMixin, check_attn_layer, check_common, check_float, check_int, check_int_seq, check_size
from .backbone import StagedBackbone
from .pretrained_tags import data_cfg, pretrained_tags
from .registry import published_meta, register_family

__all__ = ["VoloConfig", "Volo", "VoloPatchEmbed", "VoloDownsample", "reduced_config"]


@dataclass
class VoloConfig(ConfigMixin):
    """Everything a :class:`Volo` is built from (JSON-serialisable).

    ``layers`` / ``embed_dims`` / ``num_heads``: per stage; stage 0 is the outlooker stage, the others transformer
    stages of one width (``embed_dims[1:]`` equal: no downsampling between them). ``patch_size``: 4, 8 or 16 (the
    stem's stride). ``kernel_size`` / ``outlook_stride``: outlook attention's window and stride (the stride is
    offered to outlook attention only, ``kernel_size`` to any mechanism that takes one).
    ``num_class_blocks``: class-attention blocks after the transformer stages (0: no class token).
    ``use_aux_head``: the token-labelling head (added as ``0.5 · max`` over the tokens to the logits).
    ``attn_layer`` (spatial) / ``transformer_attn_layer`` / ``class_attn_layer`` (one that takes a context): the
    mechanisms of the three kinds of block; ``attn_kwargs``: keywords of the first.
    """

    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: Literal["token", "avg", ""] = "token"
    patch_size: int = 8
    stem_hidden_dim: int = 64
    layers: tuple[int, ...] = (4, 4, 8, 2)
    embed_dims: tuple[int, ...] = (192, 384, 384, 384)
    num_heads: tuple[int, ...] = (6, 12, 12, 12)
    mlp_ratio: float = 3.0
    qkv_bias: bool = False
    kernel_size: int = 3
    outlook_stride: int = 2
    num_class_blocks: int = 2
    use_aux_head: bool = True
    norm_eps: float = 1e-5
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    attn_layer: str = "outlook"
    attn_kwargs: dict[str, Any] = field(default_factory=dict)
    transformer_attn_layer: str = "mhsa"
    class_attn_layer: str = "class_attn"

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self, ("token", "avg", ""))
        layers = check_int_seq(self.layers, "layers", min_value=0)
        n = len(layers)
        if n < 2:
            raise ValueError(f"layers must have an outlooker stage and at least one transformer stage, got {layers}")
        dims = check_int_seq(self.embed_dims, "embed_dims", length=n)
        heads = check_int_seq(self.num_heads, "num_heads", length=n)
        for i, (d, h) in enumerate(zip(dims, heads)):
            if d % h:
                raise ValueError(f"embed_dims[{i}]={d} is not divisible by num_heads[{i}]={h}")
        if len(set(dims[1:])) != 1:
            raise ValueError(f"embed_dims[1:] must be one width (no downsampling between the transformer stages), "
                             f"got {dims}")
        if self.patch_size not in (4, 8, 16):
            raise ValueError(f"patch_size must be 4, 8 or 16 (the stem's stride), got {self.patch_size!r}")
        check_int(self.stem_hidden_dim, "stem_hidden_dim")
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_float(self.norm_eps, "norm_eps", low_open=True)
        check_int(self.kernel_size, "kernel_size")
        check_int(self.outlook_stride, "outlook_stride")
        check_int(self.num_class_blocks, "num_class_blocks", min_value=0)
        if self.global_pool == "token" and not self.num_class_blocks:
            raise ValueError("global_pool='token' needs the class token: num_class_blocks >= 1")
        h, w = volo_grid(check_size(self.img_size, "img_size"), self.patch_size)
        if min(h, w) < 1:
            raise ValueError(f"img_size={self.img_size} is too small: at least {2 * self.patch_size} px per side "
                             f"(a 1x1 grid after the stem and the downsample)")
        check_attn_layer(self.attn_layer, self.attn_kwargs, layout="spatial")
        check_attn_layer(self.transformer_attn_layer, {})
        check_attn_layer(self.class_attn_layer, {})
        if not get_attention_spec(self.class_attn_layer).supports_context:
            raise ValueError(f"class_attn_layer={self.class_attn_layer!r}: the class blocks need a mechanism that "
                             "takes a context (the class token queries every token), e.g. 'class_attn'")


def volo_grid(img_size: tuple[int, int], patch_size: int) -> tuple[int, int]:
    """The transformer stages' grid (= ``pos_embed``'s) for an image ``(H, W)``: the stem's conv 7x7 stride 2
    (padding 3), ``proj`` (kernel = stride = ``patch_size / 2``) and the 2x2 stride-2 downsample."""
    r = patch_size // 2
    return ((img_size[0] + 1) // 2 // r // 2, (img_size[1] + 1) // 2 // r // 2)


class VoloPatchEmbed(nn.Module):
    """VOLO's stem: images ``[B, Cin, H, W] -> [B, C, H', W']`` (NCHW), stride ``patch_size``.

    ``conv``: conv 7x7 stride 2 padding 3, BN, ReLU, 2 x (conv 3x3 padding 1, BN, ReLU), all ``hidden_dim`` wide
    and bias-free; ``proj``: conv with kernel = stride = ``patch_size / 2`` (with bias). Keys as timm's
    ``PatchEmbed(stem_conv=True, stem_stride=2)``: ``conv.{0,1,3,4,6,7}``, ``proj``.
    """

    def __init__(self, in_chans: int, hidden_dim: int, embed_dim: int, patch_size: int = 8) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(3):
            k, s = (7, 2) if i == 0 else (3, 1)
            layers += [nn.Conv2d(in_chans if i == 0 else hidden_dim, hidden_dim, k, stride=s, padding=k // 2,
                                 bias=False), nn.BatchNorm2d(hidden_dim), nn.ReLU(inplace=True)]
        self.conv = nn.Sequential(*layers)
        self.proj = nn.Conv2d(hidden_dim, embed_dim, patch_size // 2, stride=patch_size // 2)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, Cin, H, W] -> [B, C, H', W']``."""
        if x.dim() != 4 or x.shape[1] != self.conv[0].in_channels:
            raise ValueError(f"expected images [B, {self.conv[0].in_channels}, H, W], got {tuple(x.shape)}")
        return self.proj(self.conv(x))


class VoloDownsample(nn.Module):
    """A 2x2 stride-2 conv, channels-last in and out: ``[B, H, W, C] -> [B, H/2, W/2, C']`` (key ``proj``)."""

    def __init__(self, dim: int, out_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(dim, out_dim, 2, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, H, W, C] -> [B, floor(H/2), floor(W/2), C']``."""
        return self.proj(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class Volo(StagedBackbone):
    """VOLO backbone with a classifier, ``[B, Cin, H, W] -> [B, num_classes]`` (see the module docstring).

    ``forward_features`` gives the normalised tokens ``[B, 1 + N, C]`` (class token first; ``N`` tokens of the
    transformer grid), ``forward_head`` the class token's logits plus ``0.5 · max`` of the token-labelling head.
    Levels (``forward_intermediates``, ``feature_info``): the outlooker stage (stride ``patch_size``) and each
    transformer stage (stride ``2·patch_size``), as timm's ``stage_ends``: the modules of ``network`` (timm's keys)
    but the downsample.
    """

    family = "volo"
    stages_attr = "network"
    config_cls = VoloConfig
    no_weight_decay_keys = ("pos_embed", "cls_token")
    pools = ("token", "avg", "")
    avg_pool_prefix = True  # timm averages every token, the class token included
    head_fc = None
    token_merging_note: ClassVar[str] = ("its outlooker stage generates window weights for each cell of the map and "
                                         "its position embedding is a map: merged tokens would fill no grid")

    def __init__(self, cfg: VoloConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        dims = list(cfg.embed_dims)
        C = dims[-1]
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        self.global_pool = cfg.global_pool
        self.num_features = C
        self.num_prefix_tokens = 1 if cfg.num_class_blocks else 0
        self.grad_checkpointing = False
        self.patch_embed = VoloPatchEmbed(cfg.in_chans, cfg.stem_hidden_dim, dims[0], cfg.patch_size)
        self.grid_size = volo_grid(check_size(cfg.img_size, "img_size"), cfg.patch_size)
        self.pos_embed: nn.Parameter | None = nn.Parameter(torch.zeros(1, *self.grid_size, C))
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)

        block = partial(Block, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, attn_drop=cfg.attn_drop_rate,
                        norm_layer=norm_layer)
        # the window stride is outlook attention's own (another mechanism's stride subsamples its output)
        offered = dict(kernel_size=cfg.kernel_size)
        if issubclass(get_attention_spec(cfg.attn_layer).cls, OutlookAttention):
            offered["stride"] = cfg.outlook_stride
        outlook_kw = {**accepted_kwargs(cfg.attn_layer, offered), **cfg.attn_kwargs}
        total = sum(cfg.layers)
        network: list[nn.Module] = [nn.Sequential(*[
            block(dims[0], cfg.num_heads[0], attn_layer=cfg.attn_layer, attn_kwargs=outlook_kw, depth_index=j)
            for j in range(cfg.layers[0])])]
        network.append(VoloDownsample(dims[0], dims[1]))
        start = cfg.layers[0]
        for i in range(1, len(cfg.layers)):  # drop path as timm: index over every block, outlooker ones included
            network.append(nn.Sequential(*[
                block(dims[i], cfg.num_heads[i], attn_layer=cfg.transformer_attn_layer, depth_index=start + j,
                      drop_path=cfg.drop_path_rate * (start + j) / max(total - 1, 1))
                for j in range(cfg.layers[i])]))
            start += cfg.layers[i]
        self.network = nn.Sequential(*network)
        self.stage_ends = [0] + list(range(2, len(network)))  # network indices of the levels
        self.feature_info = [dict(num_chs=dims[0], reduction=cfg.patch_size, module="network.0")] + [
            dict(num_chs=dims[i], reduction=2 * cfg.patch_size, module=f"network.{i + 1}")
            for i in range(1, len(dims))]
        self.post_network = nn.ModuleList([
            block(C, cfg.num_heads[-1], attn_layer=cfg.class_attn_layer, depth_index=total + j)
            for j in range(cfg.num_class_blocks)])
        self.cls_token: nn.Parameter | None = nn.Parameter(torch.zeros(1, 1, C)) if cfg.num_class_blocks else None
        self.norm = norm_layer(C)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(C, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.aux_head = nn.Linear(C, cfg.num_classes) if cfg.use_aux_head and cfg.num_classes > 0 else None
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        init_linear_weights(self)

    # ------------------------------------------------------------------ classifier
    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh ``head`` and token-labelling ``aux_head`` (when the config uses one) for ``num_classes``
        (0 = none); ``global_pool``: one of ``pools`` (None = keep; ``"token"`` needs the class token)."""
        super().reset_classifier(num_classes, global_pool)
        device = next(self.parameters()).device
        use = self.cfg.use_aux_head and num_classes > 0
        self.aux_head = nn.Linear(self.num_features, num_classes, device=device) if use else None

    def _prune_head(self) -> None:
        """The classifiers, and the class-attention blocks and class token that only feed them: the features are
        then the normalised tokens ``[B, N, C]``."""
        super()._prune_head()
        self.aux_head = None
        self.post_network = nn.ModuleList()
        self.cls_token = None
        self.num_prefix_tokens = 0

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens ``[B, P + N, C]`` -> logits ``[B, num_classes]``: ``head`` of the pooled token plus, with the
        token-labelling head and a pooling, ``0.5 · max`` over the ``N`` tokens of ``aux_head`` (per class);
        ``pre_logits``: the pooled ``[B, C]``."""
        out = self.head_drop(self.pool(x))  # [B, C]
        if pre_logits:
            return out
        out = self.head(out)
        if self.aux_head is not None and self.global_pool:
            aux = self.aux_head(self.head_drop(x[:, self.num_prefix_tokens:]))  # [B, N, classes]
            out = out + 0.5 * aux.amax(dim=1)
        return out

    # ------------------------------------------------------------------ input size
    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Change the input resolution permanently, in place: ``pos_embed`` ``[1, h, w, C]`` is resampled to the
        new grid (:func:`volo_grid`) with the original repository's rule (bicubic, no antialias; timm has none);
        ``grid_size`` and ``cfg.img_size`` follow. ``img_size`` is checked before anything changes."""
        if img_size is None:
            return
        img = check_size(img_size, "img_size")
        grid = volo_grid(img, self.cfg.patch_size)
        if min(grid) < 1:
            raise ValueError(f"img_size={img_size} is too small: at least {2 * self.cfg.patch_size} px per side")
        if self.pos_embed is not None and grid != tuple(self.grid_size):
            with torch.no_grad():
                pos = self.pos_embed.detach()
                flat = resample_abs_pos_embed(pos.flatten(1, 2), grid, tuple(self.grid_size), num_prefix_tokens=0,
                                              rule="bicubic")  # [1, h'·w', C]
            self.pos_embed = nn.Parameter(flat.reshape(1, *grid, pos.shape[-1]).contiguous(),
                                          requires_grad=self.pos_embed.requires_grad)
        self.grid_size = grid
        self.cfg.img_size = img[0] if img[0] == img[1] else img

    # ------------------------------------------------------------------ forward
    def _add_pos(self, x: Tensor) -> Tensor:
        """``x [B, h, w, C] + pos_embed`` (then its dropout); another grid raises naming ``set_input_size``."""
        if self.pos_embed is None:
            return x
        if tuple(x.shape[1:3]) != tuple(self.pos_embed.shape[1:3]):
            raise ValueError(f"the input gives a {x.shape[1]}x{x.shape[2]} token grid, pos_embed is "
                             f"{self.pos_embed.shape[1]}x{self.pos_embed.shape[2]} (img_size={self.cfg.img_size}); "
                             "build the model at this img_size or call set_input_size first")
        return self.pos_drop(x + self.pos_embed)

    def _embed(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> the outlooker stage's map ``[B, H/p, W/p, C_0]``."""
        return self.patch_embed(x).permute(0, 2, 3, 1)

    def _run_network(self, x: Tensor, take: Sequence[int] = (), stop: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Images -> the last network module's map ``[B, h, w, C]`` and the maps of network indices ``take``."""
        x = self._embed(x)  # [B, H/p, W/p, C_0]
        saved = []
        checkpoint = self.grad_checkpointing and self.training
        last = max(take) if stop and take else len(self.network) - 1
        for idx, module in enumerate(self.network):
            if idx > last:
                break
            if idx == 2:
                x = self._add_pos(x)
            x = run_blocks(module, x, checkpoint=checkpoint) if isinstance(module, nn.Sequential) else module(x)
            if idx in take:
                saved.append(x)
        return x, saved

    def forward_cls(self, x: Tensor, feat_size: tuple[int, int] | None = None) -> Tensor:
        """Class-attention blocks: tokens ``[B, N, C]`` -> ``[B, 1 + N, C]`` (only the class token changes; none:
        ``x`` as it is). ``feat_size``: the tokens' grid (recorded maps are placed on it)."""
        if self.cls_token is None:
            return x
        cls = self.cls_token.expand(x.shape[0], -1, -1)  # [B, 1, C]
        for blk in self.post_network:
            cls = blk(cls, feat_size, context=x)  # [B, 1, C]
        return torch.cat([cls, x], dim=1)  # [B, 1 + N, C]

    def _finish(self, x: Tensor) -> Tensor:
        """The last stage's map ``[B, h, w, C]`` -> the class blocks, then the final norm: ``[B, P + h·w, C]``."""
        B, h, w, C = x.shape
        return self.norm(self.forward_cls(x.reshape(B, h * w, C), (h, w)))

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> normalised tokens ``[B, 1 + N, C]``."""
        return self._finish(self._run_network(x)[0])

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
                              output_fmt: Literal["NCHW", "NHWC"] = "NCHW", intermediates_only: bool = False,
                              stop_early: bool = False) -> Any:
        """The final tokens (as :meth:`forward_features`) plus each chosen level's map (timm's ``stage_ends``).

        ``indices``: an int ``n`` = the last ``n`` levels, or level indices (negative allowed); default all. Level
        ``i`` gives ``[B, C_i, H_i, W_i]`` (``NCHW``) or ``[B, H_i, W_i, C_i]`` (``NHWC``); ``norm``: the final norm
        on the transformer levels' maps (as timm). ``stop_early`` / ``intermediates_only``: nothing after the last
        chosen level runs; ``final`` is then its map ``[B, H_i, W_i, C_i]`` when it is not the last level.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        take = resolve_indices(indices, len(self.stage_ends), "feature level")
        net_take = [self.stage_ends[i] for i in take]
        stop = intermediates_only or stop_early
        x, saved = self._run_network(x, net_take, stop)
        outs = []
        for idx, t in zip(net_take, saved):
            t = self.norm(t) if norm and idx >= 2 else t
            outs.append(t.permute(0, 3, 1, 2) if output_fmt == "NCHW" else t)
        if intermediates_only:
            return outs
        if stop and max(net_take) < len(self.network) - 1:
            return x, outs
        return self._finish(x), outs

    # ------------------------------------------------------------------ levels (pruning, layer groups)
    def _num_levels(self) -> int:
        """The outlooker stage and the transformer stages."""
        return len(self.stage_ends)

    def _prune_after(self, last: int) -> None:
        """Keep the network up to level ``last``; cutting stages drops the class blocks, the heads and (before the
        transformer stages) ``pos_embed`` and the final norm, which belong to the transformer width."""
        end = self.stage_ends[last]
        if end == len(self.network) - 1:
            return
        self.network = self.network[:end + 1]
        self.stage_ends = self.stage_ends[:last + 1]
        self.num_features = self.feature_info[last]["num_chs"]
        if end < 2:
            self.pos_embed = None
            self.norm = nn.Identity()
        self._prune_head()

    def block_names(self) -> list[str]:
        """``network.{i}.{j}`` stage after stage (the downsample is no block); the class blocks group with the head,
        as timm's ``group_matcher`` puts them after the blocks."""
        return [f"network.{i}.{j}" for i, m in enumerate(self.network) if isinstance(m, nn.Sequential)
                for j in range(len(m))]


# ---------------------------------------------------------------------------- presets (data)
_SIZES: dict[str, dict[str, Any]] = {
    "d1": dict(layers=(4, 4, 8, 2), embed_dims=(192, 384, 384, 384), num_heads=(6, 12, 12, 12)),
    "d2": dict(layers=(6, 4, 10, 4), embed_dims=(256, 512, 512, 512), num_heads=(8, 16, 16, 16)),
    "d3": dict(layers=(8, 8, 16, 4), embed_dims=(256, 512, 512, 512), num_heads=(8, 16, 16, 16)),
    "d4": dict(layers=(8, 8, 16, 4), embed_dims=(384, 768, 768, 768), num_heads=(12, 16, 16, 16)),
    "d5": dict(layers=(12, 12, 20, 4), embed_dims=(384, 768, 768, 768), num_heads=(12, 16, 16, 16), mlp_ratio=4.0,
               stem_hidden_dim=128),
}
# name -> (size, image size, timm 1.0.31 parameters in millions on the meta device, published GMACs)
_MODELS: dict[str, tuple[str, int, float, float]] = {
    "volo_d1_224": ("d1", 224, 26.632, 6.94),
    "volo_d1_384": ("d1", 384, 26.778, 22.75),
    "volo_d2_224": ("d2", 224, 58.678, 14.34),
    "volo_d2_384": ("d2", 384, 58.873, 46.17),
    "volo_d3_224": ("d3", 224, 86.325, 20.78),
    "volo_d3_448": ("d3", 448, 86.626, 96.33),
    "volo_d4_224": ("d4", 224, 192.962, 44.34),
    "volo_d4_448": ("d4", 448, 193.413, 197.13),
    "volo_d5_224": ("d5", 224, 295.456, 72.40),
    "volo_d5_448": ("d5", 448, 295.907, 315.06),
    "volo_d5_512": ("d5", 512, 296.091, 425.09),
}
_PRESETS: dict[str, dict[str, Any]] = {n: dict(_SIZES[s], img_size=img) for n, (s, img, _, _) in _MODELS.items()}
_META = published_meta({n: (p, g) for n, (_, _, p, g) in _MODELS.items()},
                       "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs", meta_device=_MODELS)


def reduced_config(cfg: VoloConfig) -> dict[str, Any]:
    """Overrides that shrink a VOLO preset for tests: widths 16 / 32 (2 / 4 heads), one block per stage, both
    class blocks and the token-labelling head, stem width 16, on 48 px (a 6x6 outlooker map, a 3x3 grid); the
    preset's mlp ratio is kept."""
    n = len(cfg.layers)
    return dict(layers=(1,) * n, embed_dims=(16,) + (32,) * (n - 1), num_heads=(2,) + (4,) * (n - 1),
                stem_hidden_dim=16, img_size=48)


register_family("volo", Volo, VoloConfig, _PRESETS, meta=_META, reduced=reduced_config)

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_224 = data_cfg(224, 0.96)
_384 = data_cfg(384, 1.0)
_448_C115 = data_cfg(448, 1.15)
_448_C100 = data_cfg(448, 1.0)
_512 = data_cfg(512, 1.15)
PRETRAINED = pretrained_tags({
    "volo_d1_224.sail_in1k": _224,
    "volo_d1_384.sail_in1k": _384,
    "volo_d2_224.sail_in1k": _224,
    "volo_d2_384.sail_in1k": _384,
    "volo_d3_224.sail_in1k": _224,
    "volo_d3_448.sail_in1k": _448_C100,
    "volo_d4_224.sail_in1k": _224,
    "volo_d4_448.sail_in1k": _448_C115,
    "volo_d5_224.sail_in1k": _224,
    "volo_d5_448.sail_in1k": _448_C115,
    "volo_d5_512.sail_in1k": _512,
}, license="apache-2.0")
