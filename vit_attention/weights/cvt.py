"""CvT checkpoint layouts onto ours: Hugging Face ``CvtModel`` / ``CvtForImageClassification``, original microsoft/CvT.

* Hugging Face: ``cvt.encoder.stages.{i}.embedding.convolution_embeddings.{projection,normalization}``,
  ``….layers.{j}.attention.attention.convolution_projection_{query,key,value}.convolution_projection.
  {convolution,normalization}``, ``….attention.attention.projection_{query,key,value}``,
  ``….attention.output.dense``, ``….intermediate.dense``, ``….output.dense``,
  ``….layernorm_before/after``, ``cvt.encoder.stages.{i}.cls_token``, ``layernorm``, ``classifier``
  (``CvtModel`` has no ``cvt.`` prefix). Its MLP is exact GELU: build the model with
  ``act_layer="gelu"`` to reproduce the port (the weights were trained with QuickGELU).
* original microsoft/CvT (``lib/models/cls_cvt.py``): ours with ``stage{i}.`` for ``stages.{i}.``.

Neither packs q / k / v. BatchNorm running statistics come along (``num_batches_tracked`` too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from .hub import register_hf_config_reader
from .layouts import register_adapter, register_converter, rename
from .vit import HF_BLOCK_RULES, drop_mismatched_heads, hf_classes, hf_fields

__all__: list[str] = []

State = dict[str, Tensor]


# ---------------------------------------------------------------- Hugging Face
def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any("embedding.convolution_embeddings." in k for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = {re.sub(r"^cvt\.", "", k): v for k, v in state.items()}
    return rename(state, [
        (r"^encoder\.stages\.(\d+)\.embedding\.convolution_embeddings\.projection\.", r"stages.\1.patch_embed.proj."),
        (r"^encoder\.stages\.(\d+)\.embedding\.convolution_embeddings\.normalization\.",
         r"stages.\1.patch_embed.norm."),
        (r"^encoder\.stages\.(\d+)\.cls_token$", r"stages.\1.cls_token"),
        (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.", r"stages.\1.blocks.\2."),
        # query / key / value -> q / k / v (their first letters)
        (r"\.attention\.attention\.convolution_projection_([qkv])[a-z]*\.convolution_projection\.convolution\.",
         r".attn.conv_proj_\1.conv."),
        (r"\.attention\.attention\.convolution_projection_([qkv])[a-z]*\.convolution_projection\.normalization\.",
         r".attn.conv_proj_\1.bn."),
        (r"\.attention\.attention\.projection_([qkv])[a-z]*\.", r".attn.proj_\1."),
        *HF_BLOCK_RULES,
        (r"^classifier\.", "head."),
    ])


# ---------------------------------------------------------------- original microsoft/CvT
def _is_original(state: Mapping[str, Tensor]) -> bool:
    return any(re.match(r"^stage\d+\.(patch_embed|blocks)\.", k) for k in state)


def _from_original(state: State, model: nn.Module) -> State:
    return {re.sub(r"^stage(\d+)\.", r"stages.\1.", k): v for k, v in state.items()}


def _adapt_cvt(state: State, model: nn.Module, report: Any) -> State:
    """Drop a classifier for a different number of classes (left freshly initialised)."""
    return drop_mismatched_heads(state, model.state_dict(), ("head.",), report)


# ---------------------------------------------------------------- transformers config.json -> our config
def _first_stage_value(config: Mapping[str, Any], key: str) -> Any:
    """One value for a per-stage list that must agree across stages (ours is one field); else raises naming it."""
    v = config[key]
    if isinstance(v, (list, tuple)):
        if len(set(v)) != 1:
            raise ValueError(f"config.json {key}={v!r} differs per stage; this CvT takes one value for all stages")
        return v[0]
    return v


def _hf_cvt_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """CvtConfig fields a transformers Cvt ``config.json`` defines (``act_layer="gelu"``: the port's MLP)."""
    out: dict[str, Any] = {"act_layer": "gelu"}
    out.update(hf_fields(config, (("num_channels", "in_chans"), ("embed_dim", "embed_dims"), ("depth", "depths"),
                                  ("num_heads", "num_heads"), ("patch_sizes", "patch_sizes"),
                                  ("patch_stride", "patch_strides"), ("patch_padding", "patch_paddings"))))
    for theirs, ours in (("mlp_ratio", "mlp_ratio"), ("qkv_bias", "qkv_bias"), ("kernel_qkv", "kernel_size"),
                         ("stride_kv", "stride_kv"), ("qkv_projection_method", "proj_method")):
        if theirs in config:
            out[ours] = _first_stage_value(config, theirs)
    if "cls_token" in config:
        cls = list(config["cls_token"])
        if any(cls[:-1]):
            raise ValueError(f"config.json cls_token={cls!r}: only the last stage may have a class token")
        out["cls_token"] = bool(cls[-1])
    out.update(hf_classes(config))
    return out


register_hf_config_reader("cvt", _hf_cvt_config, family="cvt")
register_converter("cvt", "huggingface", _is_hf, _from_hf)
register_converter("cvt", "original", _is_original, _from_original)
register_adapter("cvt", _adapt_cvt)
