"""Reference implementations (timm, torchvision, Hugging Face) of our registered models, holding OUR weights' twins.

Each factory builds the same architecture in the other library, then loads that model's state
dict into ours through our converters (``load_weights``, layout detected), so both compute with
identical weights. timm and torchvision import only with a CUDA build of torch (see
docs/benchmarks.md); where they cannot be imported, :class:`ReferenceUnavailable` says why.

``hf`` (transformers) covers the families whose Hugging Face model has a converter here and no natten
dependency: ViTDet (``VitDetModel``, the plain backbone: compared with our ``forward_features``, the
last map ``[B, H/16, W/16, C]``). transformers' Swin / SwinV2 / ViT / DeiT have timm twins (use timm);
its DiNAT needs natten; it has no NAT (removed in 5.x), ViL, HaloNet or iGPT-as-classifier counterpart.

A name with the suffix ``-compiled`` (``timm-compiled``, ``hf-compiled``) is the same reference under
``torch.compile``; the harness compiles it (:func:`split_compiled`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..models.registry import aliases_of, get_model_entry
from ..weights import load_weights

__all__ = ["ReferenceUnavailable", "ReferenceFactory", "REFERENCE_FACTORIES", "Reference", "build_reference",
           "build_reference_spec", "library_version", "split_compiled", "COMPILED_SUFFIX", "HF_FAMILIES"]

COMPILED_SUFFIX = "-compiled"


@dataclass
class Reference:
    """A built reference: ``module`` (called on the image batch ``[B, C, H, W]``), and how ours is compared with it.

    ``ours_method``: the method of ours that computes what ``module`` computes (``"forward_features"`` for a
    backbone-only reference), None for ``forward``. ``loaded``: the factory already loaded the reference's
    weights into ours (else :func:`build_reference_spec` does, strictly).
    """

    module: nn.Module
    ours_method: str | None = None
    loaded: bool = False


# (registered model name, our model with its config, img_size or None) -> reference module (or a Reference)
ReferenceFactory = Callable[[str, nn.Module, "int | None"], "nn.Module | Reference"]


def split_compiled(lib: str) -> tuple[str, bool]:
    """``"timm-compiled"`` -> ``("timm", True)``; ``"timm"`` -> ``("timm", False)``."""
    if lib.endswith(COMPILED_SUFFIX):
        return lib[: -len(COMPILED_SUFFIX)], True
    return lib, False

SIDE_ENV_HINT = ("run the benchmark in the side environment with a CUDA build of torch, e.g. "
                 "`/tmp/ref/bin/vit-attention bench ...` (setup: docs/benchmarks.md)")


class ReferenceUnavailable(RuntimeError):
    """The reference library is missing here or has no equivalent of the model."""


def _import(lib: str):  # noqa: ANN202 - returns a module
    try:
        return importlib.import_module(lib)
    except Exception as e:  # ImportError, or torchvision's RuntimeError with a CPU-only torch
        raise ReferenceUnavailable(f"{lib} cannot be imported here ({type(e).__name__}: {str(e)[:160]}); "
                                   f"{SIDE_ENV_HINT}") from e


def library_version(lib: str) -> str | None:
    """``lib.__version__`` when it imports, else None."""
    try:
        return str(importlib.import_module(lib).__version__)
    except Exception:
        return None


def _timm(name: str, ours: nn.Module, img_size: int | None) -> nn.Module:
    timm = _import("timm")
    if name not in timm.list_models():
        raise ReferenceUnavailable(f"timm {timm.__version__} has no model {name!r}")
    kwargs = {"img_size": img_size} if img_size is not None else {}
    return timm.create_model(name, pretrained=False, num_classes=getattr(ours, "num_classes", 1000), **kwargs)


def _torchvision(name: str, ours: nn.Module, img_size: int | None) -> nn.Module:
    tv = _import("torchvision")
    available = set(tv.models.list_models(module=tv.models))
    names = [n for n in [name, *aliases_of(name)] if n in available]
    if not names:
        raise ReferenceUnavailable(f"torchvision {tv.__version__} has no model matching {name!r} "
                                   f"(aliases: {aliases_of(name) or 'none'})")
    kwargs: dict[str, object] = {"num_classes": getattr(ours, "num_classes", 1000)}
    # torchvision's ViTs fix their input size at build (image_size=); its other models take any size
    if img_size is not None and names[0] in tv.models.vision_transformer.__all__:
        kwargs["image_size"] = img_size
    return tv.models.get_model(names[0], weights=None, **kwargs)


class _HFFeatures(nn.Module):
    """A transformers backbone model returning its last map channels-last: ``[B, C, H, W]`` images ->
    ``[B, H', W', C']`` (the layout of our ``forward_features``; a permuted view, no copy)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(pixel_values=x).last_hidden_state.permute(0, 2, 3, 1)


def _hf_vitdet(ours: nn.Module, img_size: int | None) -> Reference:
    """transformers ``VitDetModel`` configured from our ViTDet's config; its weights loaded into our backbone."""
    tf = _import("transformers")
    cfg = ours.cfg  # type: ignore[attr-defined]
    size = cfg.img_size if isinstance(cfg.img_size, int) else list(cfg.img_size)
    glob = {i for i in cfg.global_block_indices if i < cfg.depth} if cfg.window_size else set(range(cfg.depth))
    if cfg.attn_layer != "rel_pos" or cfg.attn_kwargs or cfg.rel_pos_impl not in ("bias", "augment"):
        raise ReferenceUnavailable(f"hf: VitDetModel has no counterpart of attn_layer={cfg.attn_layer!r} "
                                   f"attn_kwargs={cfg.attn_kwargs}")
    if float(cfg.mlp_ratio) != int(cfg.mlp_ratio):
        raise ReferenceUnavailable(f"hf: VitDetConfig takes an integer mlp_ratio, ours is {cfg.mlp_ratio}")
    hf_cfg = tf.VitDetConfig(
        hidden_size=cfg.embed_dim, num_hidden_layers=cfg.depth, num_attention_heads=cfg.num_heads,
        mlp_ratio=int(cfg.mlp_ratio), qkv_bias=cfg.qkv_bias, layer_norm_eps=cfg.norm_eps, num_channels=cfg.in_chans,
        image_size=size, patch_size=cfg.patch_size, pretrain_image_size=cfg.pretrain_img_size,
        window_size=cfg.window_size, window_block_indices=[i for i in range(cfg.depth) if i not in glob],
        use_relative_position_embeddings=cfg.use_rel_pos, use_absolute_position_embeddings=cfg.use_abs_pos,
        drop_path_rate=0.0, dropout_prob=0.0)
    hf = tf.VitDetModel(hf_cfg)
    report = load_weights(ours, hf.state_dict(), strict=False)  # the backbone: our pyramid / probe stay as built
    backbone_missing = [k for k in report.missing if not k.startswith(("simfp_", "top_block", "head", "fc_norm"))]
    if report.unexpected or report.mismatched or backbone_missing:
        raise ReferenceUnavailable(f"hf: VitDetModel's weights do not convert onto ours: unexpected "
                                   f"{report.unexpected[:3]}, mismatched {report.mismatched[:3]}, missing "
                                   f"{backbone_missing[:3]}")
    return Reference(_HFFeatures(hf), ours_method="forward_features", loaded=True)


# family -> builder of the transformers counterpart (our model, img_size) -> Reference
HF_FAMILIES: dict[str, Callable[[nn.Module, int | None], Reference]] = {"vitdet": _hf_vitdet}
_HF_WHY_NOT = {
    "swin": "transformers' Swin has a timm twin here: use --compare timm",
    "swinv2": "transformers' SwinV2 has a timm twin here: use --compare timm",
    "dinat": "transformers' DiNAT runs on natten's kernels, which it needs installed",
    "nat": "transformers 5.x has no NAT",
}


def _hf(name: str, ours: nn.Module, img_size: int | None) -> Reference:
    family = get_model_entry(name).family
    if family not in HF_FAMILIES:
        why = _HF_WHY_NOT.get(family, f"no transformers counterpart of the {family} family with a converter here")
        raise ReferenceUnavailable(f"hf has no reference for {name} ({why}; hf covers: {', '.join(HF_FAMILIES)})")
    return HF_FAMILIES[family](ours, img_size)


REFERENCE_FACTORIES: dict[str, ReferenceFactory] = {"timm": _timm, "torchvision": _torchvision, "hf": _hf}


def known_references(factories: dict[str, ReferenceFactory] | None = None) -> list[str]:
    """Every name ``--compare`` takes: the factories' names and each one's ``-compiled`` twin."""
    names = sorted({**REFERENCE_FACTORIES, **(factories or {})})
    return names + [n + COMPILED_SUFFIX for n in names]


def build_reference_spec(lib: str, name: str, ours: nn.Module, img_size: int | None = None,
                         factories: dict[str, ReferenceFactory] | None = None) -> Reference:
    """Build ``lib``'s ``name`` and load its weights into ``ours`` (in place); returns the :class:`Reference`.

    ``lib`` is a factory name (``timm``, ``torchvision``, ``hf`` or one of ``factories``), without the
    ``-compiled`` suffix (the harness compiles). Raises :class:`ReferenceUnavailable` when the library is
    missing, has no such model, or its checkpoint does not convert onto ours (the converter's report is in
    the message), ``ValueError`` for an unknown ``lib``.
    """
    table = {**REFERENCE_FACTORIES, **(factories or {})}
    if lib not in table:
        raise ValueError(f"--compare: unknown reference {lib!r}; expected one of {known_references(factories)}")
    built: Any = table[lib](name, ours, img_size)
    ref = built if isinstance(built, Reference) else Reference(built)
    if not ref.loaded:
        try:
            load_weights(ours, ref.module.state_dict())
        except Exception as e:
            raise ReferenceUnavailable(f"{lib} {name}: its weights do not convert onto ours: {str(e)[:400]}") from e
    return ref


def build_reference(lib: str, name: str, ours: nn.Module, img_size: int | None = None,
                    factories: dict[str, ReferenceFactory] | None = None) -> nn.Module:
    """:func:`build_reference_spec`'s module: ``lib``'s ``name`` with its weights loaded into ``ours``."""
    return build_reference_spec(lib, name, ours, img_size, factories).module
