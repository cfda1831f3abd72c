"""FLOPs and parameters: analytic (per mechanism, per module, per stage) and measured.

Convention (the one of timm's tables and the papers): **multiply-adds (MACs)**, reported as
GMACs; "FLOPs" in the ViT / DeiT / Swin papers means the same number. Counted:

* matrix products: ``Linear`` (``prod(in[:-1]) · in · out``), convolutions
  (``out.numel() · Cin/groups · prod(kernel)``), the two products of attention
  (``B·nh·N·M·(hd + hdv)``);
* normalisation layers, as fvcore (which timm's tables use) counts them: ``numel · 5``
  with an affine transform, ``· 4`` without (LayerNorm, GroupNorm, BatchNorm).

Not counted (as in the published figures): biases, softmax, activations, residual adds, position
embeddings, masks, relative-position biases, LayerScale.

Every mechanism declares its own cost with a ``flops(input_shape)`` method (e.g. global MHSA
``4·N·C² + 2·N²·C``, Swin window attention ``4·hw·C² + 2·M²·hw·C``); :func:`flops` uses that method
for every mechanism called on a single input and the formulas above for all other layers.
:func:`measure_flops` counts the same thing with ``torch.utils.flop_counter.FlopCounterMode``
(which reports FLOPs = 2·MACs for matrix products; we halve it), and the test suite asserts the
two agree within 1 % for every registered mechanism and model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from ..attention.base import AttentionModule
from ..functional import fast_paths
from ..functional.tome import matching_costs
from .recording import ModuleCall, Recording, as_input, meta_state, module_device, record_forward

__all__ = ["FlopReport", "flops", "measure_flops", "count_params", "stage_of", "attention_complexity",
           "complexity_table", "layer_macs"]

_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_STAGE_CONTAINERS = ("layers", "stages")


def stage_of(name: str) -> str:
    """The stage a module / parameter name belongs to.

    The first component of the name (``patch_embed``, ``blocks``, ``norm``, ``head``), except for
    hierarchical models whose stages live in ``layers`` / ``stages`` (``layers.2.blocks.1...`` ->
    ``layers.2``). The root is ``""``.
    """
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] in _STAGE_CONTAINERS and parts[1].isdigit():
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def layer_macs(module: nn.Module, in_shape: Sequence[int], out_shape: Sequence[int]) -> int:
    """Multiply-adds of one call of a plain layer (Linear, conv, norm); 0 for anything else.

    ``in_shape`` / ``out_shape`` are the shapes of its first input and its output.
    """
    if isinstance(module, nn.Linear):
        return math.prod(in_shape[:-1]) * module.in_features * module.out_features
    if isinstance(module, _CONVS):
        k = math.prod(module.kernel_size)
        return math.prod(out_shape) * (module.in_channels // module.groups) * k
    if isinstance(module, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
        k = math.prod(module.kernel_size)
        return math.prod(in_shape) * (module.out_channels // module.groups) * k
    if isinstance(module, _NORMS):
        affine = bool(getattr(module, "elementwise_affine", getattr(module, "affine", False)))
        return math.prod(in_shape) * (5 if affine else 4)
    return 0


def _self_costed(call: ModuleCall) -> bool:
    """A call costed by the module's own ``flops(input_shape, ...)``.

    A registered mechanism is, whatever grid or speed fields its AttentionCall had (``feat_size``,
    ``num_prefix_tokens``, ``residual``), except with another tensor in it (a ``context``: cross-attention
    is costed by its layers and the attention core). Any other module with a ``flops`` method only when
    called on one input.
    """
    if not callable(getattr(call.module, "flops", None)) or call.arg_shape is None:
        return False
    if isinstance(call.module, AttentionModule):  # the base's flops (None): no closed form, count what runs inside
        if not call.module.provides("flops"):
            return False
        return call.n_positional_tensors == 1 and set(call.tensor_kwargs) <= {"residual"}
    return call.n_tensor_args == 1 and len(call.in_shapes) == 1


def _own_cost(call: ModuleCall) -> int:
    """``module.flops(input_shape)``, with the grid (``feat_size=``) when the call had one (a mechanism's
    AttentionCall)."""
    assert call.arg_shape is not None
    if call.feat_size is not None:
        return int(call.module.flops(call.arg_shape, feat_size=call.feat_size))
    return int(call.module.flops(call.arg_shape))


@dataclass
class FlopReport:
    """Analytic cost of one forward: MACs per costed module, per stage, and in total; parameters.

    ``modules`` maps each costed module name (a layer, or a mechanism costed by its own
    ``flops`` method, or ``name[attention]`` for attention calls made outside any mechanism) to
    its MACs summed over calls. ``stages`` sums them by :func:`stage_of`.
    """

    input_shape: tuple[int, ...]
    output_shapes: list[tuple[int, ...]]
    total: int
    modules: dict[str, int]
    stages: dict[str, int]
    params: int
    params_by_stage: dict[str, int]
    kinds: dict[str, str] = field(default_factory=dict)

    @property
    def gmacs(self) -> float:
        """Total in GMACs (10⁹ multiply-adds)."""
        return self.total / 1e9

    def table(self, *, by: str = "stage") -> str:
        """A plain-text table ``by="stage"`` or ``by="module"`` (MACs, share, params per stage)."""
        rows = self.stages if by == "stage" else self.modules
        if by not in ("stage", "module"):
            raise ValueError(f"by must be 'stage' or 'module', got {by!r}")
        width = max([len(k) for k in rows] + [12])
        lines = [f"{'stage' if by == 'stage' else 'module':{width}s} {'GMACs':>10s} {'share':>7s}"
                 + (f" {'params':>12s}" if by == "stage" else f"  {'kind'}")]
        for k, v in rows.items():
            share = 100.0 * v / self.total if self.total else 0.0
            tail = f" {self.params_by_stage.get(k, 0):>12,d}" if by == "stage" else f"  {self.kinds.get(k, '')}"
            lines.append(f"{k or '(root)':{width}s} {v / 1e9:>10.4f} {share:>6.1f}%" + tail)
        lines.append(f"{'total':{width}s} {self.total / 1e9:>10.4f} {100.0 if self.total else 0.0:>6.1f}%"
                     + (f" {self.params:>12,d}" if by == "stage" else ""))
        return "\n".join(lines)


def count_params(model: nn.Module) -> tuple[int, dict[str, int]]:
    """Total parameters (shared ones once) and their split by :func:`stage_of`."""
    by_stage: dict[str, int] = {}
    total = 0
    for name, p in model.named_parameters():
        total += p.numel()
        key = stage_of(name) if "." in name else ""  # the root's own tensors (class token, pos embed)
        by_stage[key] = by_stage.get(key, 0) + p.numel()
    return total, by_stage


def _costs(rec: Recording) -> tuple[dict[str, int], dict[str, str]]:
    costs: dict[str, int] = {}
    kinds: dict[str, str] = {}
    covered: list[tuple[int, int]] = []  # (start, end) event ranges of self-costed calls

    def inside(idx: int) -> bool:
        return any(s < idx < e for s, e in covered)

    for call in rec.calls:
        if inside(call.index):
            continue
        if _self_costed(call):
            macs = _own_cost(call)
            covered.append((call.index, call.end))
            kind = getattr(call.module, "attention_name", type(call.module).__name__)
        elif not any(True for _ in call.module.children()) and call.in_shapes and call.out_shapes:
            macs = layer_macs(call.module, call.in_shapes[0], call.out_shapes[0])
            kind = type(call.module).__name__
            if not macs:
                continue
        else:
            continue
        costs[call.name] = costs.get(call.name, 0) + macs
        kinds[call.name] = kind
    for att in rec.attention:
        if inside(att.index):
            continue
        key = f"{att.module}[attention]"
        costs[key] = costs.get(key, 0) + att.macs
        kinds[key] = "attention core"
    return costs, kinds


def flops(model_or_module: nn.Module, input_shape: Sequence[int] | Tensor, *, device: str | None = "meta"
          ) -> FlopReport:
    """Analytic multiply-adds of one forward of ``model_or_module`` on ``input_shape``.

    Args:
        model_or_module: a model (images ``[B, Cin, H, W]``), a mechanism (``[B, N, C]`` or
            ``[B, H, W, C]``) or any module built from them.
        input_shape: the input's shape (or a tensor).
        device: ``"meta"`` (default: shapes only, instant) or ``None`` to run where the model lives.

    Returns:
        a :class:`FlopReport` (``.total`` MACs, ``.gmacs``, ``.modules``, ``.stages``, ``.table()``).
    """
    with matching_costs() as matching:  # token merging's similarity products (no module of their own)
        rec = record_forward(model_or_module, input_shape, device=device)
    costs, kinds = _costs(rec)
    if matching:
        costs["token merging"] = sum(matching)
        kinds["token merging"] = "bipartite matching (cosine similarities)"
    stages: dict[str, int] = {}
    for name, macs in costs.items():
        key = stage_of(name.replace("[attention]", ""))
        stages[key] = stages.get(key, 0) + macs
    params, params_by_stage = count_params(model_or_module)
    for key in params_by_stage:
        stages.setdefault(key, 0)
    return FlopReport(rec.input_shape, rec.output_shapes, sum(costs.values()), costs, stages, params,
                      params_by_stage, kinds)


def _norm_flops(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """FlopCounterMode formula for normalisation ops, in its FLOPs unit (2 per multiply-add)."""
    x_shape = args[0]
    weight = args[1] if len(args) > 1 else None
    return 2 * math.prod(x_shape) * (5 if weight is not None else 4)


def _group_norm_flops(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return 2 * math.prod(args[0]) * (5 if args[1] is not None else 4)


def _sdpa_cpu_flops(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """CPU fused attention (FlopCounterMode has no formula for it): ``2·B·nh·N·M·(hd + hdv)``."""
    B, nh, N, hd = q
    return 2 * B * nh * N * k[-2] * (hd + v[-1])


def _onednn_linear_flops(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """oneDNN ``_linear_pointwise`` (plain ``(x, w, b, ...)`` or binary ``(x, other, w, b, ...)``): 2·M·Cin·Cout."""
    x = args[0]
    w = args[2] if len(args) > 2 and isinstance(args[2], (tuple, list)) and len(args[2]) == 2 and \
        isinstance(args[1], (tuple, list)) and len(args[1]) == len(x) else args[1]
    return 2 * math.prod(x[:-1]) * w[0] * w[1]


def _extra_mapping() -> dict[Any, Any]:
    aten = torch.ops.aten
    mapping: dict[Any, Any] = {aten.native_layer_norm: _norm_flops, aten.native_group_norm: _group_norm_flops,
                               aten.native_batch_norm: _norm_flops}
    cpu_sdpa = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None:
        mapping[cpu_sdpa] = _sdpa_cpu_flops
    onednn_linear = fast_paths.linear_pointwise_op()  # CPU inference fast path of vit_attention.functional.linear
    if onednn_linear is not None:
        mapping[onednn_linear] = _onednn_linear_flops
    for name in ("_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                 "_native_batch_norm_legit_functional"):
        op = getattr(aten, name, None)
        if op is not None:
            mapping[op] = _norm_flops
    return mapping


def measure_flops(model_or_module: nn.Module, input_shape: Sequence[int] | Tensor, *, device: str | None = "meta"
                  ) -> tuple[int, dict[str, int]]:
    """Measured multiply-adds with ``torch.utils.flop_counter.FlopCounterMode``.

    Counts what the operators actually do (matrix products, convolutions, fused attention, the
    oneDNN linear kernels of the CPU fast path) plus normalisation ops by the fvcore rule of
    :func:`flops`. Returns ``(total MACs, MACs per
    module name)``; the per-module counts are inclusive (a module includes its children).
    """
    dev = module_device(model_or_module) if device is None else torch.device(device)
    x = as_input(input_shape, dev)
    counter = FlopCounterMode(display=False, custom_mapping=_extra_mapping())
    with counter:  # not under no_grad: FlopCounterMode's module tracker needs autograd state
        if dev.type == "meta" and module_device(model_or_module).type != "meta":
            torch.func.functional_call(model_or_module, meta_state(model_or_module), (x,), strict=False)
        else:
            model_or_module(x)
    per_module: dict[str, int] = {}
    for key, ops in counter.get_flop_counts().items():
        if key == "Global":
            continue
        name = key.split(".", 1)[1] if "." in key else ""
        per_module[name] = sum(ops.values()) // 2
    return counter.get_total_flops() // 2, per_module


# ----------------------------------------------------------------------------- global vs window attention
def attention_complexity(h: int, w: int, dim: int, window_size: int) -> dict[str, int]:
    """The Swin paper's (Liu et al. 2021, Eq. 1-2) costs of one attention layer on an ``h x w x C`` map.

    ``Ω(MSA) = 4·hw·C² + 2·(hw)²·C`` and ``Ω(W-MSA) = 4·hw·C² + 2·M²·hw·C`` (``M`` = window size),
    in multiply-adds; softmax is not counted. Returns ``{"msa", "w_msa", "projections"}``.
    """
    for n, v in (("h", h), ("w", w), ("dim", dim), ("window_size", window_size)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{n} must be a positive int, got {v!r}")
    hw = h * w
    proj = 4 * hw * dim * dim
    return {"msa": proj + 2 * hw * hw * dim, "w_msa": proj + 2 * window_size * window_size * hw * dim,
            "projections": proj}


def complexity_table(sizes: Sequence[tuple[int, int, int]] = ((56, 56, 96), (28, 28, 192), (14, 14, 384),
                                                              (7, 7, 768), (128, 128, 96)),
                     window_size: int = 7) -> str:
    """Markdown table of :func:`attention_complexity` for feature maps ``(h, w, C)``."""
    lines = [f"| feature map h×w×C | Ω(MSA) GMACs | Ω(W-MSA) GMACs, M={window_size} | MSA / W-MSA |",
             "|---|---:|---:|---:|"]
    for h, w, c in sizes:
        cost = attention_complexity(h, w, c, window_size)
        lines.append(f"| {h}×{w}×{c} | {cost['msa'] / 1e9:.3f} | {cost['w_msa'] / 1e9:.3f} | "
                     f"{cost['msa'] / cost['w_msa']:.2f}× |")
    return "\n".join(lines)
