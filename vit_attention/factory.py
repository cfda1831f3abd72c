"""``create_model(name, pretrained=...)``: the registry's build plus the weights' download and conversion.

This module sits above both halves it joins, as timm's ``_factory.py`` sits above ``_registry.py``
and ``_hub.py``: :mod:`vit_attention.models` (families and the registry: which class and config a
name builds) knows nothing of checkpoints, :mod:`vit_attention.weights` (reading, converting and
fetching them) may ask the registry, and only this module imports both to build a model and load
what ``pretrained`` names. Nothing below it imports it.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .attention import set_attention_backend
from .functional.runtime import check_backend
from .models.registry import get_model_entry
from .weights import CheckpointMismatchError, describe_checkpoint, load_model, load_weights, transfer_weights
from .weights.hub import HF_HUB_PREFIX, resolve_pretrained, split_model_tag
from .weights.io import read_checkpoint
from .weights.saved import SavedModel, check_model_name, check_options_agree, resolve_model_file

__all__ = ["create_model", "load_or_create_model"]


# create_model keywords that choose how a model runs, not what it is: accepted by --model-arg, never in a config
RUNTIME_MODEL_ARGS = frozenset({"attn_backend"})


def config_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` (``--model-arg`` values) without the run-time keywords of :data:`RUNTIME_MODEL_ARGS`: the
    config overrides."""
    return {k: v for k, v in kwargs.items() if k not in RUNTIME_MODEL_ARGS}


def add_model_arg_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str | None = None) -> None:
    """``--model-arg KEY=VALUE`` (repeatable) on a command that builds models by name: ``args.model_arg`` is
    then a list of ``(key, value)`` pairs (:func:`model_arg`) or None; ``dict(args.model_arg or ())`` goes to
    :func:`create_model`. ``parser``: the command's parser or one of its argument groups; ``help``: the
    command's own words for the option (None: a config override of the one model built)."""
    parser.add_argument("--model-arg", type=model_arg, action="append", metavar="KEY=VALUE",
                        help=help or "model config override, repeatable, JSON values: --model-arg depth=6, "
                                     "--model-arg attn_layer=neighborhood (default: the preset's)")


def merged_model_args(model_args: Sequence[tuple[str, Any]] | Mapping[str, Any] | None,
                      **options: Any) -> dict[str, Any]:
    """``--model-arg`` pairs plus a command's own options (``img_size=args.img_size`` ...) as one ``create_model``
    keyword dict: an option given (not None) wins over the same key in ``model_args``."""
    kwargs = dict(model_args or ())
    kwargs.update({k: v for k, v in options.items() if v is not None})
    return kwargs


def model_arg(text: str) -> tuple[str, Any]:
    """One ``--model-arg`` value, ``key=value`` with a JSON value (bare words stay strings) -> ``(key, value)``:
    ``depth=2``, ``window_size=[7,7]``, ``attn_layer=window``. An argparse ``type=`` (train, eval, bench ...)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")  # argparse names the option
    k, v = text.split("=", 1)
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def apply_tome_option(model: nn.Module, r: int) -> None:
    """``model.set_token_merging(r)`` for the command line's ``--tome R``: a bad value, or a model that cannot
    merge, raises a ``ValueError`` naming the option."""
    if not isinstance(r, int) or isinstance(r, bool) or r < 0:
        raise ValueError(f"--tome must be an int >= 0 (tokens merged per block; 0 = off), got {r!r}")
    try:
        model.set_token_merging(r)  # type: ignore[operator]
    except (ValueError, AttributeError) as e:
        raise ValueError(f"--tome {r}: {e}") from None


def positive_int(text: str) -> int:
    """A size option's value (``--img-size 224``) -> the int, refusing 0 and negatives at parse time: an argparse
    ``type=`` shared by every command's size options, so argparse's error names the option."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer (>= 1), got {value}")
    return value


