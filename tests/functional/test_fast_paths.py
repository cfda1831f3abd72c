"""The CPU fast paths: one module holds every private torch API, one switch turns them all off, and the public
fallbacks compute what the fast paths compute.

* Every distinct reduced model (every family) gives the same outputs with the fast paths on (batch chunking
  forced down to one image, caches warm) and off; off, no private operator is called at all.
* A torch without a private operator (its capability flag False, the operator replaced by one that raises)
  runs the public op and gets the same numbers.

Tolerance: the saved-outputs rule of ``tests/models/test_outputs_unchanged.py`` (1e-5 x max|ref|): the fused
oneDNN kernels and the per-chunk GEMMs round differently from the eager ops, a wrong path moves far more.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from model_outputs import build, distinct_reduced_presets, first_preset_per_family, small_overrides

from vit_attention.attention.base import uncacheable
from vit_attention.functional import chunking, fast_paths, runtime
from vit_attention.functional.conv_act import conv2d_act
from vit_attention.functional.linear import linear

PACKAGE = Path(__file__).resolve().parents[2] / "vit_attention"
_PRIVATE = ("_LINEAR_POINTWISE", "_LINEAR_ADD", "_CONV_POINTWISE", "_GET_TRACING_STATE", "_SET_TRACING_STATE")
_FLAGS = ("HAS_LINEAR_POINTWISE", "HAS_LINEAR_ADD", "HAS_CONV_POINTWISE", "HAS_UNTRACED", "HAS_FAST_META")


def _forbid_private_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace every private torch API the module holds by a function that raises if called."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a private torch API was called")

    for name in _PRIVATE:
        monkeypatch.setattr(fast_paths, name, refuse)


def _outputs(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {"logits": model(x), "features": model.forward_features(x)}


def _assert_same(out: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], name: str) -> None:
    for key, value in ref.items():
        assert out[key].shape == value.shape, (name, key)
        err = (out[key] - value).abs().max().item() / value.abs().max().item()
        assert err <= 1e-5, f"{name} {key}: {err:.2e} relative to max |ref|"


def test_no_other_module_touches_private_torch_apis() -> None:
    private = re.compile(r"torch\.ops\.mkldnn|torch\._C\b")
    offenders = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                       if p.name != "fast_paths.py" and private.search(p.read_text(encoding="utf-8")))
    assert offenders == []


@pytest.mark.registry
@pytest.mark.parametrize("name", distinct_reduced_presets())
def test_model_with_fast_paths_off_equals_on(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = build(name, small_overrides(name))
    with runtime.CHUNK_ELEMENTS.override(1):  # chunking wherever a stage allows it: one image per chunk
        fast = _outputs(model, x)
        warm = _outputs(model, x)  # the parameter caches hit now
    _forbid_private_ops(monkeypatch)
    with runtime.switched(model, fast_paths=False):
        plain = _outputs(model, x)
    _assert_same(fast, plain, name)
    _assert_same(warm, plain, name)


def test_the_switch_turns_every_shortcut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    p = torch.nn.Parameter(torch.randn(3))
    x = torch.randn(4, 8, 8, 16)
    with torch.no_grad():
        assert not uncacheable([p]) and chunking.batch_chunk_size(x, [], max_elements=8 * 8 * 16) == 1
        with fast_paths.use_fast_paths(False):
            assert uncacheable([p])  # the parameter-derived caches
            assert chunking.batch_chunk_size(x, [], max_elements=8 * 8 * 16) == 4  # batch chunking
            assert not fast_paths.untraced_available()  # the tracer is not suspended
            assert isinstance(fast_paths.fast_meta(), contextlib.nullcontext)  # torch's own meta kernels
        assert not isinstance(fast_paths.fast_meta(), contextlib.nullcontext)
    _forbid_private_ops(monkeypatch)
    name = first_preset_per_family()["pvt_v2"]  # fused linear, residual add and conv + activation
    model, x = build(name, small_overrides(name))
    with fast_paths.use_fast_paths(False):
        _outputs(model, x)  # no private op is reached


@pytest.mark.slow
def test_the_environment_variable_sets_the_default() -> None:
    code = "from vit_attention.functional import runtime; print(runtime.FAST_PATHS.default)"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, VIT_ATTENTION_FAST_PATHS="0"),
                         capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_a_missing_operator_is_found_missing() -> None:
    assert fast_paths._op("mkldnn", "_no_such_operator") is None
    assert fast_paths._op("aten", "addmm", "no_such_overload") is None
    assert fast_paths._op("aten", "addmm", "default") is torch.ops.aten.addmm.default


def _torch_without_private_apis(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if this torch build lacked every private API: the flags False, the operators raising if reached."""
    _forbid_private_ops(monkeypatch)
    for flag in _FLAGS:
        monkeypatch.setattr(fast_paths, flag, False)


