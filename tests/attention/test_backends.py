"""Every registered mechanism on every backend it lists: flex and sdpa equal explicit (forward and backward).

The spec's small example runs as it is (odd, non-window-multiple sizes); patterned mechanisms
have their own option sweeps (shift, padding, dilation, globals, caches) in their test files.
The checks are plain functions of a registered name (``check_*``), so a mechanism registered from
outside the package runs the same sweep (``tests/test_bring_your_own.py``).
"""

from __future__ import annotations

import pytest
import torch
from flex_utils import assert_compiled_flex_matches_explicit, assert_flex_matches_explicit, count_graphs

from vit_attention import create_attention, list_attention
from vit_attention.attention import get_attention_spec, set_attention_backend
from vit_attention.functional.runtime import BACKENDS

NAMES = list_attention()
FLEX_NAMES = [n for n in NAMES if "flex" in get_attention_spec(n).backends]


def _example(name: str) -> tuple[torch.nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    module, shape = get_attention_spec(name).example()
    return module.eval(), shape


def check_flex_equals_explicit(name: str) -> None:
    """The spec's example on flex equals explicit (forward and backward), or flex is refused saying why."""
    spec = get_attention_spec(name)
    module, shape = _example(name)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if "flex" not in spec.backends:
        with pytest.raises(ValueError, match=f"{name} runs on"):
            set_attention_backend(module, "flex")
        assert spec.backend_note, f"{name} refuses flex without saying why"
        return
    assert_flex_matches_explicit(module, lambda: [x])


def check_sdpa_equals_explicit(name: str) -> None:
    """The spec's example on sdpa equals explicit, or sdpa is refused naming the mechanism."""
    module, shape = _example(name)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    if "sdpa" not in get_attention_spec(name).backends:
        with pytest.raises(ValueError, match=f"{name} runs on"):
            set_attention_backend(module, "sdpa")
        return
    assert_flex_matches_explicit(module, lambda: [x], other="sdpa")


def check_listed_backends_are_known(name: str) -> None:
    """The spec's backends are known ones, "auto" and "explicit" among them."""
    spec = get_attention_spec(name)
    assert set(spec.backends) <= set(BACKENDS) and "auto" in spec.backends and "explicit" in spec.backends


def check_flex_compiles_as_one_graph(name: str) -> None:
    """The example on flex traces as one graph under torch.compile (device-independent: what torch.compile sees
    on a GPU too; a pattern's plan read back to Python, e.g. a nonzero in an index builder, would break it)."""
    module, shape = _example(name)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    set_attention_backend(module, "flex")
    assert count_graphs(module, x) == 1


def check_compiled_flex_equals_explicit_on_cpu(name: str) -> None:
    """The example through inductor's CPU FlexAttention kernel equals explicit. The cases that once failed there:
    terms the graph computes (Swin's gathered table, SwinV2's CPB, ViTDet's decomposed terms, the Longformer's
    tables) did not lower, and v sliced at an offset off the shifted-window gather was read from the gather's
    start (a wrong output); the option cases (SwinV2 shifted on a window multiple, ViTDet's global blocks, a
    dilated neighbourhood) are in the mechanisms' own flex test files."""
    module, shape = _example(name)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4))
    assert_compiled_flex_matches_explicit(module, x)


@pytest.mark.compile
@pytest.mark.parametrize("name", NAMES)
def test_flex_equals_explicit(name: str) -> None:
    check_flex_equals_explicit(name)


@pytest.mark.parametrize("name", NAMES)
def test_sdpa_equals_explicit(name: str) -> None:
    check_sdpa_equals_explicit(name)


@pytest.mark.parametrize("name", NAMES)
def test_every_listed_backend_is_known(name: str) -> None:
    check_listed_backends_are_known(name)


@pytest.mark.compile
@pytest.mark.parametrize("name", FLEX_NAMES)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_flex_compiles_as_one_graph(name: str) -> None:
    check_flex_compiles_as_one_graph(name)


@pytest.mark.slow  # inductor codegen (about 10 s each)
@pytest.mark.parametrize("name", FLEX_NAMES)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_flex_equals_explicit_on_cpu(name: str) -> None:
    check_compiled_flex_equals_explicit_on_cpu(name)


def test_create_attention_takes_a_backend_and_checks_it() -> None:
    m = create_attention("mhsa", 32, 4, backend="flex")
    assert m.attention_backend == "flex"
    assert create_attention("mhsa", 32, 4).attention_backend == "auto"
    with pytest.raises(ValueError, match=r"backend must be one of \['auto', 'sdpa', 'explicit', 'flex'\]"):
        create_attention("mhsa", 32, 4, backend="fast")
    with pytest.raises(ValueError, match="talking_heads runs on \\['auto', 'explicit'\\] only \\(it mixes the heads"):
        create_attention("talking_heads", 32, 4, backend="flex")
