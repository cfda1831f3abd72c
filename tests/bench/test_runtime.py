"""``bench --runtime onnxruntime``: ours exported to ONNX, timed interleaved with eager, ratio per round."""

from __future__ import annotations

import json
import statistics
import sys

import pytest

from vit_attention.bench import BenchConfig, format_table, run_benchmark
from vit_attention.cli import main

TINY = dict(models=["vit_tiny_patch16_224"], img_size=32, batch_size=2, rounds=2, warmup=0, peak_size=128,
            model_kwargs=dict(depth=1), threads=1)


@pytest.mark.compile
def test_onnxruntime_row_with_ratio_per_round_and_parity() -> None:
    report = run_benchmark(BenchConfig(**TINY, runtimes=["onnxruntime"]))
    rows = {r["impl"]: r for r in report["results"]}
    assert set(rows) == {"ours", "ours+onnxruntime"}
    rt = rows["ours+onnxruntime"]
    ratio = rt["ratios"]["ours"]  # eager time / onnxruntime time, one per round
    assert len(ratio["per_round"]) == TINY["rounds"] and ratio["min"] > 0
    assert ratio["median"] == pytest.approx(statistics.median(ratio["per_round"]))
    assert rt["parity"] is not None and rt["parity"] < 1e-4
    assert rt["onnxruntime"]["threads"] == 1 and rt["onnxruntime"]["version"]
    assert rt["peak_memory_mb"] is None and rows["ours"]["peak_memory_mb"] > 0
    assert rt["flops_per_step"] == rows["ours"]["flops_per_step"]
    json.dumps(report)
    table = format_table(report)
    assert "ours+onnxruntime" in table and "vs ours:" in table


def test_train_mode_skips_the_runtime_with_a_note() -> None:
    report = run_benchmark(BenchConfig(**{**TINY, "rounds": 1}, mode="train", runtimes=["onnxruntime"]))
    assert {r["impl"] for r in report["results"]} == {"ours"}
    assert any("onnxruntime skipped for train" in n for n in report["notes"])


def test_unknown_runtime_and_missing_package_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="--runtime"):
        BenchConfig(**TINY, runtimes=["tensorrt"]).validate()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install vit_attention\[onnx\]"):
        run_benchmark(BenchConfig(**TINY, runtimes=["onnxruntime"]))


@pytest.mark.compile
def test_cli_runtime_option(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "vit_tiny_patch16_224", "--img-size", "32", "--batch-size", "2", "--rounds", "1",
                 "--warmup", "0", "--peak-size", "128", "--threads", "1", "--runtime", "onnxruntime", "--json",
                 "--quiet"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["runtimes"] == ["onnxruntime"]
    assert [r["impl"] for r in report["results"]] == ["ours", "ours+onnxruntime"]
