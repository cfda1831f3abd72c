"""NAT / DiNAT checkpoint layouts onto ours.

* original SHI-Labs/Neighborhood-Attention-Transformer (``classification/nat.py``, ``dinat.py``):
  ``levels.i.downsample.{reduction,norm}`` at the END of level ``i`` (ours: the start of level
  ``i + 1``), LayerScale ``gamma1`` / ``gamma2`` (ours ``ls1.gamma`` / ``ls2.gamma``), classifier
  ``head`` (ours ``head.fc``); ``qkv``, ``rpb``, ``proj``, ``mlp.fc1/fc2`` and the tokenizer's keys
  are ours already.

After conversion an adapter resizes ``rpb [nh, 2K-1, 2K-1]`` bicubically when the kernel differs
(the DiNAT-L 7x7 -> 11x11 recipe) and drops a classifier for another number of classes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from .layouts import register_adapter, register_converter
from .vit import drop_mismatched_heads

__all__ = ["resize_rpb"]

State = dict[str, Tensor]


def _is_original(state: Mapping[str, Tensor]) -> bool:
    """The SHI-Labs layout: a level-0 downsampler, or ``gamma1`` LayerScale, or a bare ``head``."""
    return any(k.startswith("levels.0.downsample.") or k.endswith(".gamma1") for k in state) or (
        "head.weight" in state and any(k.startswith("levels.") for k in state))


def _from_original(state: State, model: nn.Module) -> State:
    out: State = {}
    for k, v in state.items():
        m = re.match(r"^levels\.(\d+)\.downsample\.(.*)$", k)
        if m:
            k = f"levels.{int(m.group(1)) + 1}.downsample.{m.group(2)}"
        k = re.sub(r"\.gamma1$", ".ls1.gamma", k)
        k = re.sub(r"\.gamma2$", ".ls2.gamma", k)
        k = re.sub(r"^head\.(weight|bias)$", r"head.fc.\1", k)
        out[k] = v
    return out


def resize_rpb(rpb: Tensor, kernel_size: tuple[int, int]) -> Tensor:
    """Bicubically resize ``[nh, 2K-1, 2K-1]`` to ``[nh, 2Kh'-1, 2Kw'-1]``."""
    size = (2 * kernel_size[0] - 1, 2 * kernel_size[1] - 1)
    return F.interpolate(rpb[None].float(), size=size, mode="bicubic", align_corners=False)[0].to(rpb.dtype)


def _adapt_nat(state: State, model: nn.Module, report: Any) -> State:
    own = model.state_dict()
    resized = 0
    for key, v in list(state.items()):
        if key.endswith(".rpb") and key in own and v.shape != own[key].shape and v.shape[0] == own[key].shape[0]:
            attn = model.get_submodule(key.rsplit(".", 1)[0])
            state[key] = resize_rpb(v, attn.kernel_size)
            resized += 1
    if resized:
        report.notes.append(f"{resized} rpb table(s) resized bicubically to the model's kernel size")
    return drop_mismatched_heads(state, own, ("head.fc.",), report)


register_converter("nat", "original", _is_original, _from_original)
register_adapter("nat", _adapt_nat)
