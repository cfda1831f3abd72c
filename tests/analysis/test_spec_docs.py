"""What docs.py and compare.py keep in tables by name is what each mechanism's spec records.

Once they read the spec (``formula``, ``doc_example``, ``grid_kwargs``) these tables go; until
then this keeps both in step, so the switch changes no generated page.
"""

from __future__ import annotations

import pytest

from vit_attention import list_attention
from vit_attention.analysis import docs
from vit_attention.attention import get_attention_spec
from vit_attention.train import compare


@pytest.mark.parametrize("name", list_attention())
def test_spec_formula_and_doc_example_equal_the_docs_tables(name: str) -> None:
    spec = get_attention_spec(name)
    assert spec.formula == docs.FORMULAS[name]
    _, shape, kwargs = docs._example(name)
    assert spec.doc_example == (kwargs, shape)


@pytest.mark.parametrize("name", list_attention())
def test_spec_grid_kwargs_equal_the_compare_table(name: str) -> None:
    spec = get_attention_spec(name)
    fitted = spec.grid_kwargs((4, 4)) if spec.grid_kwargs is not None else {}
    assert fitted == compare._GRID_KWARGS.get(name, {})
