"""torch.compile in the benchmark: compiling a participant, inductor freezing, dynamo's recompile limit, and
counting graphs / graph breaks (of a compiled warm-up, one traced model, or registered models on meta).

``graph_break_report(["swin*"])`` is ``vit-attention bench --graph-breaks``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..factory import create_model
from ..functional.runtime import COMPILE_MODES
from ..models.registry import get_model_entry

__all__ = ["compile_model", "with_freezing", "recompile_limit", "dynamo_graphs", "explain_graph_breaks",
           "graph_break_report", "img_hw", "in_chans"]


def img_hw(model: nn.Module) -> tuple[int, int]:
    """The input size ``(H, W)`` a model of ours is built for (its config's ``img_size``; 224 without one)."""
    size = getattr(model.cfg, "img_size", 224)
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def in_chans(model: nn.Module) -> int:
    """The input channels of a model of ours (its config's ``in_chans``; 3 without one)."""
    return int(getattr(model.cfg, "in_chans", 3))


@contextlib.contextmanager
def recompile_limit(n: int | None) -> Iterator[None]:
    """torch._dynamo's recompile limit set to ``n`` inside the block (``recompile_limit``, or ``cache_size_limit``
    on a torch that predates the rename); None leaves it alone. Past the limit dynamo runs the function eagerly:
    for the compiled FlexAttention kernel that means the unfused path, so a model with many attention shapes
    (stages, shifted / plain windows, dilations, training and inference) needs more than the default 8."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    if n is None or not hasattr(dynamo_config, name):
        yield
        return
    prev = getattr(dynamo_config, name)
    setattr(dynamo_config, name, n)
    try:
        yield
    finally:
        setattr(dynamo_config, name, prev)


def compile_model(model: nn.Module, backend: str = "inductor", mode: str = "default") -> nn.Module:
    """``torch.compile(model, backend=backend, mode=mode)`` with static shapes (the benchmark's batch never
    changes). ``mode`` is one of :data:`COMPILE_MODES`: ``"reduce-overhead"`` records CUDA graphs on a GPU
    (launch-bound small models), the ``max-autotune`` ones also tune GEMM / convolution templates."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    return torch.compile(model, backend=backend, mode=None if mode == "default" else mode,  # type: ignore[return-value]
                         dynamic=False)


def with_freezing(step: Callable[[], Any]) -> Callable[[], Any]:
    """``step`` with inductor's ``freezing`` on while it runs: the config is read when a graph compiles (the
    first call, and any recompile), so every call is wrapped. Freezing folds the parameters into the
    inference graph as constants and prepacks the GEMMs' weights (oneDNN / MKL); with autograd recording
    (training) inductor ignores it."""
    import torch._inductor.config as inductor_config

    def frozen() -> Any:
        with inductor_config.patch(freezing=True):
            return step()
    return frozen


@contextlib.contextmanager
def dynamo_graphs() -> Iterator[dict[str, Any]]:
    """Dynamo's counters over the block, filled into the yielded dict on exit: ``{"graphs", "graph_breaks",
    "break_reasons"}`` of what compiled inside (the compiled participant's warm-up: no second trace)."""
    from torch._dynamo.utils import counters

    counters.clear()
    info: dict[str, Any] = {}
    try:
        yield info
    finally:
        breaks = counters["graph_break"]
        info.update(graphs=int(counters["stats"]["unique_graphs"]), graph_breaks=int(sum(breaks.values())),
                    break_reasons=sorted({str(r).splitlines()[0][:160] for r in breaks}))


def explain_graph_breaks(model: nn.Module, x: Tensor, *, warm: bool = True) -> dict[str, Any]:
    """Trace ``model(x)`` with dynamo (no compilation): ``{"graphs", "graph_breaks", "break_reasons"}``, or
    ``{"graphs": None, "graph_breaks": None, "error"}`` when the trace fails. ``warm``: one eager call first
    (it fills the caches: the second call is the one users repeat)."""
    import torch._dynamo

    try:
        with torch.inference_mode():
            if warm:
                model(x)
            ex = torch._dynamo.explain(model)(x)
        return {"graphs": ex.graph_count, "graph_breaks": ex.graph_break_count,
                "break_reasons": sorted({str(b.reason).splitlines()[0][:160] for b in ex.break_reasons})}
    except Exception as e:
        return {"graphs": None, "graph_breaks": None, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    finally:
        torch._dynamo.reset()


def _reduced_kwargs(name: str) -> dict[str, Any]:
    """Config overrides that keep every code path of ``name`` but one block per stage."""
    import dataclasses

    entry = get_model_entry(name)
    fields = {f.name for f in dataclasses.fields(entry.config_cls)}
    kw: dict[str, Any] = {}
    if "depth" in fields:
        kw["depth"] = 1
    if "depths" in fields:
        kw["depths"] = tuple(1 for _ in entry.config().depths)
    return kw


def graph_break_report(names: Sequence[str], *, reduced: bool = True) -> list[dict[str, Any]]:
    """Dynamo-trace each model on the meta device (``reduced``: one block per stage; the code
    paths are the same) and return ``[{"model", "graphs", "graph_breaks", "break_reasons"}]``."""
    rows = []
    for name in names:
        name = get_model_entry(name).name
        with torch.device("meta"):
            model = create_model(name, **(_reduced_kwargs(name) if reduced else {})).eval()
            x = torch.randn(1, in_chans(model), *img_hw(model))
        rows.append({"model": name, **explain_graph_breaks(model, x, warm=False)})
    return rows
