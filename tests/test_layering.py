"""The package's layers import only downwards, read from the source (imports inside functions included).

Bottom to top: ``functional`` (pure functions) < ``attention`` (mechanisms) < ``layers`` (blocks)
< ``models`` (families + registry) < ``weights`` (checkpoints: may ask the registry) < ``factory``
(``create_model``: registry + weights) < the applications: ``data`` < ``export`` < ``analysis``
< ``bench`` < ``train`` < the package facade (``vit_attention/__init__.py``) < ``registry_commands`` < ``cli``.
A module may import its own part and any part below it; an import of a part above it is listed in
``KNOWN_UPWARD`` with the reason, or this test fails naming the file and line.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vit_attention"
ROOT = "<root>"  # vit_attention/__init__.py and names imported from the package itself (`from . import __version__`)

ORDER = ("functional", "attention", "layers", "models", "weights", "factory",
         "data", "export", "analysis", "bench", "train", ROOT, "registry_commands", "cli")
RANK = {part: i for i, part in enumerate(ORDER)}

# (importing module, imported module) -> why the arrow runs up. Each must still exist (a stale entry fails).
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

# Import circles between modules (any import, inside functions too; ``if TYPE_CHECKING:`` blocks aside), each a
# sorted tuple of the modules in one circle -> why it stands. Each must still exist (a stale entry fails).
KNOWN_CIRCLES: dict[tuple[str, ...], str] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str:
    """The layer a module of the package belongs to: its subpackage, or its own name for a top-level module."""
    rest = module.split(".")[1:]
    if not rest:
        return ROOT
    head = rest[0]
    return head if (PACKAGE / head).is_dir() or (PACKAGE / f"{head}.py").is_file() else ROOT


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every module of the package ``path`` imports, anywhere in the file (functions too), with its line.

    ``from . import x`` counts as an import of the submodule ``x`` (or of the package itself when
    ``x`` is a name, not a module); ``importlib.import_module("vit_attention.x")`` with a literal
    name counts too.
    """
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "vit_attention" and not target.startswith("vit_attention."):
                continue
            if node.module is None:  # from . import a, b: submodules (or names of the package)
                out += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
            else:
                out.append((target, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names
                    if alias.name == "vit_attention" or alias.name.startswith("vit_attention.")]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and node.args[0].value.startswith("vit_attention")):
            out.append((node.args[0].value, node.lineno))
    return out


def _edges() -> list[tuple[str, str, str, int]]:
    """(importing module, imported module, file, line) for every import between two parts of the package."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _module_name(path)
        for target, line in _imports(path):
            if _part(source) != _part(target):
                edges.append((source, target, str(path.relative_to(PACKAGE.parent)), line))
    return edges


def test_every_part_of_the_package_has_a_place_in_the_order() -> None:
    parts = {_part(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert parts <= set(ORDER), f"parts without a layer (add them to ORDER): {sorted(parts - set(ORDER))}"


def test_imports_run_downwards() -> None:
    upward = [(s, t, f"{where}:{line}") for s, t, where, line in _edges()
              if RANK[_part(t)] > RANK[_part(s)] and (s, t) not in KNOWN_UPWARD]
    assert not upward, "imports of a higher layer (" + " < ".join(ORDER) + "):\n" + "\n".join(
        f"  {where}: {s} imports {t}" for s, t, where in upward)


def test_known_upward_arrows_still_exist() -> None:
    present = {(s, t) for s, t, _, _ in _edges()}
    stale = sorted(set(KNOWN_UPWARD) - present)
    assert not stale, f"KNOWN_UPWARD entries no longer in the code (remove them): {stale}"


def test_the_scanner_sees_imports_inside_functions() -> None:
    edges = {(s, t) for s, t, _, _ in _edges()}
    assert ("vit_attention.weights.hub", "vit_attention.models.pretrained_table") in edges  # inside functions


@pytest.mark.slow
@pytest.mark.parametrize("module", ["vit_attention.models", "vit_attention.models.registry"])
def test_importing_models_imports_neither_weights_nor_factory(module: str) -> None:
    code = (f"import sys\nimport {module}\n"
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['vit_attention', 'weights'], "
            "['vit_attention', 'factory'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import {module} loaded {out.stdout.strip()}"


def _runtime_imports(path: Path) -> list[str]:
    """The package modules ``path`` imports, inside functions too, leaving out ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {line for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for child in node.body for sub in ast.walk(child) if hasattr(sub, "lineno")
                   for line in range(sub.lineno, (sub.end_lineno or sub.lineno) + 1)}
    return [target for target, line in _imports(path) if line not in typing_only]


def _circles() -> set[tuple[str, ...]]:
    """Every set of two or more modules that import one another round a circle (Tarjan's strongly connected
    components over module -> imported module; ``from pkg import sub`` counts as importing ``pkg.sub``)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for target in _runtime_imports(path):
            while target not in modules and "." in target:  # a name imported from a module: that module
                target = target.rpartition(".")[0]
            if target != name and target in modules:
                graph[name].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.add(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    """No two modules import each other, directly or round a longer circle (lazy imports included)."""
    circles = _circles()
    new = sorted(c for c in circles if c not in KNOWN_CIRCLES)
    assert not new, "import circles:\n" + "\n".join("  " + " -> ".join(c) for c in new)
    stale = sorted(set(KNOWN_CIRCLES) - circles)
    assert not stale, f"KNOWN_CIRCLES entries no longer in the code (remove them): {stale}"


def test_the_circle_finder_sees_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-module circle through a function-level import is found; one through ``TYPE_CHECKING`` is not."""
    package = tmp_path / "vit_attention"
    (package / "functional").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "functional" / "__init__.py").write_text("")
    (package / "functional" / "a.py").write_text("from .b import f\n")
    (package / "functional" / "b.py").write_text("def f():\n    from .a import g\n")
    (package / "functional" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import g\n")
    (package / "functional" / "d.py").write_text("from .c import x\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert _circles() == {("vit_attention.functional.a", "vit_attention.functional.b")}
