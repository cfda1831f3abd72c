"""ViT / DeiT checkpoint layouts: Hugging Face (ViT, DeiT) and torchvision onto timm's (ours)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch import Tensor, nn

from ..functional import resample_abs_pos_embed, resample_patch_embed
from .hub import register_hf_config_reader
from .layouts import concat_qkv, register_adapter, register_converter, rename

State = dict[str, Tensor]


# ---------------------------------------------------------------- Hugging Face ViTModel / DeiTModel
# transformers' BERT-style layer names inside a block, shared by its ViT, DeiT, Swin and CvT ports (applied after
# the block prefix is ours: ``…blocks.{i}.``), and the final ``layernorm``
HF_BLOCK_RULES: tuple[tuple[str, str], ...] = (
    (r"\.layernorm_before\.", ".norm1."),
    (r"\.layernorm_after\.", ".norm2."),
    (r"\.attention\.output\.dense\.", ".attn.proj."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"(blocks\.\d+)\.output\.dense\.", r"\1.mlp.fc2."),
    (r"^layernorm\.", "norm."),
)


def _is_hf(state: Mapping[str, Tensor]) -> bool:
    return any("embeddings.patch_embeddings.projection" in k for k in state)


def _from_hf(state: State, model: nn.Module) -> State:
    state = {k.removeprefix("vit.").removeprefix("deit."): v for k, v in state.items()}
    state = rename(state, [
        (r"^embeddings\.cls_token$", "cls_token"),
        (r"^embeddings\.distillation_token$", "dist_token"),
        (r"^embeddings\.position_embeddings$", "pos_embed"),
        (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (r"^encoder\.layer\.(\d+)\.", r"blocks.\1."),  # hub files (transformers 4 names)
        (r"^layers\.(\d+)\.", r"blocks.\1."),  # transformers 5 in-memory names
        (r"\.attention\.q_proj\.", ".attn.query."),
        (r"\.attention\.k_proj\.", ".attn.key."),
        (r"\.attention\.v_proj\.", ".attn.value."),
        (r"\.attention\.o_proj\.", ".attn.proj."),
        (r"\.attention\.attention\.(query|key|value)\.", r".attn.\1."),
        *HF_BLOCK_RULES,
        (r"^pooler\.dense\.", "pre_logits.fc."),
        (r"^(classifier|cls_classifier)\.", "head."),
        (r"^distillation_classifier\.", "head_dist."),
    ])
    state = concat_qkv(state, r"(blocks\.\d+\.attn)\.query\.(weight|bias)", "{p}.query.{s}", "{p}.key.{s}",
                       "{p}.value.{s}", "{p}.qkv.{s}")
    if getattr(model, "cfg", None) is not None and model.cfg.global_pool == "avg":
        state = {("fc_norm." + k[5:] if k.startswith("norm.") else k): v for k, v in state.items()}
    return state


# ---------------------------------------------------------------- torchvision VisionTransformer
def _is_torchvision(state: Mapping[str, Tensor]) -> bool:
    return "conv_proj.weight" in state and any(k.startswith("encoder.layers.") for k in state)


def _from_torchvision(state: State, model: nn.Module) -> State:
    return rename(state, [
        (r"^class_token$", "cls_token"),
        (r"^encoder\.pos_embedding$", "pos_embed"),
        (r"^conv_proj\.", "patch_embed.proj."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.", r"blocks.\1."),
        (r"\.ln_1\.", ".norm1."),
        (r"\.ln_2\.", ".norm2."),
        (r"\.self_attention\.in_proj_(weight|bias)$", r".attn.qkv.\1"),
        (r"\.self_attention\.out_proj\.", ".attn.proj."),
        (r"\.mlp\.(0|linear_1)\.", ".mlp.fc1."),
        (r"\.mlp\.(3|linear_2)\.", ".mlp.fc2."),
        (r"^encoder\.ln\.", "norm."),
        (r"^heads\.pre_logits\.", "pre_logits.fc."),
        (r"^heads\.head\.", "head."),
    ])


# ---------------------------------------------------------------- shape fitting
def _checkpoint_grid(state: Mapping[str, Tensor], model: nn.Module, n_grid: int) -> tuple[int, int] | None:
    """The patch grid a checkpoint's ``n_grid`` position rows were trained on: square when ``n_grid`` is
    a square; else the model's image size over the checkpoint's (not yet resampled) kernel (timm's rule)
    when that accounts for every row; else unknown (None)."""
    side = math.isqrt(n_grid)
    if side * side == n_grid:
        return side, side
    kernel = state.get("patch_embed.proj.weight")
    img = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if kernel is not None and kernel.dim() == 4 and img is not None:
        grid = (img[0] // kernel.shape[-2], img[1] // kernel.shape[-1])
        if grid[0] * grid[1] == n_grid:
            return grid
    return None


def vit_adapter(interpolation: str = "bicubic", antialias: bool = True) -> Callable[..., State]:
    """The ViT shape-fitting step (``register_adapter``) that resizes with ``interpolation`` / ``antialias``:
    ``pos_embed`` resampled to the model's grid (:func:`~vit_attention.functional.resample_abs_pos_embed`,
    the prefix rows kept unless ``no_embed_class``), a patch kernel ``[C, Cin, P, P']`` of another size
    resampled to the model's (:func:`~vit_attention.functional.resample_patch_embed`, FlexiViT), and
    classifiers for another class count dropped. timm's rule: bicubic with anti-aliasing for ViTs,
    bilinear without for the FlexiViT checkpoints; a model built with another ``pos_embed_resize`` rule
    (``"dinov2"``: the original plain DINOv2's) gets its table resampled by that rule."""

    def adapt(state: State, model: nn.Module, report: Any) -> State:
        own = model.state_dict()
        pos = state.get("pos_embed")
        if pos is not None and "pos_embed" in own and pos.shape != own["pos_embed"].shape and pos.dim() == 3:
            n_prefix = 0 if model.cfg.no_embed_class else model.num_prefix_tokens
            # a table without grid rows (empty, or only the prefix tokens') is left for the shape check to report
            grid = _checkpoint_grid(state, model, pos.shape[1] - n_prefix) if pos.shape[1] > n_prefix else None
            if grid is not None and pos.shape[-1] == own["pos_embed"].shape[-1]:
                state["pos_embed"] = resample_abs_pos_embed(pos, model.grid_size, grid, num_prefix_tokens=n_prefix,
                                                            interpolation=interpolation, antialias=antialias,
                                                            rule=getattr(model.cfg, "pos_embed_resize", "timm"))
                report.notes.append(f"pos_embed resampled from {grid[0]}x{grid[1]} to "
                                    f"{model.grid_size[0]}x{model.grid_size[1]}")
        kernel, own_kernel = state.get("patch_embed.proj.weight"), own.get("patch_embed.proj.weight")
        if (kernel is not None and own_kernel is not None and kernel.dim() == own_kernel.dim() == 4
                and kernel.shape[:2] == own_kernel.shape[:2] and kernel.shape[2:] != own_kernel.shape[2:]):
            state["patch_embed.proj.weight"] = resample_patch_embed(
                kernel, tuple(own_kernel.shape[2:]), interpolation=interpolation, antialias=antialias)
            report.notes.append(f"patch_embed.proj.weight resampled from {tuple(kernel.shape[2:])} to "
                                f"{tuple(own_kernel.shape[2:])} ({interpolation} pseudo-inverse)")
        return drop_mismatched_heads(state, own, ("head.", "head_dist."), report)

    return adapt


_adapt_vit = vit_adapter()


def drop_mismatched_heads(state: State, own: Mapping[str, Tensor], prefixes: tuple[str, ...], report: Any) -> State:
    """Remove classifier tensors for another number of classes than the model's (a different ``num_classes``); a
    head of another width (the checkpoint is another architecture) stays, for the shape check to report."""
    for prefix in prefixes:
        w = state.get(prefix + "weight")
        if w is not None and prefix + "weight" in own and w.shape[0] != own[prefix + "weight"].shape[0]:
            for key in [k for k in state if k.startswith(prefix)]:
                del state[key]
            msg = (f"classifier {prefix.rstrip('.')} has {w.shape[0]} classes in the checkpoint and "
                   f"{own[prefix + 'weight'].shape[0]} in the model: left freshly initialised")
            warnings.warn(msg, stacklevel=3)
            report.notes.append(msg)
            report.dropped.append(prefix.rstrip("."))
    return state


# ---------------------------------------------------------------- transformers config.json -> our config
# transformers' activation names -> VisionTransformerConfig.act
HF_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
           "relu": "relu", "silu": "silu", "swish": "silu"}


def hf_activation(config: Mapping[str, Any], choices: Mapping[str, str] = HF_ACTS) -> str | None:
    """Our name for a transformers ``hidden_act`` (``None`` when absent); others raise naming ``hidden_act``."""
    act = config.get("hidden_act")
    if act is None:
        return None
    if act not in choices:
        raise ValueError(f"config.json hidden_act={act!r} has no equivalent here; supported: {', '.join(choices)}")
    return choices[act]


def hf_num_classes(config: Mapping[str, Any]) -> int | None:
    """Classes of a transformers ``*ForImageClassification`` head (``None`` for a bare model).

    A ``num_labels`` the file states wins (a config class that declares it as its own field, such
    as ``PvtConfig``, builds the classifier from it whatever ``id2label`` holds); else the size
    of ``id2label`` (transformers' ``num_labels``), else 2.
    """
    archs = config.get("architectures") or []
    if not any("Classification" in a for a in archs):
        return None
    stated = config.get("num_labels")
    if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
        return stated
    id2label = config.get("id2label")
    return len(id2label) if isinstance(id2label, Mapping) and id2label else int(config.get("num_labels", 2))


def hf_classes(config: Mapping[str, Any]) -> dict[str, int]:
    """``{"num_classes": n}`` for a transformers classifier's ``config.json`` (:func:`hf_num_classes`); ``{}`` for
    a bare model's, whose class count our config keeps."""
    classes = hf_num_classes(config)
    return {} if classes is None else {"num_classes": classes}


def _size(v: Any) -> Any:
    return tuple(v) if isinstance(v, (list, tuple)) else v


def hf_fields(config: Mapping[str, Any], pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """``{ours: config[theirs]}`` for each ``(theirs, ours)`` pair whose field a transformers ``config.json`` states
    (lists become tuples, as our configs hold sizes)."""
    return {ours: _size(config[theirs]) for theirs, ours in pairs if theirs in config}


# the fields every transformers ViT-style vision config names alike: (theirs, ours)
_HF_VIT_FIELDS = (("layer_norm_eps", "norm_eps"), ("image_size", "img_size"), ("patch_size", "patch_size"),
                  ("num_channels", "in_chans"), ("hidden_size", "embed_dim"), ("num_hidden_layers", "depth"),
                  ("num_attention_heads", "num_heads"))


def hf_vit_fields(config: Mapping[str, Any], extra: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """VisionTransformerConfig fields of a transformers ViT-style vision ``config`` (a composite config's
    ``vision_config`` when given one): width, depth, heads, eps, sizes, ``extra`` ``(theirs, ours)`` pairs,
    and ``mlp_ratio`` from ``intermediate_size`` (lists become tuples)."""
    vision = config.get("vision_config") or config
    out = hf_fields(vision, _HF_VIT_FIELDS + tuple(extra))
    if "intermediate_size" in vision and "hidden_size" in vision:
        out["mlp_ratio"] = vision["intermediate_size"] / vision["hidden_size"]
    return out


def _hf_vit_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """VisionTransformerConfig fields a transformers ViT / DeiT ``config.json`` defines."""
    out = hf_vit_fields(config, (("qkv_bias", "qkv_bias"),))
    act = hf_activation(config)
    if act is not None:
        out["act"] = act
    out.update(hf_classes(config))
    if config.get("model_type") == "deit" and any("WithTeacher" in a for a in config.get("architectures") or []):
        out["distilled"] = True
    return out


register_hf_config_reader("vit", _hf_vit_config, family="vit")
register_hf_config_reader("deit", _hf_vit_config, family="vit")
register_converter("vit", "huggingface", _is_hf, _from_hf)
register_converter("vit", "torchvision", _is_torchvision, _from_torchvision)
register_adapter("vit", _adapt_vit)
# timm loads every flexivit* checkpoint with bilinear, un-antialiased resizes (big_vision's rule)
register_adapter("flexivit", vit_adapter("bilinear", antialias=False))
