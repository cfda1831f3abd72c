"""Model families (one file each) and the model registry; the first look-up imports every family module."""

from .registry import create_model, get_model_entry, list_models, model_config, resolve_model_name
from .vit import VisionTransformer, VisionTransformerConfig

__all__ = ["VisionTransformer", "VisionTransformerConfig", "create_model", "get_model_entry", "list_models",
           "model_config", "resolve_model_name"]
