"""Feature extraction: ``create_model(name, features_only=True, out_indices=...)``.

A features model is the backbone itself with its classifier removed and a ``forward`` that
returns a list of maps, one per entry of ``out_indices``:

* ``forward(x [B, Cin, H, W]) -> [maps]``, map ``k`` ``[B, C_k, H / r_k, W / r_k]`` (``NCHW``,
  the default) or channels-last (``NHWC`` for hierarchical models, ``NLC`` tokens for ViT);
  ViT's prefix tokens (class, distillation) are dropped. ``C_k`` and ``r_k`` are
  ``model.feature_info.channels()[k]`` and ``.reduction()[k]``.
* It works for every family that has what every model of the library has: ``feature_info``
  (one dict per block or stage: ``num_chs``, ``reduction``, ``module``) and
  ``forward_intermediates(x, indices, norm=, output_fmt=, intermediates_only=True)``.
* Nothing after the last ``out_indices`` entry runs, and by default nothing after it is kept: the blocks /
  stages after it, the final norm when ``norm=False``, whatever only feeds the classifier and, where levels
  are parallel branches (ViTDet's pyramid), the branches no chosen level reads are removed
  (``prune_intermediate_layers``, as timm's features models do). So the model holds no parameter that gets
  no gradient (DDP needs no ``find_unused_parameters``) and no memory for layers it never runs.
  ``prune=False`` keeps them (``forward_intermediates(..., intermediates_only=True)`` still stops early).
* Default ``out_indices``: a model's own ``default_out_indices`` if it declares one; else every
  stage of a hierarchical model (strides differ), and the last 3 blocks of a plain (isotropic)
  one such as ViT (timm 1.0.31: ``out_indices=3`` for ``vision_transformer``, all stages for Swin).
* State-dict keys stay the backbone's (no ``model.`` prefix): the head's modules (``head``,
  ``head_dist``, ``fc_norm``, ``pre_logits``, ``attn_pool``) become ``nn.Identity`` and a
  checkpoint of the full model loads into the features model with ``load_state_dict`` (its
  head keys and the keys of pruned layers, ``pruned_keys``, are ignored; any missing backbone key
  still raises with ``strict=True``).

How: a features model is an instance of :func:`features_class` ``(Family)``, a subclass that puts
:class:`FeaturesMixin` first (one cached per backbone class), built directly with the features options
(``features_class(Family)(cfg, out_indices=..., output_fmt=..., norm=..., prune=...)``; ``create_model`` and
``load_model`` build it so): it builds the backbone, then removes the head and what the maps do not need. It
keeps the backbone's key names, ``isinstance`` and every method; only ``forward`` changes.
``copy.deepcopy`` and ``torch.save(model)`` work: the pickle names the backbone class and :func:`_rebuild`
makes the subclass again on load.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

__all__ = ["FeatureInfo", "FeaturesMixin", "features_class", "default_out_indices", "resolve_out_indices",
           "supported_output_formats", "HEAD_MODULES", "OUTPUT_FORMATS"]

# Attribute names of classifier parts across the families; a family may list its own as ``head_modules``.
HEAD_MODULES = ("head", "head_dist", "head_drop", "fc_norm", "pre_logits", "attn_pool")
OUTPUT_FORMATS = ("NCHW", "NHWC", "NLC")
_LAST_N_ISOTROPIC = 3  # timm's default for ViT-like models: the last 3 blocks


class FeatureInfo:
    """Channels, stride and module name of each output of a features model, in ``out_indices`` order.

    ``info``: the backbone's ``feature_info`` (one dict per block / stage); ``out_indices``:
    absolute indices into it. ``channels()``, ``reduction()``, ``module_name()`` give one value per
    output; pass ``idx`` (an int or a list) to read entries of ``info`` by index instead.
    ``len()``, indexing and iteration are over the outputs.
    """

    def __init__(self, info: Sequence[Mapping[str, Any]], out_indices: Sequence[int]) -> None:
        self.info = [dict(d, index=i) for i, d in enumerate(info)]
        self.out_indices = tuple(out_indices)

    def get(self, key: str, idx: int | Sequence[int] | None = None) -> Any:
        """``key`` of each output (``idx=None``), of entry ``idx`` (an int), or of entries ``idx`` (a list)."""
        if idx is None:
            return [self.info[i][key] for i in self.out_indices]
        if isinstance(idx, int):
            return self.info[idx][key]
        return [self.info[i][key] for i in idx]

    def channels(self, idx: int | Sequence[int] | None = None) -> Any:
        """Channels ``C_k`` of each output map."""
        return self.get("num_chs", idx)

    def reduction(self, idx: int | Sequence[int] | None = None) -> Any:
        """Stride ``r_k`` of each output map (input size / map size)."""
        return self.get("reduction", idx)

    def module_name(self, idx: int | Sequence[int] | None = None) -> Any:
        """Name of the module whose output each map is (``blocks.11``, ``layers.2``)."""
        return self.get("module", idx)

    def get_dicts(self) -> list[dict[str, Any]]:
        """The info dict of each output."""
        return [dict(self.info[i]) for i in self.out_indices]

    def __len__(self) -> int:
        return len(self.out_indices)

    def __getitem__(self, k: int) -> dict[str, Any]:
        return dict(self.info[self.out_indices[k]])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.get_dicts())

    def __repr__(self) -> str:
        return (f"FeatureInfo(out_indices={self.out_indices}, channels={self.channels()}, "
                f"reduction={self.reduction()})")


def resolve_out_indices(out_indices: int | Sequence[int], n: int) -> tuple[int, ...]:
    """``out_indices`` -> absolute indices in ``0..n-1``, order (and repeats) kept.

    An int ``k`` means the last ``k`` (``1 <= k <= n``); a sequence may hold negative indices.
    Anything out of range raises ``ValueError`` naming ``out_indices``.
    """
    if isinstance(out_indices, bool):
        raise TypeError(f"out_indices must be an int or a sequence of ints, got {out_indices!r}")
    if isinstance(out_indices, int):
        if not 1 <= out_indices <= n:
            raise ValueError(f"out_indices={out_indices} (the last {out_indices}) must be in 1..{n}: "
                             f"the model has {n} feature levels")
        return tuple(range(n - out_indices, n))
    if isinstance(out_indices, (str, bytes)) or not isinstance(out_indices, Sequence):
        raise TypeError(f"out_indices must be an int or a sequence of ints, got {out_indices!r}")
    if not out_indices:
        raise ValueError("out_indices must not be empty")
    take = []
    for i in out_indices:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"out_indices must hold ints, got {i!r} in {tuple(out_indices)}")
        if not -n <= i < n:
            raise ValueError(f"out_indices {tuple(out_indices)}: {i} is out of range for {n} feature levels "
                             f"(0..{n - 1}, or -{n}..-1 from the end)")
        take.append(i % n)
    return tuple(take)


def default_out_indices(model: Any) -> tuple[int, ...]:
    """What ``out_indices=None`` means for ``model`` (see the module docstring)."""
    info = model.feature_info
    own = getattr(model, "default_out_indices", None)
    if own is not None:
        return resolve_out_indices(own, len(info))
    isotropic = len({d["reduction"] for d in info}) == 1 and len(info) > 1
    return resolve_out_indices(min(_LAST_N_ISOTROPIC, len(info)) if isotropic else len(info), len(info))


def supported_output_formats(model: nn.Module | type) -> tuple[str, ...]:
    """The ``output_fmt`` values ``forward_intermediates`` of ``model`` (a model or its class) declares (its
    ``Literal`` hint), else all."""
    cls = model if isinstance(model, type) else type(model)
    try:
        hint = typing.get_type_hints(cls.forward_intermediates).get("output_fmt")
    except Exception:  # an unresolvable annotation: let forward_intermediates judge at the first call
        return OUTPUT_FORMATS
    if typing.get_origin(hint) is typing.Literal:
        return tuple(typing.get_args(hint))
    return OUTPUT_FORMATS


class FeaturesMixin:
    """``forward(x [B, Cin, H, W]) -> [maps]``: one map per ``out_indices`` entry (see the module docstring)."""

    feature_info: FeatureInfo
    out_indices: tuple[int, ...]
    output_fmt: str
    feature_norm: bool
    removed_head: tuple[str, ...]
    pruned_keys: frozenset[str] = frozenset()  # state-dict keys of the layers pruned away (prune=True)
    feature_prune: bool = False
    backbone_class: type[nn.Module]

    def __init__(self, cfg: Any = None, *, out_indices: int | Sequence[int] | None = None, output_fmt: str = "NCHW",
                 norm: bool = False, prune: bool = True, **overrides: Any) -> None:
        """The backbone (``cfg`` with ``overrides``, as the family takes them) as a features model.

        ``out_indices``: which blocks / stages (an int ``k`` = the last ``k``; negative indices
        allowed; ``None`` = :func:`default_out_indices`). ``output_fmt``: ``"NCHW"`` (all models),
        ``"NHWC"`` (hierarchical) or ``"NLC"`` (ViT tokens): those its ``forward_intermediates``
        declares (:func:`supported_output_formats`); another raises ``ValueError`` naming ``output_fmt``
        before anything is built. ``norm``: apply the final norm to the last stage's map (hierarchical) or
        to every map (ViT), as ``forward_intermediates(norm=True)`` does. ``prune``: remove what the maps do
        not need (the layers after the last ``out_indices`` entry, the final norm unless ``norm``, the parts
        that only fed the classifier: ``prune_intermediate_layers``); their keys are listed in
        ``pruned_keys`` and ignored when a full checkpoint loads, as the head's are.
        """
        formats = supported_output_formats(self.backbone_class)
        if output_fmt not in formats:
            raise ValueError(f"output_fmt must be one of {formats} for {self.backbone_class.__name__}, "
                             f"got {output_fmt!r}")
        super().__init__(cfg, **overrides)  # type: ignore[call-arg]
        model: Any = self
        if not hasattr(model, "feature_info"):
            raise TypeError(f"{self.backbone_class.__name__} has no feature_info: it cannot be a features model")
        info = list(model.feature_info)
        take = default_out_indices(model) if out_indices is None else resolve_out_indices(out_indices, len(info))
        removed = []
        for name in getattr(model, "head_modules", HEAD_MODULES):
            part = getattr(model, name, None)
            if isinstance(part, nn.Module) and not isinstance(part, nn.Identity):
                if any(True for _ in part.state_dict()):
                    removed.append(name)
                setattr(model, name, nn.Identity())
        self.feature_info = FeatureInfo(info, take)
        self.out_indices = take
        self.output_fmt = output_fmt
        self.feature_norm = bool(norm)
        self.removed_head = tuple(removed)
        model.register_load_state_dict_pre_hook(self._drop_head_keys)
        if getattr(model, "num_classes", None) is not None:
            model.num_classes = 0
        self.feature_prune = bool(prune and hasattr(model, "prune_intermediate_layers"))
        if self.feature_prune:
            before = set(model.state_dict())
            model.prune_intermediate_layers(sorted(set(take)), prune_norm=not norm, prune_head=True)
            self.pruned_keys = frozenset(before - set(model.state_dict()))

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """Pickle as (the backbone class, the module's state): the subclass is made again on load."""
        return _rebuild, (self.backbone_class,), self.__dict__.copy()

    def forward(self, x: Tensor) -> list[Tensor]:
        """Images ``[B, Cin, H, W]`` -> ``[B, C_k, H_k, W_k]`` per output (``NCHW``), in ``out_indices`` order."""
        take = sorted(set(self.out_indices))
        maps = self.forward_intermediates(  # type: ignore[attr-defined]
            x, take, norm=self.feature_norm, output_fmt=self.output_fmt, intermediates_only=True)
        by_index = dict(zip(take, maps))
        return [by_index[i] for i in self.out_indices]

    def _drop_head_keys(self, module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        """Load-state-dict pre-hook: a full model's head keys, and those of pruned layers, are ignored, not
        unexpected."""
        heads = tuple(f"{prefix}{name}." for name in self.removed_head)
        for key in [k for k in state_dict if k.startswith(heads)
                    or (k.startswith(prefix) and k[len(prefix):] in self.pruned_keys)]:
            del state_dict[key]


_FEATURE_CLASSES: dict[type, type] = {}


def _rebuild(backbone_class: type[nn.Module]) -> nn.Module:
    """An empty features model of ``backbone_class`` (unpickling fills its state)."""
    return object.__new__(features_class(backbone_class))


def features_class(cls: type[nn.Module]) -> type[nn.Module]:
    """``cls`` (a model class with ``forward_intermediates``) with :class:`FeaturesMixin` first in its MRO, one per
    class: ``features_class(cls)(cfg, out_indices=..., output_fmt=..., norm=..., prune=...)`` builds the features
    model (``[B, Cin, H, W] -> [maps]``). A features class, or a class without ``forward_intermediates``, raises
    ``TypeError``."""
    if issubclass(cls, FeaturesMixin):
        raise TypeError(f"{cls.__name__} is already a features model class")
    if not hasattr(cls, "forward_intermediates"):
        raise TypeError(f"{cls.__name__} has no forward_intermediates: it cannot be a features model")
    if cls not in _FEATURE_CLASSES:
        name = f"{cls.__name__}Features"
        _FEATURE_CLASSES[cls] = type(name, (FeaturesMixin, cls), {
            "__module__": __name__, "__qualname__": name, "backbone_class": cls,
            "__doc__": f"{cls.__name__} as a features model: ``[B, Cin, H, W] -> [maps]`` (models/features.py).",
        })
    return _FEATURE_CLASSES[cls]
