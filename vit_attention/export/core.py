"""Export a model to ONNX, TorchScript or a ``torch.export`` ExportedProgram.

Every writer

* exports the model in eval mode (dropout and drop-path off) and restores the mode it had;
* traces a batch of 2 (never 1, which an exporter may specialise) and, by default, leaves the
  batch dimension free, so the written model takes any batch size;
* writes atomically (:func:`vit_attention.weights.io.atomic_write`): a temp file in the same
  folder, then ``os.replace``; an interrupted export leaves the old file or none, never half a file.

Names in the written models:

* ONNX: input ``pixel_values`` ``[batch, in_chans, H, W]`` float32, output ``logits``
  ``[batch, num_classes]`` (a distilled DeiT in eval mode returns the mean of its two heads);
  a features model (``create_model(..., features_only=True)``) has one output per map instead,
  ``feature_0``, ``feature_1``, ... ``[batch, C_k, H_k, W_k]`` (:func:`output_names`);
* TorchScript / ExportedProgram: the model's ``forward(x)``, ``x`` ``[batch, in_chans, H, W]``
  -> logits ``[batch, num_classes]``.

ONNX uses PyTorch's TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``): while it
traces, the CPU fast paths step aside (:func:`vit_attention.functional.runtime.capturing`), so the
graph holds only portable ops. (The dynamo-based exporter, ``dynamo=True``, needs ``onnxscript``; with
torch 2.13 and onnxscript 0.7.2 it exports ViT but fails on Swin / SwinV2 while decomposing the
graph: a ``view`` of the attention output that its decomposition of SDPA makes non-contiguous.)
``onnx`` (for ``onnx.checker``) and ``onnxruntime`` (for
:func:`verify_onnx` and ``bench --runtime onnxruntime``) come with ``pip install vit_attention[onnx]``.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..weights.io import atomic_write

__all__ = ["FORMATS", "MIN_OPSET", "MAX_OPSET", "DEFAULT_OPSET", "INPUT_NAME", "OUTPUT_NAME",
           "to_onnx", "onnx_metadata", "to_torchscript", "to_exported_program", "export_model", "verify_onnx",
           "example_input", "check_output_path", "require", "output_names"]

FORMATS = ("onnx", "torchscript", "exported-program")
# scaled_dot_product_attention has an ONNX symbolic from opset 14; the TorchScript exporter stops at 20.
MIN_OPSET = 14
MAX_OPSET = 20
DEFAULT_OPSET = 17  # LayerNormalization is a single op from 17; every onnxruntime since 1.11 runs it
INPUT_NAME = "pixel_values"
OUTPUT_NAME = "logits"
TRACE_BATCH = 2
_INSTALL_HINT = "pip install vit_attention[onnx]"
_PROTOBUF_LIMIT = 2**31 - 2**20  # one ONNX protobuf file; a little headroom for the graph itself


def require(module: str, purpose: str) -> Any:
    """Import ``module`` or raise ``ModuleNotFoundError`` saying what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise ModuleNotFoundError(f"{purpose} needs the {module!r} package, which is not installed: "
                                  f"{_INSTALL_HINT}", name=module) from None


def output_names(model: nn.Module) -> list[str]:
    """Names of the ONNX outputs: ``["logits"]``, or ``feature_{k}`` per map of a features model."""
    from ..models.features import FeaturesMixin  # export sits above models

    if isinstance(model, FeaturesMixin):
        return [f"feature_{k}" for k in range(len(model.feature_info))]
    return [OUTPUT_NAME]


def _input_hw(model: nn.Module) -> tuple[int, int]:
    cfg = getattr(model, "cfg", None)
    size = getattr(cfg, "img_size", None)
    if size is None:
        raise ValueError("example_input: the model has no cfg.img_size; pass example_input= a tensor [B, C, H, W]")
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def example_input(model: nn.Module, batch_size: int = TRACE_BATCH, *, seed: int = 0) -> Tensor:
    """A seeded float input ``[batch_size, in_chans, H, W]`` sized from ``model.cfg``, on the model's device."""
    in_chans = int(getattr(getattr(model, "cfg", None), "in_chans", 3))
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    x = torch.randn(batch_size, in_chans, *_input_hw(model), generator=torch.Generator().manual_seed(seed))
    return x.to(device)


