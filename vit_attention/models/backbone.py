"""The base of every model family: config, classifier, pooling, the forward API, checkpointing.

A family declares its config class, builds its modules in ``__init__`` and says how images reach
its first stage; everything a user calls on any model is written here once:

* config resolution and validation: ``Family(cfg=None, **overrides)``, :meth:`Backbone.default_config`;
* ``forward`` / ``forward_features`` / ``forward_head`` / ``forward_intermediates``;
* one pooling rule (:meth:`Backbone.pool`: class token, average of the grid tokens or the map,
  attention pooling) in front of the classifier, and :meth:`Backbone.reset_classifier`;
* ``set_grad_checkpointing`` (every stage or model with a ``grad_checkpointing`` flag) and
  ``no_weight_decay`` (the parameters whose names hold one of ``no_weight_decay_keys``);
* :meth:`Backbone.set_input_size` for the families with no size-dependent tables (the size is checked
  and recorded); families with tables override it (ViT, Swin, CaiT) or name what a resize would
  need (``resize_needs``: it raises ``NotImplementedError``).

A family derives from one of the two shapes a model takes, each a small base of its own:

* :class:`StagedBackbone` (Swin, PVT, CvT, DaViT, NAT, Twins, ViL, HaloNet, MobileViT): the stages in one
  ``nn.Sequential`` of :class:`~vit_attention.layers.Stage` (named by ``stages_attr``); the family writes
  ``_embed`` (images -> the first stage's input, a map ``[B, H, W, C]`` or
  :class:`~vit_attention.layers.Tokens`); the stages carry prefix tokens when an embedding adds them
  (PVT's and CvT's class token, ViL's globals), so one loop serves them all;
* :class:`IsotropicBackbone` (ViT, CaiT, ViTDet, iGPT): one run of ``blocks`` (keys ``blocks.{i}``,
  timm's), run by :func:`~vit_attention.layers.run_blocks_with_taps`; the family writes
  ``forward_features`` / ``forward_intermediates``; :class:`ClassAttentionBackbone` (CaiT, XCiT) writes both
  for the families that end in a class-attention stage.

Each base says what the levels of its shape are (how many ``forward_intermediates`` indexes, what
``prune_intermediate_layers`` cuts, :meth:`Backbone.block_names`). Token merging (ToMe) is
:mod:`vit_attention.models.token_merging`'s, the layer-wise grouping behind :meth:`Backbone.group_matcher`
:mod:`vit_attention.models.layer_groups`'.

The attributes the API reads: ``cfg``, ``num_classes``, ``num_features``, ``global_pool``,
``num_prefix_tokens``, ``feature_info``, ``norm`` (the final norm), ``head`` (a
:class:`~vit_attention.layers.ClassifierHead` that does not pool, or a bare ``Linear`` with
``head_fc = None``) and, for ``global_pool="map"``, ``attn_pool``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from ..layers.head import reset_head
from ..layers.stage import Tokens, resolve_indices, staged_intermediates
from . import layer_groups
from ._config import check_int, check_size

__all__ = ["Backbone", "ClassAttentionBackbone", "IsotropicBackbone", "StagedBackbone", "isotropic_taps",
           "tokens_to_intermediates"]


_ENTRY_POINTS = ("forward", "forward_features", "forward_intermediates")
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu")


def _checked_entry(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(self, x, ...)`` that first runs ``self.check_input(x, fn.__name__)`` (type / dtype / rank only)."""
    @functools.wraps(fn)
    def entry(self: Backbone, x: Any, *args: Any, **kwargs: Any) -> Any:
        self.check_input(x, fn.__name__)
        return fn(self, x, *args, **kwargs)

    entry._checks_input = True  # type: ignore[attr-defined]
    return entry


def _field_names(cfg: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cfg)}


