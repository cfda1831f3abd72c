"""Spatial mechanisms in models with prefix (class / distillation / register) tokens.

The adapter lets the prefix tokens attend globally to every token through the mechanism's own
projections (``attend_prefix``) while the grid keeps the mechanism's pattern, so a class token reads
the image: the output of every such model depends on its input.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_outputs import first_preset_per_family, small_overrides

from vit_attention import create_model
from vit_attention.attention import get_attention_spec, list_attention
from vit_attention.models import get_model_entry

SPATIAL = [n for n in list_attention() if get_attention_spec(n).layout == "spatial"]


def _families_with_prefix_tokens() -> list[str]:
    """Representative presets whose family takes ``attn_layer`` and whose (reduced) model has prefix tokens."""
    names = []
    for name in sorted(first_preset_per_family().values()):
        entry = get_model_entry(name)
        if "attn_layer" not in {f.name for f in dataclasses.fields(entry.config_cls)}:
            continue
        with torch.device("meta"):
            model = create_model(name, **small_overrides(name))
        if getattr(model, "num_prefix_tokens", 0) > 0:
            names.append(name)
    return names


PREFIX_FAMILIES = _families_with_prefix_tokens()


def test_the_sweep_covers_class_token_vits():
    assert {"deit3_base_patch16_224", "vit_base_patch16_clip_224", "pvt_large"} <= set(PREFIX_FAMILIES)


@pytest.mark.registry
@pytest.mark.parametrize("mech", SPATIAL)
@pytest.mark.parametrize("name", PREFIX_FAMILIES)
def test_spatial_mechanism_in_a_model_with_prefix_tokens_depends_on_the_input(name: str, mech: str) -> None:
    over = small_overrides(name)
    try:
        model = create_model(name, **over, attn_layer=mech).eval()
    except ValueError as e:  # a family whose config cannot take the mechanism refuses by name
        assert "attn_layer" in str(e)
        return
    cfg = model.cfg
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    x = torch.randn(2, cfg.in_chans, *size, requires_grad=True)
    y = model(x)
    y = y[0] if isinstance(y, tuple) else y
    assert not torch.equal(y[0], y[1])  # two images, two outputs
    y.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0  # the output reads the image


@pytest.mark.parametrize("mech", ["window", "neighborhood"])
def test_class_token_digits_vit_with_a_spatial_mechanism_reads_the_image(mech: str) -> None:
    """The docs' example (``train --model vit_digits_patch2_8 --model-arg attn_layer=window``): class-token
    pooling, one prefix token; each input gets its own logits, and the class token's features move with it."""
    model = create_model("vit_digits_patch2_8", num_classes=3, img_size=16, attn_layer=mech).eval()
    assert model.cfg.global_pool == "token" and model.num_prefix_tokens == 1
    x = torch.randn(4, model.cfg.in_chans, 16, 16)
    with torch.no_grad():
        logits = model(x)
        cls = model.forward_features(x)[:, 0]  # [B, C]
    assert all(not torch.equal(logits[0], logits[i]) for i in range(1, 4))
    assert all(not torch.equal(cls[0], cls[i]) for i in range(1, 4))
