"""The product speaks of itself only: no issue numbers, no documents outside the repository.

Code, tests, scripts, the README and docs/ cite a paper, a reference repository's file and version or a
document of this repository, never a file that ships elsewhere (``MODERN.md``, ``FAMILIES.md`` ...), and
name no tracker issue (``issue 24``, ``issue-23``); file names carry no issue number either.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("vit_attention", "tests", "scripts", "docs")
SUFFIXES = {".py", ".md", ".sh", ".toml", ".cfg", ".txt", ".yml", ".yaml"}
OUTSIDE = re.compile(r"\b(?:MODERN|FAMILIES|REFERENCES|CATALOGUE|DESIGN)\.md\b|/work/shared\b")
ISSUE = re.compile(r"\bissue[ _-]?#?\d+|\bissues? #\d+", re.IGNORECASE)
THIS_FILE = Path(__file__).resolve()

# file (relative to the root) -> why it still cites a document outside the repository; a stale entry fails.
KNOWN: dict[str, str] = {}


def _texts() -> list[Path]:
    files = [ROOT / "README.md"]
    for part in SCANNED:
        files += [p for p in sorted((ROOT / part).rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                  and p.resolve() != THIS_FILE]
    return files


def _hits(pattern: re.Pattern[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in _texts():
        text = path.read_text(errors="replace")
        lines = [f"{i}: {line.strip()[:100]}" for i, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
        if lines:
            out[str(path.relative_to(ROOT))] = lines
    return out


def test_no_references_to_documents_outside_the_repository() -> None:
    hits = _hits(OUTSIDE)
    new = {f: lines for f, lines in hits.items() if f not in KNOWN}
    assert not new, "references to documents outside the repository:\n" + "\n".join(
        f"  {f}:{line}" for f, lines in new.items() for line in lines)
    stale = sorted(set(KNOWN) - set(hits))
    assert not stale, f"KNOWN entries that no longer cite an outside document (remove them): {stale}"


def test_no_issue_numbers_in_text_or_file_names() -> None:
    hits = _hits(ISSUE)
    names = [str(p.relative_to(ROOT)) for p in _texts() if ISSUE.search(p.name)]
    assert not hits and not names, f"issue numbers: {hits} {names}"


@pytest.mark.parametrize("text", ["see MODERN.md §0", "(issue 24)", "bench/issue24.py", "Issue-23", "/work/shared/x"])
def test_the_patterns_catch_what_they_are_for(text: str) -> None:
    assert OUTSIDE.search(text) or ISSUE.search(text)
