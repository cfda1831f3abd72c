"""Model families (one file each) and the model registry. Importing registers every family."""

from . import digits, swin, swinv2, vit  # noqa: F401  (registers the ViT / DeiT, Swin, SwinV2, digits presets)
from .registry import create_model, get_model_entry, list_models, model_config, resolve_model_name
from .vit import VisionTransformer, VisionTransformerConfig

__all__ = ["VisionTransformer", "VisionTransformerConfig", "create_model", "get_model_entry", "list_models",
           "model_config", "resolve_model_name"]
