"""DINOv2 checkpoint layouts onto ours (timm's ``vit_*_dinov2``, which loads as it is).

* ``huggingface``: ``Dinov2Model`` / ``Dinov2WithRegistersModel`` hub files (transformers 4 names, kept by
  the hub: ``embeddings.*``, ``encoder.layer.N.attention.attention.{query,key,value}``,
  ``attention.output.dense``, ``layer_scale{1,2}.lambda1``, giant ``mlp.weights_in`` / ``weights_out``,
  ``layernorm``) and the transformers 5 in-memory names (``attention.{q,k,v,o}_proj``, giant
  ``mlp.gate_proj`` / ``up_proj`` / ``down_proj``); an optional ``dinov2.`` /
  ``dinov2_with_registers.`` prefix (``*ForImageClassification``, whose classifier on
  ``[cls, mean(patches)]`` has no equivalent here and is left out).
* ``original``: facebookresearch/dinov2 hub files (``dinov2_vit{s,b,l,g}14[_reg]``): timm's names but
  ``register_tokens``, ``mask_token`` and the giant's ``mlp.w12`` / ``mlp.w3``; chunked training
  checkpoints (``blocks.<chunk>.<i>.``) are flattened.

Both drop the iBOT ``mask_token`` (pretraining only). Both keep the class slot in the position table;
for a model with ``no_embed_class`` (the register presets) it is folded into the class token:
``cls_token' = cls_token + pos_embed[:, :1]``, ``pos_embed' = pos_embed[:, 1:]`` (the class token never
gets resampled, so this is exact; timm's ``_convert_dinov2`` does the same). The adapter resamples the
table to the model's grid (bicubic, antialias: timm's rule) and drops a head of another class count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .hub import register_hf_config_reader
from .layouts import concat_qkv, register_adapter, register_converter, rename
from .vit import _adapt_vit, hf_activation, hf_vit_fields

State = dict[str, Tensor]

__all__ = ["fold_class_pos_embed"]


def fold_class_pos_embed(state: State, model: nn.Module | None) -> State:
    """Move the class slot of ``pos_embed [1, 1 + N, C]`` into ``cls_token`` when ``model`` has ``no_embed_class``."""
    cfg = getattr(model, "cfg", None)
    pos, cls = state.get("pos_embed"), state.get("cls_token")
    if cfg is None or not cfg.no_embed_class or pos is None or cls is None or pos.dim() != 3:
        return state  # a table of another rank is left for the shape check to report
    own = model.state_dict().get("pos_embed") if model is not None else None
    n_grid = own.shape[1] if own is not None else None
    if n_grid is not None and pos.shape[1] == n_grid:
        return state  # already without a class slot
    state["cls_token"] = cls + pos[:, :1]
    state["pos_embed"] = pos[:, 1:]
    return state


# ---------------------------------------------------------------- Hugging Face Dinov2(WithRegisters)Model
def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any(k.removeprefix("dinov2.").removeprefix("dinov2_with_registers.").startswith(
        "embeddings.patch_embeddings.projection") for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = {k.removeprefix("dinov2_with_registers.").removeprefix("dinov2."): v for k, v in state.items()
             if k not in ("classifier.weight", "classifier.bias")}
    state.pop("embeddings.mask_token", None)
    state = rename(state, [
        (r"^embeddings\.cls_token$", "cls_token"),
        (r"^embeddings\.register_tokens$", "reg_token"),
        (r"^embeddings\.position_embeddings$", "pos_embed"),
        (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (r"^encoder\.layer\.(\d+)\.", r"blocks.\1."),
        (r"\.attention\.attention\.(query|key|value)\.", r".attn.\1."),  # hub files
        (r"\.attention\.output\.dense\.", ".attn.proj."),
        (r"\.attention\.q_proj\.", ".attn.query."),  # transformers 5 in-memory names
        (r"\.attention\.k_proj\.", ".attn.key."),
        (r"\.attention\.v_proj\.", ".attn.value."),
        (r"\.attention\.o_proj\.", ".attn.proj."),
        (r"\.layer_scale([12])\.lambda1$", r".ls\1.gamma"),
        (r"\.mlp\.weights_in\.", ".mlp.fc1."),  # giant, hub files: packed [gate; up]
        (r"\.mlp\.weights_out\.", ".mlp.fc2."),
        (r"\.mlp\.down_proj\.", ".mlp.fc2."),
        (r"^layernorm\.", "norm."),
    ])
    state = concat_qkv(state, r"(blocks\.\d+\.attn)\.query\.(weight|bias)", "{p}.query.{s}", "{p}.key.{s}",
                       "{p}.value.{s}", "{p}.qkv.{s}")
    for key in [k for k in state if ".mlp.gate_proj." in k]:  # transformers 5 split the packed fc1: gate rows first
        up = key.replace(".gate_proj.", ".up_proj.")
        state[key.replace(".gate_proj.", ".fc1.")] = torch.cat([state.pop(key), state.pop(up)], dim=0)
    return fold_class_pos_embed(state, model)


# ---------------------------------------------------------------- facebookresearch/dinov2
def _is_original(state: Mapping[str, Tensor]) -> bool:
    return "mask_token" in state or "register_tokens" in state or any(".mlp.w12." in k for k in state)


def _from_original(state: State, model: nn.Module) -> State:
    state = dict(state)
    state.pop("mask_token", None)
    state = rename(state, [
        (r"^register_tokens$", "reg_token"),
        (r"^blocks\.\d+\.(\d+)\.", r"blocks.\1."),  # BlockChunk: blocks.<chunk>.<global index>.
        (r"\.mlp\.w12\.", ".mlp.fc1."),
        (r"\.mlp\.w3\.", ".mlp.fc2."),
    ])
    return fold_class_pos_embed(state, model)


def _adapt_dinov2(state: State, model: nn.Module, report: Any) -> State:
    """A timm-layout file with a class slot loaded into a ``no_embed_class`` model of the same grid is
    folded (:func:`fold_class_pos_embed`), then ViT's adapter (table resampling, heads)."""
    own, pos = model.state_dict().get("pos_embed"), state.get("pos_embed")
    if model.cfg.no_embed_class and own is not None and pos is not None and pos.dim() == own.dim() == 3 \
            and pos.shape[1] == own.shape[1] + 1:
        state = fold_class_pos_embed(state, model)
        report.notes.append("class slot of pos_embed folded into cls_token (no_embed_class)")
    return _adapt_vit(state, model, report)


