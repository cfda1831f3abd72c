"""Shape trace: how the shape changes at every module, in order, including inside attention.

    >>> print(trace(create_model("vit_base_patch16_224"), (1, 3, 224, 224)))

Runs one forward on the meta device (instant even for ViT-22B) with a hook on every module and
the attention shape hook of the functional core, then prints one line per module call (indented
by nesting) with its input -> output shapes. Inside each attention it adds the steps the modules
do not show, in the library's vocabulary: windows ``[B·nW, ws², C]``, heads split
``[B, nh, N, hd]``, logits ``[B, nh, N, M]``, heads merged. Shape changes made by a parent's own
code between two of its children (class token concatenation, position embedding, window
partition) get a ``·`` line naming the class whose code made them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from ..layers.drop_path import DropPath
from .recording import CoreCall, ModuleCall, Recording, record_forward

__all__ = ["Trace", "TraceLine", "trace"]


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _fmt_all(shapes: Sequence[Sequence[int]]) -> str:
    if not shapes:
        return "-"
    return ", ".join(_fmt(s) for s in shapes)


@dataclass
class TraceLine:
    """One line of a trace: a module call (``kind="module"``), a step inside attention
    (``"attention"``) or a shape change made by a parent's own code (``"code"``)."""

    depth: int
    name: str
    what: str
    in_shapes: list[tuple[int, ...]]
    out_shapes: list[tuple[int, ...]]
    kind: str
    note: str = ""

    def format(self, name_width: int = 40, what_width: int = 22) -> str:
        """``name  what  in -> out  note`` with indentation by depth."""
        label = "  " * self.depth + (self.name or "(root)")
        arrow = f"{_fmt_all(self.in_shapes)} -> {_fmt_all(self.out_shapes)}" if self.in_shapes else \
            _fmt_all(self.out_shapes)
        text = f"{label:{name_width}s} {self.what:{what_width}s} {arrow}"
        return text + (f"  {self.note}" if self.note else "")


@dataclass
class Trace:
    """A recorded shape trace; ``str(trace)`` is the printable table, :meth:`flow` a one-line summary."""

    input_shape: tuple[int, ...]
    output_shapes: list[tuple[int, ...]]
    lines: list[TraceLine]

    def format(self, max_depth: int | None = None) -> str:
        """The table, one line per event, down to nesting ``max_depth`` (None = all)."""
        keep = [ln for ln in self.lines if max_depth is None or ln.depth <= max_depth]
        width = min(max([len("  " * ln.depth + (ln.name or "(root)")) for ln in keep] + [10]) + 1, 60)
        what = min(max([len(ln.what) for ln in keep] + [10]), 32)
        head = f"{'input':{width}s} {'':{what}s} {_fmt(self.input_shape)}"
        return "\n".join([head] + [ln.format(width, what) for ln in keep])

    def __str__(self) -> str:
        return self.format()

    def flow(self, max_depth: int = 1) -> str:
        """Arrow chain ``[1, 3, 224, 224] → patch_embed → [1, 196, 768] → ...`` through depth ``max_depth``."""
        parts = [_fmt(self.input_shape)]
        for ln in self.lines:
            if ln.depth > max_depth or ln.depth == 0:
                continue
            parts_ = ln.name.split(".")
            short = ".".join(parts_[-2:]) if parts_[-1].isdigit() else parts_[-1]
            label = short if ln.kind == "module" else ln.what
            parts += [label, _fmt_all(ln.out_shapes)]
        return " → ".join(parts)


