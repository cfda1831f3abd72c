"""EfficientViT-MIT checkpoint layouts onto ours (:mod:`vit_attention.models.efficientvit`).

* ``timm``: timm 1.0.31 ``EfficientVit`` / ``EfficientVitLarge`` files (``timm/efficientvit_*`` on the Hugging Face
  hub, converted by timm from mit-han-lab/efficientvit). Every convolution unit has our keys; inside the
  EfficientViT blocks ``context_module.main.`` is our mechanism ``attn.``, whose ``qkv.conv`` / ``proj.conv`` 1x1
  convolutions ``[out, in, 1, 1]`` become ``Linear`` weights ``[out, in]`` (``qkv.weight`` / ``proj.weight``) and
  ``proj.norm.`` its ``norm.`` (the aggregation convolutions ``aggreg.*`` keep their keys); the head's
  ``classifier.0`` / ``.1`` / ``.4`` are ``head.hidden`` / ``head.norm`` / ``head.fc``.

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


def _adapt_efficientvit(state: State, model: nn.Module, report: Any) -> State:
    """Drop a classifier for a different number of classes (left freshly initialised)."""
    return drop_mismatched_heads(state, model.state_dict(), ("head.fc.",), report)


register_converter("efficientvit", "timm", _is_timm, _from_timm)
register_adapter("efficientvit", _adapt_efficientvit)
