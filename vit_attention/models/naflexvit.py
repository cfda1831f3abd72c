"""NaFlexViT: one ViT for any resolution and aspect ratio, a batch of differently shaped images in one forward
(NaViT, Dehghani et al. 2023, packing + FlexiViT; timm's ``NaFlexVit``, SigLIP 2 NaFlex, Tschannen et al. 2025).

The patch embedding is a ``Linear`` on flattened patches, per-patch layout ``(ph, pw, C)`` (channel
fastest), and the learned position table ``[1, Gh, Gw, C]`` (default 16x16) is resized to each image's
own grid (bicubic, or bilinear for the SigLIP presets; anti-aliased). Prefix tokens (class, registers)
carry no position embedding. Three input forms (docs/naflexvit.md):

* a tensor ``[B, Cin, H, W]`` (``H``, ``W`` multiples of the patch): timm's standard mode, tokens
  ``[B, P + H/p·W/p, C]`` out of ``forward_features``;
* a list of images ``[Cin, H_i, W_i]``: patchified (:func:`patchify_images`), zero-padded to the longest
  sequence and run in one batched forward;
* the packed form (timm's NaFlex contract): ``patches [B, L, p·p·Cin]``, ``patch_coord [B, L, 2]`` (y, x),
  ``patch_valid [B, L]`` bool, as a dict or keywords.

In the list / packed forms the padding keys are masked in every block (a key mask ``[B, 1, 1, P + L]``;
prefix tokens never masked), MAP pooling gets the key mask and average pooling divides by the valid
count; ``forward_features`` returns ``{"patches": [B, P + L, C], "patch_valid": [B, L]}``
(:func:`split_features` gives the per-image tokens). Valid tokens do not depend on the padding; the
outputs of padding rows are unspecified (timm's symmetric mask and Hugging Face's key mask differ there).

The state-dict layout is timm's ``NaFlexVit`` (``embeds.proj``, ``embeds.pos_embed``, ``embeds.cls_token``,
``embeds.reg_token``, ``blocks.N.*``, ``norm``, ``attn_pool.*``, ``fc_norm``, ``head``): timm checkpoints
load directly; Hugging Face ``Siglip2VisionModel`` is converted in :mod:`vit_attention.weights.naflexvit`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..functional import resample_abs_pos_embed, resample_patch_embed
from ..functional.fast_paths import untraced
from ._config import check_choice, check_size
from .backbone import isotropic_taps
from .pretrained_tags import INCEPTION_MEAN, INCEPTION_STD, data_cfg, pretrained_tags
from .registry import register_family
from .vit import VisionTransformer, VisionTransformerConfig

__all__ = ["NaFlexVitConfig", "NaFlexVit", "NaFlexEmbeds", "patchify", "patchify_images", "pack_patches",
           "split_features", "reduced_config"]

_PREFIX_KEYS = ("cls_token", "dist_token", "reg_token")


# ---------------------------------------------------------------------------- packing helpers
def patchify(x: Tensor, patch_size: tuple[int, int], *, pad: bool = False) -> tuple[Tensor, tuple[int, int]]:
    """Images ``[B, C, H, W]`` -> patches ``[B, gh·gw, ph·pw·C]`` (per patch ``(ph, pw, C)``, channel fastest;
    patches row-major over ``(y, x)``) and the grid ``(gh, gw)``.

    ``H`` and ``W`` must be multiples of the patch unless ``pad`` (zeros on the bottom / right).
    """
    B, C, H, W = x.shape
    ph, pw = patch_size
    if H % ph or W % pw:
        if not pad:
            raise ValueError(f"image {H}x{W} is not a multiple of the patch size {ph}x{pw}; resize it, or use "
                             f"dynamic_img_pad=True to pad")
        x = F.pad(x, (0, (pw - W % pw) % pw, 0, (ph - H % ph) % ph))
        H, W = x.shape[-2:]
    gh, gw = H // ph, W // pw
    patches = x.reshape(B, C, gh, ph, gw, pw).permute(0, 2, 4, 3, 5, 1)  # [B, gh, gw, ph, pw, C]
    return patches.reshape(B, gh * gw, ph * pw * C), (gh, gw)


def grid_coords(grid: tuple[int, int], device: torch.device | None = None) -> Tensor:
    """Row-major ``(y, x)`` indices of a ``(gh, gw)`` grid: ``[gh·gw, 2]`` int64."""
    ys, xs = torch.meshgrid(torch.arange(grid[0], device=device), torch.arange(grid[1], device=device),
                            indexing="ij")
    return torch.stack([ys.flatten(), xs.flatten()], dim=-1)


def pack_patches(patches: Sequence[Tensor], grids: Sequence[tuple[int, int]], max_seq_len: int | None = None
                 ) -> dict[str, Tensor]:
    """Per-image patches ``[N_i, D]`` (``N_i = gh_i·gw_i``, row-major) -> the packed batch, zero-padded to
    ``max_seq_len`` (default: the longest ``N_i``): ``{"patches": [B, L, D], "patch_coord": [B, L, 2]``
    int64 (y, x; padding (0, 0)), ``"patch_valid": [B, L]`` bool}."""
    if not patches:
        raise ValueError("pack_patches needs at least one image")
    L = max(p.shape[0] for p in patches) if max_seq_len is None else int(max_seq_len)
    B, D = len(patches), patches[0].shape[-1]
    ref = patches[0]
    out = ref.new_zeros(B, L, D)
    coord = torch.zeros(B, L, 2, dtype=torch.long, device=ref.device)
    valid = torch.zeros(B, L, dtype=torch.bool, device=ref.device)
    for i, (p, g) in enumerate(zip(patches, grids)):
        n = p.shape[0]
        if n != g[0] * g[1]:
            raise ValueError(f"image {i}: {n} patches do not fill its grid {tuple(g)}")
        if n > L:
            raise ValueError(f"image {i} has {n} patches, more than max_seq_len={L}")
        out[i, :n] = p
        coord[i, :n] = grid_coords(g, ref.device)
        valid[i, :n] = True
    return {"patches": out, "patch_coord": coord, "patch_valid": valid}


def patchify_images(images: Sequence[Tensor], patch_size: int | tuple[int, int], *, max_seq_len: int | None = None,
                    pad: bool = False) -> dict[str, Tensor]:
    """A list of images ``[C, H_i, W_i]`` -> the packed batch of :func:`pack_patches` (zero-padded to the
    longest sequence, or ``max_seq_len``). Sides must be multiples of the patch unless ``pad``."""
    ps = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    flat, grids = [], []
    for i, img in enumerate(images):
        if img.dim() != 3:
            raise ValueError(f"image {i}: expected [C, H, W], got {tuple(img.shape)}")
        p, g = patchify(img[None], ps, pad=pad)  # type: ignore[arg-type]
        flat.append(p[0])
        grids.append(g)
    return pack_patches(flat, grids, max_seq_len)


def split_features(features: Mapping[str, Tensor], num_prefix_tokens: int = 0) -> list[Tensor]:
    """NaFlex ``forward_features`` output -> per image its tokens ``[P + N_i, C]`` (prefix, then the valid
    patches in their order), padding dropped."""
    x, valid = features["patches"], features["patch_valid"]
    P = int(num_prefix_tokens)
    return [torch.cat([x[b, :P], x[b, P:][valid[b]]], dim=0) for b in range(x.shape[0])]


# ---------------------------------------------------------------------------- config
@dataclass
class NaFlexVitConfig(VisionTransformerConfig):
    """A :class:`~vit_attention.models.vit.VisionTransformerConfig` plus the NaFlex position table.

    ``img_size`` is the standard-mode default only (any multiple of the patch runs); the position table
    is ``pos_embed_grid_size`` and is resized to every image's grid (``pos_embed_interp_mode``,
    ``pos_embed_antialias``; ``pos_embed_ar_preserving``: resize to a square of the longer side and crop;
    ``pos_embed_factorized``: a row table ``[1, Gh, C]`` plus a column table ``[1, Gw, C]``, linearly
    resized, no anti-aliasing, as timm).
    """

    img_size: int | tuple[int, int] = 256
    num_classes: int = 1000
    global_pool: Literal["token", "avg", "map", ""] = "map"
    class_token: bool = False
    no_embed_class: bool = True  # prefix tokens never carry a position embedding here
    dynamic_img_size: bool = True
    pos_embed_grid_size: tuple[int, int] = (16, 16)
    pos_embed_interp_mode: Literal["bicubic", "bilinear"] = "bicubic"
    pos_embed_antialias: bool = True
    pos_embed_ar_preserving: bool = False
    pos_embed_factorized: bool = False

    def validate(self) -> None:
        """The ViT checks, plus the NaFlex table's fields; no sin-cos table, conv stem, PEG or distillation."""
        super().validate()
        check_size(self.pos_embed_grid_size, "pos_embed_grid_size")
        check_choice(self.pos_embed_interp_mode, "pos_embed_interp_mode", ("bicubic", "bilinear"))
        check_choice(self.pos_embed, "pos_embed", ("learn", "none"))
        for name in ("conv_stem", "distilled", "peg_after"):
            if getattr(self, name):
                raise ValueError(f"{name} is not a NaFlexVit option; got {getattr(self, name)!r}")
        if not self.no_embed_class:
            raise ValueError("NaFlexVit's prefix tokens carry no position embedding: no_embed_class must be True")


