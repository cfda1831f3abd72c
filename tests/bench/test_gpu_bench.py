"""The GPU benchmark runbook: ``scripts/gpu_bench.sh``'s arguments and ``python -m vit_attention.bench.gpu_report``
(the table it writes from the bench / mechanisms / iGPT outputs), on tiny CPU runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vit_attention.bench import BenchConfig, run_benchmark
from vit_attention.bench.gpu_report import collect, environment, main, render
from vit_attention.bench.mechanisms import run as run_mechanisms

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_bench.sh"
VITDET = "vitdet_base_patch16_1024"


@pytest.mark.slow
def test_script_needs_a_phase_and_names_bad_arguments() -> None:
    for args, needle in (([], "give a phase"), (["4"], "unknown argument '4'"), (["1", "--fast"], "unknown argument")):
        r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and needle in r.stderr
    r = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--smoke" in r.stdout and "phase 1" in r.stdout


def _fixture(out: Path) -> None:
    """What a phase writes: a bench report (ViTDet vs HF), a mechanisms JSON, an iGPT log, env.json, steps.tsv."""
    phase = out / "phase1"
    (phase / "bench").mkdir(parents=True)
    report = run_benchmark(BenchConfig(models=[VITDET], reduced=True, batch_size=2, rounds=2, warmup=0, peak_size=64,
                                       compare=["hf"], attn_backend="auto,sdpa", amp="bf16"))
    (phase / "bench" / "vitdet_b_bf16_infer.json").write_text(json.dumps(report))
    rows = run_mechanisms(["nat_t_s1", "nat_t_s1_nobias"], backends=["sdpa", "explicit"], amp="bf16", batch=1,
                          rounds=1, iters=1, warmup=0, smoke=True)
    (phase / "mechanisms_bf16_infer.json").write_text(json.dumps({"torch": "x", "device": "cpu", "gpu": None,
                                                                  "rows": rows}))
    (phase / "igpt_sampling_compiled.log").write_text(
        "wrote x.png\nbench: 9,000 tokens/s with the key/value cache, 1,000 tokens/s without (9.0x), batch 16\n"
        "bench: 2,000 tokens/s with the static cache, eager (2.0x uncached)\n"
        "bench: 12,000 tokens/s compiled (reduce-overhead) with the static cache (12.0x uncached, 1.3x the eager)\n")
    (phase / "env.json").write_text(json.dumps({"gpu": "NVIDIA H100", "torch": "2.11.0+cu130",
                                                "natten": "not installed (ModuleNotFoundError: natten)"}))
    (phase / "steps.tsv").write_text("env\tok\t0\t3\tpython3 -m vit_attention.bench.gpu_report --env env.json\n"
                                     "swin_t_bf16_infer\ttimed out (150 s)\t124\t150\tpython3 -m vit_attention.cli "
                                     "bench swin_tiny_patch4_window7_224\n")


def test_the_table_from_a_phase(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fixture(tmp_path)
    found = collect(tmp_path)
    assert len(found["bench"]) == 1 and len(found["mechanisms"]) == 1 and len(found["igpt"]) == 1
    text = render(found)
    assert "Device: NVIDIA H100" in text and "natten not installed" in text
    vitdet = next(line for line in text.splitlines() if line.startswith("| ViTDet-B 1024 | bf16 | infer | 2 |"))
    ratio = found["bench"][0][1]["results"][0]["ratios"]["hf"]["median"]
    assert f"| {ratio:.2f}x |" in vitdet  # ours/HF from the per-round ratios
    assert "| ViTDet-B 1024 >= 1.5x HF (batch 16) | " + f"{ratio:.2f}x" in text
    assert "| Swin-T >= 1.3x timm eager | not measured | - |" in text
    assert "| iGPT-S cached sampling >= 3x uncached | 12.00x (compiled reduce-overhead: 12,000 vs 1,000" in text
    assert "NATTEN not installed on the device; ours with bias / ours without:" in text
    assert "| igpt_sampling_compiled | 9,000 | 1,000 | 9.0x | 2,000 | 12,000 (reduce-overhead) | 12.0x |" in text
    assert "| nat_t_s1 | neighborhood | infer | bf16 | 1 | 8x8 |" in text
    assert "| phase1 | swin_t_bf16_infer | timed out (150 s) | 150 |" in text
    md = tmp_path / "gpu_report.md"
    assert main([str(tmp_path), "--markdown", str(md)]) == 0
    assert md.read_text() == text and capsys.readouterr().out == text


@pytest.mark.slow
def test_env_and_bad_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = environment()
    assert env["torch"] and "natten" in env and "transformers" in env
    assert main(["--env", str(tmp_path / "env.json")]) == 0
    assert json.loads((tmp_path / "env.json").read_text())["torch"] == env["torch"]
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])
    assert "is not a folder" in capsys.readouterr().err
