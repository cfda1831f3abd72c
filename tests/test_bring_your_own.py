"""Bring your own attention: a mechanism and a model family defined in a user's own file, outside the package,
registered through the public API only, get everything the built-in ones get.

The toy file below is written to a temporary folder and imported from there (importlib), like a user's module.
It registers ``toy_temperature`` (global attention with a learned per-head temperature, neutral at start) with
``register_attention`` and a family ``toyvit`` (a ViT whose blocks use it) with ``register_family``. The
registry sweeps then run on both, the same functions the built-in mechanisms and families are swept with:
the attention contract, plug, FLOPs, attention maps, backends, weight transfer, ``compare``, save / load and
docs generation. docs/contributing.md walks through the same file.

The registrations are undone after each test (the registries are restored), so no other test sees them.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import vit_attention as va
from vit_attention.analysis import docs
from vit_attention.attention import get_attention_spec, list_attention
from vit_attention.attention import registry as attention_registry
from vit_attention.models import get_model_entry, list_models
from vit_attention.models import registry as model_registry

TOY = "toy_temperature"
FAMILY = "toyvit"
PRESET = "toyvit_tiny_patch4_16"

# A user's file: everything a mechanism and a family need, nothing from the package's private modules.
TOY_SOURCE = '''
"""A mechanism and a family of my own."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vit_attention.attention import AttentionCall, AttentionModule, register_attention
from vit_attention.attention.registry import global_as_built
from vit_attention.functional import (
    attention_observed,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
    token_layout,
)
from vit_attention.functional.runtime import ATTENTION_BACKEND, FUSED_ATTENTION
from vit_attention.models.registry import register_family
from vit_attention.models.vit import VisionTransformer, VisionTransformerConfig, reduced_config


@register_attention(
    "toy_temperature", layout="tokens", description="global attention with a learned per-head temperature",
    paper="https://arxiv.org/abs/2010.04245",
    formula="Global self-attention whose logits are scaled per head by a learned `exp(t_h)` (`t_h = 0` at start: "
            "plain attention):\\n\\n    A_h = softmax(exp(t_h) · q_h k_hᵀ · hd^-1/2)\\n",
    cost="4·N·C² + 2·N²·C multiply-adds (as global attention)", global_kwargs=global_as_built)
class TemperatureAttention(AttentionModule):
    """Global self-attention with a learned per-head temperature, ``[B, N, C] -> [B, N, C]``."""

    transfer_slots = {"q": "q", "k": "k", "v": "v", "o": "proj"}  # where pretrained projections go

    def __init__(self, dim: int, num_heads: int = 8, *, qkv_bias: bool = True, attn_drop: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim, self.num_heads, self.attn_drop = dim, num_heads, attn_drop
        self.fused_attention = FUSED_ATTENTION.default  # captured when built (runtime.switched flips it)
        self.attention_backend = ATTENTION_BACKEND.default
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=qkv_bias) for _ in range(3))
        self.log_temperature = nn.Parameter(torch.zeros(num_heads))  # per head; 0 = plain attention
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """Tokens ``[B, N, C] -> [B, N, C]``; the grid and prefix tokens of ``call`` change nothing (global
        attention). It reads no optional field (``accepts`` is the base's empty set), so the adapter refuses a
        context, a mask, ... given to it."""
        q, k, v = (split_heads(lin(x), self.num_heads) for lin in (self.q, self.k, self.v))  # [B, nh, N, hd]
        q = q * self.log_temperature.exp().view(-1, 1, 1)
        # where the rows sit on the grid, for attention maps (only when something records them)
        layout = token_layout(x.shape[1], call.feat_size, call.num_prefix_tokens) if attention_observed() else None
        out = scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0,
                                           fused=self.fused_attention, backend=self.attention_backend,
                                           layout=layout)  # [B, nh, N, hd]
        return self.proj(merge_heads(out))

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """``4·N·C² + 2·N²·C`` multiply-adds of ``[B, N, C]``."""
        B, N, C = input_shape
        return B * (4 * N * C * C + 2 * N * N * C)

    def transfer_init(self) -> list[str]:
        """Weights from another mechanism: the temperature starts neutral (plain attention)."""
        with torch.no_grad():
            self.log_temperature.zero_()
        return ["log_temperature: zeros (plain attention)"]


@dataclass
class ToyViTConfig(VisionTransformerConfig):
    """A ViT whose blocks use ``toy_temperature``."""

    attn_layer: str = "toy_temperature"


class ToyViT(VisionTransformer):
    """ViT with temperature attention, ``[B, 3, H, W] -> [B, num_classes]``."""

    config_cls = ToyViTConfig


register_family("toyvit", ToyViT, ToyViTConfig,
                {"toyvit_tiny_patch4_16": dict(img_size=16, patch_size=4, embed_dim=64, depth=2, num_heads=4)},
                reduced=reduced_config)
