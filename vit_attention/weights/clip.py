"""CLIP checkpoint layouts onto ours (timm's ``vit_*_clip_*``, which loads as it is).

* ``huggingface``: ``CLIPVisionModel`` / ``CLIPVisionModelWithProjection`` and the image tower of
  ``CLIPModel`` (``vision_model.`` prefix; ``text_model.*``, ``text_projection``, ``logit_scale`` left out;
  file and transformers 5 memory names agree)::

      embeddings.class_embedding (C,)              -> cls_token [1, 1, C]
      embeddings.patch_embedding                   -> patch_embed.proj (no bias)
      embeddings.position_embedding.weight (1+N,C) -> pos_embed [1, 1 + N, C]
      pre_layrnorm (sic)                           -> norm_pre
      encoder.layers.N.*                           -> blocks.N.* (as SigLIP: layer_norm{1,2}, self_attn, mlp)
      post_layernorm                               -> norm
      visual_projection.weight (P, C)              -> head.weight, head.bias = 0

* ``openai``: OpenAI CLIP / OpenCLIP image towers (``visual.`` prefix optional; a full two-tower file
  keeps only ``visual.*``): ``class_embedding``, ``positional_embedding``, ``conv1``, ``ln_pre``,
  ``transformer.resblocks.N.{ln_1, attn.in_proj_*, attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}``,
  ``ln_post`` and ``proj`` ``(C, P)``, which becomes ``head.weight = projᵀ`` with a zero bias.

Neither Hugging Face's ``last_hidden_state`` nor the OpenAI tower's token output goes through the final
norm; ours (``forward_features``) does, like timm's. The adapter resamples the table (bicubic, antialias)
and drops a head of another class count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .hub import register_hf_config_reader
from .layouts import register_adapter, register_converter, rename
from .siglip import concat_hf_qkv, hf_vision_encoder_renames, strip_vision_tower
from .vit import HF_ACTS, _adapt_vit, hf_activation, hf_vit_fields

State = dict[str, Tensor]


def _with_zero_bias(state: State) -> State:
    w = state.get("head.weight")
    if w is not None and "head.bias" not in state:
        state["head.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
    return state


# ---------------------------------------------------------------- Hugging Face CLIP
def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any(k.removeprefix("vision_model.") == "embeddings.class_embedding" for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = strip_vision_tower(state)
    state.pop("embeddings.position_ids", None)
    cls = state.pop("embeddings.class_embedding")
    pos = state.pop("embeddings.position_embedding.weight", None)
    state = rename(state, hf_vision_encoder_renames() + [
        (r"^pre_layrnorm\.", "norm_pre."),
        (r"^visual_projection\.", "head."),
    ])
    state = concat_hf_qkv(state)
    state["cls_token"] = cls.reshape(1, 1, -1)
    if pos is not None:
        state["pos_embed"] = pos[None]
    return _with_zero_bias(state)


# ---------------------------------------------------------------- OpenAI CLIP / OpenCLIP
def _is_openai(state: Mapping[str, Tensor]) -> bool:
    return any(k.removeprefix("visual.") == "conv1.weight" for k in state) and any(
        "transformer.resblocks." in k for k in state)


def _from_openai(state: State, model: nn.Module) -> State:
    if any(k.startswith("visual.") for k in state):
        state = {k[len("visual."):]: v for k, v in state.items() if k.startswith("visual.")}
    else:
        state = dict(state)
    proj = state.pop("proj", None)
    cls = state.pop("class_embedding")
    pos = state.pop("positional_embedding", None)
    state = rename(state, [
        (r"^conv1\.", "patch_embed.proj."),
        (r"^ln_pre\.", "norm_pre."),
        (r"^ln_post\.", "norm."),
        (r"^transformer\.resblocks\.(\d+)\.", r"blocks.\1."),
        (r"\.ln_([12])\.", r".norm\1."),
        (r"\.attn\.in_proj_(weight|bias)$", r".attn.qkv.\1"),
        (r"\.attn\.out_proj\.", ".attn.proj."),
        (r"\.mlp\.c_fc\.", ".mlp.fc1."),
        (r"\.mlp\.c_proj\.", ".mlp.fc2."),
    ])
    state["cls_token"] = cls.reshape(1, 1, -1)
    if pos is not None:
        state["pos_embed"] = pos[None]
    if proj is not None:
        state["head.weight"] = proj.t().contiguous()  # [P, C]
    return _with_zero_bias(state)


# ---------------------------------------------------------------- transformers config.json -> our config
_CLIP_ACTS = {**HF_ACTS, "quick_gelu": "quick_gelu"}


def _hf_clip_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """VisionTransformerConfig fields a transformers ``clip`` / ``clip_vision_model`` config defines."""
    vision = config.get("vision_config") or config
    out: dict[str, Any] = dict(class_token=True, pre_norm=True, global_pool="token", **hf_vit_fields(vision))
    act = hf_activation(vision, _CLIP_ACTS)
    out["act"] = act if act is not None else "quick_gelu"  # transformers' CLIP default
    archs = config.get("architectures") or []
    projected = config.get("model_type") == "clip" or any("WithProjection" in a for a in archs)
    out["num_classes"] = int(config.get("projection_dim", vision.get("projection_dim", 512))) if projected else 0
    return out


register_converter("clip", "huggingface", _is_hf, _from_hf)
register_converter("clip", "openai", _is_openai, _from_openai)
register_adapter("clip", _adapt_vit)
register_hf_config_reader("clip", _hf_clip_config, family="clip")
register_hf_config_reader("clip_vision_model", _hf_clip_config, family="clip")
