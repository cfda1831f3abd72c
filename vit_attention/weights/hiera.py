"""Hiera checkpoint layouts onto ours (:mod:`vit_attention.models.hiera`).

* ``timm``: timm 1.0.31 ``Hiera`` files (flat ``blocks.{i}``, ``head.norm`` / ``head.fc``) and the
  facebookresearch/hiera originals (the same block names; ``norm.`` / ``encoder_norm.`` and ``head.projection.``
  for the head, ``pos_embed_abs``; a ``model_state`` wrapper): the renames of timm's ``checkpoint_filter_fn``, then
  flat block ``i`` -> ``stages.{s}.blocks.{j}`` by the model's stage depths.
* ``huggingface``: transformers ``HieraModel`` / ``HieraForImageClassification`` (``hiera.embeddings.*``,
  ``hiera.encoder.stages.{s}.layers.{j}.{layernorm_before, attn, proj, layernorm_after, mlp}``,
  ``hiera.pooler.layernorm``, ``classifier``); the folder's ``config.json`` gives the sizes
  (:func:`_hf_hiera_config`).

The adapter drops a classifier of another class count (a fresh one stays) and resamples a row-major ``pos_embed``
of another grid to the model's (bicubic, no antialiasing: transformers' ``interpolate_pos_encoding``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from .hub import register_hf_config_reader
from .layouts import register_adapter, register_converter, rename
from .vit import drop_mismatched_heads, hf_classes

State = dict[str, Tensor]


def _flat_to_staged(state: State, model: nn.Module) -> State:
    """``blocks.{i}.*`` -> ``stages.{s}.blocks.{j}.*`` by the model's stage depths (an index past them is kept as
    it is, for the key check to report)."""
    depth = list(getattr(getattr(model, "cfg", None), "depth", ()))
    where: dict[int, tuple[int, int]] = {}
    i = 0
    for s, d in enumerate(depth):
        for j in range(d):
            where[i] = (s, j)
            i += 1
    out: State = {}
    for k, v in state.items():
        m = re.match(r"^blocks\.(\d+)\.(.*)$", k)
        if m and int(m.group(1)) in where:
            s, j = where[int(m.group(1))]
            k = f"stages.{s}.blocks.{j}.{m.group(2)}"
        out[k] = v
    return out


# ---------------------------------------------------------------- timm / facebookresearch
def _is_timm(state: Mapping[str, Tensor]) -> bool:
    keys = set(state)
    return any(re.fullmatch(r"blocks\.\d+\.attn\.qkv\.weight", k) for k in keys) and "patch_embed.proj.weight" in keys


def _from_timm(state: State, model: nn.Module) -> State:
    state = rename(state, [(r"^head\.projection\.", "head.fc."), (r"^encoder_norm\.", "head.norm."),
                           (r"^norm\.", "head.norm."), (r"^pos_embed_abs$", "pos_embed")])
    return _flat_to_staged(state, model)


# ---------------------------------------------------------------- Hugging Face HieraModel / HieraForImageClassification
def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any(k.removeprefix("hiera.").startswith("embeddings.patch_embeddings.projection") for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = {k.removeprefix("hiera."): v for k, v in state.items()}
    return rename(state, [
        (r"^embeddings\.position_embeddings$", "pos_embed"),
        (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.", r"stages.\1.blocks.\2."),
        (r"\.layernorm_before\.", ".norm1."),
        (r"\.layernorm_after\.", ".norm2."),
        (r"^pooler\.layernorm\.", "head.norm."),
        (r"^classifier\.", "head.fc."),
    ])


# ---------------------------------------------------------------- shape fitting
def _adapt_hiera(state: State, model: nn.Module, report: Any) -> State:
    """A row-major ``pos_embed`` of another square grid resampled to the model's; a head of another class count
    dropped."""
    own = model.state_dict()
    pos, mine = state.get("pos_embed"), own.get("pos_embed")
    if pos is not None and mine is not None and pos.dim() == 3 and mine.dim() == 3 and pos.shape != mine.shape \
            and pos.shape[-1] == mine.shape[-1]:
        side = int(round(pos.shape[1] ** 0.5))
        grid = tuple(getattr(model, "grid_size", ()))
        if side * side == pos.shape[1] and len(grid) == 2:
            table = pos.reshape(1, side, side, -1).permute(0, 3, 1, 2)
            table = F.interpolate(table.float(), size=grid, mode="bicubic", align_corners=False).to(pos.dtype)
            state["pos_embed"] = table.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)
            report.notes.append(f"pos_embed resampled from {side}x{side} to {grid[0]}x{grid[1]} (bicubic, no "
                                "antialias, as transformers' interpolate_pos_encoding)")
    return drop_mismatched_heads(state, own, ("head.fc.",), report)


# ---------------------------------------------------------------- transformers config.json -> our config
def _hf_hiera_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """HieraConfig fields a transformers ``hiera`` ``config.json`` defines (stage 1's heads: ``num_heads[0]``;
    transformers' ``masked_unit_attention`` per stage). A geometry the family does not build (another patch
    convolution, query stride, pooling count or mask unit, heads that do not double, another norm eps or activation)
    raises ``ValueError`` naming the field."""
    depths = list(config.get("depths", [2, 3, 16, 3]))
    fixed = {"patch_size": [7, 7], "patch_stride": [4, 4], "patch_padding": [3, 3], "embed_dim_multiplier": 2.0,
             "query_stride": [2, 2], "num_query_pool": len(depths) - 1,
             "masked_unit_size": [2 ** (len(depths) - 1)] * 2, "layer_norm_eps": 1e-6, "hidden_act": "gelu"}
    for field, expected in fixed.items():
        value = config.get(field, expected)
        if (list(value) if isinstance(value, (list, tuple)) else value) != expected:
            raise ValueError(f"transformers hiera config: {field}={value!r} is not built by the hiera family "
                             f"(it builds {expected!r})")
    heads = config.get("num_heads")
    if isinstance(heads, (list, tuple)) and any(h != heads[0] * 2 ** i for i, h in enumerate(heads)):
        raise ValueError(f"transformers hiera config: num_heads={list(heads)} must double at every stage (the "
                         "hiera family's rule)")
    out: dict[str, Any] = {}
    if "num_channels" in config:
        out["in_chans"] = int(config["num_channels"])
    if "embed_dim" in config:
        out["embed_dim"] = int(config["embed_dim"])
    if isinstance(heads, (list, tuple)) and heads:
        out["num_heads"] = int(heads[0])
    if "depths" in config:
        out["depth"] = tuple(int(d) for d in config["depths"])
    if "masked_unit_attention" in config:
        out["mask_unit_attn"] = tuple(bool(b) for b in config["masked_unit_attention"])
    if "mlp_ratio" in config:
        out["mlp_ratio"] = float(config["mlp_ratio"])
    size = config.get("image_size")
    if isinstance(size, (list, tuple)):
        out["img_size"] = int(size[0]) if size[0] == size[1] else (int(size[0]), int(size[1]))
    elif size is not None:
        out["img_size"] = int(size)
    out.update(hf_classes(config))
    return out


register_converter("hiera", "timm", _is_timm, _from_timm)
register_converter("hiera", "huggingface", _is_hf, _from_hf)
register_adapter("hiera", _adapt_hiera)
register_hf_config_reader("hiera", _hf_hiera_config, family="hiera")