@pytest.mark.parametrize("act", [None, *fast_paths.ACTIVATIONS])
def test_wrappers_without_the_operator_run_the_public_ops(act: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    x, w, b, r = (torch.randn(2, 5, 16, generator=g), torch.randn(24, 16, generator=g), torch.randn(24, generator=g),
                  torch.randn(2, 5, 24, generator=g))
    img, cw = torch.randn(2, 8, 6, 6, generator=g), torch.randn(8, 1, 3, 3, generator=g)
    with torch.no_grad():
        fused = (fast_paths.linear_pointwise(x, w, b, act), fast_paths.linear_add(x, r, w, b),
                 fast_paths.conv2d_pointwise(img.contiguous(memory_format=torch.channels_last), cw, b[:8], stride=1,
                                             padding=1, groups=8, act=act))
        _torch_without_private_apis(monkeypatch)
        public = (fast_paths.linear_pointwise(x, w, b, act), fast_paths.linear_add(x, r, w, b),
                  fast_paths.conv2d_pointwise(img, cw, b[:8], stride=1, padding=1, groups=8, act=act))
    eager = (fast_paths.activation(F.linear(x, w, b), act), r + F.linear(x, w, b),
             fast_paths.activation(F.conv2d(img, cw, b[:8], padding=1, groups=8), act))
    for got, ref in zip(public, eager):
        assert torch.equal(got, ref)  # the very same public ops
    for got, ref in zip(fused, eager):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_callers_without_the_operators_take_the_public_path(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, b = torch.randn(3, 7, 16), torch.randn(32, 16), torch.randn(32)
    img = torch.randn(2, 6, 6, 8).permute(0, 3, 1, 2)  # channels-last, the fused conv's layout
    cw = torch.randn(8, 1, 3, 3)
    with torch.no_grad():
        fast = linear(x, w, b, act="gelu"), linear(x, w, b, residual=x.new_ones(3, 7, 32)), conv2d_act(
            img, cw, b[:8], padding=1, groups=8, act="gelu")
        _torch_without_private_apis(monkeypatch)
        public = linear(x, w, b, act="gelu"), linear(x, w, b, residual=x.new_ones(3, 7, 32)), conv2d_act(
            img, cw, b[:8], padding=1, groups=8, act="gelu")
    for got, ref in zip(public, fast):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["vit", "pvt_v2", "swin", "swinv2"])
def test_models_on_a_torch_without_the_private_apis_agree(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name = first_preset_per_family()[family]
    model, x = build(name, small_overrides(name))
    fast = _outputs(model, x)
    _torch_without_private_apis(monkeypatch)
    _assert_same(_outputs(model, x), fast, name)


@pytest.mark.compile
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("untraced", [True, False])
def test_jit_trace_with_and_without_suspending_the_tracer(untraced: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Swin's cached window indices: built outside the trace (a constant) or, without the tracer API, recorded in
    the graph and not cached; either way the tracer's own check (two runs, graphs compared) passes."""
    from vit_attention.functional import window

    name = first_preset_per_family()["swin"]
    model, x = build(name, small_overrides(name))
    if not untraced:
        monkeypatch.setattr(fast_paths, "HAS_UNTRACED", False)
    caches = [fn for fn in vars(window).values() if hasattr(fn, "cache_clear")]
    for fn in caches:
        fn.cache_clear()
    with torch.no_grad():
        torch.jit.trace(model, x, check_trace=False)  # the check's eager run would fill the caches
        assert (sum(fn.cache_info().currsize for fn in caches) > 0) == untraced
        for fn in caches:
            fn.cache_clear()
        traced = torch.jit.trace(model, x)
        x2 = torch.randn_like(x)
        torch.testing.assert_close(traced(x2), model(x2), rtol=1e-5, atol=1e-5)
