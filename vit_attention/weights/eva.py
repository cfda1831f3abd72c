"""Checkpoint layouts of the RoPE ViTs (families ``eva02``, ``dinov3``, ``rope_vit``) onto ours.

Our keys are timm's *VisionTransformer* layout (``blocks.N.ls1.gamma``, packed ``attn.qkv.weight``,
``attn.q_bias`` / ``attn.v_bias``, ``mlp.fc1`` or ``mlp.fc1_g`` / ``fc1_x`` / ``norm`` / ``fc2``), and a
mixed-RoPE model keeps each block's learned frequencies at ``blocks.N.attn.rope.freqs [2, nh, hd/2]``.

* ``timm``: timm's ``Eva`` files (``timm/eva02_*``, ``timm/vit_*_dinov3*``, ``timm/vit_*_rope_*``):
  ``gamma_1`` / ``gamma_2`` -> ``ls1.gamma`` / ``ls2.gamma``; split ``q_proj`` / ``k_proj`` / ``v_proj``
  (EVA-02 B / L) packed into ``qkv.weight``, their biases into ``q_bias`` / ``v_bias`` (the key has
  none); the model-level ``rope.freqs [2, depth, nh, hd/2]`` of RoPE-Mixed split into the blocks;
  the fixed ``rope.*`` buffers dropped (rebuilt from the config).
* ``original``: the upstream repositories, converted by the same rules plus
  EVA-02 (baaivision/EVA ``asuka``): ``mlp.w12`` -> ``fc1`` (Ti / S packed SwiGLU), ``mlp.w1`` / ``w2`` /
  ``w3`` -> ``fc1_g`` / ``fc1_x`` / ``fc2``, ``mlp.ffn_ln`` -> ``mlp.norm``, EVA-CLIP's inner attention
  LayerNorm ``attn.inner_attn_ln`` -> ``attn.norm`` (timm Eva ``scale_attn_inner``), ``mask_token`` and
  ``lm_head`` (MIM pretraining) dropped;
  DINOv3 (facebookresearch/dinov3): ``storage_tokens`` -> ``reg_token``, ``qkv.bias`` split into
  ``q_bias`` / ``v_bias`` (its key third is masked by ``bias_mask`` at run time, so it is dropped),
  ``rope_embed.periods`` / ``bias_mask`` / ``mask_token`` / ``local_cls_norm`` dropped;
  RoPE-ViT (naver-ai/rope-vit): ``gamma_N`` as timm, the mixed ``freqs [2, depth, nh·hd/2]`` reshaped per
  block, the coordinate buffers ``freqs_t_x`` / ``freqs_t_y`` dropped.
* ``huggingface``: transformers ``DINOv3ViTModel`` / ``DINOv3ViTBackbone`` hub files:
  ``embeddings.{cls_token,register_tokens,patch_embeddings}``, ``layer.N.attention.{q,k,v,o}_proj``,
  ``layer_scale{1,2}.lambda1``, ``mlp.{up,down}_proj`` (gated: ``gate_proj`` / ``up_proj`` / ``down_proj``),
  ``norm``; the transformers 5 in-memory names (``model.layer.N``) too.

The adapter (every layout, ours included) then: moves a MIM checkpoint's final ``norm`` onto
``fc_norm`` when the model pools through ``fc_norm`` and has no final norm (EVA-02; timm does the
same), drops q / v biases the model does not have when they are all zero (timm: the distilled DINOv3
B / L / H+ biases are zero; non-zero ones stay, so a strict load names them: use a ``_qkvb`` preset),
resamples an absolute ``pos_embed`` to the model's grid (bicubic, antialias: timm's rule) and drops a
classifier of another class count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .hub import register_hf_config_reader
from .layouts import register_adapter, register_converter, rename
from .vit import _adapt_vit, hf_activation, hf_vit_fields

State = dict[str, Tensor]

__all__ = ["FAMILIES", "from_timm", "from_huggingface", "to_timm"]

FAMILIES: tuple[str, ...] = ("eva02", "dinov3", "rope_vit")

_GAMMA = re.compile(r"^(blocks\.\d+)\.gamma_([12])$")
_BLOCK_QKV = re.compile(r"^(blocks\.\d+\.attn)\.q_proj\.weight$")
_DROP = re.compile(
    r"(^|\.)(mask_token|bias_mask|periods|k_bias)$"  # MIM / iBOT mask token, DINOv3 bias mask and periods, Eva k_bias
    r"|^lm_head\.|^local_cls_norm\.|^projectors\.|^freqs_t_[xy]$")  # EVA-02 MIM head, DINOv3-7B / EUPE, Naver coords
_ROPE_PARAM = re.compile(r"^(rope\.freqs|freqs|blocks\.\d+\.attn\.rope\.freqs)$")  # the learned mixed frequencies


def _own(model: nn.Module | None) -> Mapping[str, Tensor]:
    return model.state_dict() if model is not None else {}


def _pack_qkv(state: State, model: nn.Module | None) -> State:
    """Split ``{q,k,v}_proj`` (weights, optional biases; EVA-02 B / L, HF DINOv3) -> our packed ``qkv.weight``
    and ``q_bias`` / ``v_bias`` (or a packed ``qkv.bias`` with a zero key third when the model has one)."""
    own = _own(model)
    for key in [k for k in state if _BLOCK_QKV.match(k)]:
        p = _BLOCK_QKV.match(key).group(1)  # type: ignore[union-attr]
        state[f"{p}.qkv.weight"] = torch.cat([state.pop(f"{p}.{n}_proj.weight") for n in "qkv"], dim=0)
        q = state.pop(f"{p}.q_proj.bias", state.pop(f"{p}.q_bias", None))
        k = state.pop(f"{p}.k_proj.bias", None)
        v = state.pop(f"{p}.v_proj.bias", state.pop(f"{p}.v_bias", None))
        if f"{p}.qkv.bias" in own and (q is not None or v is not None):
            zero = torch.zeros_like(q if q is not None else v)
            state[f"{p}.qkv.bias"] = torch.cat([t if t is not None else zero for t in (q, k, v)])
            continue
        if q is not None:
            state[f"{p}.q_bias"] = q
        if v is not None:
            state[f"{p}.v_bias"] = v
        if k is not None and k.any():
            state[f"{p}.k_proj.bias"] = k  # no place for a key bias: left for a strict load to name
    return state


def _split_packed_bias(state: State, model: nn.Module | None) -> State:
    """The original DINOv3's packed ``qkv.bias`` (its key third masked by ``bias_mask``) -> ``q_bias`` / ``v_bias``,
    or the packed bias with a zero key third for a model with a packed ``qkv.bias``."""
    own = _own(model)
    for key in [k for k in state if k.endswith(".attn.qkv.bias")]:
        p = key[: -len(".qkv.bias")]
        if f"{p}.q_bias" in own or f"{p}.qkv.bias" not in own:
            q, _, v = state.pop(key).chunk(3)
            state[f"{p}.q_bias"], state[f"{p}.v_bias"] = q, v
        else:
            q, _, v = state[key].chunk(3)
            state[key] = torch.cat([q, torch.zeros_like(q), v])  # the masked third is zero at run time
    return state


def _split_rope_freqs(state: State, model: nn.Module | None) -> State:
    """Model-level RoPE-Mixed ``freqs`` (timm ``[2, depth, nh, hd/2]``, Naver ``[2, depth, nh·hd/2]``) -> one
    ``blocks.N.attn.rope.freqs [2, nh, hd/2]`` per block."""
    freqs = state.pop("rope.freqs", state.pop("freqs", None))
    if freqs is None:
        return state
    own = _own(model)
    shape = own["blocks.0.attn.rope.freqs"].shape if "blocks.0.attn.rope.freqs" in own else None
    depth = freqs.shape[1]
    if shape is not None and freqs.dim() == 3:
        freqs = freqs.reshape(freqs.shape[0], depth, *shape[1:])
    for i in range(depth):
        state[f"blocks.{i}.attn.rope.freqs"] = freqs[:, i].clone()
    return state


def from_timm(state: State, model: nn.Module | None = None) -> State:
    """timm ``Eva`` keys, and the EVA-02 / DINOv3 / RoPE-ViT originals, -> ours (rules in the module docstring)."""
    dinov3_original = "storage_tokens" in state or any(k.endswith(".bias_mask") for k in state)
    state = {k: v for k, v in state.items()
             if not _DROP.search(k) and ("rope" not in k and "freqs_" not in k or _ROPE_PARAM.match(k))}
    state = rename(state, [
        (_GAMMA.pattern, r"\1.ls\2.gamma"),
        (r"^storage_tokens$", "reg_token"),
        (r"\.mlp\.w12\.", ".mlp.fc1."),
        (r"\.mlp\.w1\.", ".mlp.fc1_g."),
        (r"\.mlp\.w2\.", ".mlp.fc1_x."),
        (r"\.mlp\.w3\.", ".mlp.fc2."),
        (r"\.mlp\.ffn_ln\.", ".mlp.norm."),
        (r"\.attn\.inner_attn_ln\.", ".attn.norm."),
    ])
    state = _pack_qkv(state, model)
    if dinov3_original:  # its qkv.bias has a masked key third; every other packed qkv.bias is used as it is
        state = _split_packed_bias(state, model)
    return _split_rope_freqs(state, model)


def to_timm(state: Mapping[str, Tensor], *, split_qkv: bool = False) -> State:
    """Our keys -> timm ``Eva``'s (``ls1.gamma`` -> ``gamma_1``; the blocks' mixed ``rope.freqs`` stacked into
    the model-level ``rope.freqs [2, depth, nh, hd/2]``; ``split_qkv``: ``q_proj`` / ``k_proj`` / ``v_proj`` with
    the q / v biases on them, timm's EVA-02 B / L)."""
    out = rename(state, [(r"^(blocks\.\d+)\.ls([12])\.gamma$", r"\1.gamma_\2")])
    freqs = sorted((int(k.split(".")[1]), k) for k in out if k.endswith(".attn.rope.freqs"))
    if freqs:
        out["rope.freqs"] = torch.stack([out.pop(k) for _, k in freqs], dim=1)
    if split_qkv:
        for key in [k for k in out if k.endswith(".attn.qkv.weight")]:
            p = key[: -len(".qkv.weight")]
            for name, w in zip("qkv", out.pop(key).chunk(3)):
                out[f"{p}.{name}_proj.weight"] = w
            for name in "qv":
                if f"{p}.{name}_bias" in out:
                    out[f"{p}.{name}_proj.bias"] = out.pop(f"{p}.{name}_bias")
    return out


