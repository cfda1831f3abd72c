"""Checkpoint formats: safe reading/writing, layout detection and conversion, ``load_weights``, ``load_model``."""

from . import swin as _swin  # noqa: F401  (registers the Swin / SwinV2 converters)
from . import vit as _vit  # noqa: F401  (registers the ViT / DeiT converters)
from .io import UnsafeCheckpointError, read_checkpoint, save_weights, unwrap_state_dict
from .load import CheckpointMismatchError, LoadReport, convert_state_dict, load_weights
from .saved import SavedModel, describe_checkpoint, load_model

__all__ = ["CheckpointMismatchError", "LoadReport", "SavedModel", "UnsafeCheckpointError", "convert_state_dict",
           "describe_checkpoint", "load_model", "load_weights", "read_checkpoint", "save_weights",
           "unwrap_state_dict"]
