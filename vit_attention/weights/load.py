"""``load_weights(model, source)``: any supported checkpoint into any model of ours, with a report."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..models.features import FeaturesMixin
from .io import TRAIN_STATE_FORMAT, read_checkpoint, unwrap_state_dict
from .layouts import adapters_for, converters_for, model_family

__all__ = ["LoadReport", "CheckpointMismatchError", "load_weights", "convert_state_dict", "adapt_input_channels",
           "check_dtypes", "check_finite", "inflate_budget"]


class CheckpointMismatchError(RuntimeError):
    """The checkpoint's keys or shapes do not fit the model (strict loading)."""


@dataclass
class LoadReport:
    """What loading did: the layout detected, keys that did not fit, and adjustments made."""

    layout: str = "vit_attention"
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every key matched."""
        return not (self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        lines = [f"checkpoint layout: {self.layout}"]
        for title, items in (("missing in checkpoint", self.missing), ("unexpected in checkpoint", self.unexpected)):
            if items:
                shown = ", ".join(items[:12]) + (f", ... (+{len(items) - 12})" if len(items) > 12 else "")
                lines.append(f"{len(items)} {title}: {shown}")
        for key, ck, own in self.mismatched[:12]:
            lines.append(f"shape mismatch {key}: checkpoint {list(ck)} vs model {list(own)}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def convert_state_dict(state: Mapping[str, Tensor], model: nn.Module, *, format: str = "auto",
                       report: LoadReport | None = None) -> dict[str, Tensor]:
    """Convert a foreign-layout state dict to ``model``'s layout and fit shapes (no loading).

    ``format``: ``"auto"`` (detect), ``"vit_attention"``/``"timm"`` (our layout), or a layout name
    registered for the model's family (``"torchvision"``, ``"huggingface"``, ``"original"`` ...).
    """
    report = report if report is not None else LoadReport()
    state = dict(state)
    try:
        family = model_family(model)
    except TypeError:
        family = None
    converters = converters_for(family) if family else []
    own_layout = ("vit_attention", "ours") if any(c.layout == "timm" for c in converters) else (
        "vit_attention", "timm", "ours")  # a family whose keys differ from timm's registers a "timm" converter
    if format in own_layout:
        report.layout = format
    elif format == "auto":
        for conv in converters:
            if conv.detect(state):
                state = conv.convert(state, model)
                report.layout = conv.layout
                break
    else:
        match = [c for c in converters if c.layout == format]
        if not match:
            known = ["auto", "vit_attention", "timm"] + [c.layout for c in converters]
            raise ValueError(f"format={format!r} is not known for {type(model).__name__}; expected one of {known}")
        state = match[0].convert(state, model)
        report.layout = format
    for adapt in adapters_for(family) if family else []:
        state = adapt(state, model, report)
    return adapt_input_channels(state, model, report)


def _input_conv(model: nn.Module) -> tuple[str, nn.Conv2d] | None:
    """The convolution that reads the image: the model's first ``Conv2d`` (registration order, as every family
    registers its stem / patch embedding first) when its input channels are the model's ``in_chans``."""
    in_chans = getattr(getattr(model, "cfg", None), "in_chans", None)
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            return (name, module) if module.in_channels == in_chans and module.groups == 1 else None
    return None


def adapt_input_channels(state: dict[str, Tensor], model: nn.Module, report: LoadReport | None = None
                         ) -> dict[str, Tensor]:
    """A checkpoint's input-convolution weight ``[C, 3, kh, kw]`` fitted to a model of other ``in_chans``
    -> ``[C, in_chans, kh, kw]``; every other entry unchanged.

    One channel: the RGB kernels summed (a grey image ``g`` then gives what ``(g, g, g)`` gave). ``n`` channels:
    the RGB kernels repeated cyclically and scaled by ``3 / n`` (timm's rule; exact when ``n`` is a multiple of 3
    and the image repeats its RGB channels: six channels ``(x, x)`` give what ``x`` gave).
    Only the model's image-reading convolution is touched, and only when the checkpoint has 3 input channels
    there; anything else is left for the strict shape check to report. The change is noted in ``report``.
    """
    found = _input_conv(model)
    if found is None:
        return state
    key = f"{found[0]}.weight" if found[0] else "weight"
    weight, want = state.get(key), found[1].in_channels
    if weight is None or weight.dim() != 4 or weight.shape[1] == want or weight.shape[1] != 3:
        return state
    w = weight.float()
    if want == 1:
        w = w.sum(dim=1, keepdim=True)
    else:
        w = w.repeat(1, math.ceil(want / 3), 1, 1)[:, :want] * (3.0 / want)
    state = dict(state)
    state[key] = w.to(weight.dtype)
    if report is not None:
        how = "the RGB kernels summed" if want == 1 else f"the RGB kernels repeated, scaled by 3/{want}"
        report.notes.append(f"input convolution {key} adapted from 3 to {want} channels ({how})")
    return state


# Room for what a checkpoint may hold beside the model's tensors (EMA copy, optimizer moments, float64 copies).
_INFLATE_FACTOR = 8
_INFLATE_SLACK = 64 * 2**20


def inflate_budget(model: nn.Module) -> int:
    """The most bytes a checkpoint for ``model`` may inflate to: ``8 x`` its state's bytes + 64 MiB.

    A zip-format ``.pth`` whose compressed entries declare more is refused before anything is
    inflated (:func:`~vit_attention.weights.io.read_checkpoint`'s ``max_bytes``).
    """
    own = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return _INFLATE_FACTOR * own + _INFLATE_SLACK


