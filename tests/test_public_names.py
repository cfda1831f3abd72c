"""Each public name has one home: the package is unreleased, so no module re-exports or aliases a moved name."""

from __future__ import annotations

import importlib

import pytest

# (module, name): a name that lives elsewhere (its home in the comment); the module neither defines nor exports
# it (it may import it for its own use, as cvt imports ConvEmbed), and no module-level __getattr__ serves it.
NOT_HERE = [
    ("vit_attention.models", "create_model"),  # vit_attention.factory (vit_attention.create_model)
    ("vit_attention.models.registry", "create_model"),  # vit_attention.factory
    ("vit_attention.layers", "HierarchicalMixin"),  # removed: families derive from models.backbone.Backbone
    ("vit_attention.layers.stage", "HierarchicalMixin"),
    ("vit_attention.models.cvt", "ConvEmbed"),  # vit_attention.layers.conv_embed
    ("vit_attention.models.davit", "NormClassifierHead"),  # layers.ClassifierHead(norm_layer=...)
    ("vit_attention.layers.mbconv", "make_divisible"),  # vit_attention.functional.sizes
    ("vit_attention.functional", "fused_attention"),  # runtime.FUSED_ATTENTION.override
    ("vit_attention.functional.attention", "fused_attention"),
    ("vit_attention.models.backbone", "TokenMergingMixin"),  # vit_attention.models.token_merging
    ("vit_attention.models.backbone", "apply_tome_option"),  # vit_attention.factory (with the other CLI options)
    ("vit_attention.models.features", "as_features_model"),  # removed: features_class(cls)(cfg, out_indices=...)
]


@pytest.mark.parametrize(("module", "name"), NOT_HERE, ids=[f"{m}.{n}" for m, n in NOT_HERE])
def test_a_moved_name_is_not_served_by_its_old_module(module: str, name: str) -> None:
    mod = importlib.import_module(module)
    assert name not in getattr(mod, "__all__", ()), f"{module}.__all__ lists {name}"
    assert not hasattr(mod, "__getattr__"), f"{module} serves names through a module __getattr__"
    if name in vars(mod):  # imported for the module's own use: defined elsewhere, not here
        assert getattr(vars(mod)[name], "__module__", module) != module, f"{module} defines {name}"


# module -> the module that holds what it held (named for its content)
MOVED_MODULES = {
    "vit_attention.train.presets": "vit_attention.models.digits",
    "vit_attention.commands": "vit_attention.registry_commands",
    "vit_attention.analysis._run": "vit_attention.analysis.recording",
    "vit_attention.layers.adapter": "vit_attention.layers.layout_adapter",
    "vit_attention.models.pretrained": "vit_attention.models.pretrained_table",
    "vit_attention.models._pretrained": "vit_attention.models.pretrained_tags",
}


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_a_moved_module_has_one_name(old: str) -> None:
    """The old module name imports nothing; the new one does."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    assert importlib.import_module(MOVED_MODULES[old]).__doc__


def test_igpt_exports_only_its_own_names() -> None:
    """iGPT builds its MLP with layers.activation.QuickGELU but does not export it."""
    from vit_attention.models import igpt

    assert "QuickGELU" not in igpt.__all__
    assert all(getattr(igpt, n).__module__ == igpt.__name__ for n in igpt.__all__
               if hasattr(getattr(igpt, n), "__module__") and isinstance(getattr(igpt, n), type))
