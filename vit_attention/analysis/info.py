"""``vit-attention info MODEL``: parameters, FLOPs, shapes, activation memory, aliases, checkpoint layouts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..factory import create_model
from ..models.registry import aliases_of, get_model_entry
from .flops import flops
from .recording import record_forward

__all__ = ["ModelInfo", "model_info", "activation_bytes"]


@dataclass
class ModelInfo:
    """What ``info`` reports about one registered model at one input size."""

    name: str
    family: str
    aliases: list[str]
    input_shape: tuple[int, ...]
    output_shapes: list[tuple[int, ...]]
    params: int
    params_by_stage: dict[str, int]
    macs: int
    macs_by_stage: dict[str, int]
    activation_bytes: int
    layouts: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def format(self) -> str:
        """Human-readable report."""
        B = self.input_shape[0]
        lines = [f"model:         {self.name} ({self.family})",
                 f"aliases:       {', '.join(self.aliases) or '-'}",
                 f"input shape:   {list(self.input_shape)}",
                 f"output shape:  {', '.join(str(list(s)) for s in self.output_shapes)}",
                 f"parameters:    {self.params:,} ({self.params / 1e6:.2f} M)",
                 f"GMACs:         {self.macs / 1e9:.3f} (batch {B}; {self.macs / B / 1e9:.3f} per image)",
                 f"activations:   ~{self.activation_bytes / 2 ** 20:,.1f} MiB for batch {B} in fp32 (training: "
                 "every layer output + attention weights kept for backward)",
                 f"loads:         timm / ours (native keys), {', '.join(self.layouts) or '-'}",
                 "", f"{'stage':14s} {'params':>14s} {'GMACs':>10s}"]
        for key in sorted(set(self.params_by_stage) | set(self.macs_by_stage), key=_stage_order(self)):
            lines.append(f"{key or '(root)':14s} {self.params_by_stage.get(key, 0):>14,d} "
                         f"{self.macs_by_stage.get(key, 0) / 1e9:>10.4f}")
        return "\n".join(lines)


def _stage_order(info: ModelInfo) -> Any:
    order = list(info.macs_by_stage) + [k for k in info.params_by_stage if k not in info.macs_by_stage]
    return lambda k: order.index(k) if k in order else len(order)


def activation_bytes(model: nn.Module, input_shape: tuple[int, ...], *, bytes_per_element: int = 4) -> int:
    """Estimate of the activations a training step keeps: every leaf module's output plus every
    attention weight matrix ``[*b, N, M]`` (explicit path), at ``bytes_per_element``.

    ``input_shape`` is the model input (e.g. ``[B, Cin, H, W]``); the attention core may take any
    number of leading batch dims (``[B, nh, N, hd]`` queries, gathered neighbourhoods and halos
    ``[B, N, nh, 1, hd]`` with ``K²`` keys each), so the weights count as ``prod(q[:-1]) · M``.
    Returns bytes.
    """
    rec = record_forward(model, input_shape)
    total = 0
    for call in rec.calls:
        if any(True for _ in call.module.children()) or isinstance(call.module, (nn.Identity, nn.Dropout)):
            continue
        total += sum(math.prod(s) for s in call.out_shapes)
    for att in rec.attention:  # weights [*b, N, M]: any leading dims (gathered neighbourhoods: [B, N, nh, 1, K²])
        total += math.prod(att.q[:-1]) * att.k[-2]
    return total * bytes_per_element


def model_info(name: str, *, img_size: int | None = None, batch_size: int = 1, num_classes: int | None = None,
               **overrides: Any) -> ModelInfo:
    """Build ``name`` on the meta device (``overrides``: config options, as :func:`create_model` takes them) and
    collect its :class:`ModelInfo` (instant for any size)."""
    from ..weights.layouts import converters_for  # weights sits above models; imported lazily

    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    entry = get_model_entry(name)
    with torch.device("meta"):
        model = create_model(entry.name, img_size=img_size, num_classes=num_classes, **overrides).eval()
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    shape = (batch_size, cfg.in_chans, *size)
    report = flops(model, shape)  # the same per-stage MACs and parameters `flops` reports
    import vit_attention.weights  # noqa: F401  (registers the converters)

    layouts = [c.layout for c in converters_for(entry.family)]
    return ModelInfo(entry.name, entry.family, aliases_of(entry.name), shape, report.output_shapes, report.params,
                     report.params_by_stage, report.total, report.stages, activation_bytes(model, shape),
                     sorted(dict.fromkeys(layouts)), cfg.to_dict())

