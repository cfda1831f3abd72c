"""Swin / SwinV2 checkpoint layouts onto timm's (ours): torchvision, Hugging Face, original microsoft repo.

* torchvision (``swin_t/s/b``, ``swin_v2_t/s/b``): ``features.{0,2i+1,2i+2}`` sequence, ``mlp.0/3``,
  ``head``; persistent ``relative_position_index`` / ``relative_coords_table`` (dropped); v2
  ``qkv.bias [3C]`` whose k third torchvision ignores -> ``q_bias``, ``v_bias``.
* Hugging Face ``SwinModel`` / ``SwinForImageClassification`` / ``Swinv2*``: both the current
  transformers naming (``attention.q_proj``, ``attention.relative_position_bias.*``) and the hub
  checkpoints' naming (``attention.self.query``, ``intermediate.dense``, ...); downsample at the
  END of stage ``i`` (``encoder.layers.i.downsample`` -> ``layers.{i+1}.downsample``).
* original microsoft/Swin-Transformer: ``{'model': sd}`` (unwrapped by the loader),
  ``layers.i.downsample`` at the end of stages, ``head.`` instead of ``head.fc.``, persistent
  ``relative_position_index`` / ``attn_mask`` / ``relative_coords_table`` buffers (dropped).

After conversion an adapter fits shapes: relative-position bias tables are resized bicubically
when the window differs (e.g. 224 -> 384 fine-tuning, window 7 -> 12), absolute position
embeddings are resampled, derived buffers are dropped, and a classifier for a different number of
classes is dropped (left freshly initialised).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import get_attention_spec
from ..functional import resample_abs_pos_embed
from .hub import register_hf_config_reader
from .layouts import concat_qkv, register_adapter, register_converter, rename
from .vit import HF_BLOCK_RULES, drop_mismatched_heads, hf_activation, hf_classes, hf_fields

__all__ = ["resize_relative_position_bias_table"]

State = dict[str, Tensor]

# derived from the config; never part of our state dict
_DERIVED = ("relative_position_index", "relative_coords_table", "attn_mask", "k_bias")


def _drop_derived(state: State) -> State:
    return {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] not in _DERIVED}


def _split_v2_qkv_bias(state: State) -> State:
    """``attn.qkv.bias [3C]`` (torchvision v2) -> ``attn.q_bias``, ``attn.v_bias`` (the k third is unused)."""
    for key in [k for k in state if k.endswith(".attn.qkv.bias")]:
        bias = state.pop(key)
        C = bias.shape[0] // 3
        prefix = key[: -len("qkv.bias")]
        state[prefix + "q_bias"], state[prefix + "v_bias"] = bias[:C], bias[2 * C:]
    return state


def _qkv_bias_split(model: nn.Module) -> bool:
    """The model's mechanism keeps q / v biases as separate parameters (its spec says so: SwinV2's cosine windows)."""
    return get_attention_spec(getattr(getattr(model, "cfg", None), "attn_layer", "window")).qkv_bias_split


# ---------------------------------------------------------------- torchvision
def _is_torchvision(state: Mapping[str, Tensor]) -> bool:
    return "features.0.0.weight" in state and any(re.match(r"features\.1\.0\.attn\.", k) for k in state)


def _from_torchvision(state: State, model: nn.Module) -> State:
    out: State = {}
    for k, v in _drop_derived(state).items():
        m = re.match(r"features\.(\d+)\.(.*)$", k)
        if m:
            idx, rest = int(m.group(1)), m.group(2)
            if idx == 0:
                rest = re.sub(r"^0\.", "proj.", re.sub(r"^2\.", "norm.", rest))
                k = "patch_embed." + rest
            elif idx % 2:  # stage (idx - 1) / 2 blocks
                k = f"layers.{(idx - 1) // 2}.blocks.{rest}"
            else:  # PatchMerging after stage idx/2 - 1 = at the start of stage idx/2
                k = f"layers.{idx // 2}.downsample.{rest}"
        k = re.sub(r"\.mlp\.0\.", ".mlp.fc1.", k)
        k = re.sub(r"\.mlp\.3\.", ".mlp.fc2.", k)
        k = re.sub(r"^head\.", "head.fc.", k)
        out[k] = v
    return _split_v2_qkv_bias(out) if _qkv_bias_split(model) else out


# ---------------------------------------------------------------- Hugging Face
def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any("embeddings.patch_embeddings.projection" in k for k in state) and any(
        "encoder.layers." in k for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = {re.sub(r"^(swin|swinv2)\.", "", k): v for k, v in _drop_derived(state).items()}
    state = {k: v for k, v in state.items() if not k.startswith(("embeddings.mask_token", "pooler."))}

    def downsample(m: re.Match[str]) -> str:
        return f"layers.{int(m.group(1)) + 1}.downsample."

    state = {re.sub(r"^encoder\.layers\.(\d+)\.downsample\.", downsample, k): v for k, v in state.items()}
    state = rename(state, [
        (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (r"^embeddings\.norm\.", "patch_embed.norm."),
        (r"^embeddings\.position_embeddings$", "absolute_pos_embed"),
        (r"^encoder\.layers\.(\d+)\.blocks\.", r"layers.\1.blocks."),
        # current transformers naming
        (r"\.attention\.(q|k|v)_proj\.", r".attn.\1_proj."),
        (r"\.attention\.o_proj\.", ".attn.proj."),
        (r"\.attention\.relative_position_bias\.relative_position_bias_table$", ".attn.relative_position_bias_table"),
        # hub checkpoint naming
        (r"\.attention\.self\.(query|key|value)\.", r".attn.\1."),
        (r"\.attention\.self\.relative_position_bias_table$", ".attn.relative_position_bias_table"),
        (r"\.attention\.self\.logit_scale$", ".attn.logit_scale"),
        (r"\.attention\.self\.continuous_position_bias_mlp\.", ".attn.cpb_mlp."),
        *HF_BLOCK_RULES,
        (r"^classifier\.", "head.fc."),
    ])
    state = {k.replace(".attn.q_proj.", ".attn.query.").replace(".attn.k_proj.", ".attn.key.")
             .replace(".attn.v_proj.", ".attn.value."): v for k, v in state.items()}
    if _qkv_bias_split(model):  # q and v biases are separate parameters; there is no k bias
        for key in [k for k in state if re.search(r"\.attn\.(query|value)\.bias$", k)]:
            prefix, which = key.rsplit(".attn.", 1)
            state[f"{prefix}.attn.{'q' if which.startswith('query') else 'v'}_bias"] = state.pop(key)
        state = concat_qkv(state, r"(.*\.attn)\.query\.(weight)", "{p}.query.{s}", "{p}.key.{s}", "{p}.value.{s}",
                           "{p}.qkv.{s}")
        state.pop("absolute_pos_embed", None)  # HF v2 stores a [1, N+1, C] table that its forward cannot use
    else:
        state = concat_qkv(state, r"(.*\.attn)\.query\.(weight|bias)", "{p}.query.{s}", "{p}.key.{s}",
                           "{p}.value.{s}", "{p}.qkv.{s}")
    return state


# ---------------------------------------------------------------- original microsoft/Swin-Transformer
def _is_original(state: Mapping[str, Tensor]) -> bool:
    return (any(k.startswith("layers.0.downsample.") for k in state) or "head.weight" in state
            or any(k.rsplit(".", 1)[-1] in _DERIVED for k in state if k.startswith("layers.")))


def _from_original(state: State, model: nn.Module) -> State:
    state = _drop_derived(state)
    if any(k.startswith("layers.0.downsample.") for k in state):  # downsample at the end of each stage
        state = {re.sub(r"^layers\.(\d+)\.downsample\.", lambda m: f"layers.{int(m.group(1)) + 1}.downsample.", k): v
                 for k, v in state.items()}
    return {re.sub(r"^head\.(weight|bias)$", r"head.fc.\1", k): v for k, v in state.items()}


# ---------------------------------------------------------------- shape fitting
def resize_relative_position_bias_table(table: Tensor, new_window: tuple[int, int]) -> Tensor:
    """Bicubically resize a table ``[(2Wh-1)(2Ww-1), nh]`` to ``[(2Wh'-1)(2Ww'-1), nh]`` (square source)."""
    L, nh = table.shape
    side = math.isqrt(L)
    if side * side != L:
        raise ValueError(f"relative_position_bias_table with {L} rows is not a square (2Ws-1)^2 table")
    new = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
    grid = table.T.reshape(1, nh, side, side).float()  # [1, nh, 2Ws-1, 2Ws-1]
    grid = F.interpolate(grid, size=new, mode="bicubic", align_corners=False)  # [1, nh, 2Wh'-1, 2Ww'-1]
    return grid.reshape(nh, -1).T.contiguous().to(table.dtype)  # [(2Wh'-1)(2Ww'-1), nh]


def _adapt_swin(state: State, model: nn.Module, report: Any) -> State:
    """Drop derived buffers, resize bias tables / absolute position embedding, drop mismatched heads."""
    own = model.state_dict()
    state = {k: v for k, v in state.items() if k in own or k.rsplit(".", 1)[-1] not in _DERIVED}
    resized = 0
    for key, v in list(state.items()):
        if key.endswith("relative_position_bias_table") and key in own and v.shape != own[key].shape \
                and v.dim() == 2 and v.shape[1] == own[key].shape[1]:
            attn = model.get_submodule(key.rsplit(".", 1)[0])
            state[key] = resize_relative_position_bias_table(v, attn.window_size)
            resized += 1
    if resized:
        report.notes.append(f"{resized} relative_position_bias_table(s) resized bicubically to the model's windows")
    pos = state.get("absolute_pos_embed")
    if pos is not None and "absolute_pos_embed" in own and pos.shape != own["absolute_pos_embed"].shape \
            and pos.shape[-1] == own["absolute_pos_embed"].shape[-1] and pos.dim() == 3:
        state["absolute_pos_embed"] = resample_abs_pos_embed(pos, model.grid_size, num_prefix_tokens=0)
        report.notes.append(f"absolute_pos_embed resampled to {model.grid_size}")
    return drop_mismatched_heads(state, own, ("head.fc.",), report)


# ---------------------------------------------------------------- transformers config.json -> our config
def _hf_swin_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """SwinTransformer(V2)Config fields a transformers Swin / Swinv2 ``config.json`` defines."""
    out = hf_fields(config, (("layer_norm_eps", "norm_eps"), ("image_size", "img_size"), ("patch_size", "patch_size"),
                             ("num_channels", "in_chans"), ("embed_dim", "embed_dim"), ("depths", "depths"),
                             ("num_heads", "num_heads"), ("window_size", "window_size"), ("mlp_ratio", "mlp_ratio"),
                             ("qkv_bias", "qkv_bias"), ("use_absolute_embeddings", "ape")))
    eps = out.get("norm_eps")
    if eps is not None and eps != 1e-5:
        warnings.warn(f"config.json layer_norm_eps={eps!r}: transformers' Swin uses it in the blocks and the final "
                      "norm but 1e-5 in the patch embedding and patch merging norms; norm_eps here applies to all",
                      stacklevel=2)
    hf_activation(config, {"gelu": "gelu"})  # Swin's MLP is GELU: anything else is refused, naming hidden_act
    windows = config.get("pretrained_window_sizes")
    if windows and any(windows):
        out["pretrained_window_sizes"] = tuple(windows)
    out.update(hf_classes(config))
    return out


register_hf_config_reader("swin", _hf_swin_config, family="swin")
register_hf_config_reader("swinv2", _hf_swin_config, family="swinv2")
for _family in ("swin", "swinv2"):
    register_converter(_family, "torchvision", _is_torchvision, _from_torchvision)
    register_converter(_family, "huggingface", _is_hf, _from_hf)
    register_converter(_family, "original", _is_original, _from_original)
    register_adapter(_family, _adapt_swin)

