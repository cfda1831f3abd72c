"""Sub-commands ``trace``, ``info``, ``attn`` and ``docs`` (thin wrappers over ``vit_attention.analysis``).

``attn`` loads models through :func:`vit_attention.load_model` when the checkpoint is ours (a run
folder, ``model.safetensors`` or ``checkpoint.safetensors``), so the map is of the model that was trained.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..factory import (
    add_model_arg_option,
    apply_tome_option,
    create_model,
    load_or_create_model,
    merged_model_args,
    positive_int,
)
from ..models.registry import get_model_entry
from ..weights.io import atomic_write
from ..weights.saved import is_checkpoint_path

__all__ = ["add_commands", "build_model", "name_and_options", "eval_data_config", "load_image", "attention_heatmap",
           "save_attention_png"]

_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def build_model(name: str | None, *, checkpoint: str | Path | None = None, img_size: int | None = None,
                num_classes: int | None = None, device: str | torch.device = "cpu", pretrained: bool = False,
                model_kwargs: Mapping[str, Any] | None = None) -> nn.Module:
    """Model ``name``, or the model a checkpoint of ours describes (its saved config wins), with weights, in eval mode.

    A file written by :func:`vit_attention.save_weights`, a training ``checkpoint.safetensors`` or
    a run folder names its model and config: the model is rebuilt as it was trained
    (:func:`vit_attention.load_model`); ``name`` may be ``None`` or must be that model (else
    ``ValueError``). Other checkpoints (timm, torchvision, Hugging Face ...) are loaded into
    ``name`` built with the given options (``checkpoint`` may also be ``hf-hub:ORG/REPO``);
    ``pretrained=True`` loads ``name``'s published weights (``NAME.TAG`` picks a tag). ``model_kwargs``
    (``--model-arg``): config options for ``name`` (with ``pretrained``, another ``attn_layer`` gets the
    weights carried over), which a file of ours must agree with; ``attn_backend`` goes with any. Sets
    ``model.data_config`` (:func:`eval_data_config`: how ``attn`` and ``predict`` read images for
    it), ``model.normalization`` (its mean, std) and ``model.class_names`` (recorded or the
    weights' names; ImageNet-1k's for a 1000-class model with weights; else ``None``).
    """
    from ..data import imagenet_class_names

    kw = dict(model_kwargs or {})  # --model-arg; img_size / num_classes given as options win over theirs
    size = kw.pop("img_size", None) if img_size is None else img_size
    kw.pop("img_size", None)
    if num_classes is not None:
        kw["num_classes"] = num_classes
    model, saved = load_or_create_model(name, checkpoint, pretrained=pretrained, options=kw, img_size=size,
                                        device=device)
    meta: Mapping[str, Any] = saved.metadata if saved is not None else {}
    data_config = eval_data_config(model, saved)
    model.data_config = data_config  # type: ignore[assignment]
    model.normalization = (data_config.mean, data_config.std)  # type: ignore[assignment]
    classes = meta.get("classes")
    if not isinstance(classes, list):
        classes = list(data_config.label_names) if data_config.label_names else None
    if classes is None and model.num_classes == 1000 and (checkpoint is not None or pretrained):
        classes = imagenet_class_names()
    model.class_names = list(classes) if isinstance(classes, list) else None  # type: ignore[assignment]
    return model.eval()


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _normalization(meta: Mapping[str, Any], in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) recorded in ``meta`` (JSON text or decoded), else ImageNet's for RGB, else 0.5."""
    for key in ("normalize", "normalization"):
        if key in meta:
            value = _decoded(meta[key])
            if isinstance(value, dict):
                return tuple(value["mean"]), tuple(value["std"])
            return tuple(value[0]), tuple(value[1])
    if "mean" in meta and "std" in meta:
        return tuple(_decoded(meta["mean"])), tuple(_decoded(meta["std"]))
    if in_chans == 3:
        return _IMAGENET
    return (0.5,) * in_chans, (0.5,) * in_chans


