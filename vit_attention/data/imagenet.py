"""ImageNet-1k class names (``imagenet_classes.txt``: WordNet synsets and lemmas, in class-index order)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

__all__ = ["imagenet_class_names", "imagenet_synsets"]

_FILE = Path(__file__).with_name("imagenet_classes.txt")


@lru_cache(maxsize=1)
def _rows() -> tuple[tuple[str, str], ...]:
    if not _FILE.is_file():
        raise FileNotFoundError(f"{_FILE} is missing from this installation: the package data was not installed "
                                "(pyproject.toml: [tool.setuptools.package-data] 'vit_attention.data' = ['*.txt'])")
    rows = []
    for line in _FILE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            synset, lemmas = line.split("\t", 1)
            rows.append((synset, lemmas))
    if len(rows) != 1000:
        raise RuntimeError(f"{_FILE} holds {len(rows)} classes, expected 1000 (a damaged installation?)")
    return tuple(rows)


def imagenet_class_names(*, full: bool = False) -> list[str]:
    """The 1000 ImageNet-1k class names, index i = class i: the first WordNet lemma (``full``: all of them)."""
    return [lemmas if full else lemmas.split(", ")[0] for _, lemmas in _rows()]


def imagenet_synsets() -> list[str]:
    """The 1000 WordNet synset ids (``n01440764`` ...), index i = class i."""
    return [synset for synset, _ in _rows()]
