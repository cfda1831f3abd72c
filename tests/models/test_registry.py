"""Registry-wide checks: every registered model builds; names, aliases and errors."""

import dataclasses
import json

import pytest
import torch

from vit_attention import create_model, list_models
from vit_attention.models import get_model_entry, model_config
from vit_attention.models.registry import aliases_of


@pytest.mark.registry
@pytest.mark.parametrize("name", list_models())
def test_every_model_builds_and_runs_on_meta(name):
    """Every preset at full size on meta: logits and pre-logits shapes, its config's JSON round trip, and its
    parameter count within 1 % of the published one where the family gives it (``published_params_m``)."""
    with torch.device("meta"):
        model = create_model(name).eval()
        cfg = model.cfg
        size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
        y = model(torch.empty(2, cfg.in_chans, *size))
    classes = get_model_entry(name).default_num_classes()  # the preset's, else its default tag's head (timm)
    classes = 1000 if classes is None else classes
    assert y.shape == (2, classes or model.num_features)
    feats = model.forward_head(model.forward_features(torch.empty(2, cfg.in_chans, *size, device="meta")),
                               pre_logits=True)
    assert feats.shape == (2, model.num_features)
    # config is a JSON-serialisable dataclass that rebuilds the same config
    d = json.loads(cfg.to_json())
    assert dataclasses.asdict(type(cfg).from_dict(d)) == dataclasses.asdict(cfg)
    entry = get_model_entry(name)
    published = entry.meta.get("published_params_m")
    if published:
        exclude = tuple(entry.meta.get("published_params_exclude", ()))
        n = sum(p.numel() for k, p in model.named_parameters() if not k.startswith(exclude)) / 1e6
        assert abs(n - published) / published < 0.01, f"{name}: {n:.1f}M vs published {published}M"


def test_aliases_and_unknown_names():
    assert aliases_of("vit_base_patch16_224") == ["vit_b_16"]
    assert "vit_b_16" in list_models(include_aliases=True) and "vit_b_16" not in list_models()
    m = create_model("vit_b_16", img_size=32, depth=1, num_classes=3)
    assert m.registry_name == "vit_base_patch16_224" and m.num_classes == 3
    with pytest.raises(KeyError, match="Did you mean: vit_base_patch16_224"):
        create_model("vit_base_patch16_22")
    with pytest.raises(KeyError, match=r"`vit-attention models` on the command line.*list_models\(\)"):
        create_model("no_such_model_at_all")
    with pytest.raises(TypeError, match="did you mean 'embed_dim'"):
        create_model("vit_tiny_patch16_224", embed_dims=3)
    with pytest.raises(ValueError, match="num_classes"):
        create_model("vit_tiny_patch16_224", num_classes=-1)


def test_model_config_applies_overrides():
    cfg = model_config("deit_small_patch16_224", depth=3)
    assert cfg.depth == 3 and cfg.embed_dim == 384


def test_default_num_classes_follow_the_default_tag_like_timm():
    """timm builds a preset with its default pretrained cfg's num_classes; here the same (0: no classifier)."""
    expected = {"davit_base_fl": 0, "davit_huge_fl": 0, "vit_huge_patch14_224": 0, "vit_large_patch32_224": 0,
                "swinv2_base_window12_192": 21841, "swinv2_large_window12_192": 21841,
                "mvitv2_base_cls": 19168, "mvitv2_large_cls": 19168, "mvitv2_huge_cls": 19168}  # ImageNet-21k heads
    changed = {n: get_model_entry(n).default_num_classes() for n in list_models()
               if "num_classes" not in get_model_entry(n).preset and get_model_entry(n).default_num_classes()
               not in (None, 1000)}
    assert changed == expected  # a new preset whose default tag has another head must be added here knowingly
    for name, classes in expected.items():
        assert model_config(name).num_classes == classes and model_config(name, num_classes=3).num_classes == 3
    assert model_config("vit_base_patch16_224_in21k").num_classes == 21843  # the preset's own value wins


def test_create_model_lives_in_the_factory_only():
    """``create_model`` is the factory's, exported by the package; ``models`` and ``models.registry`` hold none."""
    import vit_attention
    import vit_attention.models
    import vit_attention.models.registry as registry
    from vit_attention.factory import create_model as factory_create_model

    assert create_model is factory_create_model is vit_attention.create_model
    assert "create_model" in dir(vit_attention)
    for module in (vit_attention.models, registry):
        assert not hasattr(module, "create_model"), module.__name__
        assert "create_model" not in dir(module), module.__name__