class Backbone(nn.Module):
    """Images ``[B, Cin, H, W]`` -> logits ``[B, num_classes]``; the API every family shares (see the module doc).

    Class attributes a family sets: ``family`` (its registry name), ``config_cls`` (its config
    dataclass), ``no_weight_decay_keys``, ``pools`` (the ``global_pool`` values
    :meth:`reset_classifier` takes), ``avg_pool_prefix`` (the average includes the prefix tokens,
    as ViL), ``head_fc`` (where the classifier's ``Linear`` sits in ``head``; None = ``head`` itself) and
    ``resize_needs`` (non-empty: what :meth:`set_input_size` would need that is not implemented).

    Input check: ``forward``, ``forward_features`` and ``forward_intermediates`` (a family's own too:
    :meth:`__init_subclass__` wraps them) first run :meth:`check_input`, which refuses by name what no
    family can take (a NumPy array, a Pillow image, a list, None, an integer or other-dtype tensor)
    instead of torch's ``AttributeError`` or raw convolution error. ``input_ranks`` (tensor ranks a
    family takes, default images ``[B, Cin, H, W]``), ``input_int_ranks`` (integer tensors it takes:
    iGPT's token ids ``[B, n]``) and ``input_containers`` (Python types its own code checks: NaFlexViT's
    lists of images and packed dicts) widen it.
    """

    family: ClassVar[str] = ""
    config_cls: ClassVar[type]
    no_weight_decay_keys: ClassVar[tuple[str, ...]] = ()
    pools: ClassVar[tuple[str, ...]] = ("avg", "")
    avg_pool_prefix: ClassVar[bool] = False
    head_fc: ClassVar[str | None] = "fc"
    resize_needs: ClassVar[str] = ""
    input_ranks: ClassVar[tuple[int, ...]] = (4,)
    input_int_ranks: ClassVar[tuple[int, ...]] = ()
    input_containers: ClassVar[tuple[type, ...]] = ()

    cfg: Any
    num_classes: int
    num_features: int
    global_pool: str
    num_prefix_tokens: int = 0
    norm: nn.Module
    head: nn.Module

    def __init__(self, cfg: Any = None, **overrides: Any) -> None:
        """Resolve the config (``cfg`` with ``overrides``, or the family's defaults with them) and validate it."""
        super().__init__()
        self.cfg = self.resolve_config(cfg, **overrides)
        self.num_classes = self.cfg.num_classes

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every family's input entry points check their input first (:meth:`check_input`): its own, and one a
        mixin brings (the features models' ``forward``); Backbone's own are checked already."""
        super().__init_subclass__(**kwargs)
        for name in _ENTRY_POINTS:
            fn = getattr(cls, name, None)
            if fn is not None and not getattr(fn, "_checks_input", False):
                setattr(cls, name, _checked_entry(fn))

    def check_channels(self, x: Tensor) -> None:
        """Refuse images that are not ``[B, cfg.in_chans, H, W]`` (``ValueError`` naming the shape): the check of an
        embedding that reads the channels itself (a view or a permute, where a convolution would not name them)."""
        if x.dim() != 4 or x.shape[1] != self.cfg.in_chans:
            raise ValueError(f"expected images [B, {self.cfg.in_chans}, H, W], got {tuple(x.shape)}")

    def check_input(self, x: Any, entry: str = "forward") -> None:
        """Refuse an input no family takes, naming it and what is expected; ``entry`` names the method called.

        Expected: a floating-point tensor ``[B, Cin, H, W]`` in the model's dtype (images: a
        :func:`~vit_attention.data.create_transform` per image, then ``torch.stack``). ``TypeError`` for
        anything that is not a tensor, ``ValueError`` for an integer / bool tensor, a floating tensor of
        another dtype than the model's (outside autocast) or of another rank. Python checks on type,
        dtype and rank only (no data read): free at run time and invisible to ``torch.compile`` /
        ``jit.trace`` / ONNX export. Shape details (channels, size) are the embedding's to check.
        """
        cin = getattr(self.cfg, "in_chans", "Cin")
        want = f"a floating-point tensor [B, {cin}, H, W] in the model's dtype"
        where = f"{type(self).__name__}.{entry}(x)"
        if isinstance(x, Tensor):
            if x.is_floating_point():
                if x.dim() not in self.input_ranks:
                    raise ValueError(f"{where}: x has shape {tuple(x.shape)}; expected {want} (a batch of images; "
                                     "one image [C, H, W]: x.unsqueeze(0))")
                dtype = next((p.dtype for p in self.parameters() if p.is_floating_point()), x.dtype)
                if x.dtype != dtype and not (x.device.type in _AUTOCAST_DEVICES
                                             and torch.is_autocast_enabled(x.device.type)):
                    raise ValueError(f"{where}: x is {x.dtype}, the model {dtype}; pass x.to({dtype}) "
                                     f"(or move the model: model.to({x.dtype}))")
                return
            if x.dim() in self.input_int_ranks and x.dtype not in (torch.bool, torch.complex64, torch.complex128):
                return
            raise ValueError(f"{where}: x has dtype {x.dtype}; expected {want} (uint8 images: convert and "
                             "normalise them with vit_attention.data.create_transform, or x.float() / 255 and the "
                             "model's mean / std)")
        if isinstance(x, self.input_containers):
            return
        module = type(x).__module__
        kind = "None" if x is None else f"a {'' if module == 'builtins' else module + '.'}{type(x).__name__}"
        hint = " (torch.from_numpy(a).permute(0, 3, 1, 2).float() for [B, H, W, C] arrays)" \
            if module == "numpy" else ""
        raise TypeError(f"{where}: x is {kind}; expected {want}{hint}; images (Pillow, files) become tensors "
                        "with vit_attention.data.create_transform (one [C, H, W] each, then torch.stack)")

    # ------------------------------------------------------------------ config
    @classmethod
    def default_config(cls, **overrides: Any) -> Any:
        """The family's config class with ``overrides``."""
        return cls.config_cls(**overrides)

    @classmethod
    def resolve_config(cls, cfg: Any = None, **overrides: Any) -> Any:
        """``cfg`` (a copy, with ``overrides``) or :meth:`default_config` ``(**overrides)``, validated.

        Validated again here although configs check themselves on construction: fields may have
        been assigned after the config was built. A config without the fields of the family's config
        class (another family's) raises ``TypeError`` naming it; one with them is taken (SwinV2
        accepts a :class:`~vit_attention.models.swin.SwinTransformerConfig`: same fields, other defaults).
        """
        if cfg is None:
            cfg = cls.default_config(**overrides)
        elif not (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type) and hasattr(cfg, "validate")
                  and _field_names(cls.config_cls) <= _field_names(cfg)):
            raise TypeError(f"cfg must be a {cls.config_cls.__name__} (or None for the defaults), "
                            f"got {type(cfg).__name__}")
        else:
            cfg = dataclasses.replace(cfg, **overrides)
        cfg.validate()
        return cfg

    # ------------------------------------------------------------------ classifier
    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh classifier for ``num_classes`` (0 = none); ``global_pool`` (one of ``pools``; None = keep).

        ``"token"`` needs a prefix token and ``"map"`` the attention-pooling head built with the model;
        leaving ``"map"`` removes that head (as timm). The config follows, so ``save_weights`` then
        ``load_model`` rebuild this model: its ``fc_norm`` choice, which ViT derives from the pooling when
        unset, is pinned to the norms the model was built with. Every argument is checked before anything
        changes.
        """
        check_int(num_classes, "num_classes", min_value=0)
        if global_pool is not None:
            if global_pool not in self.pools:
                raise ValueError(f"global_pool must be one of {', '.join(repr(p) for p in self.pools)}; "
                                 f"got {global_pool!r}")
            if global_pool == "token" and not self.num_prefix_tokens:
                raise ValueError("global_pool='token' needs a class token; this model has none")
            if hasattr(self.cfg, "global_pool"):  # the family's own rules (ViT: registers are no class token)
                try:
                    dataclasses.replace(self.cfg, global_pool=global_pool)
                except ValueError as e:
                    raise ValueError(f"global_pool={global_pool!r}: {e}") from None
            if global_pool == "map" and getattr(self, "attn_pool", None) is None:
                raise ValueError("cannot switch to global_pool='map' after construction (no attention-pool head)")
            self._pin_pooling_choices()
            if global_pool != "map" and getattr(self, "attn_pool", None) is not None:
                self.attn_pool = None
            self.global_pool = global_pool
            if hasattr(self.cfg, "global_pool"):
                self.cfg.global_pool = global_pool
        reset_head(self, num_classes, None, fc_attr=self.head_fc)

    def _pin_pooling_choices(self) -> None:
        """Before ``cfg.global_pool`` changes: write into the config every choice the family derived from the
        pooling at build time, so the config still rebuilds this model (ViT: ``fc_norm``). Default: none."""

    def pool(self, x: Tensor) -> Tensor:
        """Features -> pooled ``[B, C]`` per ``global_pool``.

        ``x``: tokens ``[B, P + N, C]`` or a map ``[B, H, W, C]``. ``"token"``: the first token;
        ``"avg"``: the mean of the grid tokens or of the map; ``"map"``: ``attn_pool`` of the grid tokens
        (prefix tokens left out, as timm); both over every token, prefix tokens included, with the config's
        ``pool_include_prefix`` (timm's option; ViT-like families) or the family's ``avg_pool_prefix`` (ViL's
        average); ``""``: ``x`` unchanged.
        """
        if self.global_pool == "avg":
            if x.dim() == 4:
                return x.mean(dim=(1, 2))
            return x[:, 0 if self.avg_pool_prefix or self._pool_prefix() else self.num_prefix_tokens:].mean(dim=1)
        if self.global_pool == "token":
            return x[:, 0]
        if self.global_pool == "map":  # over the grid tokens, as timm (unless pool_include_prefix)
            return self.attn_pool(x if x.dim() == 4 or self._pool_prefix() else x[:, self.num_prefix_tokens:])
        return x

    def _pool_prefix(self) -> bool:
        """The config's ``pool_include_prefix`` (False for a family without the option)."""
        return bool(getattr(self.cfg, "pool_include_prefix", False))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Features (as :meth:`forward_features` gives them) -> logits ``[B, num_classes]``
        (the pooled ``[B, num_features]`` with ``pre_logits``).

        A ``ClassifierHead`` (``head_fc = "fc"``) pools and classifies itself; a bare ``Linear`` head
        (``head_fc = None``) gets :meth:`pool`, then ``head_drop`` (when the model has one), then ``head``.
        """
        if self.head_fc is None:
            x = self.pool(x)  # [B, C]
            drop = getattr(self, "head_drop", None)
            x = drop(x) if drop is not None else x
            return x if pre_logits else self.head(x)
        return self.head(self.pool(x), pre_logits=pre_logits)

    # ------------------------------------------------------------------ forward
    @_checked_entry
    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> the normalised output of the last block / stage (tokens ``[B, P + N, C]``
        or a map ``[B, H', W', C]``), what :meth:`forward_head` takes. Written by :class:`StagedBackbone` or
        the family."""
        raise NotImplementedError(f"{type(self).__name__} must define forward_features")

    @_checked_entry
    def forward(self, x: Tensor) -> Any:
        """Images ``[B, Cin, H, W]`` -> logits ``[B, num_classes]``."""
        return self.forward_head(self.forward_features(x))

    @_checked_entry
    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False,
                              stop_early: bool = False) -> Any:
        """timm's ``forward_intermediates``: the final output (as :meth:`forward_features`) plus the map of each
        chosen level (``indices``: an int ``n`` = the last ``n``, or level indices, negative allowed; default
        all), ``[B, C_i, H_i, W_i]`` (``NCHW``) or the format named; ``(final, [maps])`` or only the list with
        ``intermediates_only``. Written by :class:`StagedBackbone` or the family."""
        raise NotImplementedError(f"{type(self).__name__} must define forward_intermediates")

    # ------------------------------------------------------------------ pruning (timm's prune_intermediate_layers)
    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Remove what :meth:`forward_intermediates` ``(x, indices)`` does not need, in place (timm's API, for
        feature extraction): the blocks / stages after the last chosen level, and the classifier.

        ``indices`` as :meth:`forward_intermediates` takes them (an int ``n`` = the last ``n`` levels, or level
        indices, negative allowed). ``prune_norm``: the final norm too (it is removed anyway when stages of a
        hierarchical model are cut: it belongs to the last stage's width). ``prune_head``: the classifier and
        the parts before it (``fc_norm``, attention pooling, CaiT's class-attention blocks); ``num_classes``
        becomes 0. Returns the levels as absolute indices into the model's levels, which stay numbered as
        before: pass them to :meth:`forward_intermediates`. ``feature_info`` is unchanged.
        """
        take = resolve_indices(indices, self._num_levels(), "feature level")
        self._prune_levels(take)
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self._prune_head()
        return take

    def _prune_levels(self, take: Sequence[int]) -> None:
        """Remove what levels ``take`` do not need: in a chain of blocks / stages, all after the last of them
        (:meth:`_prune_after`); a family whose levels are parallel branches (ViTDet's pyramid) overrides this."""
        self._prune_after(max(take))

    def _num_levels(self) -> int:
        """How many levels :meth:`forward_intermediates` indexes (the model's shape says: its base)."""
        raise NotImplementedError(f"{type(self).__name__} must define _num_levels")

    def _prune_after(self, last: int) -> None:
        """Keep levels ``0..last`` and what they need (the model's shape says: its base)."""
        raise NotImplementedError(f"{type(self).__name__} must define _prune_after")

    def _prune_head(self) -> None:
        """No classifier (``num_classes=0``, no pooling where the family allows ``global_pool=""``) and no part
        that only feeds it. The config keeps its ``global_pool``: it says how the backbone was built (EVA's
        final norm depends on it), and a pruned features model is rebuilt from it."""
        pool = getattr(self.cfg, "global_pool", None)
        self.reset_classifier(0, "" if "" in self.pools else None)
        if pool is not None:
            self.cfg.global_pool = pool
        if isinstance(getattr(self, "fc_norm", None), nn.Module):
            self.fc_norm = nn.Identity()
        if getattr(self, "attn_pool", None) is not None:
            self.attn_pool = None

    @property
    def head_hidden_size(self) -> int:
        """Width of the features the classifier's ``Linear`` reads (timm's ``head_hidden_size``): the
        representation layer's (original ViT-21k's ``pre_logits``) where there is one, else ``num_features``."""
        rep = getattr(self.cfg, "representation_size", None)
        return int(rep) if rep else int(self.num_features)

    # ------------------------------------------------------------------ input size
    def set_input_size(self, img_size: int | tuple[int, int] | None = None) -> None:
        """Change the nominal input size permanently, in place (timm's ``set_input_size``), for a family
        whose modules take any size within its constraints (convolutions, padded windows or
        neighbourhoods, relative schemes read at run time: nothing is resampled).

        ``img_size`` (an int or ``(H, W)``; None = keep) is checked (:func:`check_size`, then the family's
        :meth:`_check_img_size`, e.g. PVT's ``min_input_size``) before anything changes, an error naming
        it; then ``cfg.img_size`` records it (an int when square), so the data config, FLOPs and a
        rebuilt model follow. Images ``[B, Cin, H, W]`` of the new size give what a model built at it
        gives with the same weights; ``feature_info`` (channels, strides) does not depend on the size.
        A family whose resize would need tables not handled yet (``resize_needs``) raises
        ``NotImplementedError`` naming the family and what it would need; families with size-dependent
        tables (ViT, Swin, CaiT, PVT v1, ViL, ViTDet) override this method.
        """
        if self.resize_needs:
            raise NotImplementedError(f"set_input_size is not implemented for {self.family or type(self).__name__} "
                                      f"({type(self).__name__}): it would need {self.resize_needs}")
        if img_size is None:
            return
        img = check_size(img_size, "img_size")
        self._check_img_size(img)
        self.cfg.img_size = img[0] if img[0] == img[1] else img

    def _check_img_size(self, img_size: tuple[int, int]) -> None:
        """Raise ``ValueError`` naming ``img_size`` when the family cannot take ``(H, W)``; default: any size."""

    # ------------------------------------------------------------------ training
    # why token merging has no meaning for the family (:meth:`set_token_merging`); token models override the method
    token_merging_note: ClassVar[str] = ("its blocks attend within windows or on a spatial map, whose grid merged "
                                         "tokens would no longer fill")

    def set_token_merging(self, r: int | tuple[int, float] | list[int], *, prop_attn: bool = True) -> None:
        """Token merging (ToMe) in every block: ``r`` tokens merged per block (a schedule: see
        :func:`vit_attention.functional.tome.merge_schedule`); ``r=0`` turns it off. Only token models support
        it (ViT and its relatives); here it raises ``ValueError`` naming why it has no meaning for this family."""
        if r == 0:
            return
        raise ValueError(f"token merging is not available for {type(self).__name__}: {self.token_merging_note}")

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in backward to save memory (training only): every stage (and the model
        itself) with a ``grad_checkpointing`` flag."""
        for m in self.modules():
            if hasattr(m, "grad_checkpointing"):
                m.grad_checkpointing = enable

    def no_weight_decay(self) -> set[str]:
        """Parameter names that should not get weight decay: those holding one of ``no_weight_decay_keys``."""
        keys = self.no_weight_decay_keys
        return {n for n, _ in self.named_parameters() if any(k in n for k in keys)}

    # ------------------------------------------------------------------ timm's classifier / config accessors
    def get_classifier(self) -> nn.Module:
        """The final linear classifier (``Identity`` with ``num_classes=0``), timm's ``get_classifier``."""
        return getattr(self.head, self.head_fc) if self.head_fc is not None else self.head

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's older name of ``pretrained_cfg`` (the data config, hub id, license and tag of the weights)."""
        return getattr(self, "pretrained_cfg", {})

    # ------------------------------------------------------------------ parameter groups (layer-wise decay)
    def block_names(self) -> list[str]:
        """The module names of the model's blocks in the order the forward runs them, the unit layer-wise
        learning-rate decay counts (:mod:`~vit_attention.models.layer_groups`); the model's shape says (its base)."""
        raise NotImplementedError(f"{type(self).__name__} must define block_names")

    # top-level modules that belong to the stem although they are registered after the blocks
    late_stem_modules: ClassVar[tuple[str, ...]] = ()

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's parameter grouping (what ``timm.optim``'s layer-wise decay reads): ``{"stem": regex, "blocks":
        [(regex, (ordinal,)), ...]}``, one group per block (``coarse``: per stage), the parameters after the
        blocks last (:func:`~vit_attention.models.layer_groups.group_matcher`)."""
        return layer_groups.group_matcher(self, coarse)


class IsotropicBackbone(Backbone):
    """A model that is one run of ``blocks`` (ViT, CaiT, ViTDet, iGPT): its levels are the blocks, keys
    ``blocks.{i}`` (timm's). The family writes ``forward_features`` and ``forward_intermediates`` (with
    :func:`isotropic_taps` / :func:`tokens_to_intermediates`)."""

    blocks: nn.Sequential

    def _num_levels(self) -> int:
        """The blocks."""
        return len(self.blocks)

    def _prune_after(self, last: int) -> None:
        """Keep blocks ``0..last`` (and no PEG after a removed block)."""
        self.blocks = self.blocks[:last + 1]
        pegs = getattr(self, "pos_block", None)
        if isinstance(pegs, nn.ModuleDict):
            for key in [k for k in pegs if int(k) > last]:
                del pegs[key]

    def block_names(self) -> list[str]:
        """``blocks.{i}``, in order."""
        return [f"blocks.{j}" for j in range(len(self.blocks))]

    def _record_patch_embed_size(self) -> None:
        """After ``patch_embed.set_input_size`` (ViT-style and CaiT ``set_input_size``): ``grid_size``,
        ``cfg.img_size`` / ``cfg.patch_size`` (ints when square) and every feature's reduction (the larger
        patch side) follow the patch embedding."""
        pe: Any = self.patch_embed
        self.grid_size = pe.grid_size
        (ph, pw), (h, w) = pe.patch_size, pe.img_size
        self.cfg.img_size = h if h == w else (h, w)
        self.cfg.patch_size = ph if ph == pw else (ph, pw)
        for info in getattr(self.feature_info, "info", self.feature_info):  # a features model's FeatureInfo too
            info["reduction"] = max(ph, pw)



class ClassAttentionBackbone(IsotropicBackbone):
    """An isotropic model whose patch tokens end in a class-attention stage (CaiT, XCiT): the self-attention
    ``blocks`` (its levels, as :class:`IsotropicBackbone`), then the blocks named by ``class_blocks_attr``, which
    update only a class token that reads the patch tokens.

    The family writes ``_embed`` (images ``[B, Cin, H, W]`` -> patch tokens ``[B, N, C]`` and their grid),
    ``_run_blocks`` (the self-attention blocks with taps, as :func:`~vit_attention.layers.run_blocks_with_taps`)
    and ``forward_cls`` (``[B, N, C]`` -> ``[B, 1 + N, C]``, ``x`` itself once the head is pruned); the forwards,
    the block names and the pruning of the head are written here once.
    """

    class_blocks_attr: ClassVar[str] = "blocks_token_only"
    cls_token: nn.Parameter | None

    def _embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Images ``[B, Cin, H, W]`` -> patch tokens ``[B, N, C]`` and their grid ``(H', W')``."""
        raise NotImplementedError(f"{type(self).__name__} must define _embed")

    def _run_blocks(self, x: Tensor, feat_size: tuple[int, int], indices: set[int] | None = None, *,
                    stop: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Patch tokens ``[B, N, C]`` through the self-attention blocks: ``-> (tokens, [outputs of blocks
        indices])``; ``stop``: no block after the last of ``indices`` runs."""
        raise NotImplementedError(f"{type(self).__name__} must define _run_blocks")

    def forward_cls(self, x: Tensor, feat_size: tuple[int, int] | None = None) -> Tensor:
        """Class-attention stage: patch tokens ``[B, N, C]`` -> ``[B, 1 + N, C]`` (class token first)."""
        raise NotImplementedError(f"{type(self).__name__} must define forward_cls")

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> normalised tokens ``[B, 1 + N, C]`` (``[B, N, C]`` once the head is pruned)."""
        x, feat_size = self._embed(x)
        x, _ = self._run_blocks(x, feat_size)
        return self.norm(self.forward_cls(x, feat_size))

    def forward_intermediates(
        self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
        output_fmt: Literal["NCHW", "NLC"] = "NCHW", intermediates_only: bool = False, stop_early: bool = False,
    ) -> Any:
        """Final tokens plus the outputs of chosen self-attention blocks (patch tokens; no class token).

        ``indices``: an int ``n`` = the last ``n`` blocks, or explicit block indices (negative allowed); default
        all. Intermediates are ``[B, C, H', W']`` (``NCHW``) or ``[B, N, C]`` (``NLC``), through the final norm
        when ``norm``. Returns ``(final [B, 1 + N, C], [intermediates])`` or only the list. ``stop_early``
        (timm): no self-attention block after the last chosen one runs, the class-attention blocks read its
        tokens; ``intermediates_only`` always stops there.
        """
        take = isotropic_taps(indices, len(self.blocks), output_fmt)
        x, feat_size = self._embed(x)
        x, saved = self._run_blocks(x, feat_size, set(take), stop=intermediates_only or stop_early)
        outs = tokens_to_intermediates(saved, feat_size, norm=self.norm if norm else None, output_fmt=output_fmt)
        if intermediates_only:
            return outs
        return self.norm(self.forward_cls(x, feat_size)), outs

    def _prune_head(self) -> None:
        """The classifier, and the class-attention blocks and class token that only feed it
        (``prune_intermediate_layers``): the features are then the normalised patch tokens ``[B, N, C]``, with
        no prefix token."""
        super()._prune_head()
        setattr(self, self.class_blocks_attr, nn.ModuleList())
        self.cls_token = None
        self.num_prefix_tokens = 0

    def block_names(self) -> list[str]:
        """The self-attention blocks, then the class-attention ones (the order the forward runs them)."""
        n = len(getattr(self, self.class_blocks_attr))
        return super().block_names() + [f"{self.class_blocks_attr}.{j}" for j in range(n)]


class StagedBackbone(Backbone):
    """A hierarchical model: ``_embed`` (images -> the first stage's input, a map ``[B, H, W, C]`` or
    :class:`~vit_attention.layers.Tokens`), then stages in one ``nn.Sequential`` (the attribute ``stages_attr``
    names: ``layers`` for Swin, timm's key layout), then the final ``norm``; its levels are the stages."""

    stages_attr: ClassVar[str] = "stages"

    def _embed(self, x: Tensor) -> Tensor | Tokens:
        """Images ``[B, Cin, H, W]`` -> the first stage's input (a map ``[B, H', W', C]`` or :class:`Tokens`)."""
        raise NotImplementedError(f"{type(self).__name__} must define _embed or override forward_features")

    def _stages(self) -> nn.Sequential:
        """The stages, in order."""
        return getattr(self, self.stages_attr)

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``[B, Cin, H, W]`` -> the normalised last stage: a map ``[B, H', W', C]``, or tokens
        ``[B, P + H'·W', C]`` when its embedding adds prefix tokens."""
        x = self._stages()(self._embed(x))
        return self.norm(x.x if isinstance(x, Tokens) else x)

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None, *, norm: bool = False,
                              output_fmt: Literal["NCHW", "NHWC"] = "NCHW", intermediates_only: bool = False,
                              stop_early: bool = False) -> Any:
        """The final output (as :meth:`forward_features`) plus each chosen stage's map.

        ``indices``: an int ``n`` = the last ``n`` stages, or stage indices (negative allowed);
        default all. Stage ``i`` gives ``[B, C_i, H_i, W_i]`` (``NCHW``; channels and stride in
        ``feature_info``) or ``[B, H_i, W_i, C_i]`` (``NHWC``), prefix tokens left out; ``norm``
        applies the final norm to the last stage's map. Returns ``(final, [maps])`` or only the list.
        ``stop_early`` (timm): no stage after the last chosen one runs; ``final`` is then its output (through
        the final norm when it is the last stage); ``intermediates_only`` always stops there.
        """
        return staged_intermediates(self._stages(), self._embed(x), indices, self.norm, norm=norm,
                                    output_fmt=output_fmt, intermediates_only=intermediates_only,
                                    stop_early=stop_early)

    def _num_levels(self) -> int:
        """The stages."""
        return len(self._stages())

    def _prune_after(self, last: int) -> None:
        """Keep stages ``0..last`` (and no final norm if stages went: it has the last stage's width)."""
        stages = self._stages()
        if last < len(stages) - 1:
            setattr(self, self.stages_attr, stages[:last + 1])
            self.norm = nn.Identity()

    def block_names(self) -> list[str]:
        """``{stages_attr}.{s}.blocks.{j}``, or ``{stages_attr}.{s}.{j}`` for a stage that is a plain sequence of
        blocks (HaloNet, MobileViT), stage after stage."""
        names: list[str] = []
        for s, stage in enumerate(self._stages()):
            inner = getattr(stage, "blocks", None)
            prefix = f"{self.stages_attr}.{s}" + (".blocks" if inner is not None else "")
            names += [f"{prefix}.{j}" for j in range(len(inner if inner is not None else stage))]
        return names


def isotropic_taps(indices: int | Sequence[int] | None, depth: int, output_fmt: str,
                   formats: Sequence[str] = ("NCHW", "NLC"), what: str = "block") -> list[int]:
    """``forward_intermediates`` of a model of ``depth`` blocks: the block indices to tap (see
    :func:`~vit_attention.layers.stage.resolve_indices`; errors name ``what``), after checking
    ``output_fmt`` is one of ``formats``.

    Both are checked before any block runs, so a bad call fails at once.
    """
    take = resolve_indices(indices, depth, what)
    if output_fmt not in formats:
        raise ValueError(f"output_fmt must be {' or '.join(repr(f) for f in formats)}, got {output_fmt!r}")
    return take


def tokens_to_intermediates(tapped: Sequence[Tensor], feat_size: tuple[int, int], num_prefix_tokens: int = 0, *,
                            norm: nn.Module | None = None, output_fmt: Literal["NCHW", "NLC"] = "NCHW",
                            return_prefix_tokens: bool = False) -> list[Any]:
    """Tapped block outputs, tokens ``[B, P + H·W, C]`` (``P = num_prefix_tokens``), -> intermediates.

    Each is passed through ``norm`` (the whole sequence, prefix included) when given, then split:
    the grid as ``[B, C, H, W]`` (``NCHW``) or ``[B, H·W, C]`` (``NLC``), and with
    ``return_prefix_tokens`` the pair ``(grid, prefix [B, P, C])``.
    """
    H, W = feat_size
    outs: list[Any] = []
    for t in tapped:
        t = norm(t) if norm is not None else t
        prefix, grid = t[:, :num_prefix_tokens], t[:, num_prefix_tokens:]
        if output_fmt == "NCHW":  # every size spelled out: B may be 0 (and stays symbolic in ONNX)
            grid = grid.reshape(grid.shape[0], H, W, grid.shape[-1]).permute(0, 3, 1, 2)  # [B, C, H, W]
        outs.append((grid, prefix) if return_prefix_tokens else grid)
    return outs
