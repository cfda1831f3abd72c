"""BEiT / BEiT v2 checkpoint layouts onto ours (:mod:`vit_attention.models.beit`).

* ``timm``: timm 1.0.31 ``Beit`` files and the microsoft/unilm ``beit`` / ``beit2`` originals (the same names):
  ``blocks.N.gamma_1`` / ``gamma_2`` become ``ls1.gamma`` / ``ls2.gamma``; the ``relative_position_index``
  buffers (persistent in the originals) are dropped, as is the zero ``k_bias``; a shared table
  (``rel_pos_bias.relative_position_bias_table``, the pre-training files' ``use_shared_rel_pos_bias``) is
  copied into every block's ``attn.relative_position_bias_table`` (unilm's ``run_class_finetuning.py``);
  pre-training's ``mask_token`` / ``lm_head`` are dropped.
* ``huggingface``: transformers ``BeitModel`` / ``BeitForImageClassification``, both the hub files' names
  (``beit.encoder.layer.N.attention.attention.{query, key, value}``, ``attention.output.dense``,
  ``intermediate.dense`` / ``output.dense``, ``lambda_1`` / ``lambda_2``, ``layernorm_before`` / ``_after``,
  ``relative_position_bias.relative_position_bias_table``, ``pooler.layernorm``, ``classifier``) and
  transformers 5.24's in-memory names (``beit.layers.N.attention.{q,k,v,o}_proj``, ``mlp.fc1`` / ``fc2``,
  ``layers.N.relative_position_bias.*``, ``shared_position_bias.*``). The key projection has no bias; q and v
  biases become ``q_bias`` / ``v_bias``. transformers' default LayerNorm eps is 1e-12 (timm's 1e-6): a model
  for HF weights takes ``norm_eps`` from the folder's ``config.json`` (:func:`_hf_beit_config`).

The adapter resamples square tables of another grid to the model's (timm's rule,
:func:`~vit_attention.attention.beit_rel_pos.resize_beit_bias_table`, as timm's ``checkpoint_filter_fn``), then
runs ViT's (a ``pos_embed`` of another grid resampled, a head of another class count dropped).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..attention.beit_rel_pos import NUM_PREFIX_ROWS, resize_beit_bias_table
from .hub import register_hf_config_reader
from .layouts import concat_qkv, register_adapter, register_converter, rename
from .vit import _adapt_vit, hf_activation, hf_classes, hf_vit_fields

State = dict[str, Tensor]

_TABLE = "attn.relative_position_bias_table"


def _share_table(state: State, shared_key: str, model: nn.Module) -> State:
    """Copy a model-level table ``state[shared_key]`` into every block that has none (BEiT fine-tuning's start)."""
    shared = state.pop(shared_key, None)
    if shared is None:
        return state
    for i in range(len(getattr(model, "blocks", ()))):
        state.setdefault(f"blocks.{i}.{_TABLE}", shared.clone())
    return state


# ---------------------------------------------------------------- timm / unilm
def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return any(re.fullmatch(r"blocks\.\d+\.(gamma_[12]|attn\.relative_position_index)", k)
               or k.startswith("rel_pos_bias.") for k in state)


def _from_timm(state: State, model: nn.Module) -> State:
    state = {k: v for k, v in state.items() if not k.endswith((".relative_position_index", ".k_bias"))
             and not k.startswith(("lm_head.", "mask_token"))}
    state = rename(state, [(r"^(blocks\.\d+)\.gamma_([12])$", r"\1.ls\2.gamma")])
    return _share_table(state, "rel_pos_bias.relative_position_bias_table", model)


# ---------------------------------------------------------------- Hugging Face BeitModel / BeitForImageClassification
def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any(k.removeprefix("beit.").startswith("embeddings.patch_embeddings.projection") for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = {k.removeprefix("beit."): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.endswith(".relative_position_index")
             and k != "embeddings.mask_token"}
    state = rename(state, [
        (r"^embeddings\.cls_token$", "cls_token"),
        (r"^embeddings\.position_embeddings$", "pos_embed"),
        (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (r"^encoder\.relative_position_bias\.", "shared_table."),  # hub files' shared table
        (r"^shared_position_bias\.", "shared_table."),  # transformers 5 in memory
        (r"^(?:encoder\.layer|layers)\.(\d+)\.", r"blocks.\1."),
        (r"\.attention\.attention\.relative_position_bias\.relative_position_bias_table$", f".{_TABLE}"),
        (r"\.relative_position_bias\.relative_position_bias_table$", f".{_TABLE}"),
        (r"\.attention\.attention\.(query|key|value)\.", r".attn.\1."),  # hub files
        (r"\.attention\.output\.dense\.", ".attn.proj."),
        (r"\.intermediate\.dense\.", ".mlp.fc1."),
        (r"\.output\.dense\.", ".mlp.fc2."),
        (r"\.attention\.q_proj\.", ".attn.query."),  # transformers 5 in-memory names
        (r"\.attention\.k_proj\.", ".attn.key."),
        (r"\.attention\.v_proj\.", ".attn.value."),
        (r"\.attention\.o_proj\.", ".attn.proj."),
        (r"\.lambda_([12])$", r".ls\1.gamma"),
        (r"\.layernorm_before\.", ".norm1."),
        (r"\.layernorm_after\.", ".norm2."),
        (r"^pooler\.layernorm\.", "fc_norm."),
        (r"^layernorm\.", "norm."),
        (r"^classifier\.", "head."),
    ])
    for key in [k for k in state if re.fullmatch(r"blocks\.\d+\.attn\.query\.bias", k)]:
        p = key.removesuffix(".query.bias")
        state[f"{p}.q_bias"] = state.pop(key)
        state[f"{p}.v_bias"] = state.pop(f"{p}.value.bias")
    state = concat_qkv(state, r"(blocks\.\d+\.attn)\.query\.(weight)", "{p}.query.{s}", "{p}.key.{s}",
                       "{p}.value.{s}", "{p}.qkv.{s}")
    return _share_table(state, "shared_table.relative_position_bias_table", model)


# ---------------------------------------------------------------- shape fitting
def _table_grid(rows: int) -> tuple[int, int] | None:
    """The square grid ``(s, s)`` of a table of ``(2s-1)² + 3`` rows (the released checkpoints are square)."""
    side = math.isqrt(rows - NUM_PREFIX_ROWS)
    if side * side != rows - NUM_PREFIX_ROWS or side % 2 == 0:
        return None
    return (side + 1) // 2, (side + 1) // 2


def _adapt_beit(state: State, model: nn.Module, report: Any) -> State:
    """Square tables of another grid (the released checkpoints') are resampled to each block's grid (timm's rule),
    then ViT's step: a ``pos_embed`` of another grid resampled, a head of another class count dropped."""
    own = model.state_dict()
    resized = 0
    for i, blk in enumerate(getattr(model, "blocks", ())):
        key, attn = f"blocks.{i}.{_TABLE}", getattr(blk, "attn", None)
        table, window = state.get(key), getattr(attn, "window_size", None)
        if table is None or key not in own or window is None or table.dim() != 2 or table.shape == own[key].shape:
            continue
        grid = _table_grid(table.shape[0])
        if grid is not None and table.shape[1] == own[key].shape[1]:
            state[key] = resize_beit_bias_table(table, grid, tuple(window))
            resized += 1
    if resized:
        report.notes.append(f"{resized} relative-position tables resampled to the model's grid (timm's "
                            "resize_rel_pos_bias_table rule)")
    return _adapt_vit(state, model, report)


# ---------------------------------------------------------------- transformers config.json -> our config
def _hf_beit_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """VisionTransformerConfig fields a transformers ``beit`` ``config.json`` defines (its LayerNorm eps included:
    transformers' default 1e-12, not timm's 1e-6)."""
    out = hf_vit_fields(config, (("layer_scale_init_value", "init_values"),))
    out.setdefault("norm_eps", 1e-12)
    act = hf_activation(config)
    if act is not None:
        out["act"] = act
    if out.get("init_values") is not None and out["init_values"] <= 0:
        out["init_values"] = None  # transformers: no LayerScale when the value is not positive
    out["global_pool"] = "avg" if config.get("use_mean_pooling", True) else "token"
    out["pos_embed"] = "learn" if config.get("use_absolute_position_embeddings", False) else "none"
    rel = config.get("use_relative_position_bias", False) or config.get("use_shared_relative_position_bias", False)
    if rel:
        out.update(attn_layer="beit_rel_pos", qkv_bias=True)
    else:  # global attention without a table: mhsa with BEiT's q / v biases
        out.update(attn_layer="mhsa", qkv_bias="qv")
    out.update(hf_classes(config))
    return out


register_converter("beit", "timm", _is_timm, _from_timm)
register_converter("beit", "huggingface", _is_hf, _from_hf)
register_adapter("beit", _adapt_beit)
register_hf_config_reader("beit", _hf_beit_config, family="beit")
