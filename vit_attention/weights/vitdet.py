"""ViTDet checkpoint layouts onto ours (``models/vitdet.py``, detectron2's names without ``backbone.net.``).

* **detectron2** (``projects/ViTDet`` ``model_final_*.pkl``, its ``"model"`` dict): the backbone is
  ``backbone.net.{pos_embed, patch_embed.proj, blocks.N.*}`` and ``backbone.simfp_{2,3,4,5}.*``;
  both lose their prefix, everything else (proposal generator, ROI heads, ``pixel_mean``) is
  dropped. The model zoo's ``.pkl`` files hold numpy arrays: pass
  ``{k: torch.as_tensor(v) for k, v in pickle.load(f)["model"].items()}`` (a trusted file only).
* **Hugging Face** ``VitDetModel`` / ``VitDetBackbone`` (optionally under ``vitdet.`` /
  ``backbone.``): ``embeddings.position_embeddings`` -> ``pos_embed``, ``embeddings.projection``
  -> ``patch_embed.proj``, ``encoder.layer.N.attention.*`` -> ``blocks.N.attn.*``, norms and MLP
  as they are. It has no pyramid: load into ``pyramid=False`` or with ``strict=False``. A model
  folder (``save_pretrained``: ``config.json`` with ``model_type: vitdet``) configures the model
  through its ``config.json`` (width, depth, heads, windows, eps, sizes; ``pyramid=False``,
  no classifier), so ``create_model("vitdet_base_patch16_1024", pretrained=folder)`` rebuilds it.
* **MAE pre-training** (``mae_pretrain_vit_*.pth``, timm ViT names): ``pos_embed [1, 197, C]``,
  ``patch_embed.proj``, ``blocks.N.*`` are ours already; ``cls_token``, the final ``norm`` /
  ``fc_norm``, a classifier ``head`` and the MAE decoder (``decoder_*``, ``mask_token``) are
  dropped and the relative-position tables start at zero (detectron2 initialises them so). The
  pyramid and the probe stay as initialised: load with ``strict=False`` (as detectron2 does).

An adapter run for every layout resizes relative-position tables of another length linearly
(weights trained at another resolution: what the blocks would do at run time) and drops a probe
for another class count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..functional.rel_pos import resize_rel_pos
from .hub import register_hf_config_reader
from .layouts import register_adapter, register_converter, rename
from .vit import _size, drop_mismatched_heads, hf_fields

__all__ = ["HF_RULES", "from_detectron2", "from_huggingface", "from_mae", "to_huggingface"]

State = dict[str, Tensor]

HF_RULES: list[tuple[str, str]] = [
    (r"^(?:vitdet\.|backbone\.)", ""),
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.projection\.", "patch_embed.proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.", r"blocks.\1.attn."),
    (r"^encoder\.layer\.(\d+)\.", r"blocks.\1."),
]

_MAE_DROP = re.compile(r"^(?:cls_token$|mask_token$|decoder_|norm\.|fc_norm\.|head\.)")


def _is_detectron2(state: Mapping[str, Any]) -> bool:
    return any(k.startswith("backbone.net.blocks.") for k in state)


def from_detectron2(state: Mapping[str, Any], model: nn.Module | None = None) -> State:
    """detectron2 ViTDet (detector or backbone) -> ours: ``backbone.net.`` / ``backbone.`` cut, the rest dropped."""
    out: State = {}
    for k, v in state.items():
        if k.startswith("backbone.net."):
            out[k[len("backbone.net."):]] = v
        elif k.startswith("backbone.simfp_"):
            out[k[len("backbone."):]] = v
    return out


def _is_huggingface(state: Mapping[str, Any]) -> bool:
    return any(re.match(r"^(?:vitdet\.|backbone\.)?encoder\.layer\.\d+\.attention\.qkv\.", k) for k in state)


def from_huggingface(state: Mapping[str, Tensor], model: nn.Module | None = None) -> State:
    """Hugging Face ``VitDetModel`` / ``VitDetBackbone`` -> ours. Residual bottleneck blocks raise (not built here)."""
    bad = [k for k in state if ".residual." in k]
    if bad:
        raise ValueError(f"the checkpoint has residual bottleneck blocks ({bad[0]} ...), which ViTDet's published "
                         "configs do not use and this library does not build")
    return rename(state, HF_RULES)


def to_huggingface(state: Mapping[str, Tensor]) -> State:
    """Ours -> Hugging Face ``VitDetModel`` (the backbone only: pyramid and probe keys are left out)."""
    out: State = {}
    for k, v in state.items():
        if k == "pos_embed":
            out["embeddings.position_embeddings"] = v
        elif k.startswith("patch_embed.proj."):
            out["embeddings.projection." + k[len("patch_embed.proj."):]] = v
        elif k.startswith("blocks."):
            out[re.sub(r"^blocks\.(\d+)\.attn\.", r"encoder.layer.\1.attention.",
                       re.sub(r"^blocks\.(\d+)\.(?!attn\.)", r"encoder.layer.\1.", k))] = v
    return out


def _is_mae(state: Mapping[str, Any]) -> bool:
    return ("cls_token" in state and "blocks.0.attn.qkv.weight" in state
            and not any(k.endswith("rel_pos_h") for k in state))


def from_mae(state: Mapping[str, Tensor], model: nn.Module) -> State:
    """MAE-pretrained ViT -> ours: prefix tokens, final norm, head and decoder dropped; zero rel-pos tables."""
    out = {k: v for k, v in state.items() if not _MAE_DROP.match(k)}
    own = model.state_dict()
    for k, v in own.items():
        if k.endswith(("attn.rel_pos_h", "attn.rel_pos_w")) and k.rsplit(".attn.", 1)[0] + ".attn.qkv.weight" in out:
            out[k] = torch.zeros(v.shape, dtype=v.dtype)
    return out


def _adapt_vitdet(state: State, model: nn.Module, report: Any) -> State:
    """Relative-position tables of another length are resized linearly; a probe for other classes is dropped."""
    own = model.state_dict()
    resized = []
    for k, v in list(state.items()):
        if k.endswith(("rel_pos_h", "rel_pos_w")) and k in own and v.dim() == 2 and v.shape[1] == own[k].shape[1] \
                and v.shape[0] != own[k].shape[0]:
            state[k] = resize_rel_pos(v, own[k].shape[0])
            resized.append(k)
    if resized:
        report.notes.append(f"{len(resized)} relative-position tables resized linearly to the model's lengths")
    return drop_mismatched_heads(state, own, ("head.fc.",), report)


# ---------------------------------------------------------------- transformers config.json -> our config
def _hf_vitdet_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """ViTDetConfig fields a transformers VitDet ``config.json`` defines: the plain backbone (no pyramid, no head).

    ``window_block_indices`` become their complement, ``global_block_indices``; a ``hidden_act``
    other than GELU or residual bottleneck blocks raise ``ValueError`` naming the field.
    """
    out: dict[str, Any] = {"pyramid": False, "num_classes": 0}
    out.update(hf_fields(config, (("hidden_size", "embed_dim"), ("num_hidden_layers", "depth"),
                                  ("num_attention_heads", "num_heads"), ("mlp_ratio", "mlp_ratio"),
                                  ("qkv_bias", "qkv_bias"), ("layer_norm_eps", "norm_eps"),
                                  ("num_channels", "in_chans"), ("window_size", "window_size"),
                                  ("use_relative_position_embeddings", "use_rel_pos"),
                                  ("use_absolute_position_embeddings", "use_abs_pos"),
                                  ("drop_path_rate", "drop_path_rate"), ("dropout_prob", "drop_rate"))))
    for theirs, ours in (("image_size", "img_size"), ("patch_size", "patch_size"),
                         ("pretrain_image_size", "pretrain_img_size")):
        if theirs in config:
            v = _size(config[theirs])
            if ours != "img_size" and isinstance(v, tuple):
                if len(set(v)) != 1:
                    raise ValueError(f"config.json {theirs}={list(v)}: this ViTDet takes one (square) value")
                v = v[0]
            out[ours] = v
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"config.json hidden_act={config['hidden_act']!r}: ViTDet here uses GELU only")
    if config.get("residual_block_indices"):
        raise ValueError(f"config.json residual_block_indices={list(config['residual_block_indices'])}: residual "
                         "bottleneck blocks are not built by this library")
    if "num_hidden_layers" in config and "window_block_indices" in config:
        windowed = set(config["window_block_indices"] or ())
        out["global_block_indices"] = tuple(i for i in range(int(config["num_hidden_layers"])) if i not in windowed)
    return out


register_hf_config_reader("vitdet", _hf_vitdet_config, family="vitdet")
register_converter("vitdet", "detectron2", _is_detectron2, from_detectron2)
register_converter("vitdet", "huggingface", _is_huggingface, from_huggingface)
register_converter("vitdet", "mae", _is_mae, from_mae)
register_adapter("vitdet", _adapt_vitdet)
