"""Every registered family and every registered mechanism exports to ONNX and runs in onnxruntime like eager.

Parametrized over the registries (``get_model_entry(n).family`` over ``list_models()``, and
``list_attention()``), so a new family or mechanism is covered without touching this file.
Each model is the registry preset shrunk by ``small_overrides`` (same code paths, tiny sizes),
with weights filled by key; it is exported once at batch 2 with a dynamic batch, then compared at
batch 1 and 3 (≤ 1e-4 relative to the largest eager logit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from model_outputs import fill_by_key, first_preset_per_family, small_overrides

from vit_attention import create_model
from vit_attention.attention import get_attention_spec, list_attention
from vit_attention.export import INPUT_NAME, MAX_OPSET, MIN_OPSET, OUTPUT_NAME, to_onnx, verify_onnx
from vit_attention.models import list_models

pytestmark = pytest.mark.compile

RTOL = 1e-4
BATCHES = (1, 3)
MECHANISM_BASE = "vit_digits_patch2_8_gap"  # grid tokens pooled, no class token: spatial mechanisms fit too
MECHANISM_GRID = 8  # 16 px / patch 2: room for several (shifted) windows


FAMILIES = first_preset_per_family()


def _mechanism_kwargs(mech: str) -> dict[str, Any]:
    spec = get_attention_spec(mech)
    kw = dict(spec.example_kwargs)
    if spec.grid_kwargs is not None:
        kw.update(spec.grid_kwargs((MECHANISM_GRID, MECHANISM_GRID)))
    if "shift_size" in kw and "window_size" in kw and kw["shift_size"] >= kw["window_size"]:
        kw.pop("shift_size")  # every ViT block gets the same kwargs; a shift needs a window larger than it
    return kw


def _check(model: torch.nn.Module, path: Path) -> None:
    to_onnx(model, path)
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == [INPUT_NAME] and [o.name for o in graph.output] == [OUTPUT_NAME]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    errors = verify_onnx(model, path, batch_sizes=BATCHES)
    assert set(errors) == set(BATCHES)
    assert max(errors.values()) <= RTOL, errors


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_matches_eager_at_two_batch_sizes(family: str, tmp_path: Path) -> None:
    name = FAMILIES[family]
    model = create_model(name, **small_overrides(name)).eval()
    fill_by_key(model)
    _check(model, tmp_path / f"{name}.onnx")


@pytest.mark.parametrize("mech", list_attention())
def test_every_mechanism_in_a_vit_matches_eager(mech: str, tmp_path: Path) -> None:
    over = {**small_overrides(MECHANISM_BASE), "img_size": 2 * MECHANISM_GRID}
    model = create_model(MECHANISM_BASE, **over, attn_layer=mech, attn_kwargs=_mechanism_kwargs(mech)).eval()
    assert any(isinstance(m, get_attention_spec(mech).cls) for m in model.modules())
    fill_by_key(model)
    _check(model, tmp_path / f"{mech}.onnx")


NAFLEX_TABLE = (3, 5)  # a position table the reduced 2x3 grid must be resized to (anti-aliased bicubic / bilinear)


@pytest.mark.registry
@pytest.mark.parametrize("name", list_models("naflexvit*"))
def test_every_naflexvit_preset_with_a_resized_table_matches_eager(name: str, tmp_path: Path) -> None:
    """ONNX has no anti-aliased resize: the table of the exported (fixed) grid is a constant of the graph."""
    model = create_model(name, **{**small_overrides(name), "pos_embed_grid_size": NAFLEX_TABLE}).eval()
    fill_by_key(model)
    assert model.embeds.pos_table(model.grid_size, torch.float32).shape[0] == 6  # the 2x3 grid, resized
    _check(model, tmp_path / f"{name}.onnx")


@pytest.mark.parametrize("opset", [MIN_OPSET, MAX_OPSET])
def test_naflexvit_exports_at_every_opset(opset: int, tmp_path: Path) -> None:
    name = "naflexvit_base_patch16_gap"
    model = create_model(name, **{**small_overrides(name), "pos_embed_grid_size": NAFLEX_TABLE}).eval()
    fill_by_key(model)
    to_onnx(model, tmp_path / "m.onnx", opset=opset)
    assert max(verify_onnx(model, tmp_path / "m.onnx", batch_sizes=BATCHES).values()) <= RTOL
