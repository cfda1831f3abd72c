"""The package's layers import only downwards, read from the source (imports inside functions included).

Bottom to top: ``functional`` (pure functions) < ``attention`` (mechanisms) < ``layers`` (blocks)
< ``models`` (families + registry) < ``weights`` (checkpoints: may ask the registry) < ``factory``
(``create_model``: registry + weights) < the applications: ``data`` < ``export`` < ``analysis``
< ``bench`` < ``train`` < the package facade (``vit_attention/__init__.py``) < ``commands`` < ``cli``.
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
         "data", "export", "analysis", "bench", "train", ROOT, "commands", "cli")
RANK = {part: i for i, part in enumerate(ORDER)}

# (importing module, imported module) -> why the arrow runs up. Each must still exist (a stale entry fails).
KNOWN_UPWARD: dict[tuple[str, str], str] = {
    ("vit_attention.models", "vit_attention.factory"):
        "compatibility path: `vit_attention.models.create_model`, a module __getattr__ importing the factory when "
        "first asked for (never at import time)",
    ("vit_attention.models.registry", "vit_attention.factory"):
        "compatibility path: `vit_attention.models.registry.create_model` (deprecated spelling), a module "
        "__getattr__ importing the factory when first asked for (never at import time)",
}


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
    assert ("vit_attention.models", "vit_attention.factory") in edges  # inside models/__init__.__getattr__
    assert ("vit_attention.weights.hub", "vit_attention.models.pretrained") in edges  # inside functions


@pytest.mark.parametrize("module", ["vit_attention.models", "vit_attention.models.registry"])
def test_importing_models_imports_neither_weights_nor_factory(module: str) -> None:
    code = (f"import sys\nimport {module}\n"
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['vit_attention', 'weights'], "
            "['vit_attention', 'factory'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import {module} loaded {out.stdout.strip()}"
