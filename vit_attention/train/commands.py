"""Sub-commands ``train``, ``eval``, ``predict`` and ``compare`` (thin: parse, call the engine, print)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from ..data.image import printable_name
from ..data.naflex import inference_meta as _inference_meta  # attn (analysis) reads runs the same way
from ..data.naflex import naflex_budget as _naflex_budget
from ..factory import add_model_arg_option, positive_int
from ..models.digits import DEFAULT_MODEL

__all__ = ["add_commands"]


def _json_or_str(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _pair(kind: type) -> Any:
    def parse(text: str) -> tuple[Any, Any]:
        parts = text.replace(":", ",").split(",")
        if len(parts) != 2:
            raise argparse.ArgumentTypeError(f"expected two comma-separated numbers, got {text!r}")
        return kind(parts[0]), kind(parts[1])
    return parse


# Where each TrainConfig field comes from on the command line (field -> option dest).
_FIELD_DEST = {
    "model": "model", "model_kwargs": "model_arg", "data": "data", "img_size": "img_size", "in_chans": "in_chans",
    "naflex": "naflex", "max_seq_len": "max_seq_len", "pretrained": "pretrained",
    "val_fraction": "val_fraction", "epochs": "epochs", "batch_size": "batch_size", "lr": "lr", "min_lr": "min_lr",
    "warmup_epochs": "warmup_epochs", "weight_decay": "weight_decay", "layer_decay": "layer_decay",
    "clip_grad": "clip_grad",
    "accum_steps": "accum_steps", "label_smoothing": "label_smoothing", "mixup": "mixup", "cutmix": "cutmix",
    "randaugment": "randaugment", "hflip": "hflip", "affine": "affine", "drop_rate": "drop",
    "drop_path_rate": "drop_path", "attn_drop_rate": "attn_drop", "grad_checkpointing": "grad_checkpointing",
    "amp": "amp", "ema_decay": "ema", "seed": "seed", "device": "device", "threads": "threads", "fsdp": "fsdp",
    "workers": "workers", "ckpt_every": "ckpt_every", "teacher": "teacher", "teacher_checkpoint": "teacher_checkpoint",
    "distill_type": "distill_type", "distill_alpha": "distill_alpha", "distill_tau": "distill_tau", "plot": "no_plot",
}
# Options of one invocation, never taken from the run being resumed.
_PER_INVOCATION = {"output", "resume", "stop_after", "progress"}


def _given(args: argparse.Namespace) -> set[str]:
    """The option dests given on the command line (recorded by the tracking actions)."""
    return set(getattr(args, "_given", ()))


def _tracking(base: type[argparse.Action]) -> type[argparse.Action]:
    """``base`` that also records its dest in ``namespace._given`` when the option is given."""

    class Tracked(base):  # type: ignore[valid-type, misc]
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                     option_string: str | None = None) -> None:
            super().__call__(parser, namespace, values, option_string)
            namespace._given = _given(namespace) | {self.dest}

    return Tracked


def _track_given(p: argparse.ArgumentParser) -> None:
    """Make ``p``'s store / store_true / append options record that they were given (for ``--resume``)."""
    for name, base in (("store", argparse._StoreAction), (None, argparse._StoreAction),
                       ("store_true", argparse._StoreTrueAction), ("append", argparse._AppendAction)):
        p.register("action", name, _tracking(base))


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to every option's help unless the help already says its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text:
            return text
        return super()._get_help_string(action) or ""


def _config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = dict(args.model_arg or [])
    for key in ("attn_layer",):
        if getattr(args, key, None):
            kwargs[key] = getattr(args, key)
    return dict(
        model=args.model, model_kwargs=kwargs, pretrained=args.pretrained, data=args.data, img_size=args.img_size,
        in_chans=args.in_chans,
        naflex=args.naflex, max_seq_len=args.max_seq_len,
        val_fraction=args.val_fraction, output=args.output, epochs=args.epochs, batch_size=args.batch_size,
        lr=args.lr, min_lr=args.min_lr, warmup_epochs=args.warmup_epochs, weight_decay=args.weight_decay,
        layer_decay=args.layer_decay,
        clip_grad=args.clip_grad or None, accum_steps=args.accum_steps, label_smoothing=args.label_smoothing,
        mixup=args.mixup, cutmix=args.cutmix, randaugment=args.randaugment, hflip=args.hflip, affine=args.affine,
        drop_rate=args.drop, drop_path_rate=args.drop_path, attn_drop_rate=args.attn_drop,
        grad_checkpointing=args.grad_checkpointing, amp=args.amp, ema_decay=args.ema, seed=args.seed,
        device=args.device, threads=args.threads, fsdp=args.fsdp, workers=args.workers, ckpt_every=args.ckpt_every,
        resume=args.resume, stop_after=args.stop_after,
        teacher=args.teacher, teacher_checkpoint=args.teacher_checkpoint, distill_type=args.distill_type,
        distill_alpha=args.distill_alpha, distill_tau=args.distill_tau, progress=args.progress,
        plot=not args.no_plot)


