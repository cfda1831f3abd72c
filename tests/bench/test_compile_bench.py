"""``vit-attention bench --compile`` (reduced models of three kinds: ViT, Swin, MobileViT) and its options
``--compile-mode``, ``--compile-freeze`` and ``--attn-backend``.

Cheap: the ``eager`` compile backend (dynamo traces, no code generation), reduced models (a family's small
preset, ``tests/model_outputs.py``), batch 2, one round, no warm-up beyond the compiled one.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
from model_outputs import first_preset_per_family, small_overrides

from vit_attention.bench import BenchConfig, format_table, run_benchmark
from vit_attention.bench.harness import COMPILE_MODES, compile_model, with_freezing
from vit_attention.cli import main
from vit_attention.models import get_model_entry

pytestmark = pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")

def _reduced(name: str, **over: Any) -> BenchConfig:
    kw = small_overrides(name)
    img = kw.pop("img_size", None)
    return BenchConfig(models=[name], model_kwargs=kw, img_size=img, batch_size=2, rounds=1, warmup=0, peak_size=64,
                       compile=True, compile_backend="eager", **over)


# the harness's compile path on Swin's windowed stages and MobileViT's convolutions and BatchNorm (a plain ViT:
# test_cli_bench_compile below). That every family's model traces as one graph (what the bench reports here) is
# checked for each distinct reduced model in test_compile_registry.py, with the same settings (dynamo, no code
# generation).
BENCH_FAMILIES = ("swin", "mobilevit")


@pytest.mark.slow  # a dynamo trace each (the --fast tier keeps one graph per family through test_compile_registry.py)
@pytest.mark.parametrize("name", [first_preset_per_family()[f] for f in BENCH_FAMILIES])
def test_bench_compile_reports_one_graph(name: str) -> None:
    try:
        report = run_benchmark(_reduced(name))
    finally:
        torch._dynamo.reset()
    rows = {r["impl"]: r for r in report["results"]}
    assert set(rows) == {"ours", "ours+compile"}
    row = rows["ours+compile"]
    assert row["ratios"]["ours"]["median"] > 0 and len(row["ratios"]["ours"]["per_round"]) == 1
    info = row["compile"]
    assert info["settings"] == {"backend": "eager", "mode": "default", "freeze": False}
    assert info["compile"]["graphs"] == 1 and info["compile"]["graph_breaks"] == 0, info["compile"]
    assert info["compile_warmup_s"] > 0
    assert f"compile {get_model_entry(name).name} [infer] (eager, mode default): graphs 1, graph breaks 0" \
        in format_table(report)


@pytest.mark.compile
def test_cli_bench_compile(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "vit_tiny_patch16_224", "--img-size", "32", "--batch-size", "1", "--rounds", "1", "--warmup", "0",
            "--peak-size", "64", "--quiet", "--compile", "--compile-backend", "eager"]
    try:
        assert main(args) == 0
    finally:
        torch._dynamo.reset()
    out = capsys.readouterr().out
    assert "| vit_tiny_patch16_224 | infer | ours+compile |" in out
    assert "compile vit_tiny_patch16_224 [infer] (eager, mode default): graphs 1, graph breaks 0" in out


def test_cli_bench_help_lists_compile_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for opt in ("--compile-mode", "--compile-freeze", "--attn-backend", "reduce-overhead", "max-autotune-no-cudagraphs",
                "flex"):
        assert opt in out


def test_options_validated_naming_the_option() -> None:
    with pytest.raises(ValueError, match="--compile-mode"):
        BenchConfig(models=["vit_tiny_patch16_224"], compile_mode="fast").validate()
    with pytest.raises(ValueError, match="inductor backend only"):
        BenchConfig(models=["vit_tiny_patch16_224"], compile_backend="eager", compile_mode="reduce-overhead").validate()
    with pytest.raises(ValueError, match="inductor backend only"):
        BenchConfig(models=["vit_tiny_patch16_224"], compile_backend="eager", compile_freeze=True).validate()
    with pytest.raises(ValueError, match="--attn-backend"):
        BenchConfig(models=["vit_tiny_patch16_224"], attn_backend="natten").validate()
    with pytest.raises(SystemExit):
        main(["bench", "vit_tiny_patch16_224", "--compile-mode", "fast"])


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_compile_mode_reaches_torch_compile(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_compile(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        seen.update(kwargs)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = torch.nn.Linear(2, 2)
    assert compile_model(model, "inductor", mode) is model
    assert seen == {"backend": "inductor", "mode": None if mode == "default" else mode, "dynamic": False}


def test_with_freezing_sets_inductor_freezing_while_the_step_runs() -> None:
    import torch._inductor.config as inductor_config

    seen = []
    step = with_freezing(lambda: seen.append(inductor_config.freezing))
    before = inductor_config.freezing
    step()
    assert seen == [True] and inductor_config.freezing == before


@pytest.mark.compile
def test_attn_backend_builds_ours_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``attn_backend`` reaches ``create_model`` (every mechanism switched), and the compiled participant runs
    the same model (a deep copy of ours)."""
    import vit_attention.bench.harness as harness

    backends = []
    real = harness.create_model

    def spy(name: str, **kwargs: Any) -> torch.nn.Module:
        backends.append(kwargs.get("attn_backend"))
        return real(name, **kwargs)

    monkeypatch.setattr(harness, "create_model", spy)
    name = "vit_digits_patch2_8"
    cfg = _reduced(name, attn_backend="explicit")
    try:
        report = run_benchmark(cfg)
    finally:
        torch._dynamo.reset()
    assert backends[0] == "explicit"
    assert "attention backend explicit" in format_table(report)
    assert report["results"][1]["compile"]["compile"]["graph_breaks"] == 0


@pytest.mark.compile
def test_attn_backend_flex_eager_runs_without_the_memory_tracker() -> None:
    """Eager FlexAttention on CPU cannot run under the tensor tracker (a dispatch mode), and a refused call
    poisons later ones: the bench does not try, says so, and times the flex model."""
    name = "swin_digits_patch2_window2_8"
    cfg = _reduced(name, attn_backend="flex")
    cfg.compile = False
    report = run_benchmark(cfg)
    (row,) = report["results"]
    assert row["peak_memory_mb"] is None and "FlexAttention" in row["memory_method"]
    assert row["latency_ms"]["median"] > 0
