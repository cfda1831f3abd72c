"""MobileViT v1 / v2 / v3 checkpoint layouts onto ours (timm's keys): timm, Hugging Face, apple/ml-cvnets.

* timm ``mobilevit_*`` (v1): our keys exactly. timm ``mobilevitv2_*``: the same keys, but the
  transformer's ``attn.qkv_proj`` / ``attn.out_proj`` / ``mlp.fc1`` / ``mlp.fc2`` are 1x1
  convolutions ``[out, in, 1, 1]``, ours ``Linear`` ``[out, in]`` (squeezed here).
* Hugging Face ``MobileViT*`` (``mobilevit.``) and ``MobileViTV2*`` (``mobilevitv2.``): ``conv_stem``,
  ``encoder.layer.{i}`` (MobileNet stages ``layer.{j}``, MobileViT stages ``downsampling_layer`` +
  block), ``{convolution, normalization}`` pairs, v1 separate ``query / key / value`` (packed here),
  ``conv_1x1_exp`` (final conv), ``classifier``; both ``config.json`` readers.
* apple/ml-cvnets (the original repository, v1 and v2 checkpoints; MobileViTv3's too): ``conv_1``, ``layer_{1..5}``
  (``block.{exp_1x1, conv_3x3, red_1x1}``, MobileViT blocks ``local_rep`` / ``global_rep`` /
  ``conv_proj`` / ``fusion``), ``conv_1x1_exp``, ``classifier.fc`` (v2 era: ``classifier.1``);
  ``block.conv`` / ``block.norm`` pairs; v1 transformer ``pre_norm_mha.{0, 1.qkv_proj, 1.out_proj}`` /
  ``pre_norm_ffn.{0, 1, 4}`` (linear),
  v2 ``pre_norm_attn.{0, 1.qkv_proj, 1.out_proj}`` / ``pre_norm_ffn.{0, 1, 3}`` (1x1 convs), ``local_rep.{0, 1}``.

An adapter drops a classifier for a different number of classes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..models.mobilevit import cvnets_v2_widths
from .hub import register_hf_config_reader
from .layouts import concat_qkv, register_adapter, register_converter, rename
from .vit import drop_mismatched_heads, hf_classes, hf_fields

__all__: list[str] = []

State = dict[str, Tensor]

_LINEAR_CONVS = re.compile(r".*transformer\.\d+\.(attn\.(qkv_proj|out_proj)|mlp\.fc[12])\.weight$")


def _squeeze_linear_convs(state: State) -> State:
    """1x1 conv weights ``[out, in, 1, 1]`` of the transformer's projections -> ``Linear`` ``[out, in]``."""
    return {k: v[:, :, 0, 0] if v.dim() == 4 and _LINEAR_CONVS.match(k) else v for k, v in state.items()}


def _block_index(model: nn.Module, stage: int) -> int:
    """Index of the MobileViT block inside stage ``stage`` (after its inverted residuals)."""
    return int(model.cfg.depths[stage])  # type: ignore[union-attr]


def _mobilevit_block_keys(state: State, model: nn.Module, rules: list[tuple[str, str]], stage_rx: str) -> State:
    """Rename ``<stage_rx>`` (one group: the stage index) + MobileViT-block rest by ``rules`` into
    ``stages.{i}.{block}.`` + rest."""
    out: State = {}
    rx = re.compile(stage_rx)
    compiled = [(re.compile(p), r) for p, r in rules]
    for k, v in state.items():
        m = rx.match(k)
        if m:
            rest = k[m.end():]
            for pat, rep in compiled:
                rest = pat.sub(rep, rest)
            k = f"stages.{m.group(1)}.{_block_index(model, int(m.group(1)))}.{rest}"
        out[k] = v
    return out


# ---------------------------------------------------------------- timm
def _is_timm_v2(state: Mapping[str, Tensor]) -> bool:
    return any(v.dim() == 4 and _LINEAR_CONVS.match(k) for k, v in state.items())


def _from_timm(state: State, model: nn.Module) -> State:
    return _squeeze_linear_convs(state)


