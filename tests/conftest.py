"""Shared test settings (deterministic, small) and the test tiers.

Tiers are markers, applied here at collection so no test file has to remember them:

* ``registry``: a test parametrized over registered model names (a registry sweep). Every such
  item is marked; the one of its family's *representative* preset (the first registered name of
  the family in sorted order, the preset ``tests/analysis/test_every_family.py`` also uses) is
  marked ``representative`` as well.
* ``parity``: a test that compares with a reference implementation (committed fixtures from timm,
  torchvision or the original repositories, or ``transformers`` live): files under
  ``tests/weights/`` and tests whose name says ``parity`` / ``reference`` / ``fixture``.
* ``slow``: marked by hand (the digits run, the docs regeneration, the export round trips ...).

``pytest --fast`` is the contributors' tier: it leaves out ``slow`` tests and every registry sweep
item but the family representative's, so each mechanism and each family still runs once (parity
included); ``pytest --fast -n 2`` runs it on both cores (pytest-xdist, a dev dependency). The README's
test command (plain ``pytest``) runs everything, as CI does.
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
def _model_families() -> tuple[dict[str, str], frozenset[str]]:
    """``{registered name or alias: family}`` and the set of representative names (first per family)."""
    from model_outputs import first_preset_per_family

    from vit_attention.models import get_model_entry, list_models
    from vit_attention.models.registry import _ALIASES

    family = {name: get_model_entry(name).family for name in list_models()}
    for alias, target in _ALIASES.items():
        family.setdefault(alias, family.get(target, ""))
    return family, frozenset(first_preset_per_family().values())


_PARITY_WORDS = ("parity", "reference", "fixture")


def _swept_model(item: pytest.Item) -> str | None:
    """The registered model name an item is parametrized with, or ``None``."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    family, _ = _model_families()
    for value in callspec.params.values():
        if isinstance(value, str) and value in family:
            return value
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``registry`` / ``representative`` / ``parity`` items; with ``--fast`` deselect the heavy tier."""
    family, representatives = _model_families()
    fast = config.getoption("--fast")
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        name = _swept_model(item)
        if name is not None:
            item.add_marker(pytest.mark.registry)
            if name in representatives:
                item.add_marker(pytest.mark.representative)
        path = str(getattr(item, "path", ""))
        if "/tests/weights/" in path or any(w in item.name.lower() for w in _PARITY_WORDS):
            item.add_marker(pytest.mark.parity)
        heavy = item.get_closest_marker("slow") is not None or (name is not None and name not in representatives)
        (dropped if fast and heavy else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
