"""Reference implementations (timm, torchvision) of our registered models, holding OUR weights' twins.

Each factory builds the same architecture in the other library, then loads that model's state
dict into ours through our converters (``load_weights``, layout detected), so both compute with
identical weights. timm and torchvision import only with a CUDA build of torch (see
docs/benchmarks.md); where they cannot be imported, :class:`ReferenceUnavailable` says why.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from ..models.registry import aliases_of
from ..weights import load_weights

__all__ = ["ReferenceUnavailable", "ReferenceFactory", "REFERENCE_FACTORIES", "build_reference", "library_version"]

# (registered model name, our model with its config, img_size or None) -> reference module
ReferenceFactory = Callable[[str, nn.Module, "int | None"], nn.Module]

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


REFERENCE_FACTORIES: dict[str, ReferenceFactory] = {"timm": _timm, "torchvision": _torchvision}


def build_reference(lib: str, name: str, ours: nn.Module, img_size: int | None = None,
                    factories: dict[str, ReferenceFactory] | None = None) -> nn.Module:
    """Build ``lib``'s ``name`` and load its weights into ``ours`` (in place); returns the reference.

    Raises :class:`ReferenceUnavailable` when the library is missing, has no such model, or its
    checkpoint does not convert onto ours (the converter's report is in the message).
    """
    table = {**REFERENCE_FACTORIES, **(factories or {})}
    if lib not in table:
        raise ValueError(f"--compare: unknown reference {lib!r}; expected one of {sorted(table)}")
    ref = table[lib](name, ours, img_size)
    try:
        load_weights(ours, ref.state_dict())
    except Exception as e:
        raise ReferenceUnavailable(f"{lib} {name}: its weights do not convert onto ours: {str(e)[:400]}") from e
    return ref
