"""``import vit_attention`` leaves the heavy optional modules unloaded, and ``torch.compile`` of the window
models traces the size caches (functional/window.py ``_cached``) without dynamo's ``lru_cache`` warnings."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

import pytest
import torch

import vit_attention as va
from vit_attention.functional.window import _cached, assume_constant_result

HEAVY = ("torch._dynamo", "sympy", "matplotlib", "transformers", "onnx", "onnxruntime", "onnxscript", "kornia",
         "scipy", "pandas", "PIL", "huggingface_hub", "safetensors", "sklearn")


@pytest.mark.slow
def test_import_leaves_heavy_optional_modules_unloaded() -> None:
    code = f"import sys\nimport vit_attention\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import vit_attention loaded {out.stdout.strip()}"


def test_assume_constant_result_marks_as_torch_does() -> None:
    def ours() -> int:
        return 1

    def theirs() -> int:
        return 1

    assume_constant_result(ours)
    torch.compiler.assume_constant_result(theirs)
    marks = {k: v for k, v in vars(theirs).items() if k.startswith("_dynamo")}
    assert marks  # torch still marks by an attribute
    assert {k: v for k, v in vars(ours).items() if k.startswith("_dynamo")} == marks


def test_cache_is_least_recently_used_with_counters() -> None:
    built: list[int] = []

    @_cached(maxsize=2)
    def square(n: int) -> torch.Tensor:
        built.append(n)
        return torch.tensor(n * n)

    assert square(2) is square(2)
    square(3)
    square(2)  # 2 is now the most recent: 3 goes first
    square(4)
    square(2)
    square(3)
    assert built == [2, 3, 4, 3]
    info = square.cache_info()  # type: ignore[attr-defined]
    assert (info.hits, info.misses, info.maxsize, info.currsize) == (3, 4, 2, 2)
    square.cache_clear()  # type: ignore[attr-defined]
    assert square.cache_info().currsize == 0  # type: ignore[attr-defined]


@pytest.mark.registry
@pytest.mark.parametrize("name", ["swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256"])
def test_compile_of_swin_emits_no_warning(name: str, caplog: pytest.LogCaptureFixture) -> None:
    model = va.create_model(name, num_classes=10, img_size=40, window_size=4, depths=(2, 2), num_heads=(3, 6)).eval()
    x = torch.randn(1, 3, 40, 40)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="torch"):
        warnings.simplefilter("always")
        with torch.no_grad():
            out = compiled(x)
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