# ---------------------------------------------------------------------------- embedding
class NaFlexEmbeds(nn.Module):
    """Patches -> tokens with positions, prefix tokens in front (timm's ``embeds``; keys ``proj``,
    ``pos_embed [1, Gh, Gw, C]`` or ``pos_embed_y [1, Gh, C]`` / ``pos_embed_x [1, Gw, C]``, ``cls_token``,
    ``reg_token``)."""

    def __init__(self, cfg: NaFlexVitConfig) -> None:
        super().__init__()
        ph, pw = (cfg.patch_size, cfg.patch_size) if isinstance(cfg.patch_size, int) else tuple(cfg.patch_size)
        C = cfg.embed_dim
        self.patch_size = (ph, pw)
        self.in_chans = cfg.in_chans
        self.interp_mode, self.antialias = cfg.pos_embed_interp_mode, cfg.pos_embed_antialias
        self.ar_preserving, self.factorized = cfg.pos_embed_ar_preserving, cfg.pos_embed_factorized
        self.proj = nn.Linear(ph * pw * cfg.in_chans, C, bias=not cfg.pre_norm)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, C)) if cfg.reg_tokens else None
        gh, gw = cfg.pos_embed_grid_size
        self.pos_embed: nn.Parameter | None = None
        self.pos_embed_y: nn.Parameter | None = None
        self.pos_embed_x: nn.Parameter | None = None
        if cfg.pos_embed == "learn" and cfg.pos_embed_factorized:
            self.pos_embed_y = nn.Parameter(torch.zeros(1, gh, C))
            self.pos_embed_x = nn.Parameter(torch.zeros(1, gw, C))
        elif cfg.pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, gh, gw, C))
        self.reset_parameters()

    @property
    def num_prefix_tokens(self) -> int:
        return (self.cls_token is not None) + (0 if self.reg_token is None else self.reg_token.shape[1])

    def reset_parameters(self) -> None:
        """timm's init: tables normal(0.02), prefix tokens normal(1e-6)."""
        for t in (self.pos_embed, self.pos_embed_y, self.pos_embed_x):
            if t is not None:
                nn.init.normal_(t, std=0.02)
        for t in (self.cls_token, self.reg_token):
            if t is not None:
                nn.init.normal_(t, std=1e-6)

    def pos_table(self, grid: tuple[int, int], dtype: torch.dtype) -> Tensor | None:
        """The position embedding of a ``(h, w)`` grid, row-major: ``[h·w, C]`` (None without a table).

        During an ONNX export the table of the traced grid is computed eagerly, outside the trace, and enters
        the graph as a constant: the exported graph's input size is fixed, so the table is too, and ONNX has
        no anti-aliased resize (``aten::_upsample_bicubic2d_aa`` / ``_bilinear2d_aa``). The constant is the
        eager table itself, so the file computes what eager does. (With the fast paths off, or a torch without
        the tracer API, :func:`.functional.fast_paths.untraced` records the table's ops instead.)"""
        if torch.onnx.is_in_onnx_export() and torch.jit.is_tracing():
            with untraced():  # not recorded: the result is a constant of the graph
                table = self._pos_table(grid, dtype)
                return None if table is None else table.detach().clone()
        return self._pos_table(grid, dtype)

    def _pos_table(self, grid: tuple[int, int], dtype: torch.dtype) -> Tensor | None:
        h, w = int(grid[0]), int(grid[1])
        size = (max(h, w), max(h, w)) if self.ar_preserving else (h, w)
        if self.pos_embed is not None:
            _, Gh, Gw, C = self.pos_embed.shape
            if (Gh, Gw) == (h, w):  # the table's own grid: used as it is (also when aspect-preserving)
                return self.pos_embed.reshape(h * w, C).to(dtype)
            flat = resample_abs_pos_embed(self.pos_embed.reshape(1, Gh * Gw, C), size, (Gh, Gw), num_prefix_tokens=0,
                                          interpolation=self.interp_mode, antialias=self.antialias)  # [1, h'·w', C]
            table = flat.reshape(1, size[0], size[1], C)[:, :h, :w]  # the aspect-preserving square cropped
            return table.reshape(h * w, C).to(dtype)
        if self.pos_embed_y is None or self.pos_embed_x is None:
            return None

        def resize1d(t: Tensor, n: int) -> Tensor:  # [1, L, C] -> [L', C] (linear, no antialias)
            if t.shape[1] == n:
                return t[0]
            return F.interpolate(t.permute(0, 2, 1).float(), size=n, mode="linear", align_corners=False)[0].T

        py, px = resize1d(self.pos_embed_y, size[0])[:h], resize1d(self.pos_embed_x, size[1])[:w]  # [h, C], [w, C]
        return (py[:, None] + px[None]).reshape(h * w, -1).to(dtype)

    def _prefix(self, x: Tensor) -> Tensor:
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1).to(x.dtype) for t in (self.cls_token, self.reg_token) if t is not None]
        return torch.cat(prefix + [x], dim=1) if prefix else x

    def forward_grid(self, patches: Tensor, grid: tuple[int, int]) -> Tensor:
        """Patches of one grid ``[B, h·w, ph·pw·Cin]`` -> tokens ``[B, P + h·w, C]``."""
        x = self.proj(patches)  # [B, h·w, C]
        pos = self.pos_table(grid, x.dtype)
        return self._prefix(x if pos is None else x + pos)

    def forward_packed(self, patches: Tensor, patch_coord: Tensor, patch_valid: Tensor,
                       grids: Sequence[tuple[int, int]] | None = None) -> Tensor:
        """Packed patches ``[B, L, ph·pw·Cin]``, ``patch_coord [B, L, 2]`` (y, x), ``patch_valid [B, L]``
        -> tokens ``[B, P + L, C]``; each valid patch gets the position of its coordinate in its image's
        grid ``(max y + 1, max x + 1)``, padding rows none. ``grids``: those grids when the caller knows them
        (a list of images: from their sizes), so none is read back from ``patch_coord`` (a host sync, and a
        graph break under ``torch.compile``)."""
        if patches.dim() != 3:
            raise ValueError(f"patches must be [B, L, ph·pw·Cin], got {tuple(patches.shape)}")
        B, L, _ = patches.shape
        if patch_coord.shape != (B, L, 2) or patch_valid.shape != (B, L):
            raise ValueError(f"patch_coord must be [B, L, 2] and patch_valid [B, L] for patches "
                             f"{tuple(patches.shape)}; got {tuple(patch_coord.shape)} and {tuple(patch_valid.shape)}")
        x = self.proj(patches)  # [B, L, C]
        if self.pos_embed is None and self.pos_embed_y is None:
            return self._prefix(x)
        valid = patch_valid.bool()
        coord = patch_coord.long() * valid[..., None]  # padding rows -> (0, 0)
        if grids is None:
            grids = (coord.amax(dim=1) + 1).tolist()  # [B] of [h, w], read back from the coordinates
        elif len(grids) != B:
            raise ValueError(f"grids lists {len(grids)} grids for a batch of {B}")
        pos = x.new_zeros(B, L, x.shape[-1])
        by_grid: dict[tuple[int, int], list[int]] = {}
        for b, g in enumerate(grids):
            by_grid.setdefault((int(g[0]), int(g[1])), []).append(b)
        for (h, w), rows in by_grid.items():
            table = self.pos_table((h, w), x.dtype)  # [h·w, C]
            assert table is not None
            idx = torch.as_tensor(rows, device=x.device)
            flat = coord[idx, :, 0] * w + coord[idx, :, 1]  # [b, L]
            pos[idx] = table[flat] * valid[idx, :, None].to(x.dtype)
        return self._prefix(x + pos)