def _is_timm(state: Mapping[str, Tensor]) -> bool:
    return any(_GAMMA.match(k) or _BLOCK_QKV.match(k) for k in state) or "rope.freqs" in state


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return ("storage_tokens" in state or "freqs" in state or "lm_head.weight" in state
            or any(re.search(r"\.mlp\.(w12|w1|w3|ffn_ln)\.|\.attn\.inner_attn_ln\.", k)
                   or k.startswith("rope_embed.") for k in state))


# ---------------------------------------------------------------- Hugging Face DINOv3ViTModel
def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return "embeddings.patch_embeddings.weight" in state


def from_huggingface(state: State, model: nn.Module | None = None) -> State:
    """transformers ``DINOv3ViTModel`` hub-file keys (``model.`` prefix optional) -> ours."""
    state = {k: v for k, v in state.items()
             if k not in ("embeddings.mask_token", "rope_embeddings.inv_freq")}
    state = rename(state, [
        (r"^embeddings\.cls_token$", "cls_token"),
        (r"^embeddings\.register_tokens$", "reg_token"),
        (r"^embeddings\.patch_embeddings\.", "patch_embed.proj."),
        (r"^(?:model\.)?layer\.(\d+)\.", r"blocks.\1."),
        (r"\.attention\.o_proj\.", ".attn.proj."),
        (r"\.attention\.([qkv])_proj\.", r".attn.\1_proj."),
        (r"\.layer_scale([12])\.lambda1$", r".ls\1.gamma"),
        (r"\.mlp\.down_proj\.", ".mlp.fc2."),
    ])
    for key in [k for k in state if ".mlp.up_proj." in k]:
        gated = key.replace(".up_proj.", ".gate_proj.") in state
        state[key.replace(".up_proj.", ".fc1_x." if gated else ".fc1.")] = state.pop(key)
    state = rename(state, [(r"\.mlp\.gate_proj\.", ".mlp.fc1_g.")])
    return _pack_qkv(state, model)


