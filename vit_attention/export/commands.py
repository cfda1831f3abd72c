"""``vit-attention export``: write a model (and its trained weights) as ONNX, TorchScript or an ExportedProgram."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

from ..factory import positive_int
from .core import DEFAULT_OPSET, FORMATS, INPUT_NAME, MAX_OPSET, MIN_OPSET, OUTPUT_NAME, check_output_path

VERIFY_RTOL = 1e-4


def load_for_export(name: str | None, checkpoint: str | Path | None, *, img_size: int | None = None,
                    num_classes: int | None = None) -> nn.Module:
    """The model to export, in eval mode.

    ``checkpoint``: a file of ours (``model.safetensors`` from ``save_weights``, a training
    ``checkpoint.safetensors``) or a run folder holding one: the model is what the file records
    (``name``, if given, must agree); any other checkpoint (timm, torchvision, a bare state dict)
    loads into ``create_model(name, pretrained=checkpoint)``. No checkpoint: ``name`` with its
    initial (random) weights. ``img_size`` overrides the input size (position embeddings resampled);
    ``num_classes`` the classifier's size (a foreign checkpoint's head of that size loads with it); with a file
    of ours it may repeat the recorded size but never contradict it (``ValueError`` naming ``--num-classes``: a
    new head would be random, not the trained one).
    """
    from ..factory import load_or_create_model
    from ..weights.saved import is_checkpoint_path

    if checkpoint is None and is_checkpoint_path(name):  # `export RUN`: the run says which model it holds
        name, checkpoint = None, name
    if checkpoint is None and name is not None:
        print(f"vit-attention export: no --checkpoint: {name} keeps its initial (random) weights", file=sys.stderr)
    options = {} if num_classes is None else {"num_classes": num_classes}
    model, _ = load_or_create_model(name, checkpoint, options=options, img_size=img_size,
                                    spelling={"model": "MODEL", "checkpoint": "--checkpoint",
                                              "num_classes": "--num-classes"})
    return model.eval()


def _export(args: argparse.Namespace) -> int:
    from .core import example_input, export_model, verify_onnx

    if not MIN_OPSET <= args.opset <= MAX_OPSET:
        raise ValueError(f"--opset must be in [{MIN_OPSET}, {MAX_OPSET}], got {args.opset}")
    if args.verify and args.format != "onnx":
        raise ValueError(f"--verify runs the file in onnxruntime: it needs --format onnx, got {args.format!r}")
    if args.num_classes is not None and args.num_classes < 0:
        raise ValueError(f"--num-classes must be >= 0, got {args.num_classes}")
    if args.batch_size is not None and not args.static_batch:
        raise ValueError(f"--batch-size {args.batch_size} is the batch of a static graph: give --static-batch too "
                         "(without it the batch is free)")
    if args.static_batch and args.format == "torchscript":
        raise ValueError("--static-batch applies to --format onnx and exported-program; a --format torchscript "
                         "trace keeps the batch free")
    static = (args.batch_size or 1) if args.static_batch else None  # the batch the graph is fixed at
    output = check_output_path(args.output, option="--output")
    if args.format == "exported-program" and output.suffix != ".pt2":
        raise ValueError(f"--output {output} must end in '.pt2' for --format exported-program "
                         "(torch.export.load reads only such names)")
    try:
        if args.format == "onnx" or args.verify:
            from .core import require

            require("onnx", "--format onnx")
            if args.verify:
                require("onnxruntime", "--verify")
        model = load_for_export(args.model, args.checkpoint, img_size=args.img_size, num_classes=args.num_classes)
        dtype = next(model.parameters()).dtype
        if dtype != torch.float32:  # a checkpoint saved in bf16 / fp16 comes back in it; deploy float32
            print(f"vit-attention export: the weights are {str(dtype).removeprefix('torch.')}; exporting in "
                  "float32", file=sys.stderr)
            model.float()
        example = None if static is None else example_input(model, static)
        export_model(model, output, args.format, dynamic_batch=static is None, opset=args.opset,
                     example_input=example)
        errors = {}
        if args.verify:  # a free batch at 1 and 3; a static graph at its own batch
            errors = verify_onnx(model, output, **({} if static is None else {"batch_sizes": (static,)}))
    except ModuleNotFoundError as e:
        print(f"vit-attention export: error: {e}", file=sys.stderr)
        return 2
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    batch = "batch" if static is None else str(static)
    inp, out = f"[{batch}, {cfg.in_chans}, {size[0]}, {size[1]}]", f"[{batch}, {cfg.num_classes}]"
    if args.format == "onnx":
        what = f"ONNX opset {args.opset}: {INPUT_NAME} {inp} -> {OUTPUT_NAME} {out}"
    else:
        what = f"{args.format}: forward(x {inp}) -> logits {out}"
    print(f"wrote {output} ({output.stat().st_size / 2**20:.1f} MiB), {what}")
    if errors:
        worst = max(errors.values())
        print("onnxruntime vs eager, max relative difference: "
              + ", ".join(f"batch {b}: {e:.1e}" for b, e in errors.items()))
        if worst > VERIFY_RTOL:
            print(f"vit-attention export: error: onnxruntime differs from eager by {worst:.1e} > {VERIFY_RTOL:.0e}",
                  file=sys.stderr)
            return 1
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``export``."""
    p = sub.add_parser(
        "export", help="write a model as ONNX, TorchScript or a torch.export program",
        description="Export MODEL (and/or the model a --checkpoint records) in eval mode. ONNX: input "
        f"'{INPUT_NAME}' [batch, C, H, W] float32, output '{OUTPUT_NAME}' [batch, num_classes], checked with "
        "onnx.checker (needs `pip install vit_attention[onnx]`). TorchScript / exported-program: forward(x) -> "
        "logits. The file is written atomically (temp file, then rename).")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="registered name or alias (default: the model the --checkpoint records)")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="weights to export: a run folder, model.safetensors / checkpoint.safetensors of ours, or "
                   "a timm / torchvision / bare state-dict file (then MODEL is required) (default: none, "
                   "random initial weights)")
    p.add_argument("--format", choices=FORMATS, default="onnx", help="output format (default: %(default)s)")
    p.add_argument("--output", "-o", required=True, metavar="FILE",
                   help="file to write (parent folders are created; an existing file is replaced; "
                   "exported-program: must end in .pt2)")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                   help=f"ONNX opset, {MIN_OPSET}-{MAX_OPSET} (default: %(default)s)")
    p.add_argument("--static-batch", action="store_true",
                   help="fix the batch dimension at --batch-size (default: dynamic batch; ONNX and exported-program)")
    p.add_argument("--batch-size", type=positive_int, default=None, metavar="N",
                   help="the batch a --static-batch graph takes (default: 1)")
    p.add_argument("--img-size", type=positive_int, default=None,
                   help="input size H = W (default: the model's; position embeddings are resampled)")
    p.add_argument("--num-classes", type=int, default=None,
                   help="classifier size (default: the checkpoint's for files of ours, else the preset's; a "
                   "foreign checkpoint with another head size needs it)")
    p.add_argument("--verify", action="store_true",
                   help="run the ONNX file in onnxruntime at batch 1 and 3 (a --static-batch file: at its batch) and "
                   "compare with eager PyTorch; exit 1 "
                   f"above {VERIFY_RTOL:.0e} relative difference (default: off)")
    p.set_defaults(func=_export)