def _kind(t: Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    return "floating" if t.is_floating_point() else "complex" if t.is_complex() else "integer"


def check_dtypes(state: Mapping[str, Tensor], own: Mapping[str, Tensor], where: str = "checkpoint") -> None:
    """Refuse tensors whose kind of dtype cannot be the model's (``ValueError`` naming them).

    A float parameter takes any float dtype (cast on load); an integer or bool tensor would be cast
    silently into floats (a bool file gives all-1.0 weights), so kinds (floating, integer, bool,
    complex) must agree.
    """
    wrong = [(k, v.dtype, own[k].dtype) for k, v in state.items() if k in own and _kind(v) != _kind(own[k])]
    if wrong:
        shown = ", ".join(f"{k} ({str(a).removeprefix('torch.')}, model {str(b).removeprefix('torch.')})"
                          for k, a, b in wrong[:8])
        more = f", ... (+{len(wrong) - 8})" if len(wrong) > 8 else ""
        raise ValueError(f"{where}: {len(wrong)} tensor(s) of a dtype the model's cannot be: {shown}{more}; "
                         "the file is damaged or not weights of this model")


def check_finite(state: Mapping[str, Tensor], where: str = "checkpoint") -> None:
    """Refuse floating tensors holding NaN or infinity (``ValueError`` naming them): such weights give NaN
    outputs, and a diverged run's file is better refused at load than found out from its predictions."""
    bad = [k for k, v in state.items() if (v.is_floating_point() or v.is_complex()) and v.numel()
           and not bool(torch.isfinite(v).all())]
    if bad:
        shown = ", ".join(bad[:8]) + (f", ... (+{len(bad) - 8})" if len(bad) > 8 else "")
        raise ValueError(f"{where}: {len(bad)} tensor(s) hold NaN or infinite values: {shown}; the weights are "
                         "damaged (or saved from a diverged run)")


def load_weights(model: nn.Module, source: str | Path | Mapping[str, Any], *, format: str = "auto",
                 strict: bool = True) -> LoadReport:
    """Load a checkpoint into ``model`` in place and return a :class:`LoadReport`.

    ``source``: a ``.safetensors`` / ``.pth`` / ``.bin`` file, a Hugging Face model folder, or a
    state dict, in our own, timm, torchvision, Hugging Face (or the family's original-repo)
    layout; the layout is detected unless ``format`` names it. Position embeddings are resampled
    to the model's grid; a classifier for a different number of classes is dropped with a
    warning; the head of a ``features_only`` model (``model.removed_head``) and the layers it pruned
    (``model.pruned_keys``) are ignored. ``strict``
    raises :class:`CheckpointMismatchError` listing missing / unexpected / mismatched keys; otherwise
    those are skipped and reported. Pickles are loaded with ``weights_only=True``, so a checkpoint
    holding arbitrary objects is refused. Whatever ``strict``, tensors of a dtype kind the model's cannot
    be (integer or bool into float) and tensors holding NaN / infinity raise ``ValueError`` naming them,
    and a compressed ``.pth`` declaring more than :func:`inflate_budget` is refused before inflating.
    """
    meta: dict[str, str] = {}
    if isinstance(source, (str, Path)):
        raw, meta = read_checkpoint(source, max_bytes=inflate_budget(model))
    elif isinstance(source, Mapping):
        raw = dict(source)
    else:
        raise TypeError(f"source must be a path or a state dict, got {type(source).__name__}")
    report = LoadReport()
    state = convert_state_dict(unwrap_state_dict(raw), model, format=format, report=report)
    removed = tuple(f"{name}." for name in getattr(model, "removed_head", ()))  # a features_only model's head
    pruned = getattr(model, "pruned_keys", frozenset())  # and the layers it pruned away
    if removed or pruned:
        state = {k: v for k, v in state.items() if not k.startswith(removed) and k not in pruned}
    own = model.state_dict()
    for key, value in state.items():
        if key not in own:
            report.unexpected.append(key)
        elif tuple(value.shape) != tuple(own[key].shape):
            report.mismatched.append((key, tuple(value.shape), tuple(own[key].shape)))
    dropped_prefixes = tuple(d + "." for d in report.dropped)
    report.missing = [k for k in own if k not in state and not k.startswith(dropped_prefixes)]
    if strict and not report.ok:
        hint = ""
        if "features" in meta and not isinstance(model, FeaturesMixin):
            hint = (f"\nhint: {source} holds a features model (saved with features_only=True: no classifier): "
                    "create_model(NAME, features_only=True, pretrained=path) or vit_attention.load_model(path) "
                    "rebuilds it")
        elif meta.get("format") == TRAIN_STATE_FORMAT or ("model" in meta and "config" in meta):
            hint = (f"\nhint: {source} records the model it holds and its config (classes, channels, size ...): "
                    "vit_attention.load_model(path) rebuilds it as it was saved")
        raise CheckpointMismatchError(f"checkpoint does not fit {type(model).__name__}:\n{report}{hint}")
    bad = set(report.unexpected) | {k for k, _, _ in report.mismatched}
    loadable = {k: v for k, v in state.items() if k not in bad}
    where = str(source) if isinstance(source, (str, Path)) else "checkpoint"
    check_dtypes(loadable, own, where)
    check_finite(loadable, where)
    with torch.no_grad():
        model.load_state_dict(loadable, strict=False)
    return report