# ---------------------------------------------------------------- transformers config.json -> our config
def _hf_dinov2_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """VisionTransformerConfig fields a transformers ``dinov2`` / ``dinov2_with_registers`` config defines."""
    out = hf_vit_fields(config, (("qkv_bias", "qkv_bias"), ("mlp_ratio", "mlp_ratio"),
                                 ("layerscale_value", "init_values")))
    if config.get("use_swiglu_ffn"):
        out.update(mlp_layer="glu", act="silu")
        C = int(config.get("hidden_size", 768))
        hidden = (int(C * float(config.get("mlp_ratio", 4)) * 2 / 3) + 7) // 8 * 8
        out["mlp_ratio"] = 2 * hidden / C
    else:
        act = hf_activation(config)
        if act is not None:
            out["act"] = act
    if config.get("model_type") == "dinov2_with_registers":
        out.update(reg_tokens=int(config.get("num_register_tokens", 4)), no_embed_class=True)
    else:
        out.update(reg_tokens=0, no_embed_class=False)
    return out


register_converter("dinov2", "huggingface", _is_hf, _from_hf)
register_converter("dinov2", "original", _is_original, _from_original)
register_adapter("dinov2", _adapt_dinov2)
register_hf_config_reader("dinov2", _hf_dinov2_config, family="dinov2")
register_hf_config_reader("dinov2_with_registers", _hf_dinov2_config, family="dinov2")
