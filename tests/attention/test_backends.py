"""Every registered mechanism on every backend it lists: flex and sdpa equal explicit (forward and backward).

The spec's small example runs as it is (odd, non-window-multiple sizes); patterned mechanisms
have their own option sweeps (shift, padding, dilation, globals, caches) in their test files.
"""

from __future__ import annotations

import pytest
import torch
from flex_utils import assert_compiled_flex_matches_explicit, assert_flex_matches_explicit, count_graphs

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


# the patterned mechanisms through inductor's CPU FlexAttention kernel: (name, kwargs, input shape), None = the
# spec's example (odd 7 x 9 map: padding, shift). The cases that once failed there: terms the graph computes
# (Swin's gathered table, SwinV2's CPB, ViTDet's decomposed terms, the Longformer's tables) did not lower, and
# v sliced at an offset off the shifted-window gather was read from the gather's start (a wrong output)
COMPILED = {
    "window-padded-shifted": ("window", None, None),
    "cosine_window-padded-shifted": ("cosine_window", None, None),
    "cosine_window-shifted": ("cosine_window", dict(window_size=4, shift_size=2), (1, 8, 8, 32)),
    "rel_pos-windowed": ("rel_pos", None, None),
    "rel_pos-global": ("rel_pos", dict(window_size=0, input_size=(6, 7), rel_pos_zero_init=False), (1, 6, 7, 32)),
    "neighborhood-dilated": ("neighborhood", dict(kernel_size=3, dilation=2), (1, 9, 8, 32)),
    "halo": ("halo", None, None),
    "longformer2d": ("longformer2d", None, None),
}


@pytest.mark.slow  # inductor codegen (about 10 s each)
@pytest.mark.parametrize("case", sorted(COMPILED))
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_flex_equals_explicit_on_cpu(case: str) -> None:
    name, kwargs, shape = COMPILED[case]
    if kwargs is None:
        module, shape = _example(name)
    else:
        torch.manual_seed(0)
        module = create_attention(name, 32, 4, **kwargs).eval()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4))
    assert_compiled_flex_matches_explicit(module, x)
