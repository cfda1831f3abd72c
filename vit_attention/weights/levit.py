"""LeViT checkpoint layouts onto ours (:mod:`vit_attention.models.levit`, whose keys are timm 1.0.31's linear mode).

* ``timm_conv``: timm's ``levit_conv_*`` files (``use_conv=True``): the same keys with every 1x1 convolution
  weight ``[O, I, 1, 1]`` where ours is a linear weight ``[O, I]`` (46 of them in ``levit_128s``); they are
  reshaped, nothing else changes (1x1 convolutions on NCHW maps and linear layers on tokens compute the same
  numbers).
* ``original``: facebookresearch/LeViT's files (``levit.py``, HEAD 3772b8e; ``{"model": state}``): one flat
  ``blocks.{k}`` list per model, in forward order, that maps position by position onto ours: per stage, after the
  shrink pair that opens it (``AttentionSubsample`` ``blocks.{k}.{kv, q.1, proj.1}``, ``attention_biases``, then its
  residual MLP), each block's attention (``blocks.{k}.m.{qkv, proj.1}``, ``m.attention_biases``) and MLP
  (``blocks.{k}.m.{0, 2}``); ``Linear_BN`` / ``Conv2d_BN``'s ``c`` is our ``linear``, the stem
  ``patch_embed.{0, 2, 4, 6}`` is ``stem.conv{1..4}`` and ``BN_Linear``'s ``l`` the heads' ``linear`` (timm's own
  conversion of these files was the same walk).
* ``huggingface``: transformers ``LevitModel`` / ``LevitForImageClassification(WithTeacher)`` (5.x): the stem
  ``patch_embeddings.embedding_layer_{1..4}.{convolution, batch_norm}``, each stage's ``layers`` (the same flat
  order as the original, the shrink pair at the end of the stage before: ``module.{queries_keys_values,
  projection}``, ``module.{linear_up, linear_down}``, ``{keys_values, queries, projection}``, ``attention_biases``)
  and ``classifier`` / ``classifier_distill``; a folder's ``config.json`` gives the model's widths, depths, heads
  and classes (:func:`_hf_levit_config`).
* Either layout may carry the ``attention_bias_idxs`` buffers older files persisted (facebookresearch/LeViT): they
  are dropped, the index is rebuilt from the grid (timm's ``checkpoint_filter_fn`` drops them too).

The adapter resamples ``attention_biases`` tables of another square grid (the published checkpoints', loaded into a
model built for another ``img_size``; a table of a non-square grid does not say which way it lies) to the model's
grids (bicubic with antialiasing: timm's ``resize_rel_pos_bias_table_levit`` rule,
:func:`~vit_attention.functional.attention_bias.resize_attention_bias_table`) and drops classifiers of another
class count.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from ..functional.attention_bias import resize_attention_bias_table
from .hub import register_hf_config_reader
from .layouts import register_adapter, register_converter
from .vit import drop_mismatched_heads, hf_classes, hf_fields

State = dict[str, Tensor]

_CONV_1X1 = re.compile(r"^stages\.\d+\..*\.linear\.weight$")


def _is_conv(state: Mapping[str, Tensor]) -> bool:
    return any(_CONV_1X1.match(k) and v.dim() == 4 and tuple(v.shape[2:]) == (1, 1) for k, v in state.items())


def _from_conv(state: State, model: nn.Module) -> State:
    out = {}
    for k, v in state.items():
        if k.endswith(".attention_bias_idxs"):
            continue
        out[k] = v.flatten(1) if _CONV_1X1.match(k) and v.dim() == 4 and tuple(v.shape[2:]) == (1, 1) else v
    return out


def _has_index(state: Mapping[str, Tensor]) -> bool:
    return any(k.endswith(".attention_bias_idxs") for k in state)


def _drop_index(state: State, model: nn.Module) -> State:
    return {k: v for k, v in state.items() if not k.endswith(".attention_bias_idxs")}


_ORIGINAL_RULES = {
    "attn": (("m.qkv.", "qkv."), ("m.proj.1.", "proj.ln."), ("m.attention_biases", "attention_biases")),
    "mlp": (("m.0.", "ln1."), ("m.2.", "ln2.")),
    "shrink": (("kv.", "kv."), ("q.1.", "q.ln."), ("proj.1.", "proj.ln."), ("attention_biases", "attention_biases")),
}
_HF_RULES = {
    "attn": (("module.queries_keys_values.", "qkv."), ("module.projection.", "proj.ln."),
             ("module.attention_biases", "attention_biases")),
    "mlp": (("module.linear_up.", "ln1."), ("module.linear_down.", "ln2.")),
    "shrink": (("keys_values.", "kv."), ("queries.", "q.ln."), ("projection.", "proj.ln."),
               ("attention_biases", "attention_biases")),
}


def _units(model: nn.Module) -> list[tuple[str, str]]:
    """The flat order of LeViT's residual units (the original's ``blocks`` list, transformers' layers stage after
    stage): ``(kind, our module prefix)``, per stage the shrink pair that opens it, then each block's attention and
    MLP."""
    units: list[tuple[str, str]] = []
    for i, stage in enumerate(getattr(model, "stages", ())):
        if hasattr(stage.downsample, "attn_downsample"):
            units += [("shrink", f"stages.{i}.downsample.attn_downsample"), ("mlp", f"stages.{i}.downsample.mlp")]
        for j in range(len(stage.blocks)):
            units += [("attn", f"stages.{i}.blocks.{j}.attn"), ("mlp", f"stages.{i}.blocks.{j}.mlp")]
    return units


def _unit_key(units: list[tuple[str, str]], k: int, rest: str, rules: Mapping[str, tuple[tuple[str, str], ...]],
              key: str) -> str:
    """Our name of ``rest`` inside flat unit ``k`` (``key`` unchanged when the unit or the name is not ours: the
    load then reports it)."""
    if k >= len(units):
        return key
    kind, prefix = units[k]
    for old, new in rules[kind]:
        if rest.startswith(old):
            return f"{prefix}.{new}{rest[len(old):]}"
    return key


def _is_original(state: Mapping[str, Tensor]) -> bool:
    return any(k.startswith("patch_embed.0.c.") or re.fullmatch(r"blocks\.\d+\.m\.qkv\.c\.weight", k) for k in state)


def _from_original(state: State, model: nn.Module) -> State:
    state = {re.sub(r"\.c\.weight$", ".linear.weight", k): v for k, v in state.items()
             if not k.endswith("attention_bias_idxs")}
    out: State = {}
    units = _units(model)
    for key, value in state.items():
        if (m := re.fullmatch(r"blocks\.(\d+)\.(.+)", key)) is not None:
            key = _unit_key(units, int(m.group(1)), m.group(2), _ORIGINAL_RULES, key)
        elif (m := re.fullmatch(r"patch_embed\.(\d+)\.(.+)", key)) is not None:
            key = f"stem.conv{int(m.group(1)) // 2 + 1}.{m.group(2)}"
        elif (m := re.fullmatch(r"(head|head_dist)\.l\.(.+)", key)) is not None:
            key = f"{m.group(1)}.linear.{m.group(2)}"
        out[key] = value
    return out


# ---------------------------------------------------------------- transformers LevitModel / ...WithTeacher
def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any(k.removeprefix("levit.").startswith("patch_embeddings.embedding_layer_") for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = {k.removeprefix("levit.").replace(".batch_norm.", ".bn."): v for k, v in state.items()}
    layers = sorted({(int(m.group(1)), int(m.group(2))) for k in state
                     if (m := re.match(r"encoder\.stages\.(\d+)\.layers\.(\d+)\.", k))})
    flat = {sl: k for k, sl in enumerate(layers)}  # transformers' layers stage after stage: one flat list
    units = _units(model)
    out: State = {}
    for key, value in state.items():
        if (m := re.fullmatch(r"encoder\.stages\.(\d+)\.layers\.(\d+)\.(.+)", key)) is not None:
            key = _unit_key(units, flat[(int(m.group(1)), int(m.group(2)))], m.group(3), _HF_RULES, key)
        elif (m := re.fullmatch(r"patch_embeddings\.embedding_layer_(\d+)\.(convolution|bn)\.(.+)", key)) is not None:
            key = f"stem.conv{m.group(1)}.{'linear' if m.group(2) == 'convolution' else 'bn'}.{m.group(3)}"
        elif (m := re.fullmatch(r"classifier(_distill)?\.(bn|linear)\.(.+)", key)) is not None:
            key = f"head{'_dist' if m.group(1) else ''}.{m.group(2)}.{m.group(3)}"
        out[key] = value
    return out


def _hf_levit_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """LevitConfig fields a transformers ``levit`` ``config.json`` defines: widths, heads, depths, the (first)
    ``key_dim`` / ``attention_ratio`` / ``mlp_ratio``, the image size and channels, the classes, and ``distilled``
    from its architecture (``LevitForImageClassificationWithTeacher``: two heads)."""
    out = hf_fields(config, (("hidden_sizes", "embed_dim"), ("num_attention_heads", "num_heads"),
                             ("depths", "depth"), ("num_channels", "in_chans"), ("image_size", "img_size")))
    for theirs, ours, kind in (("key_dim", "key_dim", int), ("attention_ratio", "attn_ratio", float),
                               ("mlp_ratio", "mlp_ratio", float)):
        value = config.get(theirs)
        if isinstance(value, (list, tuple)) and value:
            out[ours] = kind(value[0])
    archs = config.get("architectures") or []
    if archs:
        out["distilled"] = any("WithTeacher" in a for a in archs)
    out.update(hf_classes(config))
    return out


def resample_bias_tables(state: State, model: nn.Module, grid_attr: str, report: Any, *, what: str = "grids"
                         ) -> State:
    """``state`` with every ``<module>.attention_biases`` table ``[nh, h·h]`` of another square grid resampled to
    the grid the model's module holds in ``grid_attr`` (LeViT's ``resolution``, EfficientViT-MSRA's
    ``window_size``): timm's ``resize_rel_pos_bias_table_levit`` rule. A table of another head count or a
    non-square length is left for the shape check to name. ``what`` names the grids in the report's note."""
    own = model.state_dict()
    resized = 0
    for name, module in model.named_modules():
        key = f"{name}.attention_biases"
        table, grid = state.get(key), getattr(module, grid_attr, None)
        if table is None or key not in own or grid is None or table.dim() != 2 or table.shape == own[key].shape:
            continue
        side = math.isqrt(table.shape[1])
        if side * side == table.shape[1] and table.shape[0] == own[key].shape[0]:
            state[key] = resize_attention_bias_table(table, (side, side), tuple(grid))
            resized += 1
    if resized:
        report.notes.append(f"{resized} attention_biases tables resampled to the model's {what} (timm's "
                            "resize_rel_pos_bias_table_levit rule)")
    return state


def _adapt_levit(state: State, model: nn.Module, report: Any) -> State:
    """Tables of another square grid resampled to each module's ``resolution``; a classifier of another class
    count dropped."""
    state = resample_bias_tables(state, model, "resolution", report)
    return drop_mismatched_heads(state, model.state_dict(), ("head.linear.", "head_dist.linear."), report)


register_converter("levit", "original", _is_original, _from_original)
register_converter("levit", "huggingface", _is_hf, _from_hf)
register_converter("levit", "timm_conv", _is_conv, _from_conv)
register_converter("levit", "timm", _has_index, _drop_index)
register_adapter("levit", _adapt_levit)
register_hf_config_reader("levit", _hf_levit_config, family="levit")
