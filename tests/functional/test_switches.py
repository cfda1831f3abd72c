"""The runtime switches: one mechanism (functional.runtime.Switch), the public names are aliases."""

from __future__ import annotations

import threading

import pytest
import torch

from vit_attention import create_attention, create_model
from vit_attention.functional import attention, chunking, fast_paths, runtime
from vit_attention.functional.runtime import switched


@pytest.mark.parametrize("switch, getter, setter, context, good", [
    (runtime.FUSED_ATTENTION, attention.fused_attention_enabled, attention.set_fused_attention,
     runtime.FUSED_ATTENTION.override, False),
    (runtime.FAST_PATHS, fast_paths.fast_paths_enabled, fast_paths.set_fast_paths, fast_paths.use_fast_paths,
     False),
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
    assert set(runtime.switches()) == {"fused_attention", "attention_backend", "fast_paths", "chunk_elements"}


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


# ----------------------------------------------------------------------------- captured when built
def _count_fused(monkeypatch) -> list[int]:
    """Count the calls of the fused kernel (the explicit path never reaches it)."""
    calls: list[int] = []
    real = attention._fused
    monkeypatch.setattr(attention, "_fused", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_a_module_captures_the_default_when_built(monkeypatch) -> None:
    calls = _count_fused(monkeypatch)
    x = torch.randn(2, 5, 16)
    default = runtime.FUSED_ATTENTION.default
    try:
        attention.set_fused_attention(True)
        before = create_attention("mhsa", 16, 2).eval()
        attention.set_fused_attention(False)
        after = create_attention("mhsa", 16, 2).eval()
    finally:
        attention.set_fused_attention(default)
    assert before.fused_attention is True and after.fused_attention is False
    with torch.no_grad():
        after(x)
        assert calls == []  # built while the default was off: explicit path
        before(x)
        assert len(calls) == 1  # built before: keeps the fused kernel


def test_switched_flips_every_captured_module_of_a_model_and_restores(monkeypatch) -> None:
    calls = _count_fused(monkeypatch)
    model = create_model("swin_tiny_patch4_window7_224", img_size=32, window_size=4, depths=(1, 1),
                         num_heads=(2, 4), embed_dim=16).eval()
    other = create_attention("mhsa", 16, 2).eval()
    runtime.set_switches(model, fused_attention=True)
    other.fused_attention = True
    captors = [m for m in model.modules() if "fused_attention" in vars(m)]
    assert len(captors) == 2  # one mechanism per block
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        with switched(model, fused_attention=False) as same:
            assert same is model and all(m.fused_attention is False for m in captors)
            model(x)
            assert calls == []
            other(torch.randn(1, 4, 16))  # another module: not affected
            assert len(calls) == 1
        assert all(m.fused_attention is True for m in captors)
        with pytest.raises(RuntimeError), switched(model, fused_attention=False):
            raise RuntimeError
        assert all(m.fused_attention is True for m in captors)  # restored after an error too
        model(x)
    assert len(calls) == 1 + len(captors)


def test_set_switches_is_permanent_and_process_wide_switches_are_refused() -> None:
    attn = create_attention("window", 16, 2, window_size=4)
    assert runtime.set_switches(attn, fused_attention=False) is attn and attn.fused_attention is False
    with pytest.raises(TypeError, match="process-wide"):
        runtime.set_switches(attn, fast_paths=False)
    with pytest.raises(TypeError, match="unknown switch"):
        runtime.set_switches(attn, fused=False)
    with pytest.raises(TypeError, match="unknown switch"), switched(attn, fused=False):
        pass


def test_switched_overrides_a_process_wide_switch_for_this_thread() -> None:
    attn = create_attention("window", 16, 2, window_size=4)
    before = chunking.chunk_elements()
    with switched(attn, chunk_elements=7, fast_paths=False):
        assert chunking.chunk_elements() == 7 and not fast_paths.fast_paths_enabled()
        assert runtime.CHUNK_ELEMENTS.default == before  # the process default is untouched
    assert chunking.chunk_elements() == before and fast_paths.fast_paths_enabled() == runtime.FAST_PATHS.default


def test_an_override_reaches_built_modules_in_this_thread_only(monkeypatch) -> None:
    """``FUSED_ATTENTION.override(False)`` holds for the thread that opens it; another thread does not see it."""
    calls = _count_fused(monkeypatch)
    attn = runtime.set_switches(create_attention("mhsa", 16, 2).eval(), fused_attention=True)
    x = torch.randn(2, 5, 16)
    seen: dict[str, bool] = {}

    def other_thread() -> None:
        seen["enabled"] = attention.fused_attention_enabled()

    with torch.no_grad(), runtime.FUSED_ATTENTION.override(False):
        attn(x)
        assert calls == [] and not attention.fused_attention_enabled()
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen["enabled"] is runtime.FUSED_ATTENTION.default
    with torch.no_grad():
        attn(x)
    assert len(calls) == 1


@pytest.mark.compile
def test_compiled_model_follows_switched() -> None:
    """The captured flag is a plain attribute dynamo guards on: flipping it recompiles to the explicit path."""
    import torch._dynamo

    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        graphs.append(gm)
        return gm.forward

    def fused_ops(gm: torch.fx.GraphModule) -> int:
        return sum(n.target is torch.nn.functional.scaled_dot_product_attention for n in gm.graph.nodes)

    model = create_model("vit_tiny_patch16_224", img_size=32, depth=1).eval()
    runtime.set_switches(model, fused_attention=True)
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    try:
        with torch.no_grad():
            compiled(x)
            with switched(model, fused_attention=False):
                compiled(x)
    finally:
        torch._dynamo.reset()
    assert [fused_ops(g) for g in graphs] == [1, 0]
