"""PVT v1 / PVTv2 checkpoint layouts onto ours: timm ``pvt_v2``, the original whai362/PVT, Hugging Face.

* timm ``pvt_v2_*`` (the layout our PVTv2 follows): only the classifier differs, ``head.`` -> ``head.fc.``.
* original whai362/PVT (``classification/pvt.py``, ``pvt_v2.py``): ``patch_embed{1..4}``, ``block{k}.{j}``,
  v1 ``pos_embed{1..4}`` / ``cls_token`` / ``norm``, v2 ``norm{1..4}`` (stage norms) and ``mlp.dwconv.dwconv``.
* Hugging Face ``PvtModel`` / ``PvtForImageClassification`` (``pvt.encoder.patch_embeddings.{i}`` with
  ``position_embeddings`` / ``cls_token``, ``pvt.encoder.block.{i}.{j}.attention.self.{query,key,value,
  sequence_reduction,layer_norm}``, ``attention.output.dense``) and ``PvtV2Model`` / ``PvtV2Backbone`` /
  ``PvtV2ForImageClassification`` (``pvt_v2.encoder.layers.{i}.{patch_embedding, blocks.{j}, layer_norm}``,
  ``attention.{query,key,value,spatial_reduction,layer_norm,proj}``, ``mlp.{dense1,dwconv.dwconv,dense2}``).
  Separate ``key`` / ``value`` are packed into our ``kv`` (``[k | v]`` along the output dim).

An adapter resamples PVT v1's per-stage position tables bilinearly when the checkpoint's grid differs
from the model's (the class-token row kept aside) and drops a classifier for another number of classes.
A transformers ``config.json`` maps to our config (note: transformers uses ``layer_norm_eps`` for every
LayerNorm, so both ``norm_eps`` and ``embed_norm_eps`` take it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..functional import resample_abs_pos_embed
from .hub import register_hf_config_reader
from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads, hf_activation, hf_classes, hf_fields

__all__ = ["pack_kv"]

State = dict[str, Tensor]


def pack_kv(state: State, key: str = "key", value: str = "value") -> State:
    """Every ``<p>.attn.{key}.<s>`` / ``<p>.attn.{value}.<s>`` pair -> ``<p>.attn.kv.<s>`` (``[k | v]``, dim 0)."""
    rx = re.compile(rf"(.*\.attn)\.{key}\.(weight|bias)")
    for k in list(state):
        m = rx.fullmatch(k)
        if m:
            p, s = m.group(1), m.group(2)
            state[f"{p}.kv.{s}"] = torch.cat([state.pop(k), state.pop(f"{p}.{value}.{s}")], dim=0)
    return state


def _head(state: State) -> State:
    """A bare ``head.weight`` / ``head.bias`` classifier -> ``head.fc.*``."""
    return {re.sub(r"^head\.(weight|bias)$", r"head.fc.\1", k): v for k, v in state.items()}


def _strip(state: Mapping[str, Tensor], prefix: str) -> State:
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


# ---------------------------------------------------------------- timm pvt_v2
def _is_timm_v2(state: Mapping[str, Tensor]) -> bool:
    return "head.weight" in state and "patch_embed.proj.weight" in state and \
        any(k.startswith("stages.") for k in state)


# ---------------------------------------------------------------- original whai362/PVT
_ORIGINAL_COMMON = [
    (r"^patch_embed1\.", "patch_embed."),
    (r"^patch_embed(\d+)\.", lambda m: f"stages.{int(m.group(1)) - 1}.downsample."),
    (r"^block(\d+)\.(\d+)\.", lambda m: f"stages.{int(m.group(1)) - 1}.blocks.{m.group(2)}."),
]


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return "patch_embed1.proj.weight" in state and any(k.startswith("block1.") for k in state)


def _from_original_v2(state: State, model: nn.Module) -> State:
    state = rename(state, [*_ORIGINAL_COMMON, (r"\.mlp\.dwconv\.dwconv\.", ".mlp.dwconv."),
                           (r"^norm(\d+)\.", lambda m: f"stages.{int(m.group(1)) - 1}.norm.")])  # type: ignore[list-item]
    return _head(state)


def _from_original_v1(state: State, model: nn.Module) -> State:
    last = len(model.cfg.depths) - 1  # type: ignore[union-attr]  # the config's: a pruned features model has fewer
    state = rename(state, [*_ORIGINAL_COMMON, (r"^pos_embed1$", "patch_embed.pos_embed"),
                           (r"^pos_embed(\d+)$", lambda m: f"stages.{int(m.group(1)) - 1}.downsample.pos_embed"),
                           (r"^cls_token$", f"stages.{last}.downsample.cls_token")])  # type: ignore[list-item]
    return _head(state)


# ---------------------------------------------------------------- Hugging Face
def _is_hf_v1(state: Mapping[str, Tensor]) -> bool:
    return any(".patch_embeddings." in k or k.startswith("encoder.patch_embeddings.") for k in state)


# The block names of transformers' two PVT ports (PvtModel: ``attention.self.*``, ``sequence_reduction``,
# ``attention.output.dense``; PvtV2Model: ``attention.*``, ``spatial_reduction``, ``attention.proj``, the depth-wise
# conv inside the MLP) and the classifier, after the block prefix is ours.
_HF_BLOCK_RULES: tuple[tuple[str, str], ...] = (
    (r"\.layer_norm_1\.", ".norm1."),
    (r"\.layer_norm_2\.", ".norm2."),
    (r"\.attention\.(?:self\.)?query\.", ".attn.q."),
    (r"\.attention\.(?:self\.)?key\.", ".attn.key."),
    (r"\.attention\.(?:self\.)?value\.", ".attn.value."),
    (r"\.attention\.(?:self\.)?(?:sequence|spatial)_reduction\.", ".attn.sr."),
    (r"\.attention\.(?:self\.)?layer_norm\.", ".attn.norm."),
    (r"\.attention\.(?:output\.dense|proj)\.", ".attn.proj."),
    (r"\.mlp\.dense1\.", ".mlp.fc1."),
    (r"\.mlp\.dwconv\.dwconv\.", ".mlp.dwconv."),
    (r"\.mlp\.dense2\.", ".mlp.fc2."),
    (r"^classifier\.", "head.fc."),
)


def _from_hf_v1(state: State, model: nn.Module) -> State:
    state = rename(_strip(state, "pvt."), [
        (r"^encoder\.patch_embeddings\.0\.", "patch_embed."),
        (r"^encoder\.patch_embeddings\.(\d+)\.", r"stages.\1.downsample."),
        (r"(patch_embed|downsample)\.projection\.", r"\1.proj."),
        (r"(patch_embed|downsample)\.layer_norm\.", r"\1.norm."),
        (r"(patch_embed|downsample)\.position_embeddings$", r"\1.pos_embed"),
        (r"^encoder\.block\.(\d+)\.(\d+)\.", r"stages.\1.blocks.\2."),
        (r"^encoder\.layer_norm\.", "norm."),
        *_HF_BLOCK_RULES,
    ])
    return pack_kv(state)


def _is_hf_v2(state: Mapping[str, Tensor]) -> bool:
    return any(re.match(r"^(pvt_v2\.)?encoder\.layers\.\d+\.patch_embedding\.", k) for k in state)


def _from_hf_v2(state: State, model: nn.Module) -> State:
    state = rename(_strip(state, "pvt_v2."), [
        (r"^encoder\.layers\.0\.patch_embedding\.", "patch_embed."),
        (r"^encoder\.layers\.(\d+)\.patch_embedding\.", r"stages.\1.downsample."),
        (r"(patch_embed|downsample)\.layer_norm\.", r"\1.norm."),
        (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.", r"stages.\1.blocks.\2."),
        (r"^encoder\.layers\.(\d+)\.layer_norm\.", r"stages.\1.norm."),
        *_HF_BLOCK_RULES,
    ])
    return pack_kv(state)


# ---------------------------------------------------------------- shape fitting
def _adapt_pvt(state: State, model: nn.Module, report: Any) -> State:
    """Resample PVT v1 position tables to the model's grids; drop a classifier of another size."""
    own = model.state_dict()
    resampled = 0
    for key, v in list(state.items()):
        if not key.endswith("pos_embed") or key not in own or v.shape == own[key].shape or v.shape[-1] != \
                own[key].shape[-1] or v.dim() != 3:
            continue  # another rank (1-D, 2-D ...) is left for the shape check to report
        embed = model.get_submodule(key.rsplit(".", 1)[0])
        P = getattr(embed, "num_prefix_tokens", 0)
        side = math.isqrt(v.shape[1] - P)
        if side * side != v.shape[1] - P:
            continue  # not a square table: left for the shape check to report
        state[key] = resample_abs_pos_embed(v, embed.grid, (side, side), num_prefix_tokens=P,
                                            interpolation="bilinear", antialias=False)
        resampled += 1
    if resampled:
        report.notes.append(f"{resampled} position table(s) resampled bilinearly to the model's grids")
    return drop_mismatched_heads(state, own, ("head.fc.",), report)


