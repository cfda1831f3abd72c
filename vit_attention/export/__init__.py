"""Deployment formats: ONNX (checked with ``onnx.checker``), TorchScript and ``torch.export`` programs.

    >>> from vit_attention.export import to_onnx, verify_onnx
    >>> to_onnx(model, "model.onnx")              # pixel_values [batch, 3, H, W] -> logits [batch, classes]
    >>> verify_onnx(model, "model.onnx")          # {batch: max relative difference to eager}

From the command line: ``vit-attention export MODEL --checkpoint RUN --format onnx --output model.onnx``.
"""

from .core import (
    DEFAULT_OPSET,
    FORMATS,
    INPUT_NAME,
    MAX_OPSET,
    MIN_OPSET,
    OUTPUT_NAME,
    check_output_path,
    example_input,
    export_model,
    onnx_metadata,
    output_names,
    to_exported_program,
    to_onnx,
    to_torchscript,
    verify_onnx,
)

__all__ = ["DEFAULT_OPSET", "FORMATS", "INPUT_NAME", "MAX_OPSET", "MIN_OPSET", "OUTPUT_NAME", "check_output_path",
           "example_input", "export_model", "onnx_metadata", "output_names", "to_exported_program", "to_onnx",
           "to_torchscript", "verify_onnx"]