# ---------------------------------------------------------------- Hugging Face
_HF_CONV = [(r"\.convolution\.", ".conv."), (r"\.normalization\.", ".bn.")]
_HF_IR = [(r"expand_1x1\.", "conv1_1x1."), (r"conv_3x3\.", "conv2_kxk."), (r"reduce_1x1\.", "conv3_1x1.")]
_HF_BLOCK = [
    (r"^conv_1x1\.convolution\.", "conv_1x1."),
    (r"^transformer\.layer\.(\d+)\.", r"transformer.\1."),
    (r"\.attention\.attention\.(query|key|value)\.", r".attn.\1."),
    (r"\.attention\.output\.dense\.", ".attn.proj."),
    (r"\.attention\.(qkv_proj|out_proj)\.convolution\.", r".attn.\1."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"\.output\.dense\.", ".mlp.fc2."),
    (r"\.ffn\.conv([12])\.convolution\.", r".mlp.fc\1."),
    (r"\.layernorm_before\.", ".norm1."), (r"\.layernorm_after\.", ".norm2."),
    (r"^layernorm\.", "norm."), (r"^conv_projection\.", "conv_proj."), (r"^fusion\.", "conv_fusion."),
    *_HF_CONV,
]


def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any(re.match(r"^(mobilevit(v2)?\.)?conv_stem\.convolution\.", k) for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = {re.sub(r"^mobilevit(v2)?\.", "", k): v for k, v in state.items()}
    state = rename(state, [
        (r"^conv_stem\.", "stem."), (r"^conv_1x1_exp\.", "final_conv."), (r"^classifier\.", "head.fc."),
        (r"^encoder\.layer\.(\d+)\.layer\.(\d+)\.", r"stages.\1.\2."),  # MobileNet stages
        (r"^encoder\.layer\.(\d+)\.downsampling_layer\.", r"stages.\1.0."),  # the MobileViT stages' strided IR
        *[(rf"^(stages\.\d+\.\d+\.){p}", rf"\1{r}") for p, r in _HF_IR],
        (r"^((?:stem|final_conv|stages\.\d+\.\d+\.conv\d_\w+)\.)convolution\.", r"\1conv."),
        (r"^((?:stem|final_conv|stages\.\d+\.\d+\.conv\d_\w+)\.)normalization\.", r"\1bn."),
    ])
    state = _mobilevit_block_keys(state, model, _HF_BLOCK, r"^encoder\.layer\.(\d+)\.")
    state = concat_qkv(state, r"(stages\.\d+\.\d+\.transformer\.\d+\.attn)\.query\.(weight|bias)",
                       "{p}.query.{s}", "{p}.key.{s}", "{p}.value.{s}", "{p}.qkv.{s}")
    return _squeeze_linear_convs(state)


def _hf_common(config: Mapping[str, Any]) -> dict[str, Any]:
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"config.json hidden_act={config['hidden_act']!r}: MobileViT here uses SiLU")
    out = hf_fields(config, (("num_channels", "in_chans"), ("image_size", "img_size"), ("patch_size", "patch_size"),
                             ("conv_kernel_size", "kernel_size"), ("expand_ratio", "expand_ratio"),
                             ("layer_norm_eps", "norm_eps")))
    out.update(hf_classes(config))
    return out


def _hf_mobilevit_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """MobileViTConfig fields a transformers MobileViT (v1) ``config.json`` defines."""
    out = _hf_common(config)
    out.update(block_type="v1", depths=(1, 3, 1, 1, 1), transformer_depths=(0, 0, 2, 4, 3))
    if "neck_hidden_sizes" in config:
        neck = list(config["neck_hidden_sizes"])
        out.update(stem_chs=neck[0], channels=tuple(neck[1:6]), num_features=neck[6])
    if "hidden_sizes" in config:
        out["transformer_dims"] = (0, 0, *config["hidden_sizes"])
    out.update(hf_fields(config, (("num_attention_heads", "num_heads"), ("mlp_ratio", "mlp_ratio"))))
    if not config.get("qkv_bias", True):
        raise ValueError("config.json qkv_bias=False: MobileViT here has qkv biases")
    return out


def _hf_mobilevitv2_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """MobileViTConfig fields a transformers MobileViTV2 ``config.json`` defines."""
    out = _hf_common(config)
    out.update(block_type="v2", depths=(1, 2, 1, 1, 1), num_heads=1, num_features=0)
    out.update(cvnets_v2_widths(float(config.get("width_multiplier", 1.0)),
                                tuple(config.get("base_attn_unit_dims", (128, 192, 256)))))
    out["transformer_depths"] = (0, 0, *config.get("n_attn_blocks", (2, 4, 3)))
    if "ffn_multiplier" in config:
        out["mlp_ratio"] = float(config["ffn_multiplier"])
    return out


