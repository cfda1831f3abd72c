"""Image GPT checkpoint layouts onto ours: Hugging Face ``ImageGPT*`` and the original openai/image-gpt.

Hugging Face (``ImageGPTModel`` / ``ImageGPTForCausalImageModeling`` / ``ImageGPTForImageClassification``):
``transformer.wte`` ``[K + 1, C]`` (row ``K`` = SOS), ``transformer.wpe`` ``[N, C]``,
``transformer.h.i.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}``, ``transformer.ln_f``,
``lm_head`` ``[K, C]`` and ``score`` (classifier). ``Conv1D`` weights are stored ``(in, out)``: transposed
here into ``nn.Linear``'s ``(out, in)``. The attention's causal-mask buffers (``attn.bias``,
``attn.masked_bias``, old files) are dropped.

Original TensorFlow checkpoints (variables read into a dict of arrays, with or without the
``model/`` prefix): ``wte`` ``[K, C]`` and a separate ``sos`` ``[C]`` (our row ``K``), ``wpe``, ``wtet``
(the untied output embedding = ``lm_head``), ``h{i}/ln_1/g``, ``h{i}/attn/{q,k,v}_proj/w`` (each
``(out, in)``, no bias), ``h{i}/attn/c_proj/{w,b}``, ``h{i}/mlp/c_{fc,proj}/{w,b}`` (``(in, out)``),
``ln_f/g``; the key names map as in Hugging Face's ``load_tf_weights_in_imagegpt``. Optimiser
slots (``adam_*``, ``global_step``) are ignored.

Neither layout carries the colour clusters: the model keeps its own palette (load the real one with
``create_model(..., palette=PATH)``, see :mod:`vit_attention.models.igpt`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .hub import register_hf_config_reader
from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads, hf_fields

State = dict[str, Tensor]

_LINEAR_CONV1D = re.compile(r"^blocks\.\d+\.(attn\.(qkv|proj)|mlp\.(fc1|fc2))\.weight$")


def _keep_palette(state: State, model: nn.Module) -> State:
    """Foreign checkpoints have no clusters: keep the model's own palette."""
    own = model.state_dict()
    if "quantizer.palette" in own and "quantizer.palette" not in state:
        state["quantizer.palette"] = own["quantizer.palette"]
    return state


