"""Model families (one file each) and the model registry; the first look-up imports every family module.

``create_model`` (build a registered model and load its weights) lives in :mod:`vit_attention.factory`,
above this package and :mod:`vit_attention.weights`; importing this package never imports the weights
or the factory.
"""

from .registry import get_model_entry, list_models, model_config, resolve_model_name
from .vit import VisionTransformer, VisionTransformerConfig

__all__ = ["VisionTransformer", "VisionTransformerConfig", "get_model_entry", "list_models", "model_config",
           "resolve_model_name"]