def check_output_path(path: str | Path, *, option: str = "path") -> Path:
    """Fail early, naming ``option``, when ``path`` cannot be written (before a long export).

    A folder, a path under a regular file, or a folder without write permission raises
    ``OSError``; missing parent folders are fine (they are created).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{option} {path} is a folder; give a file name, e.g. {path / 'model.onnx'}")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"{option} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        if _read_only(parent):  # a read-only mount: permissions would not help
            raise OSError(errno.EROFS, f"{option} {path}: {parent} is on a read-only file system; give a path on a "
                                       "writable one")
        raise PermissionError(f"{option} {path}: no permission to write in {parent}")
    return path


def _read_only(folder: Path) -> bool:
    """Whether ``folder`` lies on a file system mounted read-only (``statvfs``'s ``ST_RDONLY``; False where unknown)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (AttributeError, OSError):  # no statvfs (Windows)
        return False


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """The model in eval mode, no gradients; restores the previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


def _check_opset(opset: int) -> int:
    if not isinstance(opset, int) or isinstance(opset, bool) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset must be an int in [{MIN_OPSET}, {MAX_OPSET}], got {opset!r} "
                         f"({MIN_OPSET}: the first with an attention symbolic; {MAX_OPSET}: the exporter's newest)")
    return opset


def _trace_input(model: nn.Module, x: Tensor | None) -> Tensor:
    if x is None:
        return example_input(model)
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"example_input must be a tensor [B, C, H, W], got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    return x


def to_onnx(model: nn.Module, path: str | Path, *, dynamic_batch: bool = True, opset: int = DEFAULT_OPSET,
            example_input: Tensor | None = None, check: bool = True) -> Path:
    """Write ``model`` as ONNX to ``path`` (atomically) and return ``path``.

    The graph takes ``pixel_values`` ``[batch, in_chans, H, W]`` (float32; ``H, W`` fixed at the
    model's ``img_size`` or ``example_input``'s) and returns ``logits`` ``[batch, num_classes]``
    (a features model: :func:`output_names`, one map ``[batch, C_k, H_k, W_k]`` each).
    ``dynamic_batch``: the batch dimension is symbolic (``"batch"``); else fixed at the traced
    batch (``example_input``'s, default 2). ``opset``: in ``[MIN_OPSET, MAX_OPSET]``. ``check``:
    run ``onnx.checker.check_model`` (with shape inference) on the written file. The file's
    ``metadata_props`` hold the model's name, config and data config (:func:`onnx_metadata`).
    Needs the ``onnx`` package (``pip install vit_attention[onnx]``).
    """
    _check_opset(opset)
    path = check_output_path(path)
    onnx = require("onnx", "ONNX export")
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    if size >= _PROTOBUF_LIMIT:
        raise ValueError(f"the model holds {size / 2**30:.1f} GiB of weights, over the 2 GiB limit of one ONNX "
                         "file; export it as format 'exported-program' (external-data ONNX is not supported yet)")
    x = _trace_input(model, example_input)
    outputs = output_names(model)
    axes = {name: {0: "batch"} for name in (INPUT_NAME, *outputs)} if dynamic_batch else None

    def write(tmp: str) -> None:
        with _eval_mode(model), warnings.catch_warnings():
            # the tracer's notes on Python ints taken from shapes: expected, the graph is checked below
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(model, (x,), tmp, dynamo=False, opset_version=opset, input_names=[INPUT_NAME],
                              output_names=outputs, dynamic_axes=axes, do_constant_folding=True)
        proto = onnx.load(tmp)
        onnx.helper.set_model_props(proto, onnx_metadata(model))
        onnx.save(proto, tmp)
        if check:
            onnx.checker.check_model(tmp, full_check=True)

    return atomic_write(path, write)


def onnx_metadata(model: nn.Module) -> dict[str, str]:
    """The ``metadata_props`` written into the ONNX file: what :func:`vit_attention.save_weights` records
    (``format``, ``model``, ``config``, ``data_config``: mean / std / crop / interpolation as JSON) plus
    ``input`` and ``output`` descriptions; read them with ``onnxruntime``'s ``get_modelmeta().custom_metadata_map``."""
    from ..weights.io import model_metadata

    meta = dict(model_metadata(model))
    meta["input"] = f"{INPUT_NAME}: float32 [batch, in_chans, H, W]"
    outputs = output_names(model)
    if outputs == [OUTPUT_NAME]:
        meta["output"] = f"{OUTPUT_NAME}: float32 [batch, num_classes]"
    else:
        info = model.feature_info
        meta["output"] = "; ".join(f"{n}: float32 [batch, {c}, H/{r}, W/{r}]"
                                   for n, c, r in zip(outputs, info.channels(), info.reduction()))
    return meta


def verify_onnx(model: nn.Module, path: str | Path, *, batch_sizes: Sequence[int] = (1, 3),
                providers: Sequence[str] = ("CPUExecutionProvider",)) -> dict[int, float]:
    """Run the ONNX file at ``path`` in onnxruntime next to eager ``model`` (eval mode).

    Returns ``{batch_size: max |onnx - eager| / max |eager|}`` (the worst output) over seeded inputs
    ``[batch_size, in_chans, H, W]``. Needs ``onnxruntime`` (``pip install vit_attention[onnx]``).
    """
    ort = require("onnxruntime", "running an ONNX model")
    sess = ort.InferenceSession(str(path), providers=list(providers))
    (inp,) = sess.get_inputs()
    errors: dict[int, float] = {}
    with _eval_mode(model):
        for b in batch_sizes:
            x = example_input(model, b, seed=b)
            eager = model(x)
            refs = [t.float().cpu() for t in (eager if isinstance(eager, (list, tuple)) else [eager])]
            outs = sess.run(output_names(model), {inp.name: x.cpu().numpy()})
            worst = 0.0
            for name, out, ref in zip(output_names(model), outs, refs, strict=True):
                got = torch.from_numpy(out)
                if got.shape != ref.shape:
                    raise ValueError(f"{path}: output {name} shape {tuple(got.shape)} at batch {b}, "
                                     f"eager gives {tuple(ref.shape)}")
                worst = max(worst, float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12)))
            errors[b] = worst
    return errors