def eval_data_config(model: nn.Module, saved: Any = None, **overrides: Any) -> Any:
    """The eval data config images are read with for ``model`` (``attn`` and ``predict`` both) -> ``DataConfig``.

    :func:`vit_attention.data.resolve_data_config` of the model (what its file records:
    ``load_model`` sets it), plus what ``saved`` (the :class:`~vit_attention.weights.SavedModel`
    it came from, if any) says beyond that: the normalisation of older files (``normalize`` /
    ``normalization`` keys) and the whole-image crop of training checkpoints of the digits.
    ``overrides``: fields to replace (``crop_pct=1.0``).
    """
    from ..data import resolve_data_config

    meta: Mapping[str, Any] = saved.metadata if saved is not None else {}
    fields: dict[str, Any] = {}
    if any(k in meta for k in ("normalize", "normalization")) or ("mean" in meta and "std" in meta):
        fields["mean"], fields["std"] = _normalization(meta, model.cfg.in_chans)
    if saved is not None and saved.kind == "train_state" and "crop_pct" not in meta:
        config = meta.get("config") if isinstance(meta.get("config"), Mapping) else {}
        if (config.get("data") or "digits") == "digits":  # the digits train and test uncropped
            fields["crop_pct"] = 1.0
    return resolve_data_config(model, **{**fields, **overrides})


def load_image(path: str | Path, config: Any) -> tuple[Tensor, Tensor]:
    """Read an image file with the eval transform of ``config`` (a ``DataConfig``, e.g. ``model.data_config``).

    Returns ``(normalised input [1, Cin, H, W], display image [Cin, H, W] in [0, 1])``: the same
    pixels ``predict`` feeds the model (:func:`vit_attention.data.create_transform`). A missing
    file raises ``FileNotFoundError``, a file that is not an image ``ValueError``, both naming it.
    """
    from ..data import create_transform, read_image

    tf = create_transform(config)
    image = read_image(Path(path), channels=config.input_size[0])
    shown = tf.to_tensor(tf.resize_crop(image))  # [Cin, H, W] in [0, 1]
    return tf(image)[None], shown


def attention_heatmap(model: nn.Module, x: Tensor, *, layer: int | None = None, head: int | None = None,
                      method: str = "auto") -> tuple[Tensor, str, str]:
    """One image's attention map on the token grid ``[h, w]``, a description, and the method used.

    ``x``: ``[1, Cin, H, W]``. ``method``: ``rollout`` (global attention with a class token),
    ``mean`` (every layer's map, averaged; any layout) or ``layer`` (one layer, ``layer``);
    ``auto`` = ``layer`` when ``layer`` is given, else rollout where possible, else mean. The
    description says which layers and heads and what is averaged.
    """
    heat, what, tag, _ = _heatmap_and_logits(model, x, layer=layer, head=head, method=method)
    return heat, what, tag


def _heatmap_and_logits(model: nn.Module, x: Tensor, *, layer: int | None, head: int | None,
                        method: str) -> tuple[Tensor, str, str, Tensor]:
    """:func:`attention_heatmap` plus the model's logits ``[1, num_classes]`` from the same forward."""
    from .attention_maps import record_attention

    if method not in ("auto", "rollout", "mean", "layer"):
        raise ValueError(f"method must be 'auto', 'rollout', 'mean' or 'layer', got {method!r}")
    with record_attention(model) as rec, torch.no_grad():
        out = model(x)
    logits = out[0] if isinstance(out, (tuple, list)) else out
    recs = rec.self_attention()
    global_with_cls = any(r.has_class_token for r in recs)  # registers alone are no class token
    if method == "auto":
        method = "layer" if layer is not None else ("rollout" if global_with_cls else "mean")
    n = len(recs)
    if method == "rollout":
        globals_ = [r for r in recs if r.is_global]
        heat = rec.rollout(head)[0]
        n_global = len(globals_)
        heads = _heads(head, recs[0].weights.shape[1] if recs else 0, "in each layer")
        # the class token's row of the rolled-out matrix; without a class token, what each patch receives
        flow = ("class token -> patches" if globals_[-1].has_class_token else
                "no class token: the rolled-out attention each patch receives, mean over all tokens")
        return heat, f"attention rollout through all {n_global} layers: {flow}, {heads}" \
            + _register_row(model, recs[-1], head).replace("; registers", "; in the last layer registers"), \
            method, logits
    if method == "mean":
        heat = rec.mean_map(head)[0]
        nh = recs[0].weights.shape[1] if recs else 0
        with_cls = [r.has_class_token for r in recs]
        per_layer = ("the class token's attention to each patch" if all(with_cls) else
                     "the attention each patch receives (mean over queries)" if not any(with_cls) else
                     "the class token's attention, or without one the attention each patch receives")
        return heat, (f"mean over all {n} attention layers (each scaled to mean 1) of {per_layer}; "
                      f"{_heads(head, nh, 'per layer')}"
                      + _register_row(model, recs[-1], head).replace("; registers", "; in the last layer registers")
                      ), method, logits
    idx = -1 if layer is None else layer
    r = rec.layer(idx)
    pos = idx % n if n else idx
    if r.has_class_token:
        what = "attention of the class token to each patch"
    else:
        window = " of its window" if r.layout.groups > 1 else ""
        what = "attention each patch receives, mean over all queries" + window
    heat = rec.image_map(idx, head)[0]
    return heat, f"layer {pos + 1} of {n} ({r.module}): {what}, {_heads(head, r.weights.shape[1])}" \
        + _register_row(model, r, head), f"layer{idx}", logits


