"""The benchmark harness on tiny models: rows, ratios, statistics, JSON schema, missing references."""

from __future__ import annotations

import copy
import json
import statistics
import sys

import pytest
import torch

from vit_attention import create_model
from vit_attention.bench import BenchConfig, format_table, run_benchmark, summarise
from vit_attention.bench.reference import ReferenceUnavailable, build_reference
from vit_attention.cli import main

TINY = dict(models=["vit_tiny_patch16_224"], img_size=32, batch_size=2, rounds=2, warmup=0, peak_size=128,
            model_kwargs=dict(depth=1))


def _twin(name: str, ours: torch.nn.Module, img_size: int | None) -> torch.nn.Module:
    """A stand-in reference: the same architecture with its own random weights (timm key layout)."""
    torch.manual_seed(1)
    return create_model(name, img_size=img_size, depth=1)


def _stat_ok(s: dict[str, float]) -> bool:
    return s["min"] <= s["median"] <= s["max"]


def test_summarise_orders_and_rejects_empty() -> None:
    assert summarise([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0}
    with pytest.raises(ValueError):
        summarise([])


def test_reports_interleaved_ratios_against_a_reference() -> None:
    report = run_benchmark(BenchConfig(**TINY, compare=["twin"]), references={"twin": _twin})
    rows = {r["impl"]: r for r in report["results"]}
    assert set(rows) == {"ours", "twin"}
    ours, twin = rows["ours"], rows["twin"]
    ratio = ours["ratios"]["twin"]
    assert _stat_ok(ratio) and ratio["min"] > 0
    # one ratio per round: theirs' step time over ours' in the same round
    assert len(ratio["per_round"]) == TINY["rounds"]
    assert ratio["median"] == pytest.approx(statistics.median(ratio["per_round"]))
    assert twin["parity"] is not None and twin["parity"] < 1e-5  # the twin got our weights via load_weights
    for row in (ours, twin):
        assert _stat_ok(row["latency_ms"]) and _stat_ok(row["images_per_s"])
        assert row["flops_per_step"] > 0 and _stat_ok(row["gflops"]) and row["fraction_of_peak"] > 0
        best_peak = max(report["peak"]["gflops_per_round"])
        assert row["fraction_of_peak"] == pytest.approx(row["gflops"]["max"] / best_peak)
        assert row["peak_memory_mb"] > 0
    assert len(report["peak"]["gflops_per_round"]) == TINY["rounds"]
    json.dumps(report)  # serialisable
    table = format_table(report)
    assert "vs twin:" in table and "matmul peak" in table and "torch " + torch.__version__ in table


def test_train_mode_steps_the_optimizer() -> None:
    report = run_benchmark(BenchConfig(**{**TINY, "rounds": 1}, mode="train"))
    (row,) = report["results"]
    assert row["mode"] == "train" and row["flops_per_step"] > 0
    infer_flops = run_benchmark(BenchConfig(**{**TINY, "rounds": 1}))["results"][0]["flops_per_step"]
    assert row["flops_per_step"] > 2 * infer_flops  # backward counted too


def test_missing_reference_is_said_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm -> ImportError, as in a CPU-only env
    report = run_benchmark(BenchConfig(**{**TINY, "rounds": 1}, compare=["timm"]))
    assert [r["impl"] for r in report["results"]] == ["ours"]
    assert report["results"][0]["ratios"] == {}
    (note,) = report["notes"]
    assert "timm" in note and "cannot be imported" in note and "side environment" in note
    assert "note: " in format_table(report)


def test_reference_weights_that_do_not_convert_are_reported() -> None:
    ours = create_model("vit_tiny_patch16_224", img_size=32, depth=1)

    def wrong(name: str, o: torch.nn.Module, img: int | None) -> torch.nn.Module:
        return create_model(name, img_size=img, depth=2)  # an extra block: keys do not fit

    with pytest.raises(ReferenceUnavailable, match="do not convert"):
        build_reference("wrong", "vit_tiny_patch16_224", ours, 32, {"wrong": wrong})
    with pytest.raises(ValueError, match="unknown reference"):
        build_reference("nope", "vit_tiny_patch16_224", ours, 32)


def test_bad_options_name_the_option() -> None:
    with pytest.raises(ValueError, match="--mode"):
        run_benchmark(BenchConfig(**{**TINY, "mode": "fast"}))
    with pytest.raises(ValueError, match="--batch-size"):
        run_benchmark(BenchConfig(**{**TINY, "batch_size": 0}))


def test_cli_writes_json(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "vit_tiny_patch16_224", "--img-size", "32", "--batch-size", "1", "--rounds", "1",
               "--warmup", "0", "--peak-size", "64", "--quiet", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert set(report) == {"machine", "config", "peak", "results", "notes"}
    assert {"torch", "cpu", "torch_threads", "loadavg_start"} <= set(report["machine"])
    row = report["results"][0]
    assert {"model", "mode", "impl", "latency_ms", "images_per_s", "gflops", "fraction_of_peak", "peak_memory_mb",
            "ratios", "parity"} <= set(row)
    assert "| vit_tiny_patch16_224 | infer | ours |" in capsys.readouterr().out


def test_channels_last_and_copy_do_not_change_results() -> None:
    report = run_benchmark(BenchConfig(**{**TINY, "rounds": 1}, channels_last=True, compare=["twin"]),
                           references={"twin": lambda n, o, i: copy.deepcopy(o)})
    assert report["results"][1]["parity"] == 0.0


def test_bf16_autocast_measures_a_bf16_peak() -> None:
    report = run_benchmark(BenchConfig(**{**TINY, "rounds": 1}, amp="bf16"))
    assert report["peak"]["dtype"] == "bfloat16" and report["config"]["amp"] == "bf16"
    assert report["results"][0]["latency_ms"]["median"] > 0