# ---------------------------------------------------------------- Hugging Face
def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any(re.search(r"(^|\.)h\.\d+\.attn\.c_attn\.weight$", k) for k in state) and \
        any(k.endswith("wte.weight") for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = {k.removeprefix("transformer."): v for k, v in state.items()
             if not re.search(r"\.attn\.(bias|masked_bias)$", k)}
    state = rename(state, [
        (r"^wte\.weight$", "tok_embed.weight"),
        (r"^wpe\.weight$", "pos_embed"),
        (r"^h\.(\d+)\.", r"blocks.\1."),
        (r"\.ln_1\.", ".norm1."),
        (r"\.ln_2\.", ".norm2."),
        (r"\.attn\.c_attn\.", ".attn.qkv."),
        (r"\.attn\.c_proj\.", ".attn.proj."),
        (r"\.mlp\.c_fc\.", ".mlp.fc1."),
        (r"\.mlp\.c_proj\.", ".mlp.fc2."),
        (r"^ln_f\.", "norm."),
        (r"^score\.", "head."),
    ])
    out: State = {}
    for k, v in state.items():
        if _LINEAR_CONV1D.match(k):
            v = v.t().contiguous()  # Conv1D (in, out) -> Linear (out, in)
        elif k == "pos_embed":
            v = v.unsqueeze(0)  # [N, C] -> [1, N, C]
        out[k] = v
    return _keep_palette(out, model)


# ---------------------------------------------------------------- original openai/image-gpt (TensorFlow)
def _is_original(state: Mapping[str, Any]) -> bool:
    return any(re.search(r"(^|/)h\d+/attn/q_proj/w$", k) for k in state) or \
        any(re.search(r"(^|/)wtet$", k) for k in state)


def _from_original(state: Mapping[str, Any], model: nn.Module) -> State:
    skip = ("adam_v", "adam_m", "AdamWeightDecayOptimizer", "AdamWeightDecayOptimizer_1", "global_step")
    src = {k.removeprefix("model/"): torch.as_tensor(v).squeeze() for k, v in state.items()
           if not any(s in k.split("/") for s in skip) and not k.endswith("_step")}
    out: State = {}
    qkv: dict[int, dict[str, Tensor]] = {}
    for k, v in src.items():
        if k in ("wte", "sos"):
            continue
        if k == "wpe":
            out["pos_embed"] = v.unsqueeze(0)  # [1, N, C]
        elif k == "wtet":
            out["lm_head.weight"] = v  # [K, C]
        elif k == "ln_f/g":
            out["norm.weight"] = v
        elif m := re.fullmatch(r"h(\d+)/attn/([qkv])_proj/w", k):
            qkv.setdefault(int(m[1]), {})[m[2]] = v.reshape(v.shape[-1], v.shape[-1])  # (out, in)
        elif m := re.fullmatch(r"h(\d+)/(ln_[12])/g", k):
            out[f"blocks.{m[1]}.norm{m[2][-1]}.weight"] = v
        elif m := re.fullmatch(r"h(\d+)/(attn/c_proj|mlp/c_fc|mlp/c_proj)/([wb])", k):
            name = {"attn/c_proj": "attn.proj", "mlp/c_fc": "mlp.fc1", "mlp/c_proj": "mlp.fc2"}[m[2]]
            if m[3] == "w":
                C_in = v.shape[0]
                out[f"blocks.{m[1]}.{name}.weight"] = v.reshape(C_in, -1).t().contiguous()  # (in, out) -> (out, in)
            else:
                out[f"blocks.{m[1]}.{name}.bias"] = v
        else:
            out[k] = v  # unknown: left for the strict load to name
    if "wte" in src:
        wte = src["wte"]  # [K, C]
        sos = src["sos"] if "sos" in src else torch.zeros(wte.shape[-1], dtype=wte.dtype)
        out["tok_embed.weight"] = torch.cat([wte, sos.reshape(1, -1)], dim=0)  # [K + 1, C], SOS last
    for i, parts in qkv.items():
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)  # [3C, C]
        out[f"blocks.{i}.attn.qkv.bias"] = torch.zeros(3 * parts["q"].shape[0], dtype=parts["q"].dtype)  # none
    return _keep_palette(out, model)


# ---------------------------------------------------------------- shape fitting
def _adapt_igpt(state: State, model: nn.Module, report: Any) -> State:
    """Drop a classifier whose class count differs from the model's."""
    return drop_mismatched_heads(state, model.state_dict(), ("head.",), report)


# ---------------------------------------------------------------- transformers config.json -> our config
def _hf_igpt_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """ImageGPTConfig fields a transformers ImageGPT ``config.json`` defines."""
    out = hf_fields(config, (("n_embd", "embed_dim"), ("n_layer", "depth"), ("n_head", "num_heads"),
                             ("layer_norm_epsilon", "norm_eps")))
    if "vocab_size" in config:
        out["vocab_size"] = int(config["vocab_size"]) - 1  # HF counts the SOS token
    if "n_positions" in config:
        side = int(round(int(config["n_positions"]) ** 0.5))
        out["img_size"] = side if side * side == int(config["n_positions"]) else (1, int(config["n_positions"]))
    if config.get("n_inner"):
        out["mlp_ratio"] = int(config["n_inner"]) / int(config.get("n_embd", 512))
    if config.get("activation_function", "quick_gelu") != "quick_gelu":
        raise ValueError(f"config.json activation_function={config['activation_function']!r}: ImageGPT here uses "
                         "quick_gelu only")
    if any("Classification" in a for a in config.get("architectures") or []):
        out["num_classes"] = int(config.get("num_labels", len(config.get("id2label") or {}) or 2))
    return out


register_hf_config_reader("imagegpt", _hf_igpt_config, family="igpt")
register_converter("igpt", "huggingface", _is_hf, _from_hf)
register_converter("igpt", "openai", _is_original, _from_original)
register_adapter("igpt", _adapt_igpt)