def _merge_saved(now: dict[str, Any], saved: dict[str, Any], given: set[str],
                 skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The saved options of a run, overridden by those given on this command line (and per-invocation ones)."""
    merged = dict(now)
    for name, value in saved.items():
        if name not in now or name in _PER_INVOCATION or name in skip:
            continue
        dest = _FIELD_DEST.get(name)
        if dest is not None and dest in given:
            if name == "model_kwargs":  # --model-arg given again: update the saved overrides key by key
                merged[name] = {**value, **now[name]}
            continue
        merged[name] = value
    for name in ("randaugment", "crop_scale"):  # JSON lists back to pairs
        if isinstance(merged.get(name), list):
            merged[name] = tuple(merged[name])
    return merged


def _train_config(args: argparse.Namespace) -> Any:
    """The ``TrainConfig`` of ``train`` / ``compare``; with ``--resume``, the run's saved options are the base."""
    from .checkpoint import read_saved_config
    from .config import TrainConfig

    now = _config_from_args(args)
    if args.resume and args.output and args.func is _train:
        now = _merge_saved(now, read_saved_config(args.output), _given(args))
    return TrainConfig(**now)


def _report_failure(command: str, e: BaseException) -> int:
    """Print a stopped run's one-line message and return its exit code (1 diverged, 130 / 143 interrupted)."""
    import sys

    from .errors import TrainingInterrupted

    print(f"vit-attention {command}: {'stopped' if isinstance(e, TrainingInterrupted) else 'error'}: {e}",
          file=sys.stderr, flush=True)
    return e.exit_code if isinstance(e, TrainingInterrupted) else 1


def _check_pretrained_model(cfg: Any) -> None:
    """``--pretrained RUN`` of ours records its model: one that contradicts ``--model`` is refused in one line
    (``ValueError`` naming both options) before anything is built, as ``eval`` and ``attn`` refuse it."""
    from ..models.registry import resolve_model_name
    from ..weights import describe_checkpoint
    from ..weights.hub import HF_HUB_PREFIX, split_model_tag

    source = cfg.pretrained
    if not isinstance(source, str) or source.startswith(HF_HUB_PREFIX) or not Path(source).exists():
        return
    saved = describe_checkpoint(source)
    if saved is None:
        return
    name = split_model_tag(cfg.model)[0]
    if resolve_model_name(name) != resolve_model_name(saved.model_name):
        raise ValueError(f"--pretrained {source} holds a {saved.model_name} (the file records its model), which "
                         f"contradicts --model {cfg.model}; give --model {saved.model_name}, or weights of "
                         f"{cfg.model}")


def _train(args: argparse.Namespace) -> int:
    from ..weights import CheckpointMismatchError
    from .engine import train
    from .errors import TrainingDiverged, TrainingInterrupted

    try:
        cfg = _train_config(args)
        _check_pretrained_model(cfg)
        train(cfg)
    except CheckpointMismatchError as e:  # foreign weights that do not fit: one line, the first problem and a count
        problems = [line for line in str(e).splitlines()[1:] if not line.startswith("checkpoint layout")]
        raise ValueError(f"--pretrained {cfg.pretrained} does not fit --model {cfg.model}: "
                         + (f"{problems[0]} (and {len(problems) - 1} more)" if problems else str(e))) from None
    except (TrainingDiverged, TrainingInterrupted) as e:
        return _report_failure("train", e)
    except KeyboardInterrupt:
        where = (f"the run in {args.output} was not changed and can be resumed again with: vit-attention train "
                 f"--resume --output {args.output}") if args.resume and args.output else "nothing was written"
        return _report_failure("train", TrainingInterrupted(f"interrupted before training started; {where}"))
    return 0


def _add_train_options(p: argparse.ArgumentParser, *, epochs: int = 40) -> None:
    _track_given(p)
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help="registered model name (vit-attention models lists them); NAME.TAG picks the published "
                        "weights --pretrained loads (vit-attention models --pretrained lists the tags)")
    add_model_arg_option(g, help="model config override, repeatable, JSON values: --model-arg depth=2 (default: the "
                                 "preset's); also attn_backend=auto|sdpa|explicit|flex, how attention runs")
    g.add_argument("--pretrained", nargs="?", const=True, default=False, metavar="SOURCE",
                   help="fine-tune from pretrained weights: alone, the preset's published ones (Hugging Face cache); "
                        "or a checkpoint file, a model folder or hf-hub:ORG/REPO (e.g. "
                        "hf-hub:timm/vit_base_patch16_224.augreg_in21k). The classifier is re-made for the data's "
                        "classes, the input convolution fitted to --in-chans, position tables resampled to "
                        "--img-size; image folders are normalised with the weights' mean / std (default: random "
                        "initialisation)")
    g.add_argument("--data", default=None,
                   help="image folder (ROOT/<class>/*.png or ROOT/{train,val}/<class>/...) (default: the embedded "
                        "digits)")
    g.add_argument("--img-size", type=positive_int, default=None,
                   help="input size (default: 8 for the digits, the model's for image folders)")
    g.add_argument("--in-chans", type=int, default=3, choices=(1, 3), help="image folders: 1 grayscale, 3 RGB")
    g.add_argument("--val-fraction", type=float, default=0.1, help="held-out share when the folder has no val/")
    g.add_argument("--naflex", action="store_true",
                   help="NaFlex models only (family naflexvit): train on an image folder with each image at its own "
                        "aspect ratio, resized to at most --max-seq-len patches and packed (zero-padded) to that "
                        "budget (NaFlexCollate); no crop, flip, RandAugment, Mixup / CutMix or teacher")
    g.add_argument("--max-seq-len", type=int, default=576,
                   help="with --naflex: the patch budget per image and the packed sequence length (default: 576, "
                        "timm's)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=epochs, help="passes over the training set")
    g.add_argument("--batch-size", type=int, default=64, help="global batch per optimizer step")
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (AdamW)")
    g.add_argument("--min-lr", type=float, default=1e-5, help="learning rate at the end of the cosine decay")
    g.add_argument("--warmup-epochs", type=float, default=3.0, help="linear warm-up length in epochs")
    g.add_argument("--weight-decay", type=float, default=0.05,
                   help="AdamW weight decay (not on biases, norms, position embeddings, tokens)")
    g.add_argument("--layer-decay", type=float, default=None, metavar="RATE",
                   help="layer-wise learning-rate decay for fine-tuning (e.g. 0.75 with --pretrained): the head "
                        "trains at --lr, each block below at RATE times the one above, the patch embedding last "
                        "(default: off)")
    g.add_argument("--clip-grad", type=float, default=1.0, help="max gradient norm (0: off)")
    g.add_argument("--accum-steps", type=int, default=1, help="gradient accumulation micro-steps")
    g.add_argument("--grad-checkpointing", action="store_true", help="recompute activations (less memory)")
    g.add_argument("--amp", default="auto", choices=("auto", "bf16", "none"), help="auto: bf16 on CUDA, fp32 on CPU")
    g.add_argument("--ema", type=float, default=None, metavar="DECAY",
                   help="keep an EMA of the weights with this decay (default: off)")
    g.add_argument("--seed", type=int, default=0, help="seed of the split, the order and every random draw")
    g = p.add_argument_group("regularisation and augmentation (AugReg-style)")
    g.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing of the targets")
    g.add_argument("--mixup", type=float, default=0.0, help="Mixup Beta alpha (0: off)")
    g.add_argument("--cutmix", type=float, default=0.0, help="CutMix Beta alpha (0: off)")
    g.add_argument("--randaugment", type=_pair(int), default=None, metavar="N,M",
                   help="RandAugment ops and magnitude, e.g. 2,9 (default: off)")
    g.add_argument("--hflip", type=float, default=None, help="flip probability (default: 0.5 folders, 0 digits)")
    g.add_argument("--affine", type=float, default=None,
                   help="probability of a small random rotation/shift/zoom (default: 0.5 digits, 0 folders)")
    g.add_argument("--drop", type=float, default=None, help="dropout rate (default: the model's)")
    g.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate (default: the model's)")
    g.add_argument("--attn-drop", type=float, default=None, help="attention dropout rate (default: the model's)")
    g = p.add_argument_group("distillation (DeiT)")
    g.add_argument("--teacher", default=None,
                   help="teacher: registered model name or a .safetensors checkpoint (default: no distillation)")
    g.add_argument("--teacher-checkpoint", default=None,
                   help="weights for a --teacher given by name: a checkpoint file, a model folder or hf-hub:ORG/REPO "
                        "(required with a name; a run folder or .safetensors of ours as --teacher carries its own)")
    g.add_argument("--distill-type", default="hard", choices=("soft", "hard"), help="DeiT distillation target")
    g.add_argument("--distill-alpha", type=float, default=0.5, help="weight of the distillation loss")
    g.add_argument("--distill-tau", type=float, default=1.0, help="temperature of soft distillation")
    g = p.add_argument_group("run")
    g.add_argument("--output", default=None, help="run folder (default: runs/<model>-<time>, a new folder)")
    g.add_argument("--resume", action="store_true",
                   help="continue the run in --output from its checkpoint, with its saved options (options given "
                        "again override them)")
    g.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="checkpoint and stop at this global step, for time-limited jobs; continue with --resume "
                        "(default: off)")
    g.add_argument("--ckpt-every", type=int, default=0, help="also checkpoint every N steps (0: per epoch)")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: 1 for models under 2M parameters, else torch's default)")
    g.add_argument("--fsdp", action="store_true", help="shard the model with FSDP (torchrun)")
    g.add_argument("--workers", type=int, default=0, help="data loader processes for image folders")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars below the per-epoch lines; --no-progress: the lines only (default: bars "
                        "only when stderr is a terminal)")
    g.add_argument("--no-plot", action="store_true", help="do not write curves.png")


# ---------------------------------------------------------------------------- eval / predict


def _data_meta(model: Any) -> dict[str, Any]:
    """What inference needs from a model's data config (built by name / foreign weights): mean, std, crop, names.

    ``label_names``: the weights' class names, else ImageNet-1k's for a 1000-class model.
    """
    from ..data import imagenet_class_names, resolve_data_config

    dc = resolve_data_config(model)
    names = list(dc.label_names) if dc.label_names else None
    if names is None and model.num_classes == 1000:
        names = imagenet_class_names()
    return {"mean": list(dc.mean), "std": list(dc.std), "crop_pct": dc.crop_pct, "data_config": dc,
            "label_names": names}


def _load_for_inference(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """:func:`_load_checkpoint_for_inference`, with ``--tome R`` (token merging, ``R`` tokens per block) set."""
    model, meta = _load_checkpoint_for_inference(args)
    r = getattr(args, "tome", None)
    if r:
        from ..factory import apply_tome_option

        apply_tome_option(model, r)
    return model, meta


# how load_or_create_model names the arguments in its messages: the command line's options
_OPTION_SPELLING = {"model": "--model", "checkpoint": "--checkpoint", "pretrained": "--pretrained",
                    "num_classes": "--num-classes"}


def _load_checkpoint_for_inference(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The model ``--checkpoint`` (or ``--model NAME --pretrained``) gives, in eval mode, and how to feed it.

    A file of ours (run folder, ``model.safetensors``, ``checkpoint.safetensors``) says which model it
    holds: ``--model`` / ``--model-arg`` / ``--num-classes`` may repeat that but never contradict it;
    the returned dict is what its training recorded (classes, mean, std, crop ...). A foreign
    checkpoint (timm, torchvision, a Hugging Face folder or ``hf-hub:ORG/REPO``) or ``--pretrained``
    needs ``--model`` to build first; the dict then holds the model's data config (``data_config``,
    ``mean``, ``std``, ``crop_pct``, ``label_names``).
    """
    from ..factory import load_or_create_model

    kw: dict[str, Any] = dict(args.model_arg or [])
    if args.num_classes is not None:
        kw["num_classes"] = args.num_classes
    pretrained = bool(getattr(args, "pretrained", False))
    if not pretrained and not args.checkpoint:
        raise ValueError("give --checkpoint (a run folder, a weights file, a Hugging Face folder or hf-hub:ORG/REPO) "
                         "or --model NAME[.TAG] --pretrained (the preset's published weights)")
    model, saved = load_or_create_model(args.model, args.checkpoint, pretrained=pretrained, options=kw,
                                        spelling=_OPTION_SPELLING)
    if saved is None:
        return model.eval(), _data_meta(model)
    meta = _inference_meta(saved)
    if "mean" not in meta:  # saved by save_weights outside training: the data config it records (or its preset's)
        meta = {**_data_meta(model), **meta}
    return model, meta


def _check_writable_png(path: Path, option: str) -> Path:
    """``path`` if a PNG can be written there (its folder is created); else ``ValueError`` naming ``option``."""
    from ..weights.io import probe_writable

    if path.suffix.lower() != ".png":
        raise ValueError(f"{option} {path}: expected a path ending in .png")
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; expected a .png file path")
    try:
        probe_writable(path.parent)
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot write there ({e.strerror or e}); give a writable .png "
                         "path") from None
    return path


def _check_classes(trained: list[str] | None, data_classes: list[str], data_arg: str) -> None:
    """Refuse data whose class names differ from the training classes (labels would map by index silently)."""
    if not trained or list(trained) == list(data_classes):
        return
    only_data = [c for c in data_classes if c not in trained]
    only_train = [c for c in trained if c not in data_classes]

    def show(names: list[str]) -> str:
        return ", ".join(names[:10]) + (f", ... (+{len(names) - 10})" if len(names) > 10 else "")

    if not only_data and not only_train:
        detail = f"the same names in another order: data {show(list(data_classes))} vs training {show(list(trained))}"
    else:
        detail = "; ".join(part for part in (
            f"only in --data: {show(only_data)}" if only_data else "",
            f"only in training: {show(only_train)}" if only_train else "") if part)
    raise ValueError(f"--data {data_arg} has other classes than the model was trained on ({detail}); "
                     "class i of the data would be scored as training class i. Evaluate on data with the "
                     "training classes")


def _eval(args: argparse.Namespace) -> int:
    import sys

    import torch

    from .data import BatchTransform, build_data
    from .metrics import evaluate
    from .plots import plot_confusion

    if args.run is not None:  # `eval RUN`
        if args.checkpoint is not None:
            raise ValueError(f"RUN {args.run} and --checkpoint {args.checkpoint} both give the model; give one")
        args.checkpoint = args.run
    local = args.checkpoint is not None and Path(args.checkpoint).exists()  # a run folder / file: the PNG goes there
    ckpt = Path(args.checkpoint) if local else None
    if args.confusion:
        out = Path(args.confusion)
    elif ckpt is not None:
        out = (ckpt if ckpt.is_dir() else ckpt.parent) / "confusion.png"
    else:  # --pretrained, a hub id: the current folder
        out = Path("confusion.png")
    if args.confusion:
        _check_writable_png(out, "--confusion")
    model, meta = _load_for_inference(args)
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, int) else cfg.img_size[0]
    data_arg = args.data if args.data is not None else meta.get("data", "digits")
    same_data = args.data is None
    max_seq_len = _naflex_budget(args, model, meta)
    if max_seq_len is not None and data_arg == "digits":
        raise ValueError("--naflex evaluates on an image folder of any sizes and aspects: pass --data ROOT")
    val_fraction = args.val_fraction if args.val_fraction is not None else float(meta.get("val_fraction", 0.1))
    # a model built by name or from foreign weights: its data config's crop (and mean / std below) on any data
    crop_pct = float(meta.get("crop_pct", 0.875)) if same_data or "data_config" in meta else 0.875
    data = build_data(None if data_arg == "digits" else data_arg,
                      img_size=size if data_arg != "digits" else (None if size == 8 else size), in_chans=cfg.in_chans,
                      val_fraction=val_fraction, crop_pct=crop_pct,
                      seed=int(meta.get("split_seed", 0)) if same_data else 0,
                      naflex_patch=cfg.patch_size if max_seq_len is not None else None,
                      max_seq_len=max_seq_len or 576)
    if max_seq_len is not None:
        print(f"NaFlex: each image at its own aspect, at most {max_seq_len} patches of {cfg.patch_size} px "
              f"(--max-seq-len)")
    _check_classes(meta.get("classes"), data.classes, data_arg)
    if data.num_classes != model.num_classes:
        raise ValueError(f"the model predicts {model.num_classes} classes, the data has {data.num_classes}")
    mean, std = meta.get("mean", data.mean), meta.get("std", data.std)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device)
    tf = BatchTransform(mean, std, img_size=data.img_size).to(device)
    from .distributed import DistInfo

    split = data.test if args.split == "test" else data.train
    res = evaluate(model, split, tf, info=DistInfo(device=device), return_predictions=True)
    k = data.num_classes
    conf = torch.zeros(k, k, dtype=torch.long)
    conf.index_put_((res["target"], res["pred"]), torch.ones_like(res["pred"]), accumulate=True)
    print(f"images: {res['n']}")  # the scores first: a confusion matrix that cannot be written loses none of them
    print(f"loss: {res['loss']:.4f}")
    print(f"top-5 accuracy: {res['top5']:.4f}")
    code = 0
    try:
        plot_confusion(conf, data.classes, out, title=f"{getattr(model, 'registry_name', '')} on {data.name} "
                                                         f"({args.split}), top-1 {res['top1']:.4f}")
        print(f"confusion matrix: {out}")
    except OSError as e:
        why = _os_reason(e)
        if args.confusion:  # asked for: an error (after the scores)
            print(f"vit-attention eval: error: --confusion {out}: cannot write the confusion matrix ({why})",
                  file=sys.stderr)
            code = 2
        else:  # the default place beside the checkpoint (a read-only run folder): the scores stand
            print(f"warning: cannot write the confusion matrix to {out} ({why}); give --confusion PNG to write "
                  "it elsewhere", file=sys.stderr)
    print(f"top-1 accuracy: {res['top1']:.4f}")
    return code


def _os_reason(e: OSError) -> str:
    """An ``OSError`` in words: its ``strerror`` (``Read-only file system``, ``Permission denied`` ...)."""
    return e.strerror or str(e)


def _predict(args: argparse.Namespace) -> int:
    import sys

    import torch

    from .data import load_image

    if args.topk < 1:
        raise ValueError(f"--topk must be an int >= 1 (how many classes to show per image), got {args.topk}")
    if args.crop_pct is not None and not 0 < args.crop_pct < math.inf:
        raise ValueError(f"--crop-pct must be a positive number (crop size / resize size: below 1 the border is "
                         f"cut off, 1 = whole image, above 1 padded), got {args.crop_pct}")
    missing = [p for p in args.images if not Path(p).exists()]
    if missing:
        from ..models import list_models

        names = set(list_models(include_aliases=True))
        model_like = [p for p in missing if p.split(".")[0] in names]  # `predict MODEL IMAGE`: a name is no image
        hint = (f"; {model_like[0]!r} is a model name: give it as --model {model_like[0]} (with --pretrained or "
                "--checkpoint), then the images") if model_like else ""
        if model_like or len(missing) == len(args.images):  # nothing to score: refuse before loading the model
            raise FileNotFoundError(f"image(s) not found: {', '.join(missing)}{hint}")
    model, meta = _load_for_inference(args)
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, int) else tuple(cfg.img_size)
    classes = meta.get("classes") or meta.get("label_names")
    if not classes or len(classes) != model.num_classes:
        classes = [str(i) for i in range(model.num_classes)]
    classes = [printable_name(c) for c in classes]  # names from a file: one output line per image, whatever they hold
    mean = torch.tensor(meta.get("mean", [0.5] * cfg.in_chans)).view(1, -1, 1, 1)
    std = torch.tensor(meta.get("std", [0.5] * cfg.in_chans)).view(1, -1, 1, 1)
    k = min(args.topk, len(classes))
    if k < args.topk:
        print(f"note: --topk {args.topk} is more than the model's {len(classes)} classes; showing all {k}",
              file=sys.stderr)
    max_seq_len = _naflex_budget(args, model, meta)
    if max_seq_len is not None:
        if args.crop_pct is not None:
            raise ValueError(f"--crop-pct {args.crop_pct} does not apply with --naflex: each image is read whole, "
                             "at its own aspect")
        return _predict_naflex(args, model, classes, mean, std, k, max_seq_len)
    crop = args.crop_pct if args.crop_pct is not None else float(meta.get("crop_pct", 1.0))
    transform = None
    if "data_config" in meta:  # the model's data config (as timm's for its name and tag): its resize, crop, norm
        import dataclasses

        from ..data import create_transform

        transform = create_transform(dataclasses.replace(meta["data_config"], crop_pct=crop))
    bad: list[str] = []
    for path in args.images:
        try:
            if not Path(path).exists():
                raise FileNotFoundError("not found")
            if transform is not None:
                x = transform(path)[None]
            else:  # a model trained here: images read as training read them
                x = (load_image(path, size, in_chans=cfg.in_chans, crop_pct=crop)[None] - mean) / std
        except Exception as e:  # noqa: BLE001 - Pillow raises many types
            _unreadable(path, e, bad)
            continue
        with torch.no_grad():
            logits = model(x)
        prob = logits.float().softmax(-1)[0]
        top = prob.topk(k)
        ranked = ", ".join(f"{classes[i]} ({p:.3f})" for p, i in zip(top.values.tolist(), top.indices.tolist()))
        print(f"{printable_name(path)}: {ranked}", flush=True)
    return _predict_exit(bad, len(args.images))


def _unreadable(path: str, e: BaseException, bad: list[str]) -> None:
    """Report image ``path`` that cannot be read (one line on stderr) and add it to ``bad``; the rest are scored."""
    import sys

    print(f"vit-attention predict: cannot read image {printable_name(path)}: {printable_name(str(e))}",
          file=sys.stderr, flush=True)
    bad.append(path)


def _predict_exit(bad: list[str], total: int) -> int:
    """``predict``'s exit code: 0 when every image was scored, else 2 (the commands' error code) after a line
    naming the unreadable ones."""
    import sys

    if not bad:
        return 0
    print(f"vit-attention predict: error: {len(bad)} of {total} image(s) could not be read: "
          f"{', '.join(map(printable_name, bad))}",
          file=sys.stderr)
    return 2


def _predict_naflex(args: argparse.Namespace, model: Any, classes: list[str], mean: Any, std: Any, k: int,
                    max_seq_len: int) -> int:
    """``predict`` for a NaFlex model: each image at its own aspect, resized to at most ``max_seq_len``
    patches as NaFlex training reads it, all of them in one list-of-images forward ``model([x1, x2, ...])``."""
    import torch

    from ..data.naflex import load_naflex_image

    cfg = model.cfg
    images, read, bad = [], [], []
    for path in args.images:
        try:
            if not Path(path).exists():
                raise FileNotFoundError("not found")
            img = load_naflex_image(path, cfg.patch_size, max_seq_len, in_chans=cfg.in_chans)
        except Exception as e:  # noqa: BLE001 - Pillow raises many types
            _unreadable(path, e, bad)
            continue
        images.append((img - mean[0]) / std[0])  # [C, H', W'] normalised
        read.append(path)
    if images:
        with torch.no_grad():
            logits = model(images)
        prob = (logits[0] if isinstance(logits, tuple) else logits).float().softmax(-1)
        for path, row in zip(read, prob):
            top = row.topk(k)
            ranked = ", ".join(f"{classes[i]} ({p:.3f})" for p, i in zip(top.values.tolist(), top.indices.tolist()))
            print(f"{printable_name(path)}: {ranked}")
    return _predict_exit(bad, len(args.images))


def _compare(args: argparse.Namespace) -> int:
    from .compare import read_compare_options, run_compare
    from .config import TrainConfig
    from .errors import TrainingDiverged, TrainingInterrupted

    cfg = _train_config(args)
    models = [m for m in (args.models or "").split(",") if m]
    mechs = [a for a in (args.attention or "").split(",") if a]
    quick = args.quick
    if args.resume:
        if not args.output:
            raise ValueError("--resume needs --output: the folder of the comparison to continue")
        saved = read_compare_options(args.output)
        if saved is not None:  # the comparison's own options, overridden by those given again
            given = _given(args)
            cfg = TrainConfig(**_merge_saved(_config_from_args(args), saved["train"], given))
            if not {"models", "attention"} & given:
                models, mechs = list(saved.get("models") or []), list(saved.get("attention") or [])
            quick = quick if "quick" in given else bool(saved.get("quick", False))
    try:
        run_compare(cfg, models=models, attention=mechs, output=args.output, fast=quick, resume=args.resume)
    except (TrainingDiverged, TrainingInterrupted) as e:
        return _report_failure("compare", e)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``train``, ``eval``, ``predict`` and ``compare``."""
    p = sub.add_parser("train", help="train a model (default: a small ViT on the embedded digits, >= 97%% test)",
                       formatter_class=_HelpFormatter,
                       description="Train any registered model on the embedded digits or an image folder. "
                                   "Runs under torchrun for data parallelism. Prints 'test accuracy: X' last.")
    _add_train_options(p, epochs=60)
    p.set_defaults(func=_train)

    for name, helptext in (("eval", "top-1/top-5 accuracy and a confusion matrix PNG of a trained model"),
                           ("predict", "top-k classes of image files")):
        p = sub.add_parser(name, help=helptext)
        if name == "predict":
            p.add_argument("images", nargs="+", metavar="IMAGE",
                           help="image files (PNG, JPEG, TIFF ...; any Pillow mode, 16-bit included), read with "
                                "the model's eval preprocessing: resize, centre crop, normalisation (NaFlex: "
                                "each at its own aspect, see --naflex)")
            p.add_argument("--topk", type=int, default=5, help="classes shown per image, >= 1 (default 5; at "
                                                               "most the model's number of classes)")
            p.add_argument("--crop-pct", type=float, default=None,
                           help="crop size / resize size, a positive number (default: as in training, else "
                                "the model's data config; 1 = whole image, below 1 the border cut off, above 1 "
                                "padded black)")
        p.add_argument("--checkpoint", default=None,
                       help="run folder, model.safetensors or checkpoint.safetensors (or, with --model, a foreign "
                            "file, a Hugging Face model folder or hf-hub:ORG/REPO)")
        p.add_argument("--pretrained", action="store_true",
                       help="with --model NAME[.TAG] and no --checkpoint: the preset's published weights (timm's "
                            "default tag, or TAG) from the Hugging Face hub cache; HF_HUB_OFFLINE=1: cache only. "
                            "Images are read with the model's data config; 1000-class models print ImageNet names")
        p.add_argument("--model", default=None,
                       help="with a file of ours: the model it must hold (it says which); with a foreign "
                            "checkpoint (timm, torchvision, ...) or --pretrained: build this registered model "
                            "(NAME.TAG picks a tag) and load it")
        add_model_arg_option(p, help="config option for --model with a foreign checkpoint (must agree with a file of "
                                     "ours); attn_backend=auto|sdpa|explicit|flex (how attention runs) goes with any "
                                     "checkpoint")
        p.add_argument("--num-classes", type=int, default=None,
                       help="classes of --model with a foreign checkpoint (must agree with a file of ours)")
        p.add_argument("--tome", type=int, default=0, metavar="R",
                       help="token merging (ToMe): merge R tokens in every block of a token model (ViT family), "
                            "faster at a small accuracy cost; 0 = off (default 0; docs/token_merging.md)")
        p.add_argument("--naflex", action="store_true",
                       help="NaFlex models (family naflexvit): read each image at its own aspect, resized to at most "
                            "--max-seq-len patches, as `train --naflex` does (automatic for a run trained with "
                            "--naflex)")
        p.add_argument("--max-seq-len", type=int, default=None,
                       help="with --naflex: the patch budget per image (default: the run's --max-seq-len, else 576)")
        if name == "eval":
            p.add_argument("run", nargs="?", default=None, metavar="RUN",
                           help="run folder or checkpoint file of ours (the same as --checkpoint RUN)")
            p.add_argument("--data", default=None, help="image folder with the training classes (default: the "
                                                        "data the model was trained on)")
            p.add_argument("--split", default="test", choices=("test", "train"),
                           help="which split of the data to score: the held-out test / val images, or the "
                                "training images (default: test)")
            p.add_argument("--val-fraction", type=float, default=None,
                           help="held-out share of an image folder without val/ (default: as in training)")
            p.add_argument("--confusion", default=None, metavar="PNG",
                           help="where to write the confusion matrix (default: confusion.png beside the checkpoint)")
            p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
            p.set_defaults(func=_eval)
        else:
            p.set_defaults(func=_predict)

    p = sub.add_parser("compare", help="train several models / attention mechanisms under one budget, tabulate",
                       description="Train each model (--models) or each attention mechanism in the digits ViT "
                                   "(--attention) with the same data and budget; print test accuracy, params, "
                                   "FLOPs, train and inference throughput; plot accuracy vs FLOPs. Default: "
                                   "global MHSA vs Swin-style window attention on the digits.",
                       formatter_class=_HelpFormatter)
    _track_given(p)
    p.add_argument("--models", default=None,
                   help="comma-separated registered names (default: MHSA and window attention in the digits ViT, "
                        "and a small Swin)")
    p.add_argument("--attention", default=None,
                   help="comma-separated mechanisms inside --model (default: see --models)")
    p.add_argument("--quick", action="store_true", help="a smoke-test budget (1 epoch each)")
    _add_train_options(p, epochs=30)
    p.set_defaults(func=_compare)