# ---------------------------------------------------------------- transformers config.json -> our config
def _hf_pvt_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """PvtConfig / PvtV2Config fields a transformers Pvt / PvtV2 ``config.json`` defines."""
    out = hf_fields(config, (("hidden_sizes", "embed_dims"), ("depths", "depths"), ("num_attention_heads", "num_heads"),
                             ("mlp_ratios", "mlp_ratios"), ("qkv_bias", "qkv_bias"), ("num_channels", "in_chans"),
                             ("linear_attention", "linear")))
    ratios = config.get("sr_ratios", config.get("sequence_reduction_ratios"))
    if ratios is not None:
        out["sr_ratios"] = tuple(ratios)
    if "mlp_ratios" in out:
        out["mlp_ratios"] = tuple(float(r) for r in out["mlp_ratios"])
    if "layer_norm_eps" in config:  # transformers uses it for every LayerNorm
        out["norm_eps"] = out["embed_norm_eps"] = config["layer_norm_eps"]
    size = config.get("image_size")
    if isinstance(size, int) or (isinstance(size, (list, tuple)) and len(size) == 2):
        out["img_size"] = tuple(size) if isinstance(size, (list, tuple)) else size
    if config.get("model_type") == "pvt" and config.get("patch_sizes"):
        out["patch_size"] = int(config["patch_sizes"][0])
    hf_activation(config, {"gelu": "gelu"})  # the MLPs are GELU: anything else is refused, naming hidden_act
    out.update(hf_classes(config))
    return out


register_hf_config_reader("pvt", _hf_pvt_config, family="pvt")
register_hf_config_reader("pvt_v2", _hf_pvt_config, family="pvt_v2")
register_converter("pvt_v2", "timm", _is_timm_v2, lambda state, model: _head(state))
register_converter("pvt_v2", "original", _is_original, _from_original_v2)
register_converter("pvt_v2", "huggingface", _is_hf_v2, _from_hf_v2)
register_converter("pvt", "original", _is_original, _from_original_v1)
register_converter("pvt", "huggingface", _is_hf_v1, _from_hf_v1)
for _family in ("pvt", "pvt_v2"):
    register_adapter(_family, _adapt_pvt)