'''


def _sweep(module: str) -> ModuleType:
    """A test module of this suite by its dotted path under tests/ (its plain ``check_*`` / test functions)."""
    return importlib.import_module(module)


@pytest.fixture
def toy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The user's module, imported from a temporary folder; the registries are restored after each test."""
    list_models()  # the built-in families registered first, as in any program that imports the package
    saved = (dict(attention_registry._ATTENTION), dict(model_registry._MODELS), dict(model_registry._ALIASES))
    path = tmp_path_factory.mktemp("user") / "my_attention.py"
    path.write_text(TOY_SOURCE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("my_attention", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["my_attention"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("my_attention", None)
        for live, before in zip((attention_registry._ATTENTION, model_registry._MODELS, model_registry._ALIASES),
                                saved):
            live.clear()
            live.update(before)


def test_the_toy_is_registered_from_outside_the_package(toy: ModuleType) -> None:
    assert TOY in list_attention() and PRESET in list_models(family=FAMILY)
    assert not Path(toy.__file__).resolve().is_relative_to(Path(va.__file__).resolve().parent)
    spec = get_attention_spec(TOY)
    assert spec.cls is toy.TemperatureAttention and spec.layout == "tokens" and spec.example_shape == (2, 11, 32)
    assert get_model_entry(PRESET).family == FAMILY


def test_the_attention_contract(toy: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    contract, registry = _sweep("attention.test_contract"), _sweep("attention.test_registry")
    contract.test_forward_backward_with_the_contract_keywords(TOY)
    contract.test_the_forward_takes_x_and_one_attention_call(TOY)
    contract.test_the_adapter_refuses_a_call_field_the_mechanism_does_not_read_naming_both(TOY)
    contract.test_spec_is_complete_and_its_example_runs(TOY)
    contract.test_zero_logits_give_the_mean_of_v(TOY)
    contract.test_identity_weights_fn_changes_nothing(TOY)
    for fused in (True, False):
        contract.test_is_causal_equals_an_explicit_lower_triangular_mask(TOY, fused)
        contract.test_leading_batch_dims_equal_the_folded_call(TOY, fused)
        contract.test_a_bias_with_grad_gets_its_gradient(TOY, fused)
        contract.test_fully_masked_rows_are_zeros_with_finite_gradients(TOY, fused)
    registry.test_shape_preserved_and_backward(TOY)
    registry.test_fused_equals_explicit(TOY)
    registry.test_heads_must_divide_dim(TOY)
    registry.test_declares_flops(TOY)
    registry.test_fused_switch_captured_when_built_and_switched_per_module(TOY, monkeypatch)
    for mode in ("eval", "train"):
        _sweep("attention.test_empty_batch").test_empty_batch_forward_and_backward(TOY, mode)


def test_plug_flops_and_maps(toy: ModuleType) -> None:
    plug, flops, maps = _sweep("layers.test_plug"), _sweep("analysis.test_flops"), _sweep("analysis.test_query_map")
    for mlp_ratio in (None, 2.0):
        plug.test_every_mechanism_plugs_into_a_cnn(TOY, mlp_ratio)
    plug.test_adapter_takes_tokens_or_maps_and_prefix_tokens_attend_globally_in_spatial_mechanisms(TOY)
    for device in ("meta", None):
        flops.test_mechanism_analytic_equals_measured(TOY, device)
    flops.test_mechanisms_called_with_grid_and_residual_keywords_are_costed_by_their_formula(TOY)
    maps.test_plugged_cnn_query_maps_sum_to_one_on_the_grid(TOY)
    for extra in ({}, {"pad_first": False}):
        maps.test_query_map_lies_where_the_output_depends(TOY, extra)


@pytest.mark.compile
def test_backends(toy: ModuleType) -> None:
    backends = _sweep("attention.test_backends")
    backends.check_listed_backends_are_known(TOY)
    backends.check_flex_equals_explicit(TOY)
    backends.check_sdpa_equals_explicit(TOY)
    backends.check_flex_compiles_as_one_graph(TOY)


@pytest.mark.compile
def test_the_mechanism_benchmark_has_its_case(toy: ModuleType) -> None:
    from vit_attention.bench import mechanisms as bench

    rows = bench.run([f"{TOY}_example"], backends=["explicit", "sdpa", "flex"], batch=2, rounds=1, iters=1, warmup=1,
                     smoke=True)
    assert [r["backend"] for r in rows] == ["explicit", "sdpa", "flex"] and all(r["error"] is None for r in rows)
    assert all(r["parity"] < 1e-5 for r in rows[1:]) and rows[0]["grid"] == [4, 4]
    assert f"{TOY}_example" in bench.expand_cases(["examples"])


@pytest.mark.slow  # inductor codegen
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_flex(toy: ModuleType) -> None:
    _sweep("attention.test_backends").check_compiled_flex_equals_explicit_on_cpu(TOY)


def test_transfer_and_compare(toy: ModuleType) -> None:
    transfer, spec_docs = _sweep("attention.test_transfer"), _sweep("analysis.test_spec_docs")
    transfer.check_projections_round_trip(TOY)
    kwargs = get_attention_spec(TOY).global_kwargs((7, 7))  # neutral temperature: global attention
    transfer.check_transfer_from_global_attention_is_exact(TOY, kwargs)
    spec_docs.test_compare_fits_every_mechanism_to_the_backbone_grid(TOY)


def test_the_family_sweeps(toy: ModuleType, tmp_path: Path) -> None:
    models, backbone = _sweep("models.test_registry"), _sweep("models.test_backbone")
    models.test_every_model_builds_and_runs_on_meta(PRESET)
    backbone.test_every_family_is_a_backbone_and_declares_its_reduced_config(FAMILY, PRESET)
    backbone.test_config_resolution_is_the_base_s(FAMILY, PRESET)
    backbone.test_reset_classifier_and_pools_are_the_base_s(FAMILY, PRESET)
    _sweep("analysis.test_flops").test_model_analytic_equals_measured(PRESET)
    _sweep("weights.test_load_model").test_save_load_round_trip_is_exact(PRESET, tmp_path)
    model = va.create_model(PRESET)
    assert all(type(b.attn) is toy.TemperatureAttention for b in model.blocks)


def test_save_and_load_a_model_with_the_toy_mechanism(toy: ModuleType, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = va.create_model("vit_digits_patch2_8_gap", attn_layer=TOY).eval()
    with torch.no_grad():
        model.blocks[0].attn.log_temperature.fill_(0.5)
    loaded = va.load_model(va.save_weights(model, tmp_path / "toy.safetensors"))
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert type(loaded.blocks[0].attn) is toy.TemperatureAttention


def test_docs_are_generated_for_it(toy: ModuleType, tmp_path: Path) -> None:
    spec_docs = _sweep("analysis.test_spec_docs")
    spec_docs.test_the_page_shows_the_spec_formula_and_example(TOY)
    page = docs.mechanism_page(TOY, f"img/{TOY}.png")
    assert page.startswith(f"# `{TOY}`: global attention with a learned per-head temperature")
    assert "## Pretrained weights from another mechanism" in page and "log_temperature" in page
    assert docs.mechanism_picture(TOY, tmp_path / f"{TOY}.png").stat().st_size > 0
    assert f"| [`{TOY}`]({TOY}.md) | tokens |" in docs._index_page(list_attention())
    assert f"| [`{TOY}`](docs/attention/{TOY}.md) | `[B, N, C]` |" in docs.mechanism_table()
    assert f"| `{PRESET}` | {FAMILY} | 16×16 |" in docs.models_page([PRESET])
    assert f'| [`{TOY}`](attention/{TOY}.md) | `"auto"`, `"sdpa"`, `"explicit"`, `"flex"` | - |' in docs.backend_table()
    family = docs.family_page(FAMILY, {PRESET: docs.model_row(PRESET)})  # its page, as a built-in family's
    assert family.startswith(f"# The `{FAMILY}` family") and f"| `{PRESET}` | 16×16 |" in family
    assert f"[`{TOY}`](../attention/{TOY}.md)" in family and "## Shape flow" in family
    assert "](../../" not in family  # its file lies outside the package: no link into the checkout
    assert f"| [`{FAMILY}`]({FAMILY}.md) | `ToyViT` | 1 |" in docs.family_table()


def test_no_table_keyed_by_a_mechanism_name_in_the_sweeps_bench_and_docs() -> None:
    """What the registry knows is read from it: the registry-wide sweeps, the mechanism benchmark and the docs
    generator name no mechanism (the cases come from each spec's example and declared backends)."""
    from vit_attention.bench import mechanisms as bench

    sources = {m.__name__: inspect.getsource(m) for m in (docs, bench)}
    for rel in ("attention/test_backends.py", "attention/test_transfer.py"):
        text = (Path(__file__).parent / rel).read_text(encoding="utf-8")
        sources[rel] = text.split("\ndef test_create_attention_takes_a_backend")[0].split(
            "\ndef test_a_mechanism_that_differs")[0]  # the sweeps, not the tests of one mechanism's behaviour
    for where, src in sources.items():
        for name in list_attention():
            for form in (f'"{name}":', f'== "{name}"', f'("{name}", {{', f'"{name}", ('):
                assert form not in src, (where, name, form)


def test_the_readme_table_of_mechanisms_is_generated_from_the_registry() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert docs.readme_with_table(readme) == readme, "README's mechanism table is stale: run `vit-attention docs`"
    for name in list_attention():
        assert f"| [`{name}`](docs/attention/{name}.md) |" in readme
    with pytest.raises(ValueError, match=r"the README \(mechanism\) has no table markers"):
        docs.readme_with_table("# a README without the table")


@pytest.mark.compile
def test_the_flex_page_table_of_backends_is_generated_from_the_registry() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "flex.md").read_text(encoding="utf-8")
    assert docs.flex_page_with_table(page) == page, "docs/flex.md's backend table is stale: run `vit-attention docs`"
    for name in list_attention():
        spec = get_attention_spec(name)
        row = next(line for line in page.splitlines() if line.startswith(f"| [`{name}`]"))
        assert all(f'`"{b}"`' in row.split(" | ")[1] for b in spec.backends)
        if len(spec.backends) < 4:  # the ones it does not run on, and why
            assert spec.backend_note and spec.backend_note in row.split(" | ")[2]
        else:
            assert row.endswith("| - |")