def _load_swapped(model: nn.Module, entry: Any, source: Any, overrides: Mapping[str, Any], *,
                  features: Mapping[str, Any] | None, checkpoint_format: str, strict: bool) -> bool:
    """When ``overrides`` swap an attention mechanism of the weights' model (a config field ``*attn_layer``:
    ViT's ``attn_layer``, DaViT's ``spatial_attn_layer`` ...): build that model (the donor: the overrides
    without the swapped fields and their ``*attn_kwargs``, which are the new mechanism's), load the weights
    into it (``strict`` applies there; a file of ours gives the donor the mechanisms and options it records),
    carry them into ``model`` (:func:`~vit_attention.weights.transfer_weights`)
    and warn with its report -> True; else False (the weights load directly)."""
    layers = {k for k in overrides if k.endswith("attn_layer")}
    if not layers:
        return False
    kwargs = {k[: -len("layer")] + "kwargs" for k in layers}
    recorded: dict[str, Any] = {}  # a file of ours says which mechanisms and options its weights were trained with
    try:  # a transformers folder, a timm or torchvision file: no record of ours (the preset's mechanisms, then)
        saved = describe_checkpoint(source.weights) if isinstance(source.weights, (str, Path)) else None
    except (OSError, ValueError):
        saved = None
    if saved is not None and get_model_entry(saved.model_name).name == entry.name:
        recorded = {k: v for k, v in saved.config.items() if k in layers | kwargs}
    donor_cfg = entry.config(**{**source.config_overrides,
                                **{k: v for k, v in overrides.items() if k not in layers | kwargs}, **recorded})
    changed = {k: getattr(donor_cfg, k) for k in sorted(layers) if getattr(donor_cfg, k) != getattr(model.cfg, k)}
    if not changed:
        return False
    donor = entry.build(donor_cfg, features=features)
    load_weights(donor, source.weights, format=checkpoint_format, strict=strict)
    report = transfer_weights(donor, model)
    was = ", ".join(f"{k}={v!r}" for k, v in changed.items())
    now = ", ".join(f"{k}={getattr(model.cfg, k)!r}" for k in changed)
    missing = f"; {len(report.missing)} other entries keep their initialisation" if report.missing else ""
    warnings.warn(f"{entry.name}: weights trained with {was} transferred to {now}: "
                  f"{'; '.join(report.notes) or 'nothing to carry'}{missing}", stacklevel=3)
    return True


