"""Analytic FLOPs (MACs) agree with FlopCounterMode and with the published model totals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vit_attention import create_attention, create_model, list_attention, list_models
from vit_attention.analysis import attention_complexity, complexity_table, flops, measure_flops
from vit_attention.analysis.docs import models_page
from vit_attention.analysis.flops import stage_of
from vit_attention.analysis.published import PUBLISHED_GMACS, PUBLISHED_SOURCES, matches_published, published_gmacs
from vit_attention.attention import AttentionCall, get_attention_spec

from ._models import input_shape, reduced

DIM, HEADS = 32, 4


def _mechanism(name: str) -> torch.nn.Module:
    return create_attention(name, DIM, HEADS, **get_attention_spec(name).example_kwargs)


@pytest.mark.parametrize("name", list_attention())
@pytest.mark.parametrize("device", ["meta", None])
def test_mechanism_analytic_equals_measured(name, device):
    spatial = get_attention_spec(name).layout == "spatial"
    grid = get_attention_spec(name).needs_feat_size  # token mechanisms that use the grid get square maps
    for shape in ([(2, 8, 8, DIM), (1, 7, 9, DIM)] if spatial else [(2, 16 if grid else 11, DIM), (1, 64, DIM)]):
        attn = _mechanism(name)
        analytic = flops(attn, shape, device=device)
        measured, _ = measure_flops(attn, shape, device=device)
        assert analytic.total > 0
        assert analytic.total == pytest.approx(measured, rel=0.01), (name, shape)
        assert analytic.modules == {"": attn.flops(shape)}  # costed by the mechanism's own formula


@pytest.mark.registry
@pytest.mark.parametrize("name", list_models())
def test_model_analytic_equals_measured(name):
    model, shape = reduced(name)
    report = flops(model, shape)
    measured, per_module = measure_flops(model, shape)
    assert report.total == pytest.approx(measured, rel=0.01)
    assert sum(report.stages.values()) == report.total
    assert report.params == sum(p.numel() for p in model.parameters())
    assert sum(report.params_by_stage.values()) == report.params


# Published totals (vit_attention/analysis/published.py says where each figure comes from).
EXPECTED = {"vit_small_patch16_224", "vit_base_patch16_224", "vit_large_patch16_224", "deit_tiny_patch16_224",
            "swin_tiny_patch4_window7_224", "swin_small_patch4_window7_224", "swin_base_patch4_window7_224",
            "swinv2_tiny_window8_256"}


def test_published_table_covers_the_issue_models():
    assert set(PUBLISHED_GMACS) >= EXPECTED and set(PUBLISHED_SOURCES) == set(PUBLISHED_GMACS)
    assert all(source for _, source in published_gmacs().values())  # every figure says where it comes from


def test_every_published_figure_is_of_a_registered_model():
    assert set(published_gmacs()) <= set(list_models()), sorted(set(published_gmacs()) - set(list_models()))


MODELS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def _models_page_rows() -> dict[str, str]:
    """``{name: its row}`` of the checkout's docs/models.md."""
    rows = [line for line in MODELS_PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    return {row.split("`")[1]: row for row in rows}


def test_the_models_page_lists_every_model_in_order_under_its_generated_header():
    """docs/models.md: the generated header, then one row per registered model in registry order (each row's
    figures are checked by the sweep below, so the page as a whole is what ``vit-attention docs`` writes)."""
    text = MODELS_PAGE.read_text(encoding="utf-8")
    header = models_page([])
    assert text.startswith(header), "docs/models.md's header is stale: regenerate with `vit-attention docs`"
    assert list(_models_page_rows()) == list_models()
    assert len(text.splitlines()) == len(header.splitlines()) + len(list_models())


@pytest.mark.slow  # full-size models counted on the meta device (~0.3 s a model)
@pytest.mark.registry
@pytest.mark.parametrize("name", list_models())
def test_full_size_totals_are_the_docs_and_the_published_ones(name):
    """The full-size model on meta, counted once: its docs/models.md row is what ``vit-attention docs`` writes
    now, and where a paper / timm figure is published, the analytic total equals the measured one and the
    figure (within 2 %, or within the rounding of a figure published with one decimal)."""
    with torch.device("meta"):
        model = create_model(name).eval()
    report = flops(model, input_shape(name))
    row = models_page([name], {name: report}).splitlines()[-1]
    assert _models_page_rows().get(name) == row, "docs/models.md is stale: regenerate with `vit-attention docs`"
    if name not in published_gmacs():
        return
    gmacs = report.gmacs
    assert report.total == pytest.approx(measure_flops(model, input_shape(name))[0], rel=0.01)  # full depth too
    published = published_gmacs()[name][0]
    assert matches_published(gmacs, published), (name, gmacs, published)
    assert abs(gmacs - published) <= max(0.02 * published, 0.05)


def test_stage_grouping_and_table():
    model, shape = reduced("swin_tiny_patch4_window7_224", depth=2)
    report = flops(model, shape)
    assert {"patch_embed", "layers.0", "layers.3", "head"} <= set(report.stages)
    assert stage_of("layers.2.blocks.1.attn.qkv") == "layers.2" and stage_of("blocks.3.mlp.fc1") == "blocks"
    text = report.table()
    assert "layers.2" in text and "total" in text
    assert "attn" in report.table(by="module")
    assert report.kinds["layers.0.blocks.0.attn"] == "window"  # costed by WindowAttention.flops


def test_cross_attention_falls_back_to_the_attention_core():
    """The MAP head's latent query attends to the tokens through the core: costed by its layers and the core."""
    model = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, global_pool="map",
                         class_token=False)
    report = flops(model, (2, 3, 32, 32))
    assert "attn_pool[attention]" in report.modules
    assert report.total == measure_flops(model, (2, 3, 32, 32), device=None)[0]


