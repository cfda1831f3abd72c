"""The pretrained table (default tags, hub ids, data configs) is exactly the committed snapshot.

``tests/fixtures/pretrained_table.json`` was written from the generated ``models/pretrained.py``
(timm 1.0.31's pretrained configs) before the table moved into the family files; this test proves
the move lossless: same names, same order, same values, same types (JSON lists are the table's tuples).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vit_attention.models.pretrained import DEFAULT_TAGS, PRETRAINED_CFGS

SNAPSHOT = Path(__file__).resolve().parents[1] / "fixtures" / "pretrained_table.json"


def _tuples(value: Any) -> Any:
    """The snapshot's JSON value with lists as tuples (the table keeps sequences as tuples)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _snapshot() -> dict[str, Any]:
    return json.loads(SNAPSHOT.read_text())


def test_default_tags_match_snapshot() -> None:
    expected = _snapshot()["DEFAULT_TAGS"]
    assert list(DEFAULT_TAGS) == list(expected)  # order too
    assert DEFAULT_TAGS == expected


def test_pretrained_cfgs_match_snapshot() -> None:
    expected = _snapshot()["PRETRAINED_CFGS"]
    assert list(PRETRAINED_CFGS) == list(expected)  # order too
    for key, cfg in expected.items():
        got = PRETRAINED_CFGS[key]
        assert list(got) == list(cfg), key  # field order
        for field, value in cfg.items():
            want = _tuples(value)
            assert type(got[field]) is type(want) and got[field] == want, (key, field, got[field], want)


def test_every_preset_with_a_tag_has_its_default_cfg() -> None:
    for name, tag in DEFAULT_TAGS.items():
        assert f"{name}.{tag}" in PRETRAINED_CFGS
    assert {key.split(".", 1)[0] for key in PRETRAINED_CFGS} == set(DEFAULT_TAGS)