# ---------------------------------------------------------------- apple/ml-cvnets
_CVNETS_BLOCK = [
    (r"^local_rep\.(conv_3x3|0)\.block\.", "conv_kxk."), (r"^local_rep\.(conv_1x1|1)\.block\.conv\.", "conv_1x1."),
    (r"^global_rep\.(\d+)\.pre_norm_mha\.0\.", r"transformer.\1.norm1."),
    (r"^global_rep\.(\d+)\.pre_norm_mha\.1\.qkv_proj\.", r"transformer.\1.attn.qkv."),
    (r"^global_rep\.(\d+)\.pre_norm_mha\.1\.out_proj\.", r"transformer.\1.attn.proj."),
    (r"^global_rep\.(\d+)\.pre_norm_attn\.0\.", r"transformer.\1.norm1."),  # v2
    (r"^global_rep\.(\d+)\.pre_norm_attn\.1\.qkv_proj\.block\.conv\.", r"transformer.\1.attn.qkv_proj."),
    (r"^global_rep\.(\d+)\.pre_norm_attn\.1\.out_proj\.block\.conv\.", r"transformer.\1.attn.out_proj."),
    (r"^global_rep\.(\d+)\.pre_norm_ffn\.0\.", r"transformer.\1.norm2."),
    (r"^global_rep\.(\d+)\.pre_norm_ffn\.1\.block\.conv\.", r"transformer.\1.mlp.fc1."),  # v2 (conv)
    (r"^global_rep\.(\d+)\.pre_norm_ffn\.3\.block\.conv\.", r"transformer.\1.mlp.fc2."),
    (r"^global_rep\.(\d+)\.pre_norm_ffn\.1\.", r"transformer.\1.mlp.fc1."),  # v1 (linear)
    (r"^global_rep\.(\d+)\.pre_norm_ffn\.4\.", r"transformer.\1.mlp.fc2."),
    (r"^global_rep\.(\d+)\.", r"norm."),  # the final norm is the last entry of global_rep
    (r"^conv_proj\.block\.", "conv_proj."), (r"^fusion\.block\.", "conv_fusion."),
    (r"\.norm\.", ".bn."),
]


def _is_cvnets(state: Mapping[str, Tensor]) -> bool:
    return any(k.startswith("conv_1.block.conv.") for k in state) and any(k.startswith("layer_1.") for k in state)


def _from_cvnets(state: State, model: nn.Module) -> State:
    state = rename(state, [
        (r"^conv_1\.block\.", "stem."), (r"^conv_1x1_exp\.block\.", "final_conv."),
        (r"^classifier\.(fc|\d+)\.", "head.fc."),  # ``fc`` (v1 era) or the Sequential index of the linear layer
        (r"^layer_(\d)\.(\d+)\.block\.(exp_1x1|conv_3x3|red_1x1)\.block\.", r"stage\1.\2.\3."),
    ])
    out: State = {}
    for k, v in state.items():
        m = re.match(r"^stage(\d)\.(\d+)\.(exp_1x1|conv_3x3|red_1x1)\.(conv|norm)\.(.*)$", k)
        if m:
            part = {"exp_1x1": "conv1_1x1", "conv_3x3": "conv2_kxk", "red_1x1": "conv3_1x1"}[m.group(3)]
            kind = "conv" if m.group(4) == "conv" else "bn"
            k = f"stages.{int(m.group(1)) - 1}.{m.group(2)}.{part}.{kind}.{m.group(5)}"
        out[k] = v
    state = {re.sub(r"^(stem|final_conv)\.norm\.", r"\1.bn.", k): v for k, v in out.items()}
    # the MobileViT block is layer_{i}.1; its norm after the transformer is global_rep.{depth}
    blocks: State = {}
    for k, v in state.items():
        m = re.match(r"^layer_(\d)\.1\.(.*)$", k)
        if m:
            stage = int(m.group(1)) - 1
            rest = m.group(2)
            depth = int(model.cfg.transformer_depths[stage])  # type: ignore[union-attr]
            rest = re.sub(rf"^global_rep\.{depth}\.", "norm.", rest)
            for pat, rep in _CVNETS_BLOCK:
                rest = re.sub(pat, rep, rest)
            k = f"stages.{stage}.{_block_index(model, stage)}.{rest}"
        blocks[k] = v
    return _squeeze_linear_convs(blocks)


def _adapt(state: State, model: nn.Module, report: Any) -> State:
    return drop_mismatched_heads(state, model.state_dict(), ("head.fc.",), report)


register_hf_config_reader("mobilevit", _hf_mobilevit_config, family="mobilevit")
register_hf_config_reader("mobilevitv2", _hf_mobilevitv2_config, family="mobilevit")
register_converter("mobilevit", "timm", _is_timm_v2, _from_timm)
register_converter("mobilevit", "huggingface", _is_hf, _from_hf)
register_converter("mobilevit", "cvnets", _is_cvnets, _from_cvnets)
register_adapter("mobilevit", _adapt)