def _register_row(model: nn.Module, rec: Any, head: int | None) -> str:
    """With register tokens: their own row of the description, the share of the patches' attention each
    register takes in this layer (registers are left out of every map; Darcet et al. 2024)."""
    R = int(getattr(model, "num_reg_tokens", 0) or 0)
    if not R or not rec.is_global:
        return ""
    share = rec.prefix_share(head)[0]  # [P]: class / distillation tokens first, registers last
    regs = share[-R:]
    cells = ", ".join(f"reg{i} {float(v):.1%}" for i, v in enumerate(regs))
    return f"; registers (not in the map) take {float(regs.sum()):.1%} of the patches' attention: {cells}"


def _heads(head: int | None, num_heads: int, where: str = "") -> str:
    suffix = f" {where}" if where else ""
    if head is None:
        return f"mean over all {num_heads} heads{suffix}"
    return f"head {head} (of heads 0-{num_heads - 1}){suffix}"


# ----------------------------------------------------------------------------- commands
def name_and_options(model: str, model_args: Any = None) -> tuple[str, dict[str, Any]]:
    """A command's MODEL argument -> ``(registered name, config options)``: a name with its ``--model-arg``
    pairs, or a run folder / checkpoint file of ours with the config it records (``--model-arg`` may repeat
    it, never contradict it: ``ValueError`` naming the option), so ``summary``, ``info`` and ``trace`` take
    the runs ``attn``, ``eval`` and ``generate`` take."""
    from ..weights.saved import check_options_agree, describe_checkpoint

    options = dict(model_args or ())
    if not is_checkpoint_path(model):
        return model, options
    saved = describe_checkpoint(model)
    if saved is None:
        raise ValueError(f"MODEL {model} is a checkpoint that does not record which model it holds (not written "
                         "by vit-attention); give a registered model name")
    backend = options.pop("attn_backend", None)  # how it runs, never in the saved config
    check_options_agree(saved, options)
    config = dict(saved.config)
    if backend is not None:
        config["attn_backend"] = backend
    return saved.model_name, config


def _meta_model(args: argparse.Namespace) -> tuple[nn.Module, tuple[int, ...]]:
    name, options = name_and_options(args.model, args.model_arg)
    entry = get_model_entry(name)
    with torch.device("meta"):
        model = create_model(entry.name, **merged_model_args(options, img_size=args.img_size)).eval()
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    return model, (args.batch_size, cfg.in_chans, *size)


def _trace(args: argparse.Namespace) -> int:
    from .trace import trace

    if args.depth is not None and args.depth < 0:
        raise ValueError(f"--depth must be >= 0 (how deep nested modules are shown; 0 = the model only), got "
                         f"{args.depth}")
    model, shape = _meta_model(args)
    t = trace(model, shape, max_depth=args.depth, show_all=args.all)
    print(t.flow(max_depth=args.depth or 1) if args.flow else t.format())
    return 0


def _info(args: argparse.Namespace) -> int:
    from .info import model_info

    name, options = name_and_options(args.model, args.model_arg)
    print(model_info(name, batch_size=args.batch_size, **merged_model_args(options, img_size=args.img_size)).format())
    return 0


