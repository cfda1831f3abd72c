"""Shared test settings (deterministic, small) and the test tiers.

Tiers are markers, set where each test is written (``pytestmark = ...`` at the top of a file or a
decorator on the test); nothing here guesses them from names or paths:

* ``registry``: a test parametrized over registered model names (a registry sweep), its model name in
  the parameter ``name``. The item of each family's *representative* preset (the first registered
  name of the family in sorted order, the preset ``tests/analysis/test_every_family.py`` also uses)
  is marked ``representative`` here as well.
* ``parity``: a test that compares with a reference implementation (committed fixtures from timm,
  torchvision or the original repositories, or ``transformers`` live).
* ``slow``: subprocess training, torchrun, the digits run, inductor code generation, ...

``pytest --fast`` is the contributors' tier: it leaves out ``slow`` tests and every registry sweep
item but the family representative's, so each mechanism and each family still runs once (parity
included). ``-n 2`` runs either tier on both cores (pytest-xdist, a dev dependency).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch


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
        heavy = item.get_closest_marker("slow") is not None
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
