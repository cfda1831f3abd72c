"""Image GPT (iGPT, Chen et al. 2020): a GPT-2 decoder over colour-cluster tokens, pixel by pixel.

An image ``[B, Cin, H, W]`` (normalised to ``[-1, 1]``) becomes ``N = H·W`` tokens: each pixel is the
index of its nearest palette colour (:func:`quantize`; 512 k-means clusters of RGB in the paper),
in raster order. The model predicts each token from the ones before it (causal attention, the
``causal`` mechanism). Blocks are GPT-2's pre-norm blocks with the original's weight-only RMS-style
"LayerNorm" (``x / √(mean(x²) + ε) · g``, no centring, no bias) and quick-GELU (``x·σ(1.702x)``, the
library's :class:`~vit_attention.layers.activation.QuickGELU`, which the MLP fuses with ``fc1`` in CPU inference).

Two ways in, one transformer:

* generative: :meth:`ImageGPT.forward_logits` takes token ids ``[B, n]`` (id ``K`` = the start token
  SOS, as in Hugging Face's ``ImageGPTForCausalImageModeling``) and returns next-token logits
  ``[B, n, K]``; :meth:`ImageGPT.loss` is the next-pixel loss; :meth:`ImageGPT.generate` samples
  images with a key/value cache (each new pixel costs ``O(N)`` attention).
* the library's model contract (every registered model): ``forward(images) -> [B, num_classes]``.
  ``forward_features`` quantises the images and feeds ``[SOS, t0 .. t(N-2)]`` (the original's input,
  shifted right), giving ``[B, N, C]``; ``forward_head`` averages the tokens and applies a linear
  classifier (Hugging Face's ``ImageGPTForImageClassification``: mean pool, ``score`` without bias).
  ``forward_intermediates`` gives any block's output as a ``[B, C, H, W]`` map (stride 1) for linear
  probes (the paper's best features come from the middle blocks).

Palettes (``palette=``): ``"uniform"`` (an even ``L^Cin`` grid of ``[-1, 1]``, e.g. 8x8x8 = 512 RGB
colours), ``"grey"`` (``K`` grey levels), or a file holding the clusters (``.npy`` such as the
original's ``kmeans_centers.npy``, a Hugging Face ``preprocessor_config.json`` with ``"clusters"``,
``.safetensors`` / ``.pt`` with one ``[K, Cin]`` tensor, or text with one colour per line). The
palette is the buffer ``quantizer.palette`` of the state dict, so a saved model carries it.
Hugging Face / OpenAI checkpoints do not contain the clusters: load them with ``palette=PATH``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import get_attention_spec, list_attention
from ..attention.causal import KVCache, StaticKVCache
from ..functional.runtime import COMPILE_MODES, capturing
from ..layers import Block, drop_path_schedule, run_blocks_with_taps, stage_feature_info
from ..layers.activation import QuickGELU
from ._config import ConfigMixin, check_attn_layer, check_common, check_float, check_int, check_size, check_width_heads
from .backbone import IsotropicBackbone, isotropic_taps, tokens_to_intermediates
from .features import HEAD_MODULES
from .registry import register_family

__all__ = ["ImageGPTConfig", "ImageGPT", "PaletteQuantizer", "RMSNorm", "quantize", "dequantize",
           "load_palette", "make_palette", "reduced_config"]


# ---------------------------------------------------------------------------- palette and tokens
def make_palette(spec: str, num_colors: int, in_chans: int) -> Tensor:
    """The ``[K, Cin]`` palette named by ``spec`` (``"uniform"``, ``"grey"`` or a file path), values in ``[-1, 1]``."""
    if spec == "grey":
        return torch.linspace(-1.0, 1.0, num_colors).unsqueeze(1).expand(num_colors, in_chans).contiguous()
    if spec == "uniform":
        levels = round(num_colors ** (1.0 / in_chans))
        if levels ** in_chans != num_colors:
            raise ValueError(f"palette='uniform' needs vocab_size = L**in_chans for an integer L; got vocab_size="
                             f"{num_colors}, in_chans={in_chans} (use palette='grey' or a clusters file)")
        centres = -1.0 + (2.0 * torch.arange(levels) + 1.0) / levels  # [L], the centre of each bin
        grids = torch.meshgrid(*([centres] * in_chans), indexing="ij")
        return torch.stack([g.reshape(-1) for g in grids], dim=1)  # [L**Cin, Cin]
    clusters = load_palette(spec)
    if clusters.shape != (num_colors, in_chans):
        raise ValueError(f"palette file {spec!r} holds {list(clusters.shape)} clusters; the config expects "
                         f"[vocab_size, in_chans] = [{num_colors}, {in_chans}]")
    return clusters


def load_palette(path: str | Path) -> Tensor:
    """Colour clusters ``[K, Cin]`` (float32, in ``[-1, 1]``) from a file.

    ``.npy`` (OpenAI's ``kmeans_centers.npy``), ``.json`` (Hugging Face ``preprocessor_config.json``:
    its ``"clusters"``, or a bare list of colours), ``.safetensors`` / ``.pt`` / ``.pth`` (one tensor),
    anything else as text: one colour per line, numbers separated by spaces or commas.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"palette file {str(path)!r} does not exist (palette= takes 'uniform', 'grey' or "
                                "the path of a clusters file: .npy, .json, .safetensors, .pt or text)")
    suffix = p.suffix.lower()
    if suffix == ".npy":
        import numpy as np

        data: Any = np.load(p, allow_pickle=False)
    elif suffix == ".json":
        data = json.loads(p.read_text())
        data = data["clusters"] if isinstance(data, dict) else data
    elif suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = list(load_file(str(p)).values())
        if len(tensors) != 1:
            raise ValueError(f"palette file {str(path)!r} must hold one tensor, found {len(tensors)}")
        data = tensors[0]
    elif suffix in (".pt", ".pth"):
        data = torch.load(p, map_location="cpu", weights_only=True)
    else:
        data = [[float(v) for v in line.replace(",", " ").split()] for line in p.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    clusters = torch.as_tensor(data, dtype=torch.float32)
    if clusters.dim() != 2 or clusters.shape[0] < 2:
        raise ValueError(f"palette file {str(path)!r} must hold clusters [K, Cin] with K >= 2, got "
                         f"{list(clusters.shape)}")
    return clusters


def quantize(images: Tensor, palette: Tensor) -> Tensor:
    """Images ``[B, Cin, H, W]`` in ``[-1, 1]`` -> tokens ``[B, H·W]`` (raster order): the nearest palette colour.

    Squared Euclidean distance ``|x|² - 2 x·c + |c|²``, argmin over the ``K`` colours of ``palette
    [K, Cin]`` (Hugging Face ``ImageGPTImageProcessor``'s ``color_quantize``).
    """
    if images.dim() != 4 or images.shape[1] != palette.shape[1]:
        raise ValueError(f"quantize expects images [B, {palette.shape[1]}, H, W] (the palette's channels), "
                         f"got {tuple(images.shape)}")
    x = images.flatten(2).transpose(1, 2)  # [B, N, Cin]
    c = palette.to(x.dtype)
    d = (c * c).sum(-1) - 2.0 * (x @ c.T)  # [B, N, K]; |x|² is the same for every colour
    return d.argmin(dim=-1)  # [B, N]


def dequantize(tokens: Tensor, palette: Tensor, size: tuple[int, int]) -> Tensor:
    """Tokens ``[B, H·W]`` -> images ``[B, Cin, H, W]`` (each token's palette colour, in ``[-1, 1]``).

    Tokens outside ``0..K-1`` (``K`` colours in ``palette [K, Cin]``) raise ``ValueError``.
    """
    H, W = size
    if tokens.dim() != 2 or tokens.shape[1] != H * W:
        raise ValueError(f"dequantize expects tokens [B, {H * W}] for size {tuple(size)}, got {tuple(tokens.shape)}")
    _check_ids(tokens, "tokens", palette.shape[0])
    return palette[tokens].transpose(1, 2).reshape(tokens.shape[0], palette.shape[1], H, W)  # [B, Cin, H, W]


def _check_ids(ids: Tensor, name: str, num_ids: int, note: str = "") -> None:
    """Raise ``ValueError`` naming ``name`` unless every id of ``ids [*]`` lies in ``0..num_ids-1``.

    One ``aminmax`` (a single host sync); skipped on an empty or meta tensor and while torch records a
    graph (compile, export, trace: the check is data-dependent). ``note`` says what the range holds.
    """
    if ids.numel() == 0 or ids.device.type == "meta" or capturing():
        return
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be integer token ids, got {ids.dtype}")
    lo, hi = torch.stack(torch.aminmax(ids)).tolist()
    if lo < 0 or hi >= num_ids:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} must lie in 0..{num_ids - 1}{note}, got {bad} (min {lo}, max {hi})")


