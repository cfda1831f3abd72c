"""vit_attention: plug-and-play vision-transformer attention mechanisms and the backbones built from them.

    >>> import vit_attention as va
    >>> model = va.create_model("vit_base_patch16_224")        # timm names; torchvision aliases too
    >>> model = va.create_model("vit_base_patch16_224", pretrained=True)  # timm's weights via the HF hub cache
    >>> x = va.create_transform(va.resolve_data_config(model))(pil_image)[None]  # its eval preprocessing
    >>> attn = va.create_attention("mhsa", dim=256, num_heads=8)  # any registered mechanism
    >>> model = va.load_model("runs/<run>")       # a trained model: name, config and weights from the file
"""

import importlib as _importlib
from typing import Any as _Any

from . import functional
from .attention import AttentionCall, create_attention, list_attention
from .data import create_transform, resolve_data_config
from .layers.plug import Plug, plug
from .models import list_models

__version__ = "0.1.0"

__all__ = ["AttentionCall", "__version__", "create_attention", "create_model", "create_transform", "functional",
           "list_attention", "list_models", "list_pretrained", "resolve_data_config",
           "load_model", "load_weights", "save_weights",
           "Plug", "plug"]

# Names served lazily (module that defines them, relative to this package). Importing this package
# runs first whatever submodule one imports (``import vit_attention.models``), so an eager import of
# the factory / weights here would load them under every lower layer, and take longer (safetensors,
# every family's converters): they are imported when first asked for, and so are those two subpackages
# (``va.weights`` and ``va.factory`` as attributes after ``import vit_attention``).
_LAZY: dict[str, str] = {"create_model": ".factory", "list_pretrained": ".weights.hub", "load_model": ".weights",
                         "load_weights": ".weights", "save_weights": ".weights"}
_LAZY_MODULES = frozenset({"factory", "weights"})  # subpackages served as attributes


def __getattr__(name: str) -> _Any:
    """``create_model``, ``load_model``, ``load_weights``, ``save_weights``, ``list_pretrained`` and the
    subpackages, imported when first asked for (see ``_LAZY``)."""
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # asked once
        return value
    if name in _LAZY_MODULES:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The package's names, those served by :func:`__getattr__` included."""
    return sorted({*globals(), *_LAZY, *_LAZY_MODULES})
