"""One reduced model per family on the flex backend equals the explicit backend, forward and backward.

``create_model(name, attn_backend=...)`` sets every mechanism of the model; a family whose mechanism
cannot run on flex (CaiT's talking heads) refuses it by name instead.
"""

from __future__ import annotations

import pytest
import torch
from flex_utils import assert_flex_matches_explicit
from model_outputs import build, first_preset_per_family, small_overrides

from vit_attention import create_model
from vit_attention.attention import get_attention_spec

FAMILIES = sorted(first_preset_per_family().items())


def _mechanisms(model: torch.nn.Module) -> set[str]:
    return {type(m).attention_name for m in model.modules() if hasattr(type(m), "attention_name")}


@pytest.mark.compile
@pytest.mark.registry
@pytest.mark.parametrize(("family", "name"), FAMILIES)
def test_flex_model_equals_explicit(family: str, name: str) -> None:
    model, x = build(name, small_overrides(name))
    refusing = sorted(m for m in _mechanisms(model) if "flex" not in get_attention_spec(m).backends)
    if refusing:
        with pytest.raises(ValueError, match=f"{refusing[0]} runs on"):
            create_model(name, attn_backend="flex", **small_overrides(name))
        return
    assert_flex_matches_explicit(model, lambda: [x[:1]])


def test_create_model_sets_every_mechanism_and_checks_the_name() -> None:
    name = first_preset_per_family()["swin"]
    model = create_model(name, attn_backend="flex", **small_overrides(name))
    backends = {m.attention_backend for m in model.modules() if "attention_backend" in vars(m)}
    assert backends == {"flex"}
    with pytest.raises(ValueError, match="attn_backend must be one of"):
        create_model(name, attn_backend="flash", **small_overrides(name))



def _patterned(name: str) -> bool:
    """The family runs a mechanism with a flex pattern of its own (its class declares ``flex_pattern``); the
    others run the generic path, traced at the mechanism level in tests/attention/test_backends.py."""
    with torch.device("meta"):
        model = create_model(name, **small_overrides(name))
    return any(get_attention_spec(m).cls.flex_pattern is not None for m in _mechanisms(model))


@pytest.mark.compile
@pytest.mark.registry
@pytest.mark.parametrize(("family", "name"), [f for f in FAMILIES if _patterned(f[1])])
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_flex_model_compiles_as_one_graph(family: str, name: str) -> None:
    # dynamo's trace is device-independent: a break here is a break on a GPU too
    from flex_utils import count_graphs

    from vit_attention.attention import set_attention_backend

    model, x = build(name, small_overrides(name))
    set_attention_backend(model.eval(), "flex")
    assert count_graphs(model, x[:1]) == 1
