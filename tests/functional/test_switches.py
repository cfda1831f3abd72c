"""The runtime switches: one mechanism (functional.runtime.Switch), the public names are aliases."""

from __future__ import annotations

import pytest

from vit_attention.functional import attention, chunking, linear, runtime


@pytest.mark.parametrize("switch, getter, setter, context, good", [
    (runtime.FUSED_ATTENTION, attention.fused_attention_enabled, attention.set_fused_attention,
     attention.fused_attention, False),
    (runtime.FAST_LINEAR, linear.fast_linear_enabled, linear.set_fast_linear, linear.fast_linear, False),
    (runtime.CHUNK_ELEMENTS, chunking.chunk_elements, chunking.set_chunk_elements, None, 123),
])
def test_public_names_are_views_of_one_switch(switch, getter, setter, context, good) -> None:
    before = switch.value
    assert getter() == before
    with switch.override(good):
        assert getter() == good == switch.value
        if context is not None:
            with context(not good):
                assert getter() == (not good)
            assert getter() == good
    assert getter() == before
    setter(good)
    try:
        assert switch.value == good
    finally:
        switch.set(before)
    assert set(runtime.switches()) == {"fused_attention", "fast_linear", "chunk_elements"}


def test_override_restores_after_an_error_and_bad_values_name_the_switch() -> None:
    before = runtime.CHUNK_ELEMENTS.value
    with pytest.raises(RuntimeError), runtime.CHUNK_ELEMENTS.override(7):
        raise RuntimeError
    assert runtime.CHUNK_ELEMENTS.value == before
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="chunk elements"):
            chunking.set_chunk_elements(bad)


def test_environment_defaults(monkeypatch) -> None:
    monkeypatch.setenv("VIT_X_FLAG", "0")
    assert runtime.Switch("x", "VIT_X_FLAG", "1", runtime._parse_flag, bool).value is False
    monkeypatch.delenv("VIT_X_FLAG")
    assert runtime.Switch("x", "VIT_X_FLAG", "1", runtime._parse_flag, bool).value is True
