"""timm's fused parallel-scaling blocks onto :class:`~vit_attention.layers.parallel_scaling.ParallelScalingBlock`.

timm 1.0.31's ``DiffParallelScalingBlock`` (``vit_dpwee_patch16_reg1_gap_256``) and ``ParallelScalingBlock``
with ``fuse_out_proj`` (``timm/models/vision_transformer.py``) keep, per block ``blocks.N``:

* ``in_norm`` -> ``norm1``;
* ``in_proj`` (rows ``[fc1 | q | k | v]``, ``H + 3C``; its bias when the model has a qkv bias) -> ``mlp.fc1``
  (the first ``H`` rows) and ``attn.qkv`` (the rest); ``mlp_bias`` (without a qkv bias) -> ``mlp.fc1.bias``;
* ``out_proj`` (columns ``[attn | mlp]``, ``C + H``) -> ``attn.proj.weight`` (the first ``C`` columns) and
  ``mlp.fc2`` (the rest, with the one output bias);
* ``lambda_*``, ``sub_norm``, ``q_norm`` / ``k_norm`` (differential attention's) -> ``attn.*``; ``ls.gamma`` as it is.

The rest of the model is the ViT's timm layout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor, nn

from .layouts import register_converter

__all__ = ["is_timm_parallel_scaling", "from_timm_parallel_scaling"]

State = dict[str, Tensor]

_IN_PROJ = re.compile(r"^(blocks\.\d+)\.in_proj\.weight$")
_TO_ATTN = re.compile(r"^(blocks\.\d+)\.(lambda_(?:q1|k1|q2|k2|a|b)|sub_norm\.weight|[qk]_norm\.\w+)$")


def is_timm_parallel_scaling(state: Mapping[str, Tensor]) -> bool:
    """Whether ``state`` has timm's fused ``blocks.N.in_proj`` and ``blocks.N.out_proj``."""
    return any(_IN_PROJ.match(k) for k in state) and any(k.endswith(".out_proj.weight") for k in state)


def from_timm_parallel_scaling(state: State, model: nn.Module) -> State:
    """timm's fused parallel-scaling blocks -> ours (module docstring); ``model`` is not read."""
    out: State = {}
    for key, value in state.items():
        if m := _TO_ATTN.match(key):
            out[f"{m.group(1)}.attn.{m.group(2)}"] = value
        elif m := re.match(r"^(blocks\.\d+)\.in_norm\.(\w+)$", key):
            out[f"{m.group(1)}.norm1.{m.group(2)}"] = value
        elif m := re.match(r"^(blocks\.\d+)\.mlp_bias$", key):
            out[f"{m.group(1)}.mlp.fc1.bias"] = value
        elif re.match(r"^blocks\.\d+\.(in_proj|out_proj)\.", key):
            continue  # split below, with the block's sizes
        else:
            out[key] = value
    for key in [k for k in state if _IN_PROJ.match(k)]:
        blk = key[: -len(".in_proj.weight")]
        w_in, w_out = state[key], state[f"{blk}.out_proj.weight"]  # [H + 3C, C], [C, C + H]
        C = w_in.shape[1]
        H = w_in.shape[0] - 3 * C
        if H < 0 or tuple(w_out.shape) != (C, C + H):
            raise ValueError(f"{blk}: in_proj.weight {tuple(w_in.shape)} and out_proj.weight {tuple(w_out.shape)} "
                             f"are not a parallel-scaling block's ([H + 3C, C] and [C, C + H])")
        out[f"{blk}.mlp.fc1.weight"], out[f"{blk}.attn.qkv.weight"] = w_in[:H], w_in[H:]
        out[f"{blk}.attn.proj.weight"], out[f"{blk}.mlp.fc2.weight"] = w_out[:, :C], w_out[:, C:]
        if f"{blk}.in_proj.bias" in state:
            b_in = state[f"{blk}.in_proj.bias"]
            out[f"{blk}.mlp.fc1.bias"], out[f"{blk}.attn.qkv.bias"] = b_in[:H], b_in[H:]
        if f"{blk}.out_proj.bias" in state:
            out[f"{blk}.mlp.fc2.bias"] = state[f"{blk}.out_proj.bias"]
    return out


register_converter("vit", "timm_parallel_scaling", is_timm_parallel_scaling, from_timm_parallel_scaling)
