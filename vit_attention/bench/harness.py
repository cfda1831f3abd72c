"""Side-by-side benchmark: our models against their timm / torchvision twins, interleaved round by round.

One run measures, for each model: step latency (min / median / max over rounds), images/s,
peak memory of one step, achieved GFLOP/s and its fraction of this machine's matmul peak
(a square GEMM timed in every round of the same run), and, against each reference, the per-round
speed ratio ours/theirs. ``runtimes=["onnxruntime"]`` adds our model exported to ONNX and run
in onnxruntime (inference, CPU, fp32), with its per-round ratio eager/onnxruntime. All participants
of a model run back to back inside each round, in an order that rotates from round to round, so a
noisy neighbour slows every participant of a round alike: the per-round ratio is the figure that
holds on a shared machine; absolute times do not.

``attn_backend="flex,sdpa,explicit"`` (a comma-separated list) times one participant of ours per attention
backend (``ours[flex]``, ``ours[sdpa]``, ...), copies of the same model (same weights), each with its per-round
ratio to the first one and its parity with it. A reference named ``timm-compiled`` (any reference with the
suffix ``-compiled``) is that reference under ``torch.compile`` (the ``--compile-*`` settings), its own
participant. ``keep_going=True`` records a model that fails in the notes and goes on with the next.

``run_benchmark(BenchConfig(models=[...], compare=["timm"]))`` returns a JSON-serialisable dict;
:func:`format_table` renders it as Markdown.
"""

from __future__ import annotations

import contextlib
import copy
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import set_attention_backend
from ..factory import apply_tome_option, create_model
from ..functional.runtime import COMPILE_MODES
from ..models.registry import get_model_entry
from .compile import (
    compile_model,
    dynamo_graphs,
    explain_graph_breaks,
    graph_break_report,
    img_hw,
    in_chans,
    recompile_limit,
    with_freezing,
)
from .device import autocast, synchronize
from .memory import measure_peak_memory
from .peak import MatmulPeak
from .reference import (
    REFERENCE_FACTORIES,
    ReferenceFactory,
    ReferenceUnavailable,
    build_reference_spec,
    known_references,
    library_version,
    split_compiled,
)
from .report import format_table

__all__ = ["BenchConfig", "Participant", "run_benchmark", "format_table", "count_flops", "summarise",
           "explain_graph_breaks", "graph_break_report", "compile_model", "with_freezing", "recompile_limit",
           "parse_backends", "COMPILE_MODES",
           "ATTN_BACKENDS"]


RUNTIMES = ("onnxruntime",)
ATTN_BACKENDS = ("auto", "sdpa", "explicit", "flex")  # create_model(attn_backend=)


