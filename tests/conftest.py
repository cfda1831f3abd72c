"""Shared test settings (deterministic, small) and the test tiers.

Tiers are markers, set where each test is written (``pytestmark = ...`` at the top of a file or a
decorator on the test); nothing here guesses them from names or paths:

* ``registry``: a test parametrized over registered model names (a registry sweep), its model name in
  the parameter ``name``. The item of each family's *representative* preset (the first registered
  name of the family in sorted order, the preset ``tests/analysis/test_every_family.py`` also uses)
  is marked ``representative`` here as well.
* ``parity``: a test that compares with a reference implementation (committed fixtures from timm,
  torchvision or the original repositories, or ``transformers`` live).
* ``slow``: a test that starts another process (the CLI, training, torchrun, signals, fresh imports),
  the digits run, inductor code generation, ...
* ``compile``: a test that traces through TorchDynamo (``torch.compile``, ``torch.export``, ONNX export,
  FlexAttention, which runs through dynamo even eagerly on the CPU) or TorchScript (jit trace / script, the ONNX
  exporter): seconds per case.

``pytest --fast`` is the contributors' tier: it leaves out ``slow`` and ``compile`` tests and every
registry sweep item but the family representative's, so each mechanism and each family still runs
once on the eager backends (parity included). Under ``--fast`` a test that starts a process or traces
through dynamo without its marker fails, naming the marker it needs: the markers stay true as tests are
written. ``-n 2`` runs either tier on both cores (pytest-xdist, a dev dependency).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.jit
import torch.onnx

_LEFT_OUT_BY_FAST = ("slow", "compile")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n 2``) each worker gets its share of the cores: two workers with torch's default
    thread count each would oversubscribe a 2-core machine and run slower than one process."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--fast``: the contributors' tier (see the module docstring)."""
    parser.addoption("--fast", action="store_true", default=False,
                     help="contributors' tier: skip slow tests and registry sweeps beyond one preset per family")


@functools.cache
def _representatives() -> frozenset[str]:
    """The representative preset of every family (its first registered name)."""
    from model_outputs import first_preset_per_family

    return frozenset(first_preset_per_family().values())


def _swept_model(item: pytest.Item) -> str:
    """The registered model name a ``registry`` item runs (its ``name`` parameter)."""
    callspec = getattr(item, "callspec", None)
    name = callspec.params.get("name") if callspec is not None else None
    if not isinstance(name, str):
        raise pytest.UsageError(f"{item.nodeid}: a test marked 'registry' takes the registered model name as its "
                                "parameter 'name'")
    return name


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the ``representative`` items of the registry sweeps; with ``--fast`` deselect the heavy tier."""
    fast = config.getoption("--fast")
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        heavy = any(item.get_closest_marker(m) is not None for m in _LEFT_OUT_BY_FAST)
        if item.get_closest_marker("registry") is not None:
            if _swept_model(item) in _representatives():
                item.add_marker(pytest.mark.representative)
            else:
                heavy = True
        (dropped if fast and heavy else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


_STARTED = [0, 0]  # processes, and torchrun launches among them, started by this test process
_popen_init = subprocess.Popen.__init__


def _counting_popen_init(self: subprocess.Popen, *args: object, **kwargs: object) -> None:
    _STARTED[0] += 1
    command = args[0] if args else kwargs.get("args")
    if isinstance(command, (list, tuple)) and "torch.distributed.run" in map(str, command):
        _STARTED[1] += 1
    _popen_init(self, *args, **kwargs)


subprocess.Popen.__init__ = _counting_popen_init  # type: ignore[method-assign]


_TORCHSCRIPT = [0]  # TorchScript traces (jit trace, the TorchScript ONNX exporter) in this process; not jit.script,
# which libraries also apply as a decorator when a module is first imported


def _counting(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        _TORCHSCRIPT[0] += 1
        return fn(*args, **kwargs)

    return counted


torch.jit.trace, torch.jit.trace_module = _counting(torch.jit.trace), _counting(torch.jit.trace_module)
torch.onnx.export = _counting(torch.onnx.export)  # type: ignore[assignment]


def _traced() -> int:
    """Frames TorchDynamo has converted (0 while it was never imported: importing it costs) plus the TorchScript
    captures of this process."""
    if "torch._dynamo" not in sys.modules:
        return _TORCHSCRIPT[0]
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values()) + sum(counters["stats"].values()) + _TORCHSCRIPT[0]


@pytest.fixture(autouse=True)
def _torchrun_tests_take_turns(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that launches ``torchrun`` is in the xdist group ``torchrun``: under ``-n 2`` (``--dist loadgroup``)
    one worker runs them one after another, so two launchers never pick their rendezvous ports at once."""
    launched = _STARTED[1]
    yield
    group = request.node.get_closest_marker("xdist_group")
    if _STARTED[1] != launched and (group is None or group.args[:1] != ("torchrun",)):
        pytest.fail(f'{request.node.nodeid} launched torchrun: mark it `@pytest.mark.xdist_group("torchrun")`')


@pytest.fixture(autouse=True)
def _fast_tier_markers_are_true(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under ``--fast`` (where no ``slow`` or ``compile`` test runs, so nothing was traced or started before):
    a test that starts a process must be marked ``slow``, one that traces (dynamo, TorchScript) ``compile``."""
    if not request.config.getoption("--fast"):
        yield
        return
    started, traced = _STARTED[0], _traced()
    yield
    if _STARTED[0] != started:
        pytest.fail(f"{request.node.nodeid} started a process: mark it `@pytest.mark.slow` (left out by --fast)")
    if _traced() != traced:
        pytest.fail(f"{request.node.nodeid} traced through TorchDynamo (torch.compile, torch.export, FlexAttention) "
                    "or TorchScript (jit trace, ONNX export): mark it `@pytest.mark.compile` (left out by "
                    "--fast)")
