"""Model families (one file each) and the model registry; the first look-up imports every family module.

``create_model`` (build a registered model and load its weights) lives in :mod:`vit_attention.factory`,
above this package and :mod:`vit_attention.weights`; ``vit_attention.models.create_model`` is a
compatibility path to it (:func:`__getattr__`, imported when first asked for), so importing this
package never imports the weights or the factory.
"""

from collections.abc import Callable

from torch import nn

from .registry import get_model_entry, list_models, model_config, resolve_model_name
from .vit import VisionTransformer, VisionTransformerConfig

__all__ = ["VisionTransformer", "VisionTransformerConfig", "create_model", "get_model_entry", "list_models",
           "model_config", "resolve_model_name"]


def __getattr__(name: str) -> Callable[..., nn.Module]:
    """Compatibility path: ``vit_attention.models.create_model`` is :func:`vit_attention.factory.create_model`.

    Imported lazily, when first asked for: the factory sits above ``models/`` (it imports
    :mod:`vit_attention.weights`, which imports ``models/``), so an import at the top would be a circle.
    """
    if name == "create_model":
        from ..factory import create_model  # compatibility path: the factory sits above models/

        return create_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, ``create_model`` (served by :func:`__getattr__`) included."""
    return sorted({*globals(), "create_model"})
