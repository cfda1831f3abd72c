"""Knowledge about a mechanism lives in its spec: the docs pages, ``compare`` and the Swin converters
read it there, with no table keyed by mechanism name elsewhere."""

from __future__ import annotations

import pytest

from vit_attention import create_model, list_attention
from vit_attention.analysis import docs
from vit_attention.attention import get_attention_spec
from vit_attention.train import compare


@pytest.mark.parametrize("name", list_attention())
def test_the_page_shows_the_spec_formula_and_example(name: str) -> None:
    spec = get_attention_spec(name)
    page = docs.mechanism_page(name)
    assert spec.formula and spec.formula in page
    kwargs, shape = docs._doc_example(name)
    if spec.doc_example is not None:
        assert (kwargs, shape) == (dict(spec.doc_example[0]), tuple(spec.doc_example[1]))
    assert f"`{list(shape)}`" in page


@pytest.mark.parametrize("name", list_attention())
def test_compare_fits_every_mechanism_to_the_backbone_grid(name: str) -> None:
    """The digits ViT has a 4x4 grid: each mechanism's spec fits it (window 2), and the model runs."""
    import torch

    entry = compare._mechanism_entry(name, "vit_digits_patch2_8_gap")
    spec = get_attention_spec(name)
    expected = spec.grid_kwargs((4, 4)) if spec.grid_kwargs is not None else {}
    assert entry.model_kwargs.get("attn_kwargs", {}) == expected
    model = create_model(entry.model, **entry.model_kwargs).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 8, 8)).shape == (2, 1000)


def test_no_name_tables_left() -> None:
    import inspect

    from vit_attention.weights import swin as swin_weights

    for module in (docs, compare, swin_weights):
        src = inspect.getsource(module)
        for name in list_attention():
            assert f'"{name}":' not in src and f'== "{name}"' not in src, (module.__name__, name)


def test_every_table_row_of_mechanisms_has_its_columns() -> None:
    """A description holding a pipe (LeViT's "bias per |offset|") stays one cell: each row of the README's table has
    three cells and each row of the index page four, pipes in a description escaped."""
    for table, cells in ((docs.mechanism_table(), 3), (docs._index_page(list_attention()), 4)):
        rows = [line for line in table.splitlines() if line.startswith("| [`")]
        assert len(rows) == len(list_attention())
        for row in rows:
            assert len(row.replace("\\|", "").strip("|").split("|")) == cells, row
    assert docs.table_cell("a |offset| bias") == "a \\|offset\\| bias"