def _attention_lines(att: CoreCall, depth: int) -> list[TraceLine]:
    B, (nh, N, hd) = math.prod(att.q[:-3]), att.q[-3:]  # leading batch dims folded into B
    M, hdv = att.k[-2], att.v[-1]
    info = att.info
    lines: list[TraceLine] = []
    window = info.get("window_size")
    folded = info.get("heads_layout") == "windows*heads"
    split_note = "[B, nh, N, hd] | [B, nh, M, hd] | [B, nh, M, hdv]"
    if window is not None:
        ws = tuple(window) if isinstance(window, (tuple, list)) else (window, window)
        shift = info.get("shift_size", 0)
        note = f"ws={ws[0]}x{ws[1]}" + (f", shift={shift}" if shift and shift != (0, 0) else "")
        nW = int(info.get("num_windows", 1)) if folded else 1
        lines.append(TraceLine(depth, att.module, "windows", [], [(B * nW, N, nh // nW * hd)], "attention",
                               f"[B·nW, ws², C]  {note}"))
        if folded:
            split_note = f"windows folded into heads: [B, nW·nh, N, hd], nW={nW}"
    lines.append(TraceLine(depth, att.module, "heads split q|k|v", [], [att.q, att.k, att.v], "attention",
                           split_note))
    extra = "".join(f"  {label} {_fmt(info[key])}" for key, label in (("bias", "+ bias"), ("mask", "& mask"))
                    if info.get(key))
    lines.append(TraceLine(depth, att.module, "logits q·kᵀ", [], [(B, nh, N, M)], "attention",
                           "[B, nh, N, M]" + extra + ("  causal" if info.get("is_causal") else "")))
    lines.append(TraceLine(depth, att.module, "softmax(logits)·v", [], [(B, nh, N, hdv)], "attention",
                           "[B, nh, N, hdv] -> merge heads [B, N, nh·hdv]"))
    return lines


_HIDDEN = (nn.Identity, nn.Dropout, DropPath)


def _build_lines(rec: Recording, max_depth: int | None, show_all: bool = False) -> list[TraceLine]:
    events: list[tuple[int, str, object]] = [(c.index, "call", c) for c in rec.calls]
    events += [(c.end, "end", c) for c in rec.calls] + [(a.index, "attention", a) for a in rec.attention]
    events.sort(key=lambda e: e[0])
    lines: list[TraceLine] = []
    last_child_out: dict[int, list[tuple[int, ...]]] = {}  # parent call index -> last child's outputs
    parents: list[ModuleCall] = []

    def code_line(parent: ModuleCall, after: list[tuple[int, ...]], depth: int) -> None:
        before = last_child_out.get(parent.index, parent.in_shapes[:1])
        if before and after and before[0] != after[0] and (max_depth is None or depth <= max_depth):
            lines.append(TraceLine(depth, "·", f"({type(parent.module).__name__} code)", [before[0]], [after[0]],
                                   "code"))

    for _, what, ev in events:
        if what == "call":
            assert isinstance(ev, ModuleCall)
            depth = len(parents)
            if parents:
                code_line(parents[-1], ev.in_shapes[:1], depth)
            hidden = not show_all and isinstance(ev.module, _HIDDEN) and ev.in_shapes[:1] == ev.out_shapes[:1]
            if (max_depth is None or depth <= max_depth) and not hidden:
                lines.append(TraceLine(depth, ev.name, type(ev.module).__name__, ev.in_shapes, ev.out_shapes,
                                       "module"))
            parents.append(ev)
        elif what == "end":
            assert isinstance(ev, ModuleCall)
            parents.pop()
            if last_child_out.get(ev.index) is not None:  # shape change after its last child
                code_line(ev, ev.out_shapes[:1], len(parents) + 1)
            if parents:
                last_child_out[parents[-1].index] = ev.out_shapes
        else:
            assert isinstance(ev, CoreCall)
            depth = len(parents)
            if parents:
                B, (nh, N, hd) = math.prod(ev.q[:-3]), ev.q[-3:]
                if ev.info.get("window_size") is not None and ev.info.get("heads_layout") != "windows*heads":
                    code_line(parents[-1], [(B, N, nh * hd)], depth)
                nW = int(ev.info.get("num_windows", 1)) if ev.info.get("heads_layout") == "windows*heads" else 1
                last_child_out[parents[-1].index] = [(B * nW, N, nh // nW * ev.v[-1])]  # heads merged
            if max_depth is None or depth <= max_depth:
                lines.extend(_attention_lines(ev, depth))
    return lines


def trace(model: nn.Module, input_shape: Sequence[int] | Tensor, *, device: str | None = "meta",
          max_depth: int | None = None, show_all: bool = False) -> Trace:
    """Record how shapes change through ``model`` on an input of ``input_shape``.

    Args:
        model: a model (images ``[B, Cin, H, W]``), a mechanism (``[B, N, C]`` / ``[B, H, W, C]``)
            or any module.
        input_shape: shape of the input (or a tensor).
        device: ``"meta"`` (default, no compute) or None to run where the model lives.
        max_depth: keep module calls nested at most this deep (None = all).
        show_all: also list shape-preserving ``Identity`` / ``Dropout`` / ``DropPath`` calls (hidden by default).

    Returns:
        a :class:`Trace`; ``print(trace(...))`` shows the table.
    """
    rec = record_forward(model, input_shape, device=device)
    return Trace(rec.input_shape, rec.output_shapes, _build_lines(rec, max_depth, show_all))
