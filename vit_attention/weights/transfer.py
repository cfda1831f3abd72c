"""``transfer_weights(source, target)``: a trained model's weights into the same model with other attention mechanisms.

The plug-and-play study on pretrained weights: take DeiT-S, Swin-T or any preset with its published
weights, swap the attention (``create_model(NAME, attn_layer="window", pretrained=True)`` builds the
preset, loads its weights, then calls this), and fine-tune. Everything outside the attention modules
is copied by name; each attention module whose mechanism or options changed gets its q / k / v /
output projections carried over (:func:`vit_attention.attention.transfer.carry_attention`, from what each
mechanism declares in its file), and what has no counterpart is set to the value that adds nothing
(a zero position table, the identity head mixing) or left as initialised. The report lists it all.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from ..attention.transfer import carry_attention
from .load import LoadReport

__all__ = ["transfer_weights", "attention_modules"]


def attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    """``{path: module}`` of the registered attention mechanisms inside ``model`` (outermost ones only)."""
    found: dict[str, nn.Module] = {}
    for name, m in model.named_modules():
        if getattr(type(m), "attention_name", None) and not any(name.startswith(p + ".") for p in found):
            found[name] = m
    return found


@torch.no_grad()
def transfer_weights(source: nn.Module, target: nn.Module) -> LoadReport:
    """Copy ``source``'s weights into ``target`` in place, ``target`` being the same architecture with other
    attention mechanisms (or options) -> a :class:`~vit_attention.weights.LoadReport` (layout ``"transfer"``).

    Attention modules at the same path: same class and shapes are copied whole; otherwise
    :func:`~vit_attention.attention.transfer.carry_attention`. Other parameters and buffers: copied when the
    name and shape match; ``missing`` lists the target's entries nothing was copied into (they keep their
    initialisation), ``mismatched`` those of another shape, ``unexpected`` the source's entries left unused.
    ``notes`` says, per pair of mechanisms, what was carried and how the rest was set.
    """
    src_attn, tgt_attn = attention_modules(source), attention_modules(target)
    report = LoadReport(layout="transfer")
    src_state, tgt_state = source.state_dict(), target.state_dict()
    carried: Counter[tuple[str, str, str, str]] = Counter()
    swapped: list[str] = []
    for path, tm in tgt_attn.items():
        sm = src_attn.get(path)
        if sm is None:
            continue
        s_sd, t_sd = sm.state_dict(), tm.state_dict()
        if type(sm) is type(tm) and s_sd.keys() == t_sd.keys() and all(s_sd[k].shape == t_sd[k].shape for k in s_sd):
            continue  # the same mechanism: copied with everything else
        what, notes = carry_attention(sm, tm)
        carried[(sm.attention_name, tm.attention_name, "; ".join(what) or "nothing", "; ".join(notes))] += 1
        swapped.append(path + ".")
    prefixes = tuple(swapped)
    own = {k: v for k, v in tgt_state.items() if not k.startswith(prefixes)}
    loadable = {}
    for key, value in own.items():
        if key not in src_state:
            report.missing.append(key)
        elif src_state[key].shape != value.shape:
            report.mismatched.append((key, tuple(src_state[key].shape), tuple(value.shape)))
        else:
            loadable[key] = src_state[key]
    report.unexpected = [k for k in src_state if k not in tgt_state and not k.startswith(prefixes)]
    target.load_state_dict(loadable, strict=False)
    for (src, dst, what, notes), n in carried.items():
        report.notes.append(f"{n} attention module{'s' if n != 1 else ''} {src} -> {dst}: carried {what}"
                            + (f" ({notes})" if notes else ""))
    return report