def create_model(name: str, *, pretrained: bool | str | Path | Mapping[str, Any] | None = None,
                 num_classes: int | None = None, img_size: int | tuple[int, int] | None = None,
                 checkpoint_format: str = "auto", strict: bool = True, features_only: bool = False,
                 out_indices: int | Sequence[int] | None = None, output_fmt: str | None = None,
                 feature_prune: bool | None = None, attn_backend: str | None = None,
                 **overrides: Any) -> nn.Module:
    """Build registered model ``name`` (or alias, optionally ``NAME.TAG``) with config ``overrides``.

    ``num_classes`` defaults to the preset's (its default tag's head, as in timm: 0 for towers published
    without a classifier such as ``davit_base_fl``; else 1000), or the tag's / the weights' when those
    are given; ``img_size`` overrides the preset's input size. ``pretrained``: ``True`` fetches the
    preset's default weights (or ``NAME.TAG``'s) from the Hugging Face hub into the HF cache;
    ``"hf-hub:ORG/REPO"`` any repository (timm layout or a transformers model folder, whose
    ``config.json`` configures the model: eps, activation, image size, labels ...); a checkpoint
    path or a state dict (layout detected, see :func:`vit_attention.weights.load_weights`).
    A ``num_classes`` other than the weights' drops their head with a warning. Options given here
    win over what the weights say. Options that swap attention mechanisms (``attn_layer``, DaViT's
    ``spatial_attn_layer`` ...; ``attn_kwargs`` then configure the new one) with ``pretrained``: the weights
    load into the model they were trained for, then go into this one
    (:func:`~vit_attention.weights.transfer_weights`: everything but the attention by name, each swapped
    mechanism's q / k / v / output projections carried over, what has no counterpart set to add nothing,
    such as a zero position table) with a warning saying what was carried.
    The model's ``pretrained_cfg`` (a dict: data config, hub id,
    license, tag) is what :func:`vit_attention.data.resolve_data_config` reads. Build on the meta
    device with ``with torch.device("meta"): create_model(...)``.
    ``features_only``: return the backbone as a features model (see :mod:`vit_attention.models.features`;
    ``pretrained`` may be a full model's weights, whose head is ignored, or a features model's file
    saved with :func:`~vit_attention.save_weights`, whose ``out_indices`` / ``output_fmt`` / ``norm``
    apply unless given here): ``forward`` gives one map ``[B, C_k, H_k, W_k]`` per
    ``out_indices`` entry (an int ``k`` = the last ``k``, negative indices allowed; default: every
    stage, or the last 3 blocks of ViT), ``model.feature_info.channels()`` / ``.reduction()`` in
    that order; ``output_fmt`` ``"NCHW"`` (default), ``"NHWC"`` (hierarchical) or ``"NLC"`` (ViT).
    ``feature_prune`` (default True, or what a features model's file records): remove the layers after
    the last ``out_indices`` entry and what only fed the classifier, as timm's features models do (no
    parameter without a gradient under DDP); False keeps them (they do not run either way).
    ``attn_backend``: ``"auto"`` (default), ``"sdpa"``, ``"explicit"`` or ``"flex"``, the attention
    backend of every mechanism in the model (:func:`vit_attention.attention.set_attention_backend`;
    a run-time choice, not part of the config: the weights are the same on every backend).
    Returns the model (images ``[B, Cin, H, W]`` -> logits ``[B, num_classes]``).
    """
    if not features_only and (out_indices is not None or output_fmt is not None or feature_prune is not None):
        raise ValueError("out_indices, output_fmt and feature_prune are options of features_only=True")
    if attn_backend is not None:
        check_backend(attn_backend, "attn_backend")
    base, tag = split_model_tag(name) if isinstance(name, str) else (name, None)
    entry = get_model_entry(base)
    if num_classes is not None:
        if not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f"num_classes must be a non-negative int, got {num_classes!r}")
        overrides["num_classes"] = num_classes
    if img_size is not None:
        overrides["img_size"] = img_size
    source = resolve_pretrained(entry.name, tag, pretrained)
    features = None
    if features_only:  # built without the head, so a features model's file (no head) loads strictly
        saved = source.features or {}  # what a features model's file of ours records, unless given here
        features = {"out_indices": saved.get("out_indices") if out_indices is None else out_indices,
                    "output_fmt": output_fmt or saved.get("output_fmt", "NCHW"), "norm": saved.get("norm", False),
                    "prune": saved.get("prune", True) if feature_prune is None else bool(feature_prune)}
    model = entry.build(entry.config(**{**source.config_overrides, **overrides}), features=features)
    model.pretrained_cfg = source.pretrained_cfg  # type: ignore[assignment]
    if source.weights is not None and not _load_swapped(model, entry, source, overrides, features=features,
                                                        checkpoint_format=checkpoint_format, strict=strict):
        load_weights(model, source.weights, format=checkpoint_format, strict=strict)
    return model if attn_backend is None else set_attention_backend(model, attn_backend)


# how load_or_create_model's messages name its arguments: Python's spelling (override with the command line's)
_PYTHON_SPELLING = {"model": "model", "checkpoint": "checkpoint", "pretrained": "pretrained=True",
                    "num_classes": "num_classes"}


