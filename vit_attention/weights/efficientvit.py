"""EfficientViT-MIT checkpoint layouts onto ours (:mod:`vit_attention.models.efficientvit`).

* ``timm``: timm 1.0.31 ``EfficientVit`` / ``EfficientVitLarge`` files (``timm/efficientvit_*`` on the Hugging Face
  hub, converted by timm from mit-han-lab/efficientvit). Every convolution unit has our keys; inside the
  EfficientViT blocks ``context_module.main.`` is our mechanism ``attn.``, whose ``qkv.conv`` / ``proj.conv`` 1x1
  convolutions ``[out, in, 1, 1]`` become ``Linear`` weights ``[out, in]`` (``qkv.weight`` / ``proj.weight``) and
  ``proj.norm.`` its ``norm.`` (the aggregation convolutions ``aggreg.*`` keep their keys); the head's
  ``classifier.0`` / ``.1`` / ``.4`` are ``head.hidden`` / ``head.norm`` / ``head.fc``.

* ``original``: mit-han-lab/efficientvit (``efficientvit/models/efficientvit/backbone.py``, ``cls.py``, its
  ``assets/checkpoints/efficientvit_cls/*.pt``): ``backbone.input_stem.op_list.{j}`` (B) or
  ``backbone.stages.0.op_list.{j}`` (L) is the stem (``0``: ``in_conv``, ``j``: ``res{j-1}``),
  ``backbone.stages.{s}.op_list.{j}`` stage ``s`` (L: ``s - 1``) block ``j``, ``head.op_list.{0, 2, 3}`` the head's
  ``in_conv``, ``hidden`` + ``norm`` and ``fc``; inside, timm's names (which timm took from it). The original's
  LiteMLA divides with ``eps = 1e-15`` (``attn_eps=1e-15`` reproduces it; timm's 1e-5 differs by
  ~1e-7) and its model zoo sets every norm's eps of the L models to 1e-7, the head's BatchNorm included
  (``head_bn_eps=1e-7``; timm keeps 1e-5 there).

An adapter drops a classifier for a different number of classes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads

__all__: list[str] = []

State = dict[str, Tensor]

_SQUEEZE = re.compile(r".*\.attn\.(qkv|proj)\.weight$")


def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return any(".context_module.main." in k or k.startswith("head.classifier.") for k in state)


def _from_timm(state: State, model: nn.Module) -> State:
    state = rename(state, [
        (r"\.context_module\.main\.(qkv|proj)\.conv\.", r".attn.\1."),
        (r"\.context_module\.main\.proj\.norm\.", ".attn.norm."),
        (r"\.context_module\.main\.", ".attn."),
        (r"^head\.classifier\.0\.", "head.hidden."),
        (r"^head\.classifier\.1\.", "head.norm."),
        (r"^head\.classifier\.4\.", "head.fc."),
    ])
    return {k: v[:, :, 0, 0] if v.dim() == 4 and _SQUEEZE.match(k) else v for k, v in state.items()}


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return any(re.match(r"backbone\.(input_stem|stages\.\d+)\.op_list\.", k) for k in state)


def _stem(j: int) -> str:
    return "stem.in_conv." if j == 0 else f"stem.res{j - 1}."


def _from_original(state: State, model: nn.Module) -> State:
    large = not any(k.startswith("backbone.input_stem.") for k in state)  # L: the stem is stages.0
    out: State = {}
    for k, v in state.items():
        m = re.match(r"backbone\.(?:input_stem|stages\.(\d+))\.op_list\.(\d+)\.", k)
        if m:
            s, j = (int(m.group(1)) if m.group(1) is not None else None), int(m.group(2))
            if s is None or (large and s == 0):
                k = _stem(j) + k[m.end():]
            else:
                k = f"stages.{s - 1 if large else s}.blocks.{j}." + k[m.end():]
        out[k] = v
    out = rename(out, [(r"^head\.op_list\.0\.", "head.in_conv."), (r"^head\.op_list\.2\.linear\.", "head.hidden."),
                       (r"^head\.op_list\.2\.norm\.", "head.norm."), (r"^head\.op_list\.3\.linear\.", "head.fc.")])
    return _from_timm(out, model)


def _adapt_efficientvit(state: State, model: nn.Module, report: Any) -> State:
    """Drop a classifier for a different number of classes (left freshly initialised)."""
    return drop_mismatched_heads(state, model.state_dict(), ("head.fc.",), report)


register_converter("efficientvit", "original", _is_original, _from_original)
register_converter("efficientvit", "timm", _is_timm, _from_timm)
register_adapter("efficientvit", _adapt_efficientvit)
