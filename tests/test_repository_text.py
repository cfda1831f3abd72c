"""The product speaks of itself only: no tracker issue numbers, no documents outside the repository.

Code, tests, scripts, the README and docs/ cite a paper, a reference repository's file and version or a
document of this repository, never a file that does not ship with it (a capitalised ``NAME.md`` the
repository does not hold, or an absolute path on a developer's machine), and name no tracker issue; file
names carry no issue number either.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("vit_attention", "tests", "scripts", "docs")
SUFFIXES = {".py", ".md", ".sh", ".toml", ".cfg", ".txt", ".yml", ".yaml"}
# a capitalised Markdown document (README.md-style) and an absolute path on a machine: the first is fine when the
# repository holds a file of that name, the second never is (a reader of the package cannot open either)
OWN_DOCS = frozenset(p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts)
DOC_NAME = re.compile(r"\b[A-Z][A-Z0-9_]*\.md\b")
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|home|root|mnt)/\w")


class _Outside:
    """``search(line)``: a capitalised ``NAME.md`` the repository does not hold, or a machine path."""

    def search(self, line: str) -> bool:
        return any(m.group(0) not in OWN_DOCS for m in DOC_NAME.finditer(line)) or bool(MACHINE_PATH.search(line))


OUTSIDE = _Outside()
ISSUE = re.compile(r"\bissue[ _-]?#?\d+|\bissues? #\d+", re.IGNORECASE)
THIS_FILE = Path(__file__).resolve()


def _texts() -> list[Path]:
    files = [ROOT / "README.md"]
    for part in SCANNED:
        files += [p for p in sorted((ROOT / part).rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                  and p.resolve() != THIS_FILE]
    return files


def _hits(pattern: re.Pattern[str] | _Outside) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in _texts():
        text = path.read_text(errors="replace")
        lines = [f"{i}: {line.strip()[:100]}" for i, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
        if lines:
            out[str(path.relative_to(ROOT))] = lines
    return out


def test_no_references_to_documents_outside_the_repository() -> None:
    hits = _hits(OUTSIDE)
    assert not hits, "references to documents outside the repository:\n" + "\n".join(
        f"  {f}:{line}" for f, lines in hits.items() for line in lines)


def test_no_issue_numbers_in_text_or_file_names() -> None:
    hits = _hits(ISSUE)
    names = [str(p.relative_to(ROOT)) for p in _texts() if ISSUE.search(p.name)]
    assert not hits and not names, f"issue numbers: {hits} {names}"


@pytest.mark.parametrize("text", ["see NOTES_ELSEWHERE.md §0", "read /home/someone/notes/x.md", "(issue 7)",
                                  "bench/issue7.py", "Issue-7"])
def test_the_patterns_catch_what_they_are_for(text: str) -> None:
    assert OUTSIDE.search(text) or ISSUE.search(text)


@pytest.mark.parametrize("text", ["docs/models.md", "see docs/attention_core.md", "see README.md", "tissue 7",
                                  "an issue of scale", "x = a/work/b"])
def test_the_patterns_leave_the_repository_s_own_text(text: str) -> None:
    assert not OUTSIDE.search(text) and not ISSUE.search(text)
