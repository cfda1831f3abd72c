"""Training options: :class:`TrainConfig` (every choice of a run; validated, JSON-serialisable, stored
in checkpoints) and :func:`check_model_kwargs`, which checks ``--model-arg`` values against the
annotations of the model's config class and names the expected type."""

from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import asdict, dataclass, field
from typing import Any

from ..factory import config_kwargs
from ..functional.runtime import check_backend
from ..models.digits import DEFAULT_MODEL
from ..models.registry import get_model_entry
from ..weights.hub import split_model_tag

__all__ = ["TrainConfig", "check_model_kwargs"]


@dataclass
class TrainConfig:
    """Every choice of a training run (JSON-serialisable; stored in checkpoints)."""

    model: str = DEFAULT_MODEL
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # config overrides, e.g. {"attn_layer": "window"}
    # start from these weights (create_model's pretrained=): True = the preset's published default, or a file,
    # model folder or "hf-hub:ORG/REPO"; the head is re-made for the data's classes, the input conv fitted to
    # in_chans, position tables resampled to img_size; image folders then use the weights' mean / std
    pretrained: bool | str = False
    data: str | None = None  # None / "digits": the embedded set; else an image folder
    img_size: int | None = None  # None: 8 for digits, the model's for folders
    in_chans: int = 3  # image folders: 1 (grayscale) or 3 (RGB)
    naflex: bool = False  # NaFlex models: aspect-kept images packed to max_seq_len patches (data/naflex.py)
    max_seq_len: int = 576  # with naflex: the patch budget per image and the packed length
    val_fraction: float = 0.1
    crop_pct: float = 0.875
    output: str | None = None  # run folder; None: runs/<model>-<time>
    epochs: int = 60
    batch_size: int = 64  # global batch per optimizer step
    lr: float = 2e-3
    min_lr: float = 1e-5
    warmup_epochs: float = 3.0
    weight_decay: float = 0.05
    layer_decay: float | None = None  # layer-wise lr decay: block i of L trains at lr · layer_decay ** (L + 1 - i)
    clip_grad: float | None = 1.0
    accum_steps: int = 1
    label_smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    randaugment: tuple[int, int] | None = None  # (num ops, magnitude), e.g. (2, 9)
    hflip: float | None = None  # None: 0.5 for image folders, 0 for digits
    crop_scale: tuple[float, float] | None = None  # random resized crop; None: (0.35, 1) folders, off for digits
    affine: float | None = None  # probability of a small random affine; None: 0.5 for digits, off for folders
    drop_rate: float | None = None  # model overrides when set
    drop_path_rate: float | None = None
    attn_drop_rate: float | None = None
    grad_checkpointing: bool = False
    amp: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU), bf16, none
    ema_decay: float | None = None
    seed: int = 0
    device: str | None = None
    threads: int | None = None  # CPU intra-op threads; None: 1 for models under 2M parameters, else torch's
    fsdp: bool = False
    workers: int = 0
    ckpt_every: int = 0  # also checkpoint every N optimizer steps (0: at epoch ends only)
    resume: bool = False
    stop_after: int | None = None  # save a checkpoint and stop at this global step (continue with resume)
    teacher: str | None = None  # a registered model name or a .safetensors checkpoint
    teacher_checkpoint: str | None = None
    distill_type: str = "hard"
    distill_alpha: float = 0.5
    distill_tau: float = 1.0
    progress: bool | None = None  # progress bars; None: only when stderr is a terminal (else one line per epoch)
    plot: bool = True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the fields."""
        return json.loads(json.dumps(asdict(self)))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad option."""
        self._validate_numbers()
        checks = [
            (self.epochs > 0, f"epochs must be positive, got {self.epochs}"),
            (self.img_size is None or self.img_size > 0, f"img_size must be positive, got {self.img_size}"),
            (self.batch_size > 0, f"batch_size must be positive, got {self.batch_size}"),
            (self.accum_steps > 0, f"accum_steps must be positive, got {self.accum_steps}"),
            (self.lr > 0, f"lr must be positive, got {self.lr}"),
            (self.layer_decay is None or 0 < self.layer_decay <= 1,
             f"layer_decay must be in (0, 1] (e.g. 0.75), got {self.layer_decay}"),
            (self.warmup_epochs >= 0, f"warmup_epochs must be >= 0, got {self.warmup_epochs}"),
            (0 <= self.label_smoothing < 1, f"label_smoothing must be in [0, 1), got {self.label_smoothing}"),
            (self.mixup >= 0 and self.cutmix >= 0, "mixup and cutmix must be >= 0 (0 = off)"),
            (self.amp in ("auto", "bf16", "none"), f"amp must be 'auto', 'bf16' or 'none', got {self.amp!r}"),
            (self.ema_decay is None or 0 < self.ema_decay < 1, f"ema_decay must be in (0, 1), got {self.ema_decay}"),
            (self.distill_type in ("soft", "hard"), f"distill_type must be soft or hard, got {self.distill_type!r}"),
            (self.ckpt_every >= 0, f"ckpt_every must be >= 0, got {self.ckpt_every}"),
            (not (self.fsdp and self.ema_decay), "ema_decay is not supported together with fsdp"),
            (not (self.resume and not self.output),
             "resume needs output (--output): the folder of the run to continue"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        self._validate_naflex()

    def _validate_numbers(self) -> None:
        """Every float option finite (``--lr inf`` / ``nan`` are refused), and >= 0 where a negative means nothing."""
        floats = {"lr": self.lr, "min_lr": self.min_lr, "warmup_epochs": self.warmup_epochs,
                  "weight_decay": self.weight_decay, "layer_decay": self.layer_decay, "clip_grad": self.clip_grad,
                  "label_smoothing": self.label_smoothing, "mixup": self.mixup, "cutmix": self.cutmix,
                  "hflip": self.hflip, "affine": self.affine, "drop_rate": self.drop_rate,
                  "drop_path_rate": self.drop_path_rate, "attn_drop_rate": self.attn_drop_rate,
                  "ema_decay": self.ema_decay, "val_fraction": self.val_fraction, "crop_pct": self.crop_pct,
                  "distill_alpha": self.distill_alpha, "distill_tau": self.distill_tau}
        for name, value in floats.items():
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            option = "--" + name.replace("_", "-")
            if not math.isfinite(value):
                raise ValueError(f"{option} must be a finite number, got {value}")
            if value < 0 and name in ("min_lr", "weight_decay", "clip_grad", "hflip", "affine", "drop_rate",
                                      "drop_path_rate", "attn_drop_rate", "distill_alpha"):
                raise ValueError(f"{option} must be >= 0, got {value}")
        if self.distill_tau <= 0:
            raise ValueError(f"--distill-tau must be positive (a softmax temperature), got {self.distill_tau}")

    def _validate_naflex(self) -> None:
        """``--naflex`` needs a NaFlex model and an image folder, and excludes the tensor-batch augmentations."""
        if not self.naflex:
            if self.max_seq_len != 576:
                raise ValueError(f"--max-seq-len {self.max_seq_len} applies with --naflex only")
            return
        family = model_entry(self.model).family
        if family != "naflexvit":
            raise ValueError(f"--naflex needs a NaFlex model (family naflexvit, e.g. naflexvit_base_patch16_gap); "
                             f"{self.model} is a {family} model, which takes fixed-size image tensors")
        if self.max_seq_len < 1:
            raise ValueError(f"--max-seq-len must be >= 1, got {self.max_seq_len}")
        if self.data in (None, "digits"):
            raise ValueError("--naflex trains on an image folder of any sizes and aspects: pass --data ROOT")
        off = [name for name, value in (("--mixup", self.mixup), ("--cutmix", self.cutmix),
                                        ("--randaugment", self.randaugment), ("crop_scale", self.crop_scale),
                                        ("--affine", self.affine), ("--hflip", self.hflip),
                                        ("--teacher", self.teacher))
               if value]
        if off:
            raise ValueError(f"--naflex batches packed patches, not image tensors: {', '.join(off)} do not apply")


def _type_name(tp: Any) -> str:
    """A short readable name of a config annotation: ``int``, ``float``, ``list of int``, ``one of 'a', 'b'``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (tuple, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_type_name(args[0])}"
        return f"a list of {len(args)} ({', '.join(_type_name(a) for a in args)})" if args else "a list"
    if origin is dict or tp is dict:
        return "a JSON object"
    if tp is float:
        return "a number (float)"
    if tp is bool:
        return "true or false (bool)"
    if tp is int:
        return "an integer (int)"
    if tp is str:
        return "a string (str)"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    """Whether the JSON ``value`` fits the annotation ``tp`` (unknown annotations accept anything)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True
    if tp is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return not args or (len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args)))
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return not isinstance(tp, type) or isinstance(value, tp)


