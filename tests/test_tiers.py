"""The test tiers of ``tests/conftest.py``: markers come from where a test is written, never from its name."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from model_outputs import first_preset_per_family

pytestmark = pytest.mark.slow  # pytest in subprocesses (a few seconds each)

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
import pytest

def test_reference_fixture_parity_in_its_name_only():
    pass

@pytest.mark.parity
def test_marked_parity():
    pass

@pytest.mark.registry
@pytest.mark.parametrize("name", [{rep!r}, {other!r}])
def test_sweep(name):
    pass

@pytest.mark.parametrize("name", [{rep!r}, {other!r}])
def test_not_a_sweep(name):
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.compile
def test_compiled():
    pass
'''


def _collect(folder: Path, *args: str) -> tuple[int, list[str]]:
    """Collect ``folder`` with the suite's conftest: the return code and the test ids listed."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--rootdir", str(folder), *args, str(folder)],
                          capture_output=True, text=True, timeout=300, cwd=folder,
                          env={"PYTHONPATH": str(TESTS), "PATH": ""})
    return done.returncode, [line.split("::", 1)[1] for line in done.stdout.splitlines() if "::" in line]


def test_markers_are_the_written_ones_and_fast_keeps_the_representative(tmp_path: Path) -> None:
    """A name that says "parity" / "reference" / "fixture" marks nothing; an unmarked test parametrized over model
    names is no sweep; ``--fast`` keeps a marked sweep's representative preset only and drops ``slow`` and
    ``compile``."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    rep = first_preset_per_family()["vit"]
    other = next(n for n in ("vit_base_patch16_224", "deit_tiny_patch16_224") if n != rep)
    (tmp_path / "test_sample.py").write_text(SAMPLE.format(rep=rep, other=other))
    rc, marked = _collect(tmp_path, "-m", "parity or registry")
    assert rc == 0 and marked == ["test_marked_parity", f"test_sweep[{rep}]", f"test_sweep[{other}]"]
    rc, fast = _collect(tmp_path, "--fast")
    assert rc == 0 and fast == ["test_reference_fixture_parity_in_its_name_only", "test_marked_parity",
                                f"test_sweep[{rep}]", f"test_not_a_sweep[{rep}]", f"test_not_a_sweep[{other}]"]


def test_a_sweep_without_a_name_parameter_is_refused(tmp_path: Path) -> None:
    """``registry`` names the parameter that carries the model: a sweep over another parameter is a usage error."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n@pytest.mark.registry\n@pytest.mark.parametrize('model', ['a'])\ndef test_x(model):\n"
        "    pass\n")
    rc, _ = _collect(tmp_path)
    assert rc != 0


GUARDED = '''
import subprocess
import sys

import pytest
import torch

def test_starts_a_process_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_traces_unmarked():
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))

def test_scripts_unmarked():
    torch.jit.trace(torch.nn.Linear(2, 2), torch.ones(1, 2))

def test_plain():
    assert torch.ones(2).sum() == 2
'''


def test_fast_fails_a_test_whose_work_needs_a_marker_it_lacks(tmp_path: Path) -> None:
    """Under ``--fast`` a test that starts a process without ``slow`` or traces through dynamo without ``compile``
    fails, naming the marker; the whole suite (no ``--fast``) runs them as they are."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_guarded.py").write_text(GUARDED)

    def run(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                               "--rootdir", str(tmp_path), *args, str(tmp_path)], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path, env={"PYTHONPATH": str(TESTS), "PATH": ""}).stdout

    fast = run("--fast")
    assert "4 passed" in fast and "3 errors" in fast, fast[-3000:]  # a teardown error after each call that did it
    assert "test_starts_a_process_unmarked started a process: mark it `@pytest.mark.slow`" in fast
    assert "test_traces_unmarked traced through TorchDynamo" in fast and "`@pytest.mark.compile`" in fast
    assert "test_scripts_unmarked traced through TorchDynamo (torch.compile, torch.export, FlexAttention) or " \
        "TorchScript" in fast
    whole = run()
    assert "4 passed" in whole and "error" not in whole, whole[-3000:]
