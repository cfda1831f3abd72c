"""The generated family pages, ``docs/families/<family>.md``: one per registered family and none for a family no
longer registered, each current (byte for byte what ``vit-attention docs`` writes), with a presets table holding
every preset of the family and the stage-level shape flow of the family's reduced model.

The pages show docs/models.md's cells of their presets, read here from the checkout's docs/models.md: each of
those rows is checked against the full-size count by ``tests/analysis/test_flops.py``, so a count that changes
fails there first, and here once docs/models.md is regenerated without the family pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vit_attention.analysis import docs
from vit_attention.analysis.docs import (
    ModelRow,
    check_docs,
    family_page,
    family_presets,
    family_table,
    models_page,
    read_model_rows,
    stage_trace,
)
from vit_attention.models import get_model_entry, list_models

DOCS = Path(__file__).resolve().parents[2] / "docs"
FAMILIES = family_presets()


def _checkout_rows() -> dict[str, ModelRow]:
    return read_model_rows((DOCS / "models.md").read_text(encoding="utf-8"))


def _section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_families_are_the_registrys_and_have_a_page_each_and_no_other() -> None:
    """Every registered model belongs to one family listed once; docs/families/ holds exactly their pages (a page
    of a family no longer registered is stale) beside their index, docs/families/README.md, which links each."""
    assert sorted(n for presets in FAMILIES.values() for n in presets) == list_models()
    assert all(get_model_entry(n).family == f for f, presets in FAMILIES.items() for n in presets)
    pages = sorted(p.name for p in (DOCS / "families").glob("*.md") if p.name != "README.md")
    assert pages == sorted(f"{f}.md" for f in FAMILIES), "regenerate with `vit-attention docs`"
    listing = (DOCS / "families" / "README.md").read_text(encoding="utf-8")
    assert family_table() in listing, "docs/families/README.md's list of family pages is stale: `vit-attention docs`"
    for family in FAMILIES:
        assert f"]({family}.md)" in listing


def test_model_rows_read_back_as_written() -> None:
    """docs/models.md is its rows under the generated header: read back (:func:`read_model_rows`), they write
    the same page, every registered model in registry order; a line that is no row is refused, naming it."""
    text = (DOCS / "models.md").read_text(encoding="utf-8")
    rows = _checkout_rows()
    assert list(rows) == list_models()
    assert models_page(rows=list(rows.values())) == text
    row = rows[list_models()[0]]
    assert ModelRow.parse(row.line()) == row
    with pytest.raises(ValueError, match="not a docs/models.md row"):
        ModelRow.parse("| model | family | input |")


@pytest.mark.slow  # each family's presets built reduced on the meta device (~8 s for every family)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_page_is_current_with_every_preset_and_the_shape_flow(family: str) -> None:
    """The checkout's page is what :func:`family_page` writes now; its presets table has one row per registered
    preset of the family, in order, with docs/models.md's cells; its shape flow is the reduced representative's
    stage-level trace, from the input shape to the logits."""
    path = DOCS / "families" / f"{family}.md"
    assert path.is_file(), f"{path} is missing: regenerate with `vit-attention docs`"
    text = path.read_text(encoding="utf-8")
    rows = _checkout_rows()
    guide = f"../{family}.md" if (DOCS / f"{family}.md").is_file() else None
    assert text == family_page(family, rows, guide=guide), f"{path} is stale: regenerate with `vit-attention docs`"

    presets = FAMILIES[family]
    table = [line for line in _section(text, "Presets").splitlines() if line.startswith("| `")]
    assert [line.split("`")[1] for line in table] == presets
    for line, name in zip(table, presets):
        r = rows[name]
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:5] == [r.input, r.params, r.gmacs, r.published], line

    flow = _section(text, "Shape flow")
    block = re.search(r"```\n(.*?)\n```", flow, flags=re.S)
    assert block is not None, "the shape flow has no trace block"
    trace_text, shape = stage_trace(presets[0])
    assert block.group(1) == trace_text and f"`{list(shape)}`" in flow
    lines = trace_text.splitlines()
    assert lines[0].startswith("input") and lines[0].endswith(str(list(shape)))
    model, _ = docs._reduced_model(presets[0])
    logits = [1, model.num_classes or model.num_features]  # a tower without a head (num_classes=0): its features
    assert lines[1].startswith("(root)") and lines[1].endswith(f"-> {logits}")
    assert all(not line.startswith("      ") for line in lines), "the trace goes deeper than the stages"
    assert len([line for line in lines if line.startswith("  ") and not line.startswith("   ")]) >= 2


def test_a_page_names_its_mechanisms_links_its_guide_and_refuses_an_unknown_family() -> None:
    """LeViT's page links its mechanism's page and timm's file; Swin's links the hand-written guide; a family
    not registered and rows missing a preset are refused, naming what is wrong."""
    rows = _checkout_rows()
    levit = family_page("levit", rows, mechanisms={n: ("attention_bias",) for n in FAMILIES["levit"]})
    assert "[`attention_bias`](../attention/attention_bias.md)" in levit
    assert "timm/models/levit.py" in levit and "- **Guide**" not in levit
    swin = family_page("swin", rows, guide="../swin.md", mechanisms={n: ("window",) for n in FAMILIES["swin"]})
    assert "[swin.md](../swin.md)" in swin
    with pytest.raises(ValueError, match="'no_such_family' is not registered"):
        family_page("no_such_family", rows)
    with pytest.raises(ValueError, match="levit_128s"):
        family_page("levit", {k: v for k, v in rows.items() if k != "levit_128s"})


def test_check_names_a_missing_or_stale_family_page_and_one_of_an_unregistered_family(tmp_path, monkeypatch):
    """``vit-attention docs --check`` names a family page missing, one that differs, and one no registered family
    generates; ``vit-attention docs`` removes the last and keeps the hand-written index ``README.md``."""
    pages = {"families/kept.md": "K\n", "families/edited.md": "E\n", "families/missing.md": "M\n"}
    monkeypatch.setattr(docs, "_pages", lambda models=True, out=None: dict(pages))
    monkeypatch.setattr(docs, "pictured_mechanisms", lambda: [])
    (tmp_path / "families").mkdir()
    for name, text in (("kept", "K\n"), ("edited", "E, edited\n"), ("gone", "G\n"), ("README", "index\n")):
        (tmp_path / "families" / f"{name}.md").write_text(text, encoding="utf-8")
    stale = {p.relative_to(tmp_path).as_posix() for p in check_docs(tmp_path)}
    assert stale == {"families/edited.md", "families/missing.md", "families/gone.md"}
    docs.generate_docs(tmp_path, images=False)
    kept = sorted(p.name for p in (tmp_path / "families").iterdir())
    assert kept == ["README.md", "edited.md", "kept.md", "missing.md"]
    assert check_docs(tmp_path) == []