def test_complexity_formulas_match_the_mechanisms():
    h, w, c, m = 16, 16, 32, 4
    cost = attention_complexity(h, w, c, m)
    assert cost["msa"] == create_attention("mhsa", c, 4).flops((1, h * w, c))
    assert cost["w_msa"] == create_attention("window", c, 4, window_size=m).flops((1, h, w, c))
    # Swin paper, stage 1 of Swin-T: 56x56x96, M = 7 -> global attention costs 13.8x more
    big = attention_complexity(56, 56, 96, 7)
    assert big["msa"] / big["w_msa"] == pytest.approx(13.81, abs=0.01)
    table = complexity_table(window_size=7)
    assert "56×56×96" in table and "| 7×7×768 |" in table and "1.00×" in table  # one window = global
    with pytest.raises(ValueError, match="window_size"):
        attention_complexity(8, 8, 32, 0)


class _Caller(torch.nn.Module):
    """Calls a mechanism the way blocks do: with the grid and the residual in its AttentionCall."""

    def __init__(self, attn: torch.nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        grid = x[:, 1:].reshape(B, 4, (N - 1) // 4, C)  # a prefix token and a 4 x 6 grid
        res = "residual" in self.attn.accepts
        if self.attn.layout == "spatial":
            return self.attn(grid, AttentionCall(feat_size=(4, (N - 1) // 4), residual=grid if res else None))
        call = AttentionCall(feat_size=(4, (N - 1) // 4), num_prefix_tokens=1, residual=x if res else None)
        return self.attn(x, call)


@pytest.mark.parametrize("name", list_attention())
def test_mechanisms_called_with_grid_and_residual_keywords_are_costed_by_their_formula(name):
    attn = _mechanism(name).eval()
    shape = (2, 1 + 4 * 6, DIM)  # a prefix token and a 4x6 grid
    report = flops(_Caller(attn), shape, device=None)
    spatial = get_attention_spec(name).layout == "spatial"
    grid = {"feat_size": (4, 6)} if get_attention_spec(name).needs_feat_size and not spatial else {}
    own = attn.flops((2, 4, 6, DIM) if spatial else shape, **grid)
    assert report.modules == {"attn": own} and report.kinds["attn"] == name
    assert report.total == pytest.approx(measure_flops(_Caller(attn), shape, device=None)[0], rel=0.01)


def _fast_meta_cases() -> list[str]:
    from model_outputs import distinct_reduced_presets

    return distinct_reduced_presets()


@pytest.mark.registry
@pytest.mark.parametrize("name", _fast_meta_cases())
def test_fast_meta_records_what_torch_meta_kernels_record(name: str) -> None:
    """``record_forward`` on meta answers layer norm / addmm / softmax / GELU with their empty outputs
    (``_FastMeta``): every module and attention call records the same shapes as with torch's own meta kernels,
    so FLOPs, traces and the generated docs are unchanged."""
    from model_outputs import small_overrides

    from vit_attention.analysis.recording import record_forward

    with torch.device("meta"):
        model = create_model(name, **small_overrides(name)).eval()
    size = model.cfg.img_size if isinstance(model.cfg.img_size, (tuple, list)) else (model.cfg.img_size,) * 2
    shape = (2, model.cfg.in_chans, *size)
    slow, fast = record_forward(model, shape, fast_meta=False), record_forward(model, shape)
    assert fast.output_shapes == slow.output_shapes
    assert [(c.name, c.in_shapes, c.out_shapes) for c in fast.calls] == \
        [(c.name, c.in_shapes, c.out_shapes) for c in slow.calls]
    assert [(a.module, a.q, a.k, a.v) for a in fast.attention] == \
        [(a.module, a.q, a.k, a.v) for a in slow.attention]
