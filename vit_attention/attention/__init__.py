"""Attention mechanisms: one file per idea, each a thin nn.Module over ``functional``.

Importing this package imports every mechanism module here (each registers itself with
:func:`register_attention`) and re-exports what each module lists in ``__all__``; see
:func:`list_attention`. A new mechanism is a new file in this folder; nothing else lists it.
"""

import importlib as _importlib
import pkgutil as _pkgutil

from .base import AttentionCall, AttentionModule
from .registry import (
    AttentionSpec,
    create_attention,
    get_attention_spec,
    list_attention,
    register_attention,
    set_attention_backend,
)

__all__ = ["AttentionCall", "AttentionModule", "AttentionSpec", "create_attention", "get_attention_spec",
           "list_attention", "register_attention", "set_attention_backend"]

for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name.startswith("_") or _info.name == "registry":
        continue
    _module = _importlib.import_module(f"{__name__}.{_info.name}")
    for _name in getattr(_module, "__all__", ()):
        globals()[_name] = getattr(_module, _name)
        __all__.append(_name)
del _info, _module, _name
