"""CPU fast paths step aside where they cannot run: a CPU without bf16 kernels, and graph capture.

These tests prove the fallbacks on any machine: the dtype check is forced with
``override_cpu_kernel_support`` and, in a subprocess, with oneDNN / ATen limited to AVX2
(``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``: what an AVX2-only CPU gives).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnxruntime
import pytest
import torch

import vit_attention as va
from vit_attention.functional import fast_paths
from vit_attention.functional import linear as L
from vit_attention.functional.fast_paths import cpu_kernel_supports, override_cpu_kernel_support
from vit_attention.functional.runtime import capturing, switched

pytestmark = [pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SMALL = {
    "vit": ("vit_tiny_patch16_224", dict(img_size=32, depth=2), 32),
    "swin": ("swin_tiny_patch4_window7_224", dict(img_size=40, window_size=4, depths=(2, 2), num_heads=(3, 6)), 40),
    "swinv2": ("swinv2_tiny_window8_256", dict(img_size=40, window_size=4, depths=(2, 2), num_heads=(3, 6)), 40),
}


def _model(kind: str) -> tuple[torch.nn.Module, torch.Tensor]:
    name, kw, size = SMALL[kind]
    torch.manual_seed(0)
    model = va.create_model(name, num_classes=10, **kw).eval()
    return model, torch.randn(2, 3, size, size)


def test_fp32_is_always_supported_and_override_restores() -> None:
    assert cpu_kernel_supports(torch.float32)
    before = cpu_kernel_supports(torch.bfloat16)
    with override_cpu_kernel_support(torch.bfloat16, False):
        assert not cpu_kernel_supports(torch.bfloat16)
        with override_cpu_kernel_support(torch.bfloat16, True):
            assert cpu_kernel_supports(torch.bfloat16)
        assert not cpu_kernel_supports(torch.bfloat16)
    assert cpu_kernel_supports(torch.bfloat16) == before


def test_no_bf16_kernels_means_no_fused_bf16_linear() -> None:
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(16, 8, dtype=torch.bfloat16)
    with torch.no_grad(), override_cpu_kernel_support(torch.bfloat16, False):
        assert not L.can_fuse(x, w)
        assert L.can_fuse(x.float(), w.float()) == (fast_paths.fast_paths_enabled() and fast_paths.HAS_LINEAR_POINTWISE)
        out = L.linear(x, w, act="gelu", residual=torch.zeros(4, 16, dtype=torch.bfloat16))
    ref = torch.nn.functional.gelu(torch.nn.functional.linear(x, w))
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_bf16_inference_without_bf16_kernels_equals_plain_pytorch(kind: str) -> None:
    model, x = _model(kind)
    model = model.to(torch.bfloat16)
    x = x.to(torch.bfloat16)
    with torch.no_grad(), override_cpu_kernel_support(torch.bfloat16, False):
        fast_on = model(x)
        with switched(model, fast_paths=False):  # process-wide switch: overridden for this thread
            plain = model(x)
    assert fast_on.dtype == torch.bfloat16 and torch.isfinite(fast_on).all()
    torch.testing.assert_close(fast_on, plain, rtol=0, atol=0)


_AVX2_SCRIPT = textwrap.dedent(
    """
    import torch, vit_attention as va
    from vit_attention.functional.fast_paths import cpu_kernel_supports, use_fast_paths
    assert torch.backends.cpu.get_cpu_capability() == "AVX2", torch.backends.cpu.get_cpu_capability()
    assert not cpu_kernel_supports(torch.bfloat16)
    swin_kw = dict(img_size=32, window_size=4, depths=(2,), num_heads=(3,))
    for name, kw, s in [("vit_tiny_patch16_224", dict(img_size=32, depth=1), 32),
                        ("swin_tiny_patch4_window7_224", swin_kw, 32)]:
        torch.manual_seed(0)
        m = va.create_model(name, num_classes=5, **kw).eval().to(torch.bfloat16)
        x = torch.randn(2, 3, s, s, dtype=torch.bfloat16)
        with torch.no_grad():
            y = m(x)
            with use_fast_paths(False):
                ref = m(x)
        assert y.shape == (2, 5) and torch.equal(y, ref), name
    print("ok")
    """
)


@pytest.mark.slow
def test_bf16_inference_on_an_avx2_only_cpu() -> None:
    """oneDNN limited to AVX2 refuses bf16 inner products; the fast path must fall back, not crash."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _AVX2_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


class _Probe(torch.nn.Module):
    """Records what :func:`capturing` says while its forward runs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(capturing())
        return x * 2


@pytest.mark.compile
def test_capturing_is_false_in_eager_and_true_under_trace_and_export() -> None:
    probe = _Probe()
    probe(torch.ones(1))
    assert probe.seen == [False]
    torch.jit.trace(probe, torch.ones(1), check_trace=False)
    assert probe.seen[-1] is True
    torch.export.export(probe, (torch.ones(1),))
    assert probe.seen[-1] is True
    assert not capturing()


@pytest.mark.compile
@pytest.mark.parametrize("kind", sorted(SMALL))
def test_jit_trace_with_fast_path_on(kind: str) -> None:
    model, x = _model(kind)
    assert fast_paths.fast_paths_enabled()
    with torch.no_grad():
        traced = torch.jit.trace(model, x)  # the tracer's own check re-runs it and compares graphs
        ref = model(x)
        x2 = torch.randn_like(x)
        torch.testing.assert_close(traced(x2), model(x2), rtol=1e-5, atol=1e-5)
    graph = str(traced.inlined_graph)
    assert "mkldnn" not in graph, "a oneDNN-private op was traced"
    assert ref.shape == (2, 10)


@pytest.mark.compile
@pytest.mark.parametrize("kind", sorted(SMALL))
def test_torch_export_with_fast_path_on(kind: str) -> None:
    model, x = _model(kind)
    ep = torch.export.export(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.compile
@pytest.mark.parametrize("kind", sorted(SMALL))
def test_torchscript_onnx_export_with_fast_path_on(kind: str) -> None:
    model, x = _model(kind)
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, input_names=["x"], output_names=["logits"])
    sess = onnxruntime.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, {"x": x.numpy()})
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.compile
@pytest.mark.parametrize("kind", ["swin", "swinv2"])
def test_non_strict_export_leaves_no_fake_tensor_in_the_index_caches(kind: str) -> None:
    """The window index / mask caches are filled with real tensors even under export's fake mode, and the
    exported graph runs under no_grad too (where the fused kernel's output strides differ from the trace's)."""
    from vit_attention.functional import window as fw

    x = torch.randn(2, 3, 48, 48)  # a size no other test uses: the caches are filled inside export
    model = va.create_model(SMALL[kind][0], num_classes=10, **{**SMALL[kind][1], "img_size": 48}).eval()
    for f in vars(fw).values():
        if hasattr(f, "cache_clear"):
            f.cache_clear()
    ep = torch.export.export(model, (x,), strict=False)
    with torch.no_grad():
        eager = model(x)
        assert type(eager) is torch.Tensor
        torch.testing.assert_close(ep.module()(x), eager, rtol=1e-5, atol=1e-5)