def load_or_create_model(name: str | None, checkpoint: str | Path | None = None, *, pretrained: bool = False,
                         options: Mapping[str, Any] | None = None, img_size: int | None = None,
                         device: str | torch.device | None = None, spelling: Mapping[str, str] | None = None,
                         ) -> tuple[nn.Module, SavedModel | None]:
    """Registered model ``name`` or the model ``checkpoint`` holds, with its weights: how the commands that take
    a model and weights (``attn``, ``eval``, ``predict``, ``generate`` ...) build it. Returns ``(model, the file's
    record or None)``; the model maps images ``[B, Cin, H, W]`` to logits ``[B, num_classes]``.

    A file of ours (:func:`~vit_attention.save_weights`, a training ``checkpoint.safetensors``, a run folder)
    names its model and config: :func:`~vit_attention.load_model` rebuilds it as it was trained; ``name`` may
    repeat the model (aliases allowed) and ``options`` (``--model-arg`` config values, ``num_classes``) what it
    records, never contradict them (``ValueError`` naming the option); ``img_size`` another input size (position
    tables resampled). Other weights (timm, torchvision, a Hugging Face folder, ``hf-hub:ORG/REPO``, or the
    preset's published ones with ``pretrained=True``) load into ``create_model(name, **options)``, so they need
    ``name``; none gives ``name`` with its initial weights. ``options`` may hold ``attn_backend`` (how it runs,
    never recorded). ``device``: where the model is built. ``spelling``: how messages name ``model``,
    ``checkpoint``, ``pretrained`` and ``num_classes`` (the command line's ``--model`` ...; default Python's).
    """
    say = {**_PYTHON_SPELLING, **(spelling or {})}
    kw = dict(options or {})
    if pretrained and checkpoint is not None:
        raise ValueError(f"{say['pretrained']} and {say['checkpoint']} {checkpoint} both give weights; give one of "
                         "them")
    hub = isinstance(checkpoint, str) and checkpoint.startswith(HF_HUB_PREFIX)
    saved = describe_checkpoint(checkpoint) if checkpoint is not None and not hub else None
    if saved is None:
        if name is None:
            if pretrained or hub:
                what = say["pretrained"] if pretrained else f"{say['checkpoint']} {checkpoint}"
                raise ValueError(f"{what} needs {say['model']} NAME[.TAG]: the registered model to build")
            if checkpoint is None:
                raise ValueError(f"give {say['model']} (a registered name) or {say['checkpoint']} (a run folder or "
                                 "weights file)")
            read_checkpoint(resolve_model_file(checkpoint))  # a damaged or non-checkpoint file says so first
            raise ValueError(f"{say['checkpoint']} {checkpoint} does not record which model it holds (it was not "
                             f"written by vit-attention); give {say['model']} NAME (and {say['num_classes']} N) to "
                             "build the model first")
        weights = True if pretrained else checkpoint
        try:
            with torch.device(device) if device is not None else nullcontext():
                sized = kw if img_size is None else {**kw, "img_size": img_size}  # --img-size over --model-arg
                model = create_model(name, pretrained=weights, **sized)
        except CheckpointMismatchError as e:
            what = "the weights" if pretrained or hub else f"{say['checkpoint']} {checkpoint}"
            raise ValueError(f"{what} do{'' if pretrained or hub else 'es'} not fit {say['model']} {name}: {e}"
                             ) from None
        return model, None
    check_model_name(saved, name, option=say["model"])
    backend = kw.pop("attn_backend", None)  # how it runs, not what it is: never in the saved config
    check_options_agree(saved, kw, {"num_classes": say["num_classes"]})
    recorded = saved.config.get("img_size")
    resize = {"img_size": img_size} if img_size is not None and img_size != recorded and [img_size] * 2 != recorded \
        else {}  # position embeddings resampled to the new grid
    model = load_model(saved.path, device=device, **resize)
    if backend is not None:
        set_attention_backend(model, check_backend(backend, "--model-arg attn_backend"))
    return model, saved
