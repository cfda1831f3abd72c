"""``vit-attention bench --tome R``: ours with token merging beside ours, its per-round speed-up and its FLOPs."""

from __future__ import annotations

import pytest

from vit_attention.bench import BenchConfig, format_table, run_benchmark
from vit_attention.cli import main


def test_bench_reports_merged_beside_unmerged() -> None:
    cfg = BenchConfig(models=["vit_tiny_patch16_224"], img_size=64, batch_size=2, rounds=2, warmup=0,
                      peak_size=64, tome=4, model_kwargs={"depth": 3})
    report = run_benchmark(cfg)
    rows = {r["impl"]: r for r in report["results"]}
    assert set(rows) == {"ours", "ours+tome"}
    tome = rows["ours+tome"]
    assert len(tome["ratios"]["ours"]["per_round"]) == 2 and tome["ratios"]["ours"]["median"] > 0
    # 16 patches: 4, 4, 4 merged -> the blocks see 17, 13, 9 tokens: fewer FLOPs, counted at the merged sizes
    assert tome["tome"]["r"] == 4 and tome["flops_per_step"] < rows["ours"]["flops_per_step"]
    assert tome["tome"]["flops_ratio"] == pytest.approx(rows["ours"]["flops_per_step"] / tome["flops_per_step"])
    assert "tome vit_tiny_patch16_224 [infer]: r = 4 per block" in format_table(report)


def test_bench_tome_refusals_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "swin_tiny_patch4_window7_224", "--tome", "2", "--img-size", "64", "--rounds", "1",
                 "--batch-size", "1", "--quiet"]) == 2
    assert "--tome 2: token merging is not available for SwinTransformer" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--tome must be an int >= 0"):
        BenchConfig(models=["vit_tiny_patch16_224"], tome=-1).validate()