def _output_folder(out: str | None, checkpoint: str | None) -> Path:
    """``--output``, else ``attention_maps/`` in the run folder (or beside the checkpoint file), else in the cwd."""
    if out is not None:
        return Path(out)
    if checkpoint is None:
        return Path("attention_maps")
    ckpt = Path(checkpoint)
    return (ckpt if ckpt.is_dir() else ckpt.parent) / "attention_maps"


def save_attention_png(image: Tensor, heat: Tensor, path: str | Path, *, title: str, description: str,
                       colorbar_label: str, cmap: str = "inferno", alpha: float = 0.6) -> Path:
    """Write the input ``image [Cin, H, W]`` beside ``heat [h, w]`` (resized, overlaid) with a colour bar, as a PNG.

    ``title``: the figure title (model, weights, prediction); ``description``: what the map shows
    (wrapped under the overlay); ``colorbar_label``: what the colours measure.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .render import upsample_map

    arr = image.detach().float().cpu().numpy()
    arr = np.repeat(arr, 3, axis=0) if arr.shape[0] == 1 else arr
    arr = arr.transpose(1, 2, 0)  # [H, W, 3]
    lo, hi = float(arr.min()), float(arr.max())
    arr = (arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr)
    H, W = arr.shape[:2]
    up = upsample_map(heat, (H, W)).numpy()
    fig = Figure(figsize=(7.6, 4.4), dpi=110)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.12]})
    ax1.imshow(arr, interpolation="nearest")
    ax1.set_title(f"input ({H}x{W} px)", fontsize=9)
    ax2.imshow(arr, interpolation="nearest")
    shown = ax2.imshow(up, cmap=cmap, alpha=alpha, interpolation="bilinear")
    h, w = heat.shape
    ax2.set_title(f"attention over the input ({h}x{w} token grid)", fontsize=9)
    bar = fig.colorbar(shown, ax=ax2, fraction=0.046, pad=0.03)
    bar.set_label(colorbar_label, fontsize=8)
    bar.ax.tick_params(labelsize=7)
    for ax in (ax1, ax2):
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.text(0.5, 0.02, "\n".join(textwrap.wrap(description, 95)), ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    path = Path(path)
    try:  # atomically: a symlink planted at ``path`` is replaced, its target untouched
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", metadata={"Software": None}))
    except OSError as e:
        raise ValueError(f"--output {path.parent}: cannot write {path.name} there ({e.strerror or e})") from None
    return path


_COLORBAR = {"rollout": "rollout weight (share of the class token's attention)",
             "rollout-received": "rollout weight (received, mean over all tokens)",
             "mean": "attention relative to the layer mean (1 = uniform)"}


def _attn(args: argparse.Namespace) -> int:
    name: str | None = args.model
    checkpoint: str | None = args.checkpoint
    if is_checkpoint_path(args.model):  # `attn runs/<run> IMAGE`: the run says which model it is
        if checkpoint is not None:
            raise ValueError(f"model {args.model!r} is a path and --checkpoint {checkpoint} is given too; give the "
                             "registered model name (or only the run folder / checkpoint)")
        name, checkpoint = None, args.model
    from ..data import read_image

    read_image(Path(args.image))  # a missing, non-image or unreadable-mode file fails before the model is built
    if checkpoint is None and not args.pretrained:
        print(f"warning: no --checkpoint: these maps show {name} with random (untrained) weights; give "
              "--checkpoint (a run folder or weights file) or --pretrained for a trained model's attention",
              file=sys.stderr)
    model = build_model(name, checkpoint=checkpoint, img_size=args.img_size, pretrained=args.pretrained,
                        model_kwargs=dict(args.model_arg or ()))
    if args.tome:
        apply_tome_option(model, args.tome)  # the maps: each patch shows the token that covers it
    max_seq_len = _attn_naflex_budget(args, model, checkpoint)
    if max_seq_len is None:
        x, img = load_image(args.image, model.data_config)  # the model's eval preprocessing, as `predict`
    else:  # NaFlex: the image at its own aspect, as `train --naflex` / `predict` read it; the map on its own grid
        from ..data.naflex import load_naflex_image

        img = load_naflex_image(args.image, model.cfg.patch_size, max_seq_len, in_chans=model.cfg.in_chans)
        mean, std = (torch.tensor(v, dtype=img.dtype).view(-1, 1, 1) for v in model.normalization)
        x = ((img - mean) / std)[None]  # [1, C, H', W'], sides multiples of the patch: the same logits as model([...])
    heat, what, tag, logits = _heatmap_and_logits(model, x, layer=args.layer, head=args.head, method=args.method)
    model_name = getattr(model, "registry_name", name)
    prob = logits.float().softmax(-1)[0]
    p, k = prob.max(dim=0)
    classes = getattr(model, "class_names", None)
    label = classes[int(k)] if classes and len(classes) == prob.numel() else f"class {int(k)}"
    if args.pretrained:
        pcfg = getattr(model, "pretrained_cfg", None) or {}
        weights = f"weights: {pcfg.get('hf_hub_id') or 'pretrained'}"
    elif checkpoint:
        ckpt = Path(checkpoint)
        weights = "weights: " + (f"{ckpt.name}/" if ckpt.is_dir() else ckpt.name)
    else:
        weights = "RANDOM weights (no --checkpoint)"
    tome = f"ToMe r={args.tome}" if args.tome else ""  # merged tokens: the map is not the unmerged model's
    title = f"{model_name}, {weights}" + (f", {tome}" if tome else "") + f"; predicted: {label} ({float(p):.1%})"
    stem = Path(args.image).stem
    fname = (f"{stem}_{model_name}_{tag}" + ("" if args.head is None else f"_head{args.head}")
             + (f"_tome{args.tome}" if args.tome else ""))
    bar = "rollout-received" if tag == "rollout" and "class token -> patches" not in what else tag
    out = save_attention_png(img, heat, _output_folder(args.output, checkpoint) / f"{fname}.png", title=title,
                             description=what + (f"; {tome}: tokens merged in every block" if tome else ""),
                             colorbar_label=_COLORBAR.get(bar, "attention weight"))
    if args.save_map:
        def write_npy(tmp: str) -> None:
            with open(tmp, "wb") as f:  # a file object: np.save would append ".npy" to the temporary name
                np.save(f, heat.numpy())

        atomic_write(out.with_suffix(".npy"), write_npy)
    print(f"{out}  ({what}; token grid {tuple(heat.shape)}; predicted {label} {float(p):.3f})")
    return 0


def _attn_naflex_budget(args: argparse.Namespace, model: nn.Module, checkpoint: str | None) -> int | None:
    """The patch budget for reading the image at its own aspect (a run trained with ``--naflex``, or
    ``--naflex``), else ``None`` (the fixed-size path); the rules of ``eval`` / ``predict``."""
    from ..data.naflex import inference_meta as _inference_meta
    from ..data.naflex import naflex_budget as _naflex_budget
    from ..weights import describe_checkpoint
    from ..weights.hub import HF_HUB_PREFIX

    meta: dict[str, Any] = {}
    if checkpoint is not None and not str(checkpoint).startswith(HF_HUB_PREFIX):
        saved = describe_checkpoint(checkpoint)
        meta = _inference_meta(saved) if saved is not None else {}
    if args.img_size is not None and (args.naflex or meta.get("naflex")):
        raise ValueError(f"--img-size {args.img_size} does not apply with --naflex: the image keeps its aspect, "
                         "at most --max-seq-len patches")
    return _naflex_budget(args, model, meta)


def _docs(args: argparse.Namespace) -> int:
    from .docs import check_docs, default_docs_folder, generate_docs

    out = Path(args.output) if args.output else default_docs_folder()  # not ./docs of wherever it runs
    if args.check:
        stale = check_docs(out)
        for path in stale:
            print(f"stale: {path}")
        print("docs are up to date" if not stale else f"{len(stale)} generated file(s) are stale; "
              "run `vit-attention docs` to regenerate")
        return 1 if stale else 0
    for path in generate_docs(out, images=not args.no_images):
        print(path)
    return 0


def _add_output(p: argparse.ArgumentParser, *, default: str | None, help: str) -> None:
    """``--output``, the name every command uses for where it writes."""
    p.add_argument("--output", default=default, help=help)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``trace``, ``info``, ``attn`` and ``docs``."""
    p = sub.add_parser("trace", help="print the shape at every module (meta device, instant)")
    p.add_argument("model", help="registered model name or alias, or a run folder / checkpoint file of ours")
    p.add_argument("--img-size", type=positive_int, default=None, help="input size (default: the preset's)")
    p.add_argument("--batch-size", type=int, default=1, help="batch size of the traced input (default: 1)")
    p.add_argument("--depth", type=int, default=None, help="show modules nested at most this deep (>= 0)")
    p.add_argument("--all", action="store_true", help="also list shape-preserving Identity / Dropout")
    p.add_argument("--flow", action="store_true", help="one-line arrow summary instead of the table")
    add_model_arg_option(p)
    p.set_defaults(func=_trace)

    p = sub.add_parser("info", help="params and GMACs per stage, shapes, activation memory, aliases, layouts")
    p.add_argument("model", help="registered model name or alias, or a run folder / checkpoint file of ours")
    p.add_argument("--img-size", type=positive_int, default=None, help="input size (default: the preset's)")
    p.add_argument("--batch-size", type=int, default=1, help="batch for FLOPs and activation memory (default: 1)")
    add_model_arg_option(p)
    p.set_defaults(func=_info)

    # allow_abbrev=False: an option is taken only as spelled (``--out`` is not ``--output``)
    p = sub.add_parser("attn", help="write attention heat maps over an image as PNG", allow_abbrev=False,
                       description="Draw where a model attends in one image: the input beside the map overlaid, "
                                   "with a colour bar, the layers / heads shown and the predicted class. "
                                   "MODEL may be a run folder or checkpoint of ours (it says which model it holds).")
    p.add_argument("model", help="registered model name or alias, or a run folder / checkpoint of ours")
    p.add_argument("image", help="image file (PNG, JPEG, ...; any Pillow mode), read with the model's eval "
                                 "preprocessing (resize, crop, normalisation; NaFlex: its own aspect, see --naflex), "
                                 "as predict reads it")
    p.add_argument("--checkpoint", default=None,
                   help="weights: a run folder, model.safetensors / checkpoint.safetensors (which name their "
                        "model: MODEL must agree), or timm / torchvision / Hugging Face files loaded into MODEL. "
                        "Without it the maps show random weights")
    p.add_argument("--pretrained", action="store_true",
                   help="MODEL's published weights (MODEL.TAG picks a tag) from the Hugging Face hub cache; "
                        "HF_HUB_OFFLINE=1: cache only")
    p.add_argument("--layer", type=int, default=None, help="one attention layer (negative from the end)")
    p.add_argument("--head", type=int, default=None, help="one head (default: mean over heads)")
    p.add_argument("--method", default="auto", choices=["auto", "rollout", "mean", "layer"],
                   help="rollout: through all layers from the class token; mean: every layer's map averaged; "
                        "layer: one layer (--layer); auto: layer with --layer, else rollout where the model has a "
                        "class token and global attention, else mean (default: auto)")
    p.add_argument("--img-size", type=positive_int, default=None,
                   help="input size; position embeddings are resampled (default: the model's or checkpoint's)")
    _add_output(p, default=None,
                help="output folder (default: attention_maps/ in the run folder, or beside the checkpoint file; "
                     "./attention_maps without a checkpoint)")
    p.add_argument("--save-map", action="store_true", help="also save the raw token-grid map as .npy")
    p.add_argument("--tome", type=int, default=0, metavar="R",
                   help="token merging (ToMe), R tokens merged per block of a token model; the maps stay in image "
                        "space (each patch shows the merged token covering it, a key's weight shared by its "
                        "patches) (default 0: off)")
    p.add_argument("--naflex", action="store_true",
                   help="NaFlex models (family naflexvit): the image at its own aspect, resized to at most "
                        "--max-seq-len patches as `train --naflex` reads it, the map on the image's own token grid "
                        "(automatic for a run trained with --naflex; without it a NaFlex model gets the fixed-size "
                        "path: resize, centre crop)")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="with --naflex: the patch budget (default: the run's --max-seq-len, else 576)")
    add_model_arg_option(p)
    p.set_defaults(func=_attn)

    p = sub.add_parser("docs", help="regenerate docs/attention/*.md and docs/models.md from the library",
                       allow_abbrev=False)
    _add_output(p, default=None, help="docs folder to write (default: the docs/ folder of the checkout the package "
                                      "runs from, wherever the command runs; outside a checkout, required)")
    p.add_argument("--check", action="store_true", help="only check the generated text is up to date")
    p.add_argument("--no-images", action="store_true", help="skip the PNG pictures")
    p.set_defaults(func=_docs)
