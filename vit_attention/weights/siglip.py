"""SigLIP checkpoint layouts onto ours (timm's ``vit_*_siglip_*``, which loads as it is).

``huggingface``: ``SiglipVisionModel`` and the image tower of ``SiglipModel`` (hub files carry a
``vision_model.`` prefix; ``text_model.*``, ``logit_scale`` and ``logit_bias`` are left out; the file
and the transformers 5 in-memory names are the same)::

    embeddings.patch_embedding                 -> patch_embed.proj
    embeddings.position_embedding.weight (N,C) -> pos_embed [1, N, C]
    encoder.layers.N.layer_norm{1,2}           -> blocks.N.norm{1,2}
    encoder.layers.N.self_attn.{q,k,v}_proj    -> blocks.N.attn.qkv (rows q, k, v)
    encoder.layers.N.self_attn.out_proj        -> blocks.N.attn.proj
    encoder.layers.N.mlp.fc{1,2}               -> blocks.N.mlp.fc{1,2}
    post_layernorm                             -> norm
    head.probe                                 -> attn_pool.latent
    head.attention.in_proj_{weight,bias}       -> attn_pool.q (rows :C), attn_pool.kv (rows C:, k then v)
    head.attention.out_proj                    -> attn_pool.proj
    head.layernorm / head.mlp.fc{1,2}          -> attn_pool.norm / attn_pool.mlp.fc{1,2}

The adapter resamples the table to the model's grid (bicubic, antialias) and drops a head of another
class count. Hugging Face resizes the table only with ``interpolate_pos_encoding=True`` and then without
antialias, so outputs agree at the native size only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from .hub import register_hf_config_reader
from .layouts import concat_qkv, register_adapter, register_converter, rename
from .vit import _adapt_vit, hf_activation, hf_num_classes, hf_vit_fields

State = dict[str, Tensor]

_DROP = ("text_model.", "logit_scale", "logit_bias", "text_projection")


def strip_vision_tower(state: Mapping[str, Tensor]) -> State:
    """The image tower of a two-tower (``vision_model.`` / ``text_model.``) state dict, prefix removed."""
    return {k.removeprefix("vision_model."): v for k, v in state.items() if not k.startswith(_DROP)}


def hf_vision_encoder_renames() -> list[tuple[str, str]]:
    """Renames shared by the transformers SigLIP and CLIP vision encoders (``encoder.layers.N.*``)."""
    return [
        (r"^embeddings\.patch_embedding\.", "patch_embed.proj."),
        (r"^encoder\.layers\.(\d+)\.", r"blocks.\1."),
        (r"\.layer_norm([12])\.", r".norm\1."),
        (r"\.self_attn\.(q|k|v)_proj\.", r".attn.\1."),
        (r"\.self_attn\.out_proj\.", ".attn.proj."),
        (r"^post_layernorm\.", "norm."),
    ]


def concat_hf_qkv(state: State) -> State:
    """``blocks.N.attn.{q,k,v}.*`` -> ``blocks.N.attn.qkv.*``."""
    return concat_qkv(state, r"(blocks\.\d+\.attn)\.q\.(weight|bias)", "{p}.q.{s}", "{p}.k.{s}", "{p}.v.{s}",
                      "{p}.qkv.{s}")


# the transformers SigLIP MAP head (``head.*``) -> ours (``attn_pool.*``); its packed in_proj: split_hf_map_head
HF_MAP_HEAD_RENAMES: list[tuple[str, str]] = [
    (r"^head\.probe$", "attn_pool.latent"),
    (r"^head\.attention\.out_proj\.", "attn_pool.proj."),
    (r"^head\.layernorm\.", "attn_pool.norm."),
    (r"^head\.mlp\.", "attn_pool.mlp."),
]


def split_hf_map_head(state: State) -> State:
    """``head.attention.in_proj_{weight,bias}`` (q rows, then k, then v) -> ``attn_pool.q.*`` and ``attn_pool.kv.*``
    (k rows then v, as timm's ``AttentionPoolLatent``); in place, returned."""
    for kind in ("weight", "bias"):
        packed = state.pop(f"head.attention.in_proj_{kind}", None)
        if packed is not None:
            C = packed.shape[0] // 3
            state[f"attn_pool.q.{kind}"], state[f"attn_pool.kv.{kind}"] = packed[:C], packed[C:]
    return state


def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any(k.removeprefix("vision_model.").startswith("embeddings.patch_embedding.") for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = strip_vision_tower(state)
    pos = state.pop("embeddings.position_embedding.weight", None)
    state.pop("embeddings.position_ids", None)  # a buffer some transformers 4 files saved
    state = rename(state, hf_vision_encoder_renames() + HF_MAP_HEAD_RENAMES + [
        (r"^classifier\.", "head."),  # SiglipForImageClassification (a patch mean, then the classifier)
    ])
    state = concat_hf_qkv(state)
    if pos is not None:
        state["pos_embed"] = pos[None]  # [1, N, C]
    return split_hf_map_head(state)


def _hf_siglip_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """VisionTransformerConfig fields a transformers ``siglip`` / ``siglip_vision_model`` config defines."""
    vision = config.get("vision_config") or config
    out: dict[str, Any] = dict(class_token=False, **hf_vit_fields(vision))
    act = hf_activation(vision)
    if act is not None:
        out["act"] = act
    if vision.get("vision_use_head", True):
        out["global_pool"] = "map"
    else:
        out.update(global_pool="avg", fc_norm=False)
    classes = hf_num_classes(config)
    out["num_classes"] = classes if classes is not None else 0
    return out


register_converter("siglip", "huggingface", _is_hf, _from_hf)
register_adapter("siglip", _adapt_vit)
register_hf_config_reader("siglip", _hf_siglip_config, family="siglip")
register_hf_config_reader("siglip_vision_model", _hf_siglip_config, family="siglip")
