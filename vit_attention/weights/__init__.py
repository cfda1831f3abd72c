"""Checkpoint formats: safe reading/writing, layout detection and conversion, ``load_weights``, ``load_model``."""

import importlib as _importlib
import pkgutil as _pkgutil

from .io import UnsafeCheckpointError, read_checkpoint, save_weights, unwrap_state_dict
from .load import CheckpointMismatchError, LoadReport, convert_state_dict, load_weights
from .saved import SavedModel, describe_checkpoint, load_model
from .transfer import transfer_weights

__all__ = ["CheckpointMismatchError", "LoadReport", "SavedModel", "UnsafeCheckpointError", "convert_state_dict",
           "describe_checkpoint", "load_model", "load_weights", "read_checkpoint", "save_weights",
           "transfer_weights", "unwrap_state_dict"]

# Every other module here is one family's converters (it registers them at import): a new family's
# converter is a new file in this folder; nothing else lists it.
_INFRASTRUCTURE = frozenset({"hub", "io", "layouts", "load", "saved", "transfer"})
for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_") and _info.name not in _INFRASTRUCTURE:
        _importlib.import_module(f"{__name__}.{_info.name}")
del _info