def model_entry(model: str) -> Any:
    """The registry entry of ``--model``: a registered name or alias, optionally ``NAME.TAG`` (the tag picks the
    published weights ``--pretrained`` loads, as in ``eval`` / ``predict``); unknown names raise ``KeyError``."""
    return get_model_entry(split_model_tag(model)[0])


# Config options training derives from the data, so a --model-arg for them is refused with what to give instead.
_FROM_THE_DATA = {"img_size": "give --img-size (the size the images are read at)",
                  "num_classes": "the classes of --data decide it (a classifier for another count is re-made)"}


def check_model_kwargs(model: str, kwargs: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the option and its expected type when a ``--model-arg`` value has the wrong type.

    Unknown model names raise ``KeyError`` (with suggestions), unknown options ``TypeError`` (with the
    valid ones), both from the registry.
    """
    if "attn_backend" in kwargs:
        check_backend(kwargs["attn_backend"], "--model-arg attn_backend")
    for key, instead in _FROM_THE_DATA.items():
        if key in kwargs:
            raise ValueError(f"--model-arg {key}: training sets it from the data; {instead}")
    kwargs = config_kwargs(kwargs)
    entry = model_entry(model)
    try:
        hints = typing.get_type_hints(entry.config_cls)
    except Exception:  # noqa: BLE001 - an annotation we cannot resolve: the config checks its own values
        hints = {}
    for key, value in kwargs.items():
        if key in hints and not _matches(value, hints[key]):
            example = json.dumps(getattr(entry.config(), key, None), default=list)
            raise ValueError(f"--model-arg {key}={json.dumps(value)}: {key} expects {_type_name(hints[key])} "
                             f"(the preset has {key}={example})")
    entry.config(**kwargs)  # unknown option names (and values the config refuses) raise, naming the option