# ---------------------------------------------------------------------------- model
Packed = Mapping[str, Tensor]


class NaFlexVit(VisionTransformer):
    """NaFlexViT, ``[B, Cin, H, W]`` / a list of images / a packed dict -> ``[B, num_classes]``.

    ``forward(x)`` takes the three forms (the packed one as a dict); timm's keyword form
    ``forward_features(patches, patch_coord=, patch_valid=)`` is on ``forward_features``.

    ``forward_features``: normalised tokens ``[B, P + N, C]`` for a tensor, ``{"patches": [B, P + L, C],
    "patch_valid": [B, L]}`` for a list or a packed batch; ``forward_head(x, patch_valid=)`` pools
    (masked) and classifies. The blocks are :class:`~vit_attention.layers.Block` with any token
    mechanism taking ``mask`` (default ``mhsa``). With ``rope`` the list / packed forms rotate each
    image on its own grid (``patch_coord`` / ``patch_valid`` handed to every block as
    ``rope_coords`` / ``rope_valid``).
    """

    def _merging_obstacle(self) -> str | None:
        """Why token merging is refused (``r=0`` accepted): packed batches carry padding masks and per-sample grids."""
        return ("NaFlexVit does not support it yet: its packed batches carry padding masks and per-sample grids; "
                "use a fixed-size ViT")

    family = "naflexvit"
    late_stem_modules = ("embeds",)  # the patch / position embedding, registered after the head
    config_cls = NaFlexVitConfig
    no_weight_decay_keys = ("pos_embed", "cls_token", "reg_token", "rope.freqs")
    input_ranks = (4, 3)  # images, or packed patches [B, L, P·P·Cin] (with patch_coord / patch_valid)
    input_containers = (list, tuple, Mapping)  # lists of images, packed dicts: checked by pack / check_images

    def __init__(self, cfg: NaFlexVitConfig | None = None, **overrides: Any) -> None:
        super().__init__(cfg, **overrides)
        cfg = self.cfg
        # the ViT's own conv embedding, table and tokens give way to timm's NaFlex embedding (key `embeds`)
        del self.patch_embed
        for name in ("pos_embed", *_PREFIX_KEYS):
            setattr(self, name, None)
        self.embeds = NaFlexEmbeds(cfg)
        self.patch_size = self.embeds.patch_size
        self.num_prefix_tokens = self.embeds.num_prefix_tokens
        self.grid_size = self._grid((cfg.img_size, cfg.img_size) if isinstance(cfg.img_size, int)
                                    else tuple(cfg.img_size))  # type: ignore[arg-type]
        nn.init.trunc_normal_(self.embeds.proj.weight, std=0.02)
        if self.embeds.proj.bias is not None:
            nn.init.zeros_(self.embeds.proj.bias)

    # ------------------------------------------------------------------ sizes
    def _grid(self, hw: tuple[int, int]) -> tuple[int, int]:
        (H, W), (ph, pw) = hw, self.patch_size
        if self.cfg.dynamic_img_pad:
            return -(-H // ph), -(-W // pw)
        return H // ph, W // pw

    def feat_size(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Token grid of an image of size ``hw`` (always dynamic)."""
        return self._grid(hw)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None, *, interpolation: str = "bicubic",
                       antialias: bool = True) -> None:
        """Change the default input size and / or the patch size in place. The position table is resized
        per call anyway; a new patch size resamples ``embeds.proj`` (FlexiViT's pseudo-inverse, on the
        kernel seen as ``[O, Cin, ph, pw]``)."""
        img = check_size(img_size, "img_size") if img_size is not None else None
        new_p = check_size(patch_size, "patch_size") if patch_size is not None else self.patch_size
        if img is not None and not self.cfg.dynamic_img_pad and (img[0] % new_p[0] or img[1] % new_p[1]):
            raise ValueError(f"img_size={img_size!r} is not divisible by patch_size={tuple(new_p)}")
        if tuple(new_p) != self.patch_size:
            proj = self.embeds.proj
            ph, pw = self.patch_size
            cin = self.embeds.in_chans
            with torch.no_grad():
                w = proj.weight.reshape(proj.out_features, ph, pw, cin).permute(0, 3, 1, 2)  # [O, Cin, ph, pw]
                w = resample_patch_embed(w, tuple(new_p), interpolation=interpolation, antialias=antialias)
                w = w.permute(0, 2, 3, 1).reshape(proj.out_features, -1)  # [O, ph'·pw'·Cin]
            new = nn.Linear(w.shape[1], proj.out_features, bias=proj.bias is not None, device=w.device,
                            dtype=w.dtype)
            with torch.no_grad():
                new.weight.copy_(w)
                if proj.bias is not None:
                    new.bias.copy_(proj.bias)
            self.embeds.proj = new
            self.embeds.patch_size = self.patch_size = (int(new_p[0]), int(new_p[1]))
            self.cfg.patch_size = new_p[0] if new_p[0] == new_p[1] else tuple(new_p)
            for info in getattr(self.feature_info, "info", self.feature_info):
                info["reduction"] = max(new_p)
        if img is not None:
            self.cfg.img_size = img[0] if img[0] == img[1] else tuple(img)
        size = self.cfg.img_size
        self.grid_size = self._grid((size, size) if isinstance(size, int) else tuple(size))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ inputs
    def _embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:  # type: ignore[override]
        """Images ``[B, Cin, H, W]`` -> the blocks' input ``[B, P + N, C]`` and the grid ``(H/p, W/p)``."""
        if x.dim() != 4:
            raise ValueError(f"expected images [B, Cin, H, W], got {tuple(x.shape)}")
        patches, grid = patchify(x, self.patch_size, pad=self.cfg.dynamic_img_pad)
        tokens = self.embeds.forward_grid(patches, grid)
        return self.norm_pre(self.pos_drop(tokens)), grid

    def pack(self, x: Any, patch_coord: Tensor | None = None, patch_valid: Tensor | None = None
             ) -> dict[str, Tensor] | None:
        """Any NaFlex input -> the packed dict (None for a standard ``[B, Cin, H, W]`` tensor): a list of
        images is patchified and padded (:func:`patchify_images`), a dict / keywords are checked."""
        if isinstance(x, Mapping):
            packed = dict(x)
            packed.setdefault("patch_coord", patch_coord)  # type: ignore[arg-type]
            packed.setdefault("patch_valid", patch_valid)  # type: ignore[arg-type]
        elif isinstance(x, (list, tuple)):
            self.check_images(x)
            return patchify_images(x, self.patch_size, pad=self.cfg.dynamic_img_pad)
        elif patch_coord is not None or patch_valid is not None or (isinstance(x, Tensor) and x.dim() == 3):
            packed = {"patches": x, "patch_coord": patch_coord, "patch_valid": patch_valid}  # type: ignore[dict-item]
        else:
            return None
        missing = [k for k in ("patches", "patch_coord", "patch_valid") if packed.get(k) is None]
        if missing:
            raise ValueError(f"the packed NaFlex input needs patches, patch_coord and patch_valid; missing "
                             f"{', '.join(missing)}")
        return packed

    def check_images(self, images: Sequence[Any]) -> None:
        """A list of images, checked before anything runs: each a floating tensor ``[Cin, H_i, W_i]`` with this
        model's ``in_chans``, sides multiples of the patch (unless ``dynamic_img_pad``), all on one device;
        ``ValueError`` (``TypeError`` for a non-tensor) naming the index of the first that is not."""
        if len(images) == 0:
            raise ValueError("images: the list is empty; expected at least one image [Cin, H, W]")
        (ph, pw), cin = self.patch_size, self.embeds.in_chans
        first = images[0]
        for i, img in enumerate(images):
            if not isinstance(img, Tensor):
                hint = " (torch.from_numpy(a).permute(2, 0, 1) for an [H, W, C] array)" \
                    if type(img).__module__ == "numpy" else ""
                raise TypeError(f"images[{i}] is a {type(img).__module__}.{type(img).__name__}; expected a torch "
                                f"tensor [Cin, H, W]{hint}")
            if img.dim() != 3:
                raise ValueError(f"images[{i}] has shape {tuple(img.shape)}; expected [Cin, H, W] (one image, no batch "
                                 "dimension)")
            if img.shape[0] != cin:
                raise ValueError(f"images[{i}] has {img.shape[0]} channels ({tuple(img.shape)}); this model takes "
                                 f"in_chans={cin}")
            if not img.is_floating_point():
                raise ValueError(f"images[{i}] has dtype {img.dtype}; expected a floating-point tensor (e.g. .float())")
            if img.shape[1] == 0 or img.shape[2] == 0:
                raise ValueError(f"images[{i}] is empty: {tuple(img.shape)}")
            if not self.cfg.dynamic_img_pad and (img.shape[1] % ph or img.shape[2] % pw):
                raise ValueError(f"images[{i}] is {img.shape[1]}x{img.shape[2]}, not a multiple of the patch size "
                                 f"{ph}x{pw}; resize it, or build the model with dynamic_img_pad=True to pad")
            if img.device != first.device or img.dtype != first.dtype:
                raise ValueError(f"images[{i}] is {img.dtype} on {img.device}, images[0] {first.dtype} on "
                                 f"{first.device}; give every image the same dtype and device")

    def _uses_rope(self) -> bool:
        """Whether any block's mechanism carries a rotary embedding (``rope`` config field or ``attn_kwargs``)."""
        return any(getattr(getattr(blk, "attn", None), "rope", None) is not None for blk in self.blocks)

    def _run_masked(self, x: Tensor, mask: Tensor, patch_coord: Tensor | None = None,
                    patch_valid: Tensor | None = None, taps: set[int] | None = None, stop: bool = False,
                    ) -> tuple[Tensor, list[Tensor]]:
        """Tokens ``[B, P + L, C]`` through the blocks with the key mask ``[B, 1, 1, P + L]``; with RoPE, the
        per-sample grids ``patch_coord [B, L, 2]`` / ``patch_valid [B, L]`` go to every block too.
        ``-> (tokens, [outputs of the blocks in taps])``; ``stop``: no block after the last tap runs."""
        kw: dict[str, Tensor] = {"mask": mask}
        if patch_coord is not None:
            kw.update(rope_coords=patch_coord, rope_valid=patch_valid)  # type: ignore[arg-type]
        ckpt = self.grad_checkpointing and self.training
        saved: list[Tensor] = []
        last = max(taps) if stop and taps else None
        for i, blk in enumerate(self.blocks):
            if ckpt:
                x = checkpoint(blk, x, None, self.num_prefix_tokens, use_reentrant=False, **kw)
            else:
                x = blk(x, None, self.num_prefix_tokens, **kw)
            if taps and i in taps:
                saved.append(x)
            if i == last:
                break
        return x, saved

    def key_mask(self, patch_valid: Tensor) -> Tensor:
        """``patch_valid [B, L]`` -> the blocks' key mask ``[B, 1, 1, P + L]`` bool (prefix always True)."""
        valid = patch_valid.bool()
        prefix = valid.new_ones(valid.shape[0], self.num_prefix_tokens)
        return torch.cat([prefix, valid], dim=1)[:, None, None, :]

    def forward_features(self, x: Any, patch_coord: Tensor | None = None,  # type: ignore[override]
                         patch_valid: Tensor | None = None) -> Any:
        """Images ``[B, Cin, H, W]`` -> tokens ``[B, P + N, C]``; a list of images ``[Cin, H_i, W_i]`` or a
        packed batch -> ``{"patches": [B, P + L, C], "patch_valid": [B, L]}`` (normalised tokens)."""
        packed = self.pack(x, patch_coord, patch_valid)
        if packed is None:
            return super().forward_features(x)
        t, _, _ = self._forward_packed(x, packed)
        return {"patches": self.norm(t), "patch_valid": packed["patch_valid"].bool()}

    def _forward_packed(self, x: Any, packed: Mapping[str, Tensor], taps: set[int] | None = None,
                        stop: bool = False) -> tuple[Tensor, list[Tensor], list[tuple[int, int]] | None]:
        """A packed batch (``x``: what :meth:`pack` packed, a list of images gives the grids from their sizes)
        through the embedding and the masked blocks: ``-> (tokens [B, P + L, C], [tapped block outputs],
        grids or None)``."""
        grids = [self._grid(tuple(img.shape[-2:])) for img in x] if isinstance(x, (list, tuple)) else None
        t = self.embeds.forward_packed(packed["patches"], packed["patch_coord"], packed["patch_valid"], grids)
        t = self.norm_pre(self.pos_drop(t))
        rope = self._uses_rope()  # each sample's RoPE grid from its own coordinates (RotaryEmbedding(coords=))
        t, saved = self._run_masked(t, self.key_mask(packed["patch_valid"]),
                                    packed["patch_coord"].long() if rope else None,
                                    packed["patch_valid"].bool() if rope else None, taps, stop)
        return t, saved, grids

    def forward_intermediates(  # type: ignore[override]
        self, x: Any, indices: int | Sequence[int] | None = None, *, norm: bool = False,
        output_fmt: Literal["NCHW", "NLC"] = "NCHW", return_prefix_tokens: bool = False,
        intermediates_only: bool = False, patch_coord: Tensor | None = None, patch_valid: Tensor | None = None,
        stop_early: bool = False,
    ) -> Any:
        """The final tokens plus the outputs of chosen blocks, for every input form of :meth:`forward_features`.

        A tensor ``[B, Cin, H, W]``: as the ViT (``(final [B, P + N, C], [[B, C, H', W'] per index])``).
        A list of images or a packed batch: each intermediate is a list with one map per image, on that
        image's own grid ``(h_i, w_i)``: ``[C, h_i, w_i]`` (``NCHW``) or ``[h_i·w_i, C]`` (``NLC``; with
        ``return_prefix_tokens`` the pair ``(map, prefix [P, C])``), equal to that image run alone; the final
        output is :meth:`forward_features`' dict. ``indices``, ``norm``, ``intermediates_only``, ``stop_early``
        as the ViT.
        """
        packed = self.pack(x, patch_coord, patch_valid)
        if packed is None:
            return super().forward_intermediates(x, indices, norm=norm, output_fmt=output_fmt,
                                                 return_prefix_tokens=return_prefix_tokens,
                                                 intermediates_only=intermediates_only, stop_early=stop_early)
        take = isotropic_taps(indices, len(self.blocks), output_fmt)
        t, saved, grids = self._forward_packed(x, packed, set(take), stop=intermediates_only or stop_early)
        valid = packed["patch_valid"].bool()
        coord = packed["patch_coord"].long() * valid[..., None]
        if grids is None:
            grids = [(int(h), int(w)) for h, w in (coord.amax(dim=1) + 1).tolist()]
        P = self.num_prefix_tokens
        outs: list[list[Any]] = []
        for tapped in saved:
            tapped = self.norm(tapped) if norm else tapped
            per_image: list[Any] = []
            for b, (h, w) in enumerate(grids):
                rows = tapped[b, P:][valid[b]]  # [n_b, C], the image's patches in their packed order
                flat = coord[b][valid[b]]
                grid = rows.new_zeros(h * w, rows.shape[-1]).index_copy(0, flat[:, 0] * w + flat[:, 1], rows)
                out = grid.reshape(h, w, -1).permute(2, 0, 1) if output_fmt == "NCHW" else grid  # [C, h, w] / [h·w, C]
                per_image.append((out, tapped[b, :P]) if return_prefix_tokens else out)
            outs.append(per_image)
        if intermediates_only:
            return outs
        return {"patches": self.norm(t), "patch_valid": valid}, outs

    def pool(self, x: Tensor, patch_valid: Tensor | None = None) -> Tensor:  # type: ignore[override]
        """Tokens ``[B, P + L, C]`` -> ``[B, C]``: MAP with the key mask, the mean of the valid grid tokens
        (``avg``), the class token (``token``); ``""``: ``x`` unchanged."""
        if patch_valid is None:
            return super().pool(x)
        valid = patch_valid.bool()
        if self._pool_prefix():  # pool_include_prefix: the prefix tokens are always valid keys / terms
            grid, valid = x, torch.cat([valid.new_ones(x.shape[0], self.num_prefix_tokens), valid], dim=1)
        else:
            grid = x[:, self.num_prefix_tokens:]
        if self.global_pool == "map":
            return self.attn_pool(grid, key_mask=valid)
        if self.global_pool == "avg":
            w = valid.to(x.dtype)[..., None]  # [B, L, 1]
            return (grid * w).sum(1) / w.sum(1).clamp(min=1)
        return super().pool(x)

    def forward_head(self, x: Any, pre_logits: bool = False,  # type: ignore[override]
                     patch_valid: Tensor | None = None) -> Tensor:
        """Tokens ``[B, P + L, C]`` (or the NaFlex features dict) -> logits ``[B, num_classes]`` (features
        ``[B, num_features]`` with ``pre_logits``); ``patch_valid [B, L]`` masks the pooling."""
        if isinstance(x, Mapping):
            x, patch_valid = x["patches"], x["patch_valid"]
        x = self.pre_logits(self.fc_norm(self.pool(x, patch_valid)))
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    # forward is the base one, forward_head(forward_features(x)): x a tensor, a list of images or the packed dict


# ---------------------------------------------------------------------------- presets (data)
_BASE = dict(embed_dim=768, depth=12, num_heads=12, patch_size=16, img_size=384)  # the tags' input size
_GAP = dict(_BASE, init_values=1e-5, global_pool="avg", reg_tokens=4, fc_norm=True)
_SIGLIP = dict(act="gelu_tanh", global_pool="map", pos_embed_interp_mode="bilinear", num_classes=0)
_PRESETS: dict[str, dict[str, Any]] = {
    "naflexvit_base_patch16_gap": dict(_GAP),
    "naflexvit_base_patch16_par_gap": dict(_GAP, pos_embed_ar_preserving=True),
    "naflexvit_base_patch16_parfac_gap": dict(_GAP, pos_embed_ar_preserving=True, pos_embed_factorized=True),
    "naflexvit_base_patch16_map": dict(_BASE, init_values=1e-5, global_pool="map", reg_tokens=1),
    "naflexvit_base_patch16_siglip": dict(_BASE, **_SIGLIP),
    "naflexvit_so400m_patch16_siglip": dict(embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, patch_size=16,
                                            img_size=384,
                                            **_SIGLIP),
}

# timm 1.0.31 parameters on the meta device at 1000 classes; GMACs from timm's
# results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv at 384 px.
_PARAMS = {"naflexvit_base_patch16_gap": 86.634, "naflexvit_base_patch16_parfac_gap": 86.462,
           "naflexvit_base_patch16_map": 93.719}
_GMACS = {"naflexvit_base_patch16_gap": 55.86, "naflexvit_base_patch16_parfac_gap": 55.86,
          "naflexvit_base_patch16_map": 56.23, "naflexvit_base_patch16_siglip": 56.12,
          "naflexvit_so400m_patch16_siglip": 259.65}
_SIGLIP_PARAMS = {"naflexvit_base_patch16_siglip": 92.930, "naflexvit_so400m_patch16_siglip": 427.888}
_SOURCE = "timm 1.0.31 benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs at 384 px"


def _meta(name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if name in _PARAMS:
        meta["published_params_m"] = _PARAMS[name]
    elif name in _SIGLIP_PARAMS:  # num_classes=0 (the .v2_webli tag): the encoder + MAP, no classifier
        meta["published_params_m"] = _SIGLIP_PARAMS[name]
    if name in _GMACS:
        meta.update(published_gmacs=_GMACS[name], published_gmacs_source=_SOURCE)
    return meta


def reduced_config(cfg: VisionTransformerConfig) -> dict[str, Any]:
    """Overrides that shrink a NaFlexViT preset for tests: width 32, 2 heads, 2 blocks, 8 px patches, a 2x3
    position table and a 16x24 px input (its 2x3 grid: no table resize at the default size; resizing is
    covered by the parity tests and the ONNX export tests); tokens, pooling, LayerScale, table kind and
    activation kept."""
    return dict(embed_dim=32, num_heads=2, depth=2, mlp_dim=None, patch_size=8, img_size=(16, 24),
                pos_embed_grid_size=(2, 3))


register_family("naflexvit", NaFlexVit, NaFlexVitConfig, _PRESETS, reduced=reduced_config,
                meta={name: _meta(name) for name in _PRESETS})

# ---------------------------------------------------------------------------- pretrained tags (data)
# timm 1.0.31's pretrained configs (scripts/make_pretrained_table.py); a name's first tag is its
# default; hf_hub_id: timm/<name>.<tag> unless given; num_classes: 1000 unless given.
_384 = data_cfg(384, 1.0, mean=INCEPTION_MEAN, std=INCEPTION_STD)
PRETRAINED = pretrained_tags({
    "naflexvit_base_patch16_gap.e300_s576_in1k": _384,
    "naflexvit_base_patch16_map.untrained": dict(_384, hf_hub_id=None),
    "naflexvit_base_patch16_par_gap.e300_s576_in1k": _384,
    "naflexvit_base_patch16_parfac_gap.e300_s576_in1k": _384,
    "naflexvit_base_patch16_siglip.v2_webli": dict(_384, num_classes=0),
    "naflexvit_so400m_patch16_siglip.v2_webli": dict(_384, num_classes=0),
}, license="apache-2.0")

