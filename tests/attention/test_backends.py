"""Every registered mechanism on every backend it lists: flex and sdpa equal explicit (forward and backward).

The spec's small example runs as it is (odd, non-window-multiple sizes); patterned mechanisms
have their own option sweeps (shift, padding, dilation, globals, caches) in their test files.
"""

from __future__ import annotations

import pytest
import torch
from flex_utils import assert_flex_matches_explicit, count_graphs

from vit_attention import create_attention, list_attention
from vit_attention.attention import get_attention_spec, set_attention_backend
from vit_attention.functional.runtime import BACKENDS

NAMES = list_attention()


def _example(name: str) -> tuple[torch.nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    module, shape = get_attention_spec(name).example()
    return module.eval(), shape


@pytest.mark.parametrize("name", NAMES)
def test_flex_equals_explicit(name: str) -> None:
    spec = get_attention_spec(name)
    module, shape = _example(name)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if "flex" not in spec.backends:
        with pytest.raises(ValueError, match=f"{name} runs on"):
            set_attention_backend(module, "flex")
        assert spec.backend_note, f"{name} refuses flex without saying why"
        return
    assert_flex_matches_explicit(module, lambda: [x])


@pytest.mark.parametrize("name", NAMES)
def test_sdpa_equals_explicit(name: str) -> None:
    module, shape = _example(name)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    if "sdpa" not in get_attention_spec(name).backends:
        with pytest.raises(ValueError, match=f"{name} runs on"):
            set_attention_backend(module, "sdpa")
        return
    assert_flex_matches_explicit(module, lambda: [x], other="sdpa")


def test_create_attention_takes_a_backend_and_checks_it() -> None:
    m = create_attention("mhsa", 32, 4, backend="flex")
    assert m.attention_backend == "flex"
    assert create_attention("mhsa", 32, 4).attention_backend == "auto"
    with pytest.raises(ValueError, match=r"backend must be one of \['auto', 'sdpa', 'explicit', 'flex'\]"):
        create_attention("mhsa", 32, 4, backend="fast")
    with pytest.raises(ValueError, match="talking_heads runs on \\['auto', 'explicit'\\] only \\(it mixes the heads"):
        create_attention("talking_heads", 32, 4, backend="flex")


def test_every_listed_backend_is_known() -> None:
    for name in NAMES:
        spec = get_attention_spec(name)
        assert set(spec.backends) <= set(BACKENDS) and "auto" in spec.backends and "explicit" in spec.backends


FLEX_NAMES = [n for n in NAMES if "flex" in get_attention_spec(n).backends]


@pytest.mark.parametrize("name", FLEX_NAMES)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_flex_compiles_as_one_graph(name: str) -> None:
    # device-independent: what torch.compile sees on a GPU too (a pattern's plan read back to Python, e.g. a
    # nonzero in an index builder, would break the graph there as well)
    module, shape = _example(name)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    set_attention_backend(module, "flex")
    assert count_graphs(module, x) == 1
