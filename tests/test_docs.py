"""The README and the reference pages in ``docs/`` and ``docs/families/``: every relative link resolves (file and
heading), the README stays a short entry page with the Quick start's two commands, and its registering example
runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "families").glob("*.md"))]
QUICK_START = ("bash scripts/setup.sh && .venv/bin/vit-attention",
               "bash scripts/setup.sh && .venv/bin/python -m pytest -q -n 2 tests")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings (outside code blocks)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(line.lstrip("#")) for line in text.split("\n") if line.startswith("#")}


def _links(page: Path) -> list[str]:
    """The relative Markdown link targets of ``page`` (code blocks and web addresses left out)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    """A link names a file of the checkout; a ``#fragment`` names a heading of the page it points to."""
    broken = []
    for link in _links(page):
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link} (no such file)")
        elif fragment and target.suffix == ".md" and fragment not in _anchors(target):
            broken.append(f"{link} (no such heading in {target.name})")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_the_readme_is_an_entry_page() -> None:
    """At most ~200 lines, the Quick start's two commands verbatim, and a link to each reference page."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 210, "README.md is the entry page: reference text belongs in docs/"
    for command in QUICK_START:
        assert command in text
    linked = {Path(link.partition("#")[0]).name for link in _links(README)}
    for page in ("usage.md", "cli.md", "attention_core.md", "performance.md", "benchmarks.md", "contributing.md"):
        assert page in linked, page


def test_ci_runs_the_readme_test_command() -> None:
    """CI (``.ci/run``) runs the Quick start's second command: the same set-up, then the same pytest line."""
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    setup, _, tests = QUICK_START[1].partition(" && ")
    assert setup in ci and tests in ci.splitlines()[-1], ci


def _python_block(after_heading: str) -> str:
    """The first Python code block under the README heading ``after_heading``."""
    text = README.read_text(encoding="utf-8")
    rest = text[text.index(after_heading):]
    return re.search(r"```python\n(.*?)```", rest, flags=re.S).group(1)  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_readme_registering_example_runs() -> None:
    """The README's own mechanism, registered from user code, builds into a ViT and a CNN and runs.

    In a subprocess: registering a name here would add it to every registry sweep of this test process."""
    code = _python_block("### Your own mechanism, registered") + (
        "assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)\n"
        "assert block(torch.randn(2, 32, 8, 8)).shape == (2, 32, 8, 8)\n"
        "assert 'my_attention' in va.list_attention()\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