class PaletteQuantizer(nn.Module):
    """Holds the palette ``[K, Cin]`` (buffer ``palette``); ``forward(images [B, Cin, H, W]) -> tokens [B, H·W]``."""

    def __init__(self, palette: Tensor) -> None:
        super().__init__()
        self.register_buffer("palette", palette)

    def forward(self, images: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> tokens ``[B, H·W]`` (see :func:`quantize`)."""
        return quantize(images, self.palette)

    def flops(self, input_shape: Sequence[int]) -> int:
        """``B·H·W·K·Cin`` multiply-adds (the pixel-colour products of the distances)."""
        B, C, H, W = input_shape
        return B * H * W * self.palette.shape[0] * C


class RMSNorm(nn.Module):
    """iGPT's "LayerNorm": ``x / √(mean(x²) + ε) · g`` over the last dim (no centring, no bias), any ``[..., C]``.

    Written out (not ``nn.RMSNorm``): the same math, and it exports to ONNX at every opset.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


# ---------------------------------------------------------------------------- config and model
@dataclass
class ImageGPTConfig(ConfigMixin):
    """Everything an :class:`ImageGPT` is built from (JSON-serialisable)."""

    img_size: int | tuple[int, int] = 32
    in_chans: int = 3
    num_classes: int = 1000
    vocab_size: int = 512  # palette colours K; the start token SOS is id K (the embedding has K + 1 rows)
    palette: str = "uniform"  # "uniform", "grey", or a clusters file (module docstring)
    embed_dim: int = 512
    depth: int = 24
    num_heads: int = 8
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_eps: float = 1e-5
    attn_layer: str = "causal"
    attn_kwargs: dict[str, Any] = field(default_factory=dict)
    drop_rate: float = 0.0  # before the classifier
    pos_drop_rate: float = 0.0  # on the embeddings (GPT-2's embd_pdrop)
    attn_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0  # GPT-2's resid_pdrop
    drop_path_rate: float = 0.0

    def validate(self) -> None:
        """Raise ``TypeError`` / ``ValueError`` naming the first bad field (see :class:`ConfigMixin`)."""
        check_common(self, pools=None)
        check_int(self.vocab_size, "vocab_size", min_value=2)
        if not isinstance(self.palette, str) or not self.palette:
            raise TypeError(f"palette must be 'uniform', 'grey' or the path of a clusters file, got {self.palette!r}")
        dim, heads = check_width_heads(self)
        check_int(self.depth, "depth", min_value=0)
        check_float(self.mlp_ratio, "mlp_ratio", low_open=True)
        check_float(self.norm_eps, "norm_eps")
        check_attn_layer(self.attn_layer, self.attn_kwargs, layout="tokens")
        if not getattr(get_attention_spec(self.attn_layer).cls, "causal", False):
            causal = [n for n in list_attention() if getattr(get_attention_spec(n).cls, "causal", False)]
            raise ValueError(f"attn_layer={self.attn_layer!r} is not causal: Image GPT predicts each pixel from the "
                             f"ones before it, so a token must not see later tokens (use one of {causal})")


class ImageGPT(IsotropicBackbone):
    """Image GPT, ``[B, Cin, H, W] -> [B, num_classes]``; ``forward_logits(tokens [B, n]) -> [B, n, K]``.

    Keys: ``quantizer.palette``, ``tok_embed`` (``[K + 1, C]``, row ``K`` = SOS), ``pos_embed``
    (``[1, N, C]``), ``blocks.i.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}``, ``norm``,
    ``lm_head`` (``[K, C]``, no bias, untied), ``head`` (classifier, no bias). An isotropic
    :class:`~vit_attention.models.backbone.Backbone` (one stage of ``blocks``) that pools by the mean
    of all tokens (``global_pool="avg"``, the only pooling).
    """

    token_merging_note: ClassVar[str] = ("its causal blocks predict every next pixel of the sequence; merged tokens "
                                         "would break the order generation and the loss need")

    family = "igpt"
    input_ranks = (4,)
    input_int_ranks = (2,)  # token ids [B, n] (colours and the start token), checked by _input_ids
    resize_needs = ("the learned position table of the H·W pixel sequence (pos_embed) extended or resampled, "
                    "and the autoregressive order over the new sequence")
    config_cls = ImageGPTConfig
    no_weight_decay_keys = ("pos_embed", "tok_embed")
    pools = ("avg",)
    head_fc = None
    head_modules = (*HEAD_MODULES, "lm_head")  # a features model has neither classifier (models/features.py)
    generative = True  # trained on its own pixels: the training loop uses the next-pixel objective

    def __init__(self, cfg: ImageGPTConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        C, K = cfg.embed_dim, cfg.vocab_size
        self.grid_size = check_size(cfg.img_size, "img_size")
        self.num_tokens = self.grid_size[0] * self.grid_size[1]
        self.global_pool = "avg"  # the mean of all tokens (no prefix tokens)
        self.embed_dim = self.num_features = C
        self.sos_token = K
        self.num_prefix_tokens = 0
        self.grad_checkpointing = False
        norm_layer = partial(RMSNorm, eps=cfg.norm_eps)  # weight-only, no centring: ImageGPTLayerNorm

        self.quantizer = PaletteQuantizer(make_palette(cfg.palette, K, cfg.in_chans))
        self.tok_embed = nn.Embedding(K + 1, C)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_tokens, C))
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)
        dpr = drop_path_schedule(cfg.drop_path_rate, (cfg.depth,))[0]
        self.blocks = nn.Sequential(*[
            Block(C, cfg.num_heads, style="pre", mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                  drop=cfg.proj_drop_rate, attn_drop=cfg.attn_drop_rate, drop_path=dpr[i], norm_layer=norm_layer,
                  act_layer=QuickGELU, attn_layer=cfg.attn_layer, attn_kwargs=cfg.attn_kwargs,
                  depth_index=i)
            for i in range(cfg.depth)
        ])
        self.feature_info = stage_feature_info((C,) * cfg.depth, (1,) * cfg.depth, "blocks")  # a token per pixel
        self.norm = norm_layer(C)
        self.lm_head = nn.Linear(C, K, bias=False)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head: nn.Module = nn.Linear(C, cfg.num_classes, bias=False) if cfg.num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's: N(0, 0.02) for weights and embeddings, residual projections scaled by 1/√(2·depth)."""
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.02)
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                std = 0.02 / math.sqrt(2 * max(len(self.blocks), 1)) if name.endswith(("attn.proj", "mlp.fc2")) \
                    else 0.02
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    # ------------------------------------------------------------------ API of every model
    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the classifier with a fresh one for ``num_classes`` (0 = no head); pooling is always the mean
        (``global_pool``: ``"avg"`` or None). The base's reset, with the classifier built without a bias."""
        super().reset_classifier(num_classes, global_pool)
        self.head = nn.Linear(self.num_features, num_classes, bias=False, device=self.pos_embed.device) \
            if num_classes > 0 else nn.Identity()

    @property
    def palette(self) -> Tensor:
        """The colour clusters ``[K, Cin]``."""
        return self.quantizer.palette

    def set_palette(self, palette: Tensor | str | Path) -> None:
        """Replace the clusters with ``palette`` (a ``[K, Cin]`` tensor or a file, see :func:`load_palette`)."""
        clusters = load_palette(palette) if isinstance(palette, (str, Path)) else torch.as_tensor(palette)
        if tuple(clusters.shape) != tuple(self.palette.shape):
            raise ValueError(f"palette must be [vocab_size, in_chans] = {list(self.palette.shape)}, "
                             f"got {list(clusters.shape)}")
        self.quantizer.palette.copy_(clusters)

    def quantize(self, images: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` in ``[-1, 1]`` -> tokens ``[B, H·W]``."""
        return self.quantizer(images)

    def dequantize(self, tokens: Tensor) -> Tensor:
        """Tokens ``[B, H·W]`` -> images ``[B, Cin, H, W]`` in ``[-1, 1]``."""
        return dequantize(tokens, self.palette, self.grid_size)

    def shift_right(self, tokens: Tensor) -> Tensor:
        """Model input for targets ``tokens [B, N]``: ``[SOS, t0 .. t(N-2)]`` ``[B, N]``."""
        sos = torch.full_like(tokens[:, :1], self.sos_token)
        return torch.cat([sos, tokens[:, :-1]], dim=1)

    def _check_input_ids(self, ids: Tensor, name: str) -> None:
        """Input ids ``[B, n]`` must be colours ``0..K-1`` or the start token ``K`` (``ValueError`` naming ``name``)."""
        K = self.cfg.vocab_size
        _check_ids(ids, name, K + 1, f" (colours 0..{K - 1}, {K} = the start-of-image token)")

    def _input_ids(self, x: Tensor) -> Tensor:
        """Images -> shifted tokens; integer ids ``[B, n]`` pass as they are (checked: ``0..K``)."""
        if x.dim() == 2 and not x.is_floating_point():
            self._check_input_ids(x, "x (token ids)")
            return x
        if x.dim() != 4 or tuple(x.shape[-2:]) != self.grid_size:
            raise ValueError(f"expected images [B, {self.cfg.in_chans}, {self.grid_size[0]}, {self.grid_size[1]}] "
                             f"or token ids [B, n] (integers), got {x.dtype} {tuple(x.shape)}")
        return self.shift_right(self.quantize(x))

    def _embed(self, ids: Tensor, start: int | Tensor = 0) -> Tensor:  # type: ignore[override]
        """Token ids ``[B, n]`` at positions ``start .. start + n - 1`` -> embeddings ``[B, n, C]``.

        ``start`` may be a 0-d long tensor (a :class:`StaticKVCache`'s position: no host sync, one
        compiled graph for every step); it is then not range-checked.
        """
        n = ids.shape[1]
        if isinstance(start, Tensor):
            where = start + torch.arange(n, device=ids.device)  # [n]
            return self.pos_drop(self.tok_embed(ids) + self.pos_embed[0].index_select(0, where))  # [B, n, C]
        if start + n > self.num_tokens:
            raise ValueError(f"{start + n} positions exceed the model's {self.num_tokens} "
                             f"(img_size {self.grid_size})")
        return self.pos_drop(self.tok_embed(ids) + self.pos_embed[:, start:start + n])  # [B, n, C]

    def _run_blocks(self, x: Tensor, feat_size: tuple[int, int] | None, indices: set[int] | None = None, *,
                    stop: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Embeddings ``[B, n, C]`` through the blocks (``feat_size``: the pixel grid when ``n = N``, else None):
        ``-> (hidden [B, n, C], [outputs of blocks indices])``; ``stop``: none after the last of ``indices``."""
        return run_blocks_with_taps(self.blocks, x, feat_size, 0, checkpoint=self.grad_checkpointing and self.training,
                                    taps=indices, stop_at_last_tap=stop)

    def forward_tokens(self, ids: Tensor, *, cache: KVCache | StaticKVCache | None = None) -> Tensor:
        """Token ids ``[B, n]`` -> final-norm hidden states ``[B, n, C]`` (Hugging Face ``ImageGPTModel``).

        With a :class:`~vit_attention.attention.causal.KVCache` the ids are the next ``n`` tokens after
        the ``len(cache)`` already seen; each block's attention appends to the cache (a
        :class:`~vit_attention.attention.causal.StaticKVCache` from :meth:`new_static_cache` works
        the same, at fixed shapes). Ids outside
        ``0..K`` (colours ``0..K-1``, ``K`` the start token) raise ``ValueError``.
        """
        self._check_input_ids(ids, "ids")
        if isinstance(cache, StaticKVCache):  # host reads are fine here: the id check above syncs already
            room = min(cache.max_len, self.num_tokens) - len(cache)
            if ids.shape[1] > room:
                raise ValueError(f"ids: {ids.shape[1]} new tokens do not fit: the StaticKVCache holds {len(cache)} of "
                                 f"{min(cache.max_len, self.num_tokens)} positions")
        return self._tokens(ids, cache)

    def _tokens(self, ids: Tensor, cache: KVCache | StaticKVCache | None = None) -> Tensor:
        """:meth:`forward_tokens` without the id check: ``[B, n]`` -> ``[B, n, C]``."""
        if cache is None:
            x, _ = self._run_blocks(self._embed(ids), self.grid_size if ids.shape[1] == self.num_tokens else None)
            return self.norm(x)
        x = self._embed(ids, cache.position() if isinstance(cache, StaticKVCache) else len(cache))
        for i, blk in enumerate(self.blocks):  # pre-norm GPT-2 block, its attention fed the cache
            x = x + blk.drop_path1(blk.attn(blk.norm1(x), cache=cache, layer=i))
            x = x + blk.drop_path2(blk.mlp(blk.norm2(x)))
        return self.norm(x)

    def forward_logits(self, ids: Tensor, *, cache: KVCache | StaticKVCache | None = None) -> Tensor:
        """Token ids ``[B, n]`` -> next-token logits ``[B, n, K]`` (``ImageGPTForCausalImageModeling``)."""
        return self.lm_head(self.forward_tokens(ids, cache=cache))

    def loss(self, x: Tensor, *, reduction: Literal["mean", "none"] = "mean") -> Tensor:
        """Next-pixel negative log-likelihood (nats per pixel) of images ``[B, Cin, H, W]`` or targets ``[B, N]``.

        Divide by ``ln 2`` for bits per pixel. ``reduction="none"``: per image ``[B]``. Target ids
        outside ``0..K-1`` raise ``ValueError``.
        """
        if x.dim() == 2 and not x.is_floating_point():
            targets = x  # [B, N]
            _check_ids(targets, "x (target ids)", self.cfg.vocab_size, " (the palette's colours)")
        else:
            targets = self.quantize(x)  # [B, N]
        logits = self.lm_head(self._tokens(self.shift_right(targets)))  # [B, N, K]
        nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [B, N]
        return nll.mean() if reduction == "mean" else nll.mean(dim=1)

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` (or token ids ``[B, n]``) -> hidden states ``[B, N, C]``."""
        return self._tokens(self._input_ids(x))

    def forward(self, x: Tensor, objective: Literal["classify", "generative"] = "classify") -> Tensor:
        """Images ``[B, Cin, H, W]`` -> class logits ``[B, num_classes]``.

        ``objective="generative"``: next-pixel logits ``[B, N, K]`` of the shifted input instead (targets:
        :meth:`quantize`; what the training loop calls for generative models, see ``generative``).
        """
        if objective == "generative":
            return self.lm_head(self.forward_features(x))
        if objective != "classify":
            raise ValueError(f"objective must be 'classify' or 'generative', got {objective!r}")
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
        output_fmt: Literal["NCHW", "NLC"] = "NCHW", intermediates_only: bool = False, stop_early: bool = False,
    ) -> Any:
        """Final hidden states plus the outputs of chosen blocks (linear probes).

        ``indices``: an int ``n`` = the last ``n`` blocks, or block indices (negative allowed);
        default all. Intermediates are ``[B, C, H, W]`` (``NCHW``, one cell per pixel) or ``[B, N, C]``
        (``NLC``); ``norm`` applies the final norm to them. Returns ``(final [B, N, C], [maps])`` or the list.
        ``stop_early`` (timm): no block after the last chosen one runs, and the final output is that block's
        (through the final norm); ``intermediates_only`` always stops there.
        """
        take = isotropic_taps(indices, len(self.blocks), output_fmt)
        ids = self._input_ids(x)
        if ids.shape[1] != self.num_tokens:
            raise ValueError(f"forward_intermediates needs all {self.num_tokens} tokens, got {ids.shape[1]}")
        h, saved = self._run_blocks(self._embed(ids), self.grid_size, set(take), stop=intermediates_only or stop_early)
        outs = tokens_to_intermediates(saved, self.grid_size, norm=self.norm if norm else None, output_fmt=output_fmt)
        return outs if intermediates_only else (self.norm(h), outs)

    # ------------------------------------------------------------------ generation
    def new_static_cache(self, batch_size: int, *, dtype: torch.dtype | None = None,
                         device: torch.device | str | None = None) -> StaticKVCache:
        """A :class:`StaticKVCache` for this model: every block, ``batch_size`` rows, all ``N`` positions.

        ``dtype`` defaults to the parameters' (give the autocast dtype when sampling under autocast),
        ``device`` to theirs. Feed it to :meth:`forward_tokens` / :meth:`forward_logits` step by step.
        """
        attn = self.blocks[0].attn
        return StaticKVCache(len(self.blocks), check_int(batch_size, "batch_size"), attn.num_heads, self.num_tokens,
                             attn.head_dim, dtype=dtype or self.pos_embed.dtype,
                             device=device if device is not None else self.pos_embed.device)

    @torch.no_grad()
    def generate(self, num_images: int, *, temperature: float = 1.0, top_k: int | None = None,
                 seed: int | None = None, use_cache: bool = True, prompt: Tensor | None = None,
                 static_cache: bool = False, compile_mode: str | None = None) -> Tensor:
        """Sample ``num_images`` images pixel by pixel: tokens ``[num_images, N]`` (see :meth:`dequantize`).

        Args:
            num_images: how many images.
            temperature: divides the logits (> 0; lower = more conservative).
            top_k: sample among the ``top_k`` most likely colours only (None = all).
            seed: seeds a private generator (same seed, same images); None = torch's global one.
            use_cache: keep a key/value cache (each new pixel attends to the cached keys: ``O(N)``);
                without it each step reruns the whole prefix (``O(N²)``). Both give the same tokens.
            prompt: optional first tokens ``[num_images, P]`` (image completion); generation continues after them.
            static_cache: a :class:`StaticKVCache` (fixed shapes: each step attends over all ``N``
                slots, the unwritten ones masked) instead of the growing :class:`KVCache`.
            compile_mode: compile the one-token step with ``torch.compile(mode=compile_mode,
                fullgraph=True)`` over a static cache (implies ``static_cache``): ``"default"``,
                ``"reduce-overhead"`` (CUDA graphs on a GPU: one graph replayed per token, what a
                launch-bound sampler needs), ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``.
                The first call pays the compilation; later calls on the same model reuse it.
        """
        n = check_int(num_images, "num_images")
        check_float(temperature, "temperature", low=0.0, low_open=True)
        K, N = self.cfg.vocab_size, self.num_tokens
        if top_k is not None:
            top_k = min(check_int(top_k, "top_k"), K)
        if compile_mode is not None and compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {list(COMPILE_MODES)} or None, got {compile_mode!r}")
        static = bool(static_cache) or compile_mode is not None
        if static and not use_cache:
            raise ValueError("static_cache / compile_mode need the key/value cache: use_cache=False reruns the "
                             "whole prefix each step, at a new shape every step")
        device = self.pos_embed.device
        gen = torch.Generator(device=device).manual_seed(int(seed)) if seed is not None else None
        start = torch.full((n, 1), self.sos_token, dtype=torch.long, device=device)
        if prompt is not None:
            if prompt.dim() != 2 or prompt.shape[0] != n or prompt.shape[1] >= N:
                raise ValueError(f"prompt must be tokens [num_images={n}, P] with P < {N}, got {tuple(prompt.shape)}")
            _check_ids(prompt, "prompt", K, " (the palette's colours)")
            start = torch.cat([start, prompt.to(device=device, dtype=torch.long)], dim=1)
        was_training = self.training
        self.eval()
        try:
            seq = start  # [n, 1 + P]: SOS and the prompt
            cache: KVCache | StaticKVCache | None = None
            if static:
                autocast = torch.is_autocast_enabled(device.type)
                cache = self.new_static_cache(n, dtype=torch.get_autocast_dtype(device.type) if autocast else None)
            elif use_cache:
                cache = KVCache(len(self.blocks), capacity=N)
            step = _next_logits
            if compile_mode is not None:  # the prompt runs eagerly (its own shape); every later step is one graph
                step = _compiled_step(compile_mode)
            logits = _next_logits(self, seq, cache)  # [n, K]
            while True:
                nxt = _sample(logits.float(), temperature, top_k, gen)  # [n, 1]
                seq = torch.cat([seq, nxt], dim=1)
                if seq.shape[1] > N:  # N tokens after SOS; the last needs no forward of its own
                    break
                logits = step(self, nxt, cache) if use_cache else _next_logits(self, seq, None)  # [n, K]
        finally:
            self.train(was_training)
        return seq[:, 1:]  # [n, N]


def _compiled_step(mode: str) -> Any:
    """:func:`_next_logits` under ``torch.compile(mode=mode, fullgraph=True)``; each call first marks a new
    CUDA-graph step (``reduce-overhead``: the previous step's logits were consumed, so its buffers may be
    reused by the replay instead of a new recording)."""
    compiled = torch.compile(_next_logits, mode=mode, fullgraph=True, dynamic=False)
    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)

    def step(model: ImageGPT, ids: Tensor, cache: KVCache | StaticKVCache | None) -> Tensor:
        if mark is not None:
            mark()
        return compiled(model, ids, cache)

    return step


def _next_logits(model: ImageGPT, ids: Tensor, cache: KVCache | StaticKVCache | None) -> Tensor:
    """The next-token logits after ``ids [B, n]`` (the next ``n`` tokens when ``cache`` holds the earlier
    ones): ``[B, K]``. Sampled ids are not checked (no host sync)."""
    return model.lm_head(model._tokens(ids, cache))[:, -1]


def _sample(logits: Tensor, temperature: float, top_k: int | None, gen: torch.Generator | None) -> Tensor:
    """One token per row of ``logits [B, K]``: ``[B, 1]``."""
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)  # the sampling distribution (not attention)
    return torch.multinomial(probs, 1, generator=gen)  # [B, 1]


# ---------------------------------------------------------------------------- presets (data)
# Hugging Face openai/imagegpt-{small,medium,large} configs: n_embd / n_layer / n_head, 32x32, 512 clusters.
_PRESETS: dict[str, dict[str, Any]] = {
    "igpt_small": dict(embed_dim=512, depth=24, num_heads=8),
    "igpt_medium": dict(embed_dim=1024, depth=36, num_heads=8),
    "igpt_large": dict(embed_dim=1536, depth=48, num_heads=16),
    # The embedded digits (8x8 = 64 pixels, 17 grey levels 0..16): a grey palette that holds every level exactly;
    # `vit-attention train --model igpt_digits` trains it on the next-pixel loss (vit_attention/train/generative.py).
    "igpt_digits": dict(img_size=8, vocab_size=17, palette="grey", embed_dim=64, depth=4, num_heads=4,
                        drop_path_rate=0.1),
}
# Params: the HF configs counted (transformer + untied 512-way LM head; the classifier excluded).
# GMACs at N = 1024: 12·N·d² + 2·N²·d per block plus the LM head (analytic);
# forward() runs the classifier instead of the LM head (0.27 / 0.54 / 0.81 GMACs fewer, inside the 2 %).
_META: dict[str, dict[str, Any]] = {
    name: {"published_params_m": params, "published_params_exclude": ("head.",), "published_gmacs": gmacs,
           "published_gmacs_source": "HF ImageGPT config, analytic 12·N·d² + 2·N²·d per block + LM head, N = 1024 "
                                     "(paper: 76M / 455M / 1.4B)"}
    for name, params, gmacs in (("igpt_small", 76.68, 103.3), ("igpt_medium", 455.49, 541.7),
                                ("igpt_large", 1362.91, 1547.0))
}


def reduced_config(cfg: ImageGPTConfig) -> dict[str, Any]:
    """Overrides that shrink an iGPT preset for tests: width 32, 2 heads, 2 causal blocks on a 4x4 image
    (16 pixel tokens); the palette and vocabulary stay the preset's."""
    return dict(embed_dim=32, num_heads=2, depth=2, img_size=4)


register_family("igpt", ImageGPT, ImageGPTConfig, _PRESETS, meta=_META, reduced=reduced_config)
