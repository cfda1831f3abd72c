"""The pretrained table (default tags, hub ids, data configs) is exactly the committed snapshot.

``tests/fixtures/pretrained_table.json`` is the table timm 1.0.31's pretrained configs give; the family
files' declarations, expanded by ``models/pretrained_table.py``, must match it exactly: same names, same
order, same values, same types (JSON lists are the table's tuples).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vit_attention.models.pretrained_table import DEFAULT_TAGS, PRETRAINED_CFGS, family_pretrained_tags
from vit_attention.models.pretrained_tags import FIELDS, build_tables, data_cfg, expand, pretrained_tags
from vit_attention.models.registry import get_model_entry

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


def test_each_family_declares_the_tags_of_its_own_presets() -> None:
    for module, tags in family_pretrained_tags().items():
        for key in tags.cfgs:
            entry = get_model_entry(key.split(".", 1)[0])  # a registered preset (raises otherwise)
            assert entry.model_cls.__module__ == f"vit_attention.models.{module}", (module, key)


def test_expand_fills_the_defaults_and_rejects_unknown_fields() -> None:
    tags = pretrained_tags({"m.a": data_cfg(224, 0.9), "m.b": dict(data_cfg(384, 1.0), hf_hub_id=None, num_classes=0),
                            "n.c": dict(data_cfg(224, 0.9), license="mit")}, license="apache-2.0")
    full = expand(tags)
    assert list(full["m.a"]) == list(FIELDS)
    assert full["m.a"]["hf_hub_id"] == "timm/m.a" and full["m.a"]["num_classes"] == 1000
    assert full["m.a"]["hf_hub_filename"] is None and full["m.a"]["license"] == "apache-2.0"
    assert full["m.b"]["hf_hub_id"] is None and full["m.b"]["input_size"] == (3, 384, 384)
    assert full["n.c"]["license"] == "mit"
    defaults, cfgs = build_tables([tags])
    assert defaults == {"m": "a", "n": "c"} and list(cfgs) == ["m.a", "m.b", "n.c"]
    with pytest.raises(ValueError, match="unknown field"):
        expand(pretrained_tags({"m.a": dict(data_cfg(224, 0.9), crop=1.0)}))
    with pytest.raises(ValueError, match="name.tag"):
        expand(pretrained_tags({"m": data_cfg(224, 0.9)}))
    with pytest.raises(TypeError, match="unknown pretrained field"):
        pretrained_tags({}, licence="mit")
    with pytest.raises(ValueError, match="declared twice"):
        build_tables([tags, tags])
