"""docs/flex.md's table of patterns comes from the mechanisms: each one that runs a pattern of its own on the flex
backend declares it (``flex_pattern``), and the table's rows and skipped shares are generated from those."""

from __future__ import annotations

import pytest
import torch

from vit_attention.analysis import docs
from vit_attention.attention import get_attention_spec, list_attention, set_attention_backend
from vit_attention.functional import flex
from vit_attention.functional.runtime import switched


@pytest.mark.compile
@pytest.mark.parametrize("name", [n for n in list_attention() if "flex" in get_attention_spec(n).backends])
def test_a_mechanism_declares_a_pattern_exactly_when_it_runs_one(name: str) -> None:
    """The generic path's pattern carries no cache key; a mechanism's own pattern always does (its geometry)."""
    spec = get_attention_spec(name)
    attn, shape = spec.example()
    set_attention_backend(attn.eval(), "flex")
    with flex.recording_patterns() as seen, switched(attn, fused_attention=True), torch.no_grad():
        attn(torch.randn(shape))
    assert seen, f"{name} ran no flex call"
    own = any(p.cache_key is not None and p.cache_key[0] is not None for p in seen)
    assert (spec.cls.flex_pattern is not None) == own


@pytest.mark.compile
def test_the_table_has_a_row_per_declaring_mechanism_with_its_counted_share() -> None:
    table = docs.pattern_table(["causal", "mhsa"])  # mhsa declares no pattern: no row
    rows = table.split("\n")[2:]
    assert len(rows) == 1 and rows[0].startswith("| [`causal`](attention/causal.md) (iGPT) |")
    causal = get_attention_spec("causal").cls.flex_pattern
    assert causal.keys in rows[0]
    n = causal.example[1][1]  # a lower triangle over n tokens: the blocks wholly above the diagonal are skipped
    blocks = -(-n // 128)
    skipped = blocks * (blocks - 1) // 2
    assert rows[0].endswith(f"**{100 * skipped / blocks ** 2:.1f} %** ({skipped} of {blocks ** 2}) |")


@pytest.mark.compile
def test_the_flex_page_needs_both_markers() -> None:
    page = f"{docs.FLEX_TABLE_START}\n{docs.FLEX_TABLE_END}\n"
    with pytest.raises(ValueError, match="docs/flex.md \\(pattern\\) has no table markers"):
        docs.flex_page_with_table(page)
