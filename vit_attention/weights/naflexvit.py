"""NaFlexViT checkpoint layouts onto ours (timm's ``NaFlexVit``, which loads as it is).

``huggingface``: ``Siglip2VisionModel`` and the image tower of ``Siglip2Model`` (hub files carry a
``vision_model.`` prefix; the text tower, ``logit_scale`` and ``logit_bias`` are left out)::

    embeddings.patch_embedding (Linear, (ph, pw, C) patches) -> embeds.proj
    embeddings.position_embedding.weight (Gh·Gw, C)          -> embeds.pos_embed [1, Gh, Gw, C]
    encoder.layers.N.* / post_layernorm / head.*             -> blocks.N.* / norm / attn_pool.* (as SigLIP)

A classic timm ViT checkpoint (``patch_embed.proj`` conv ``[O, C, ph, pw]``, ``pos_embed [1, N, C]``,
``cls_token`` / ``reg_token``) is converted as timm's ``checkpoint_filter_fn`` does: the conv kernel
flattened as ``(ph, pw, C)``, a square table reshaped to ``[1, G, G, C]`` (prefix rows, if the table has
them, folded into the tokens).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from torch import Tensor, nn

from .layouts import register_converter, rename
from .siglip import HF_MAP_HEAD_RENAMES, concat_hf_qkv, hf_vision_encoder_renames, split_hf_map_head, strip_vision_tower

State = dict[str, Tensor]


def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any(k.removeprefix("vision_model.").startswith("embeddings.patch_embedding.") for k in state)


def _grid_table(pos: Tensor) -> Tensor:
    """A square table ``[N, C]`` or ``[1, N, C]`` -> ``[1, G, G, C]``."""
    pos = pos.reshape(-1, pos.shape[-1])
    g = math.isqrt(pos.shape[0])
    if g * g != pos.shape[0]:
        raise ValueError(f"position table of {pos.shape[0]} rows is not a square grid")
    return pos.reshape(1, g, g, -1)


def _from_hf(state: State, model: nn.Module) -> State:
    state = strip_vision_tower(state)
    pos = state.pop("embeddings.position_embedding.weight", None)
    state.pop("embeddings.position_ids", None)
    state = rename(state, [(r"^embeddings\.patch_embedding\.", "embeds.proj.")] + hf_vision_encoder_renames()
                   + HF_MAP_HEAD_RENAMES)
    state = concat_hf_qkv(state)
    if pos is not None:
        state["embeds.pos_embed"] = _grid_table(pos)
    return split_hf_map_head(state)


def _is_classic_timm(state: Mapping[str, Tensor]) -> bool:
    return "patch_embed.proj.weight" in state and not any(k.startswith("embeds.") for k in state)


def _from_classic_timm(state: State, model: nn.Module) -> State:
    out: State = {}
    prefix = {k: v.clone() for k, v in state.items() if k in ("cls_token", "reg_token")}
    n_prefix = sum(v.shape[1] for v in prefix.values())
    for k, v in state.items():
        if k == "patch_embed.proj.weight":
            out["embeds.proj.weight"] = v.permute(0, 2, 3, 1).flatten(1) if v.dim() == 4 else v
        elif k == "patch_embed.proj.bias":
            out["embeds.proj.bias"] = v
        elif k == "pos_embed":
            n = v.shape[1]
            if n_prefix and math.isqrt(n - n_prefix) ** 2 == n - n_prefix and math.isqrt(n) ** 2 != n:
                rows = v[:, :n_prefix]  # the table covers the prefix tokens: fold their rows into them
                if "cls_token" in prefix:
                    prefix["cls_token"] = prefix["cls_token"] + rows[:, :1]
                    rows = rows[:, 1:]
                if "reg_token" in prefix:
                    prefix["reg_token"] = prefix["reg_token"] + rows
                v = v[:, n_prefix:]
            out["embeds.pos_embed"] = _grid_table(v)
        elif k not in prefix:
            out[k] = v
    out.update({f"embeds.{k}": v for k, v in prefix.items()})
    return out


register_converter("naflexvit", "huggingface", _is_hf, _from_hf)
register_converter("naflexvit", "timm_vit", _is_classic_timm, _from_classic_timm)