def to_torchscript(model: nn.Module, path: str | Path, *, example_input: Tensor | None = None) -> Path:
    """Write ``torch.jit.trace(model)`` to ``path`` (atomically; load with ``torch.jit.load``).

    ``forward(x)``: ``x`` ``[batch, in_chans, H, W]`` -> logits ``[batch, num_classes]``; the
    trace records shapes as operations, so the batch size stays free.
    """
    path = check_output_path(path)
    x = _trace_input(model, example_input)

    def write(tmp: str) -> None:
        with _eval_mode(model), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            traced = torch.jit.trace(model, (x,), check_trace=False)
            torch.jit.save(traced, tmp)

    return atomic_write(path, write)


def to_exported_program(model: nn.Module, path: str | Path, *, dynamic_batch: bool = True,
                        example_input: Tensor | None = None) -> Path:
    """Write ``torch.export.export(model)`` to ``path`` (``*.pt2``, atomically; ``torch.export.load(path).module()``).

    ``forward(x)``: ``x`` ``[batch, in_chans, H, W]`` -> logits ``[batch, num_classes]``.
    ``dynamic_batch``: the batch is symbolic, in the range export infers (``program.range_constraints``;
    torch 2.13 records at most 1024 for Swin); else fixed at the traced batch.
    """
    path = check_output_path(path)
    if path.suffix != ".pt2":
        raise ValueError(f"path {str(path)!r} must end in '.pt2': torch.export.load reads only such names")
    x = _trace_input(model, example_input)
    # Dim.AUTO: export infers the batch range itself (a named Dim with bounds trips torch 2.13's
    # constraint solver on Swin's window partition); the program accepts any batch >= 1
    shapes = ({0: torch.export.Dim.AUTO},) if dynamic_batch else None

    def write(tmp: str) -> None:
        with _eval_mode(model):
            # strict: dynamo traces the index builders' caches through; the non-strict tracer would
            # call them under fake mode and leave fake tensors in the caches for later eager calls
            program = torch.export.export(model, (x,), dynamic_shapes=shapes, strict=True)
        buf = io.BytesIO()  # torch.export.save wants a .pt2 name or a buffer; the temp file is neither
        torch.export.save(program, buf)
        Path(tmp).write_bytes(buf.getvalue())

    return atomic_write(path, write)


def export_model(model: nn.Module, path: str | Path, format: str = "onnx", *, dynamic_batch: bool = True,
                 opset: int = DEFAULT_OPSET, example_input: Tensor | None = None) -> Path:
    """Write ``model`` to ``path`` in ``format`` (one of :data:`FORMATS`); returns ``path``.

    ``opset`` applies to ONNX only; TorchScript traces keep the batch free whatever ``dynamic_batch``.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")
    if format == "onnx":
        return to_onnx(model, path, dynamic_batch=dynamic_batch, opset=opset, example_input=example_input)
    if format == "torchscript":
        return to_torchscript(model, path, example_input=example_input)
    return to_exported_program(model, path, dynamic_batch=dynamic_batch, example_input=example_input)