def parse_backends(value: str | Sequence[str] | None) -> list[str | None]:
    """``--attn-backend`` as a list: ``None`` -> ``[None]`` (the models' default), ``"flex,sdpa"`` ->
    ``["flex", "sdpa"]``. Raises ``ValueError`` naming the option for an unknown, repeated or empty entry."""
    if value is None:
        return [None]
    items = [v.strip() for v in (value.split(",") if isinstance(value, str) else value)]
    expected = f"one of {', '.join(ATTN_BACKENDS)}, or a comma-separated list of them (e.g. flex,sdpa,explicit)"
    if not items or any(not v or v not in ATTN_BACKENDS for v in items):
        raise ValueError(f"--attn-backend must be {expected}, got {value!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"--attn-backend lists a backend twice: {value!r} (expected {expected})")
    return list(items)


@dataclass
class BenchConfig:
    """What to benchmark and how (the ``vit-attention bench`` options)."""

    models: Sequence[str]
    batch_size: int = 8
    img_size: int | None = None
    mode: str = "infer"  # "infer", "train" or "both"
    compare: Sequence[str] = ()
    compile: bool = False
    compile_backend: str = "inductor"
    compile_mode: str = "default"  # torch.compile(mode=): one of COMPILE_MODES (inductor only)
    compile_freeze: bool = False  # inductor freezing (weights folded as constants, prepacked GEMMs); inference
    attn_backend: str | None = None  # create_model(attn_backend=): "auto", "sdpa", "explicit", "flex"; None: default;
    #                                a comma-separated list ("flex,sdpa,explicit"): one participant of ours per backend
    tome: int = 0  # also time ours with token merging, this many tokens merged per block ("ours+tome"); 0: not
    channels_last: bool = False
    amp: str | None = None  # None or "bf16"
    device: str = "cpu"
    threads: int | None = None
    rounds: int = 5
    iters: int = 1
    warmup: int = 1
    peak_size: int | None = None
    runtimes: Sequence[str] = ()  # also time ours exported to these runtimes: "onnxruntime"
    clock: str = "wall"  # "wall" (perf_counter) or "process" (CPU seconds of this process: robust to load
    #                      from other processes when threads=1; spin-waits count with more threads)
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    keep_going: bool = False  # a model (or mode) that fails is recorded in the notes; the run goes on
    reduced: bool = False  # each model in its family's reduced form (every code path, tiny: smoke runs)
    recompile_limit: int | None = None  # torch._dynamo's recompile limit during the run (None: torch's, 8): the
    #                                     compiled FlexAttention kernel recompiles per shape / pattern on CUDA

    def model_args(self, name: str) -> tuple[dict[str, Any], int | None]:
        """``(create_model keywords, img_size)`` of ``name`` in this run: the family's reduced overrides under
        ``reduced`` (its image size unless ``img_size`` is given), then ``model_kwargs``."""
        kwargs: dict[str, Any] = {}
        img = self.img_size
        if self.reduced:
            kwargs = dict(get_model_entry(name).reduced_overrides())
            size = kwargs.pop("img_size", None)
            img = img if img is not None else size
        return {**kwargs, **self.model_kwargs}, img

    def backends(self) -> list[str | None]:
        """The attention backends of ours, one participant each (:func:`parse_backends`)."""
        return parse_backends(self.attn_backend)

    def validate(self) -> None:
        """Raise ValueError naming the option that is out of range."""
        if not self.models:
            raise ValueError("bench: give at least one MODEL name")
        if self.mode not in ("infer", "train", "both"):
            raise ValueError(f"--mode must be 'infer', 'train' or 'both', got {self.mode!r}")
        if self.amp not in (None, "bf16"):
            raise ValueError(f"--amp must be 'bf16' (or left out for fp32), got {self.amp!r}")
        for name, v in (("--batch-size", self.batch_size), ("--rounds", self.rounds), ("--iters", self.iters)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if self.clock not in ("wall", "process"):
            raise ValueError(f"--clock must be 'wall' or 'process', got {self.clock!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"--compile-mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")
        if (self.compile_mode != "default" or self.compile_freeze) and self.compile_backend != "inductor":
            raise ValueError(f"--compile-mode / --compile-freeze apply to the inductor backend only, got "
                             f"--compile-backend {self.compile_backend!r}")
        if not isinstance(self.tome, int) or isinstance(self.tome, bool) or self.tome < 0:
            raise ValueError(f"--tome must be an int >= 0 (tokens merged per block; 0 = off), got {self.tome!r}")
        self.backends()
        for lib in self.compare:
            if not lib or split_compiled(lib)[0] == "":
                raise ValueError(f"--compare: empty reference name in {list(self.compare)}; expected names from "
                                 f"{known_references()}")
        if self.recompile_limit is not None and (not isinstance(self.recompile_limit, int) or self.recompile_limit < 1):
            raise ValueError(f"--recompile-limit must be an int >= 1, got {self.recompile_limit!r}")
        for rt in self.runtimes:
            if rt not in RUNTIMES:
                raise ValueError(f"--runtime must be one of {', '.join(RUNTIMES)}, got {rt!r}")


@dataclass
class Participant:
    """One timed contender: ``step()`` runs one forward (or training step) on a fixed batch."""

    label: str
    step: Callable[[], Any]
    model: nn.Module
    times: list[float] = field(default_factory=list)  # seconds per step, one entry per round
    info: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------- steps
def _loss(out: Any, target: Tensor) -> Tensor:
    """Cross-entropy of logits ``[B, K]`` (averaged over a tuple of heads); the mean square of a feature map
    ``[B, ...]`` of more dimensions (a backbone compared on its features)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(F.cross_entropy(o.float(), target) if o.dim() == 2 else o.float().square().mean()
               for o in outs) / len(outs)  # type: ignore[return-value]


class _Method(nn.Module):
    """Calls ``model.<method>(x)`` as its forward (ours compared on ``forward_features`` with a backbone-only
    reference); the model is a submodule, so ``.to`` / ``.train`` / parameters / ``torch.compile`` see it."""

    def __init__(self, model: nn.Module, method: str) -> None:
        super().__init__()
        self.model, self.method = model, method

    def forward(self, x: Tensor) -> Any:
        return getattr(self.model, self.method)(x)


def make_step(model: nn.Module, x: Tensor, mode: str, device: torch.device, amp: str | None) -> Callable[[], Any]:
    """One inference forward (``mode="infer"``) or one forward + backward + AdamW step (``"train"``)."""
    if mode == "infer":
        model.eval()

        def infer() -> Any:
            with torch.inference_mode(), autocast(device, amp):
                return model(x)
        return infer
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    target = torch.randint(0, 10, (x.shape[0],), generator=torch.Generator().manual_seed(0)).to(device)

    def train() -> Any:
        opt.zero_grad(set_to_none=True)
        with autocast(device, amp):
            loss = _loss(model(x), target)
        loss.backward()
        opt.step()
        return loss
    return train


_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "process": time.process_time}


def count_flops(name: str, batch_size: int, img_size: int | None, mode: str,
                model_kwargs: dict[str, Any] | None = None, *, tome: int = 0, method: str | None = None) -> int | None:
    """FLOPs (``2 x`` multiply-adds) of one step of ``name``, counted on the meta device.

    Forward only for ``"infer"``; forward + backward for ``"train"`` (the optimizer is not
    counted). Counted with torch's ``FlopCounterMode``: matmuls, convolutions, attention.
    ``tome``: with token merging, this many tokens per block (the blocks at their merged sizes and the
    matching products). ``method``: count ``model.<method>(x)`` instead of ``model(x)`` (``"forward_features"``).
    """
    from torch.utils.flop_counter import FlopCounterMode

    from ..functional.runtime import FAST_PATHS, FUSED_ATTENTION

    def count(device: str, batch: int) -> int:
        with torch.device(device):
            model = create_model(name, img_size=img_size, **(model_kwargs or {}))
            x = torch.randn(batch, in_chans(model), *img_hw(model))
        if tome:
            model.set_token_merging(tome)
        model.train(mode == "train")
        fwd = model if method is None else getattr(model, method)
        # plain aten ops (matmuls the counter knows), not the fused kernels it cannot see into
        with FlopCounterMode(display=False) as counter, FAST_PATHS.override(False), FUSED_ATTENTION.override(False):
            if mode == "train":
                _loss(fwd(x), torch.zeros(batch, dtype=torch.long, device=device)).backward()
            else:
                with torch.no_grad():
                    fwd(x)
        return int(counter.get_total_flops())

    try:
        return count("meta", batch_size)
    except Exception:  # the meta device cannot run it: count one real image on CPU, scale by the batch
        try:
            return count("cpu", 1) * batch_size
        except Exception:
            return None


# ---------------------------------------------------------------------------- statistics
def summarise(values: Sequence[float]) -> dict[str, float]:
    """``{"min", "median", "max"}`` of a non-empty sequence."""
    if not values:
        raise ValueError("summarise needs at least one value")
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _rounds(participants: list[Participant], peak: MatmulPeak | None, rounds: int, iters: int,
            device: torch.device, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Time every participant twice per round, in ABBA order (A B C C B A, first one rotating): drift that
    is linear over a round cancels out of each participant's mean. Returns the peak GFLOP/s per round."""
    peaks: list[float] = []
    for r in range(rounds):
        k = r % len(participants)
        order = participants[k:] + participants[:k]
        spent = {id(p): 0.0 for p in participants}
        for p in order + order[::-1]:
            synchronize(device)
            t0 = clock()
            for _ in range(iters):
                p.step()
            synchronize(device)
            spent[id(p)] += clock() - t0
        for p in participants:
            p.times.append(spent[id(p)] / (2 * iters))
        if peak is not None:
            peaks.append(max(peak.time_once(), peak.time_once()))
    return peaks


# ---------------------------------------------------------------------------- environment
def machine_info(device: torch.device) -> dict[str, Any]:
    """CPU / GPU name, core count, threads, versions and the load average (noise indicator)."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    info: dict[str, Any] = {
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "device": str(device), "python": platform.python_version(), "torch": torch.__version__,
        "timm": library_version("timm") if "timm" in _imported() else None,
        "torchvision": library_version("torchvision") if "torchvision" in _imported() else None,
        "transformers": library_version("transformers") if "transformers" in _imported() else None,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError, AttributeError):
        info["loadavg_start"] = [round(v, 2) for v in os.getloadavg()]
    try:
        from importlib.metadata import version

        info["vit_attention"] = version("vit_attention")
    except Exception:
        info["vit_attention"] = None
    return info


def _imported() -> set[str]:
    import sys

    return {m for m in ("timm", "torchvision", "transformers") if m in sys.modules}


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    prev = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


# ---------------------------------------------------------------------------- main entry
def _parity(a: Any, b: Any) -> float:
    a = a[0] if isinstance(a, (tuple, list)) else a
    b = b[0] if isinstance(b, (tuple, list)) else b
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


def _compile_settings(cfg: BenchConfig) -> dict[str, Any]:
    return {"backend": cfg.compile_backend, "mode": cfg.compile_mode, "freeze": cfg.compile_freeze}


def run_benchmark(cfg: BenchConfig, *, references: dict[str, ReferenceFactory] | None = None,
                  log: Callable[[str], None] | None = None,
                  progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Benchmark ``cfg.models``; returns ``{"machine", "config", "peak", "results", "notes"}``.

    ``references`` adds reference factories (name -> ``factory(name, ours, img_size)``) next to
    the built-in timm, torchvision and hf ones. ``results`` has one row per (model, mode, impl).
    ``progress`` is called with the report so far after each (model, mode) (to write partial results).
    """
    cfg.validate()
    table = {**REFERENCE_FACTORIES, **(references or {})}
    for lib in cfg.compare:
        if split_compiled(lib)[0] not in table:
            raise ValueError(f"--compare: unknown reference {lib!r}; expected one of {known_references(references)}")
    if "onnxruntime" in cfg.runtimes:
        from ..export.core import require

        require("onnx", "--runtime onnxruntime")
        require("onnxruntime", "--runtime onnxruntime")
    log = log or (lambda s: None)
    device = torch.device(cfg.device)
    notes: list[str] = []
    results: list[dict[str, Any]] = []
    peak_dtype = torch.bfloat16 if cfg.amp == "bf16" else torch.float32
    with _threads(cfg.threads), recompile_limit(cfg.recompile_limit):
        info = machine_info(device)
        peak = MatmulPeak(device, peak_dtype, cfg.peak_size or (8192 if device.type == "cuda" else 2048),
                          clock=_CLOCKS[cfg.clock])
        peak_cal = peak.calibrate()
        log(f"matmul peak ({peak_dtype}, n={peak.n}): " + ", ".join(f"{k} {v:.1f} GFLOP/s"
                                                                   for k, v in peak_cal.items()))
        all_peaks: list[float] = []

        def report() -> dict[str, Any]:
            with contextlib.suppress(OSError, AttributeError):
                info["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
            for lib in ("timm", "torchvision", "transformers"):
                info[lib] = library_version(lib) if lib in _imported() else info[lib]
            return {
                "machine": info,
                "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
                "peak": {"dtype": str(peak_dtype).removeprefix("torch."), "n": peak.n, "kernel": peak.kernel,
                         "calibration_gflops": peak_cal, "gflops_per_round": all_peaks,
                         "gflops": summarise(all_peaks) if all_peaks else None},
                "results": results,
                "notes": notes,
            }

        modes = ["infer", "train"] if cfg.mode == "both" else [cfg.mode]
        for name in cfg.models:
            for mode in modes:
                failed = False
                try:
                    name = get_model_entry(name).name
                    rows, peaks = _bench_one(name, mode, cfg, device, peak, references, notes, log)
                except Exception as e:
                    if not cfg.keep_going:
                        raise
                    msg = f"{name} [{mode}] failed: {type(e).__name__}: {str(e).strip()[:300]}"
                    notes.append(msg)
                    log("NOTE " + msg)
                    rows, peaks, failed = [], [], True
                if failed:  # outside the handler: its traceback (holding the failed models' frames) is gone
                    _release(device)
                results += rows
                all_peaks += peaks
                if progress is not None:
                    progress(report())
        return report()


def _release(device: torch.device) -> None:
    """Drop what a failed model left behind (compiled code keeps its graphs; the CUDA cache its blocks)."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _note(notes: list[str], log: Callable[[str], None], msg: str) -> None:
    if msg not in notes:
        notes.append(msg)
        log("NOTE " + msg)


def _bench_one(name: str, mode: str, cfg: BenchConfig, device: torch.device, peak: MatmulPeak,
               references: dict[str, ReferenceFactory] | None, notes: list[str], log: Callable[[str], None]
               ) -> tuple[list[dict[str, Any]], list[float]]:
    torch.manual_seed(0)
    backends = cfg.backends()
    multi = len(backends) > 1
    base = f"ours[{backends[0]}]" if multi else "ours"  # the first backend: the others' ratios are to it
    backend_kw = {} if backends[0] is None else {"attn_backend": backends[0]}
    model_kwargs, img_size = cfg.model_args(name)
    ours = create_model(name, img_size=img_size, **model_kwargs, **backend_kw)
    size = img_hw(ours)
    x = torch.randn(cfg.batch_size, in_chans(ours), *size, generator=torch.Generator().manual_seed(0))
    refs: dict[str, nn.Module] = {}  # eager references (a compiled one is compiled below, after the move)
    twins: dict[str, nn.Module] = {}  # for parity: ours loaded with each reference's weights
    method: str | None = None  # what of ours the references compute (None: forward)
    for lib in cfg.compare:
        base_lib, compiled = split_compiled(lib)
        try:
            if compiled and base_lib in refs:  # its eager twin is here: a copy of it (same weights), compiled
                refs[lib], twins[lib] = copy.deepcopy(refs[base_lib]), twins[base_lib]
                continue
            # ours keeps the first reference's weights; later ones are checked on a copy loaded with theirs
            target = ours if not refs else copy.deepcopy(ours)
            spec = build_reference_spec(base_lib, name, target, img_size, references)
            if refs and spec.ours_method != method:
                raise ReferenceUnavailable(f"it compares ours' {spec.ours_method or 'forward'}, the first reference "
                                           f"ours' {method or 'forward'}: run them in separate benchmarks")
            method = spec.ours_method
            refs[lib], twins[lib] = spec.module, target
        except ReferenceUnavailable as e:
            _note(notes, log, f"{name}: reference {lib} unavailable: {e}")
    if method is not None:
        _note(notes, log, f"{name}: ours is timed and compared on {method} (what the references compute)")

    def form(m: nn.Module) -> nn.Module:
        return m if method is None else _Method(m, method)

    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    x = x.to(device).contiguous(memory_format=fmt)
    for m in [ours, *refs.values(), *twins.values()]:
        m.to(device=device, memory_format=fmt)

    eager: dict[str, nn.Module] = {base: form(ours)}  # ours per backend: copies of one model (same weights)
    for b in backends[1:]:
        try:
            eager[f"ours[{b}]"] = form(set_attention_backend(copy.deepcopy(ours), b))  # type: ignore[arg-type]
        except ValueError as e:
            _note(notes, log, f"{name}: --attn-backend {b} skipped: {e}")

    parity: dict[str, float] = {}
    with torch.inference_mode():
        for lib, ref in refs.items():
            if not split_compiled(lib)[1]:
                parity[lib] = _parity(form(twins[lib]).eval()(x), ref.eval()(x))
        if len(eager) > 1:
            first = eager[base].eval()(x)
            for label, m in list(eager.items())[1:]:
                parity[label] = _parity(m.eval()(x), first)
    backend_of = dict(zip([base, *(f"ours[{b}]" for b in backends[1:])], backends))

    def step(m: nn.Module) -> Callable[[], Any]:
        return make_step(m, x, mode, device, cfg.amp)

    participants = [Participant(label, step(m), m, info={"backend": backend_of[label]}) for label, m in eager.items()]
    settings = _compile_settings(cfg)
    for lib, ref in refs.items():
        if not split_compiled(lib)[1]:
            participants.append(Participant(lib, step(ref), ref))
            continue
        compiled = compile_model(ref, cfg.compile_backend, cfg.compile_mode)
        st = step(compiled)
        participants.append(Participant(lib, with_freezing(st) if cfg.compile_freeze else st, ref,
                                        info={"settings": settings, "compiled": True,
                                              "parity_with": form(twins[lib])}))
    if cfg.compile:
        for label, m in eager.items():
            src = copy.deepcopy(m)
            st = step(compile_model(src, cfg.compile_backend, cfg.compile_mode))
            participants.append(Participant(f"{label}+compile", with_freezing(st) if cfg.compile_freeze else st, src,
                                            info={"settings": settings, "compiled": True, "eager": label,
                                                  "backend": backend_of[label], "parity_with": m}))

    if cfg.tome:
        merged = copy.deepcopy(ours)
        apply_tome_option(merged, cfg.tome)
        participants.append(Participant(f"{base}+tome", step(form(merged)), merged,
                                        info={"tome": cfg.tome, "eager": base, "backend": backends[0]}))

    for runtime in cfg.runtimes:
        if method is not None:
            _note(notes, log, f"{runtime} skipped: ours is compared on {method}, the export is of forward")
            continue
        rt = _runtime_participant(runtime, ours, x, mode, cfg, device, notes, log)
        if rt is not None:
            rt.label = f"{base}+{runtime}"
            rt.info.update(eager=base, outside_torch=True)
            participants.append(rt)
            parity[rt.label] = rt.info[runtime]["parity"]

    log(f"{name} [{mode}]: warm-up ({', '.join(p.label for p in participants)})")
    for p in list(participants):
        t0 = time.perf_counter()
        try:
            with dynamo_graphs() if p.info.get("compiled") else contextlib.nullcontext() as graphs:
                # compiled / merged / exported ours, compiled references and the other backends run at least once
                # here: a compile, or a backend that cannot run this step (flex has no CPU backward), fails here
                once = p.label != base and ("eager" in p.info or "compiled" in p.info or p.label in backend_of)
                for _ in range(max(cfg.warmup, 1 if once else 0)):
                    p.step()
        except Exception as e:
            if p.label == base:
                raise
            _note(notes, log, f"{name} [{mode}]: {p.label} failed in its warm-up and is left out: "
                              f"{type(e).__name__}: {str(e).strip()[:300]}")
            participants.remove(p)
            _release(device)
            continue
        if p.info.get("compiled"):
            p.info["compile_warmup_s"] = time.perf_counter() - t0
            p.info["compile"] = graphs
    if mode == "infer":  # compiled participants: parity with their eager twin, at the run's precision
        for p in participants:
            twin = p.info.pop("parity_with", None)
            if twin is not None:
                with torch.inference_mode(), autocast(device, cfg.amp):
                    theirs = twin.eval()(x)
                    mine = p.step()
                    parity[p.label] = _parity(theirs, mine) if p.label in refs else _parity(mine, theirs)
    for p in participants:
        p.info.pop("parity_with", None)
    # eager FlexAttention on CPU compiles its own wrapper, which torch refuses under the tracker's dispatch mode,
    # and the refusal sticks: later flex calls of the process fail too; so it is not even tried
    untracked = "not measured (FlexAttention cannot run under the CPU tensor tracker)"
    outside = "not measured (the runtime allocates outside torch)"

    def memory_of(p: Participant) -> dict[str, Any]:
        why = (outside if p.info.get("outside_torch") else
               untracked if p.info.get("backend") == "flex" and device.type != "cuda" else None)
        if why is None:
            return _peak_memory(p.step, device)
        return {"peak_bytes": None, "method": why, "largest_bytes": None, "largest_shape": None}

    memory = {p.label: memory_of(p) for p in participants}
    flops = count_flops(name, cfg.batch_size, img_size, mode, model_kwargs, method=method)
    flops_of = {p.label: flops for p in participants}
    if cfg.tome:
        flops_of[f"{base}+tome"] = count_flops(name, cfg.batch_size, img_size, mode, model_kwargs,
                                               tome=cfg.tome, method=method)
    log(f"{name} [{mode}]: {cfg.rounds} rounds x {cfg.iters} iters")
    peaks = _rounds(participants, peak, cfg.rounds, cfg.iters, device, _CLOCKS[cfg.clock])

    rows = []
    by_label = {p.label: p for p in participants}
    ref_labels = [lib for lib in refs if lib in by_label]

    def ratio(p: Participant, other: str) -> dict[str, Any]:
        per_round = [t_o / t_p for t_p, t_o in zip(p.times, by_label[other].times)]
        return {**summarise(per_round), "per_round": per_round}

    for p in participants:
        flops = flops_of[p.label]
        lat = summarise(p.times)
        row: dict[str, Any] = {
            "model": name, "mode": mode, "impl": p.label, "batch_size": cfg.batch_size, "img_size": list(size),
            "latency_ms": {k: v * 1e3 for k, v in lat.items()},
            "images_per_s": {"min": cfg.batch_size / lat["max"], "median": cfg.batch_size / lat["median"],
                             "max": cfg.batch_size / lat["min"]},
            "flops_per_step": flops,
            "peak_memory_mb": None if memory[p.label]["peak_bytes"] is None else memory[p.label]["peak_bytes"] / 2**20,
            "memory_method": memory[p.label]["method"], "largest_tensor_shape": memory[p.label]["largest_shape"],
            "gflops": None, "fraction_of_peak": None, "ratios": {}, "parity": None,
        }
        if multi and p.label in backend_of:
            row["backend"] = backend_of[p.label]
        if method is not None and p.label not in refs:
            row["ours_method"] = method
        if flops:
            achieved = [flops / t / 1e9 for t in p.times]
            row["gflops"] = summarise(achieved)
            # best achieved over best peak: both approach the unloaded machine as rounds grow; the
            # per-round quotient (round's model rate / round's GEMM rate) is kept for the record
            row["fraction_of_peak"] = max(achieved) / max(peaks) if peaks else None
            row["fraction_of_peak_per_round"] = summarise([a / pk for a, pk in zip(achieved, peaks)])
        if p.label in parity:
            row["parity"] = parity[p.label]
        if p.label in eager:  # ours per backend: vs the first backend, and vs every reference
            if p.label != base and base in by_label:
                row["ratios"][base] = ratio(p, base)
            for lib in ref_labels:
                row["ratios"][lib] = ratio(p, lib)
        if "eager" in p.info and p.info["eager"] in by_label:  # compiled / merged / exported ours vs its eager self
            row["ratios"][p.info["eager"]] = ratio(p, p.info["eager"])
            if p.info.get("compiled"):  # and compiled ours vs every reference (compiled ones: like for like)
                for lib in ref_labels:
                    row["ratios"][lib] = ratio(p, lib)
        base_lib, compiled = split_compiled(p.label)
        if p.label in refs and compiled and base_lib in by_label:  # a compiled reference vs the eager one
            row["ratios"][base_lib] = ratio(p, base_lib)
        if p.info.get("compiled"):
            row["compile"] = {k: v for k, v in p.info.items() if k not in ("eager", "backend", "compiled")}
        if p.label == f"{base}+tome":
            row["tome"] = {"r": cfg.tome, "flops_unmerged": flops_of[base],
                           "flops_ratio": (flops_of[base] / flops) if flops and flops_of[base] else None}
        for runtime in cfg.runtimes:
            if runtime in p.info:
                row[runtime] = p.info[runtime]
        rows.append(row)
    return rows, peaks


def _peak_memory(step: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    """:func:`measure_peak_memory`, or ``peak_bytes`` None where the step cannot run under the CPU tracker (a
    dispatch mode)."""
    try:
        return measure_peak_memory(step, device)
    except Exception as e:
        return {"peak_bytes": None, "method": f"not measured ({type(e).__name__} under the tensor tracker)",
                "largest_bytes": None, "largest_shape": None}


# ---------------------------------------------------------------------------- exported runtimes
def _runtime_participant(runtime: str, ours: nn.Module, x: Tensor, mode: str, cfg: BenchConfig, device: torch.device,
                         notes: list[str], log: Callable[[str], None]) -> Participant | None:
    """``ours`` exported to ONNX (dynamic batch, like ``vit-attention export``) in an onnxruntime session
    with as many intra-op threads as torch uses; ``None`` (and a note) where the runtime does not apply."""
    why = ("it times inference only" if mode != "infer" else
           f"CPU only (device {device})" if device.type != "cpu" else
           "fp32 only (--amp given)" if cfg.amp else None)
    if why:
        msg = f"{runtime} skipped for {mode}: {why}"
        if msg not in notes:
            notes.append(msg)
            log("NOTE " + msg)
        return None
    import onnxruntime as ort

    from ..export.core import INPUT_NAME, to_onnx

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vit_attention_bench_") as tmp:
        path = to_onnx(ours, os.path.join(tmp, "model.onnx"), example_input=x.contiguous())
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = torch.get_num_threads()
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])  # loaded: file may go
    export_s = time.perf_counter() - t0
    feed = {INPUT_NAME: x.detach().contiguous().numpy()}

    def step() -> Any:
        return sess.run(None, feed)

    with torch.inference_mode():
        parity = _parity(torch.from_numpy(step()[0]), ours.eval()(x))
    info = {"version": ort.__version__, "threads": opts.intra_op_num_threads, "export_s": export_s,
            "parity": parity}
    log(f"{runtime}: exported and loaded in {export_s:.1f} s, parity {parity:.1e}")
    return Participant(f"ours+{runtime}", step, ours, info={runtime: info})