def _hf_dinov3_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """VisionTransformerConfig fields a transformers ``dinov3_vit`` config defines (DINOv3's rules for the rest)."""
    out: dict[str, Any] = dict(pos_embed="none", rope="axial", rope_kwargs={"convention": "dinov3"},
                               dynamic_img_size=True)
    out.update(hf_vit_fields(config, (("layerscale_value", "init_values"), ("num_register_tokens", "reg_tokens"),
                                      ("mlp_bias", "mlp_bias"), ("proj_bias", "proj_bias"))))
    if float(config.get("rope_theta", 100.0)) != 100.0:
        out["rope_kwargs"] = {"convention": "dinov3", "theta": float(config["rope_theta"])}
    if "intermediate_size" in config and "hidden_size" not in config:
        out["mlp_ratio"] = int(config["intermediate_size"]) / 384  # transformers' DINOv3 default width
    if config.get("use_gated_mlp"):
        out["mlp_layer"] = "swiglu"
    act = hf_activation(config)
    if act is not None:
        out["act"] = act
    q, k, v = (bool(config.get(n, d)) for n, d in (("query_bias", True), ("key_bias", False), ("value_bias", True)))
    out["qkv_bias"] = True if k else ("qv" if q or v else False)
    return out


def _adapt(state: State, model: nn.Module, report: Any) -> State:
    """The shape-fitting step of the three families (module docstring), then ViT's."""
    if _is_timm(state) or _is_original(state):  # a converter bypassed by format="vit_attention"
        state = from_timm(state, model)
        report.notes.append("timm Eva / original key names converted")
    own = model.state_dict()
    if "norm.weight" in state and "norm.weight" not in own and "fc_norm.weight" in own \
            and "fc_norm.weight" not in state:
        for name in ("weight", "bias"):
            if f"norm.{name}" in state:
                state[f"fc_norm.{name}"] = state.pop(f"norm.{name}")
        report.notes.append("final norm moved to fc_norm (the model pools through fc_norm, as timm does for "
                            "MIM checkpoints)")
    dropped = []
    for key in [k for k in state if re.search(r"\.attn\.[qv]_bias$", k) and k not in own]:
        if not state[key].any():
            del state[key]
            dropped.append(key)
    if dropped:
        report.notes.append(f"{len(dropped)} all-zero q / v biases dropped (the model has none)")
    return _adapt_vit(state, model, report)


for _family in FAMILIES:
    register_converter(_family, "original", _is_original, from_timm)  # first: its marks are the more specific
    register_converter(_family, "timm", _is_timm, from_timm)
    register_adapter(_family, _adapt)
register_converter("dinov3", "huggingface", _is_hf, from_huggingface)
register_hf_config_reader("dinov3_vit", _hf_dinov3_config, family="dinov3")
