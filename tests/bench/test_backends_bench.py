"""``bench --attn-backend a,b,c`` (one participant of ours per backend), ``--compare timm-compiled`` / ``hf``,
``--keep-going`` (what the GPU runbook, scripts/gpu_bench.sh, asks of bench).

Small: digit-sized reduced models, batch 2, one or two rounds, the ``eager`` compile backend where something
compiles (dynamo traces, no code generation).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import torch
import torch._dynamo

from vit_attention import create_model
from vit_attention.bench import BenchConfig, format_table, run_benchmark
from vit_attention.bench.harness import parse_backends
from vit_attention.bench.reference import build_reference_spec, known_references, split_compiled
from vit_attention.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")

SWIN = "swin_digits_patch2_window2_8"
VIT = "vit_tiny_patch16_224"
VITDET = "vitdet_base_patch16_1024"
VITDET_SMALL = dict(embed_dim=32, depth=2, num_heads=2, window_size=2, global_block_indices=(1,),
                    pretrain_img_size=32, drop_path_rate=0.0)


def _cfg(name: str = SWIN, **over: Any) -> BenchConfig:
    kw: dict[str, Any] = dict(models=[name], batch_size=2, rounds=2, warmup=0, peak_size=64)
    if name == VIT:
        kw.update(img_size=32, model_kwargs=dict(depth=1))
    return BenchConfig(**{**kw, **over})


def _twin(name: str, ours: torch.nn.Module, img_size: int | None) -> torch.nn.Module:
    """A stand-in reference: the same architecture with its own random weights (our key layout)."""
    torch.manual_seed(1)
    return create_model(name, img_size=img_size, depth=1)


def _rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["impl"]: r for r in report["results"]}


# ------------------------------------------------------------------------------------------ --attn-backend a,b,c
def test_parse_backends() -> None:
    assert parse_backends(None) == [None]
    assert parse_backends("flex") == ["flex"]
    assert parse_backends(" flex, sdpa ,explicit") == ["flex", "sdpa", "explicit"]
    for bad in ("natten", "flex,natten", "flex,,sdpa", "", "flex,flex"):
        with pytest.raises(ValueError, match="--attn-backend"):
            parse_backends(bad)
    with pytest.raises(ValueError, match="twice"):
        BenchConfig(models=[SWIN], attn_backend="sdpa,sdpa").validate()


@pytest.mark.compile
def test_backend_list_one_participant_per_backend_same_weights() -> None:
    report = run_benchmark(_cfg(attn_backend="explicit,sdpa,flex"))
    rows = _rows(report)
    assert list(rows) == ["ours[explicit]", "ours[sdpa]", "ours[flex]"]
    first = rows["ours[explicit]"]
    assert first["ratios"] == {} and first["parity"] is None and first["backend"] == "explicit"
    for label in ("ours[sdpa]", "ours[flex]"):
        row = rows[label]
        assert row["backend"] == label[5:-1]
        ratio = row["ratios"]["ours[explicit]"]  # vs the first backend, per round
        assert len(ratio["per_round"]) == 2 and ratio["min"] > 0
        assert row["parity"] is not None and row["parity"] < 1e-5  # copies of one model: the same weights
        assert row["flops_per_step"] == first["flops_per_step"] > 0
    # FlexAttention cannot run under the CPU tensor tracker: only its participant goes unmeasured
    assert rows["ours[flex]"]["peak_memory_mb"] is None and "FlexAttention" in rows["ours[flex]"]["memory_method"]
    assert rows["ours[sdpa]"]["peak_memory_mb"] > 0
    table = format_table(report)
    assert "| ours[sdpa] |" in table and "vs ours[explicit]:" in table
    assert "attention backend explicit,sdpa,flex" in table
    json.dumps(report)


def test_backend_list_with_references_gives_each_backend_its_ratio_to_them() -> None:
    report = run_benchmark(_cfg(VIT, attn_backend="sdpa,explicit", compare=["twin"]), references={"twin": _twin})
    rows = _rows(report)
    assert list(rows) == ["ours[sdpa]", "ours[explicit]", "twin"]
    assert set(rows["ours[sdpa]"]["ratios"]) == {"twin"}
    assert set(rows["ours[explicit]"]["ratios"]) == {"ours[sdpa]", "twin"}
    assert rows["twin"]["parity"] < 1e-5 and rows["ours[explicit]"]["parity"] < 1e-5


def test_single_backend_keeps_the_plain_ours_participant() -> None:
    report = run_benchmark(_cfg(attn_backend="sdpa", rounds=1))
    (row,) = report["results"]
    assert row["impl"] == "ours" and "backend" not in row and row["ratios"] == {}
    assert "attention backend sdpa" in format_table(report)


@pytest.mark.compile
def test_backend_list_with_compile_compiles_each_backend() -> None:
    try:
        report = run_benchmark(_cfg(attn_backend="sdpa,explicit", rounds=1, compile=True, compile_backend="eager"))
    finally:
        torch._dynamo.reset()
    rows = _rows(report)
    assert list(rows) == ["ours[sdpa]", "ours[explicit]", "ours[sdpa]+compile", "ours[explicit]+compile"]
    for b in ("sdpa", "explicit"):
        row = rows[f"ours[{b}]+compile"]
        assert set(row["ratios"]) == {f"ours[{b}]"}  # vs its own eager twin
        assert row["compile"]["compile"]["graphs"] == 1 and row["compile"]["compile"]["graph_breaks"] == 0
        assert row["parity"] is not None and row["parity"] < 1e-5  # compiled vs eager, inference
    table = format_table(report)
    assert f"compile {SWIN} [infer] ours[explicit]+compile (eager, mode default): graphs 1, graph breaks 0" in table


def test_a_backend_a_model_cannot_run_is_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    import vit_attention.bench.harness as harness

    real = harness.set_attention_backend

    def refuse(module: torch.nn.Module, backend: str) -> torch.nn.Module:
        if backend == "flex":
            raise ValueError("attention backend 'flex': talking heads run on ['sdpa', 'explicit'] only")
        return real(module, backend)

    monkeypatch.setattr(harness, "set_attention_backend", refuse)
    report = run_benchmark(_cfg(attn_backend="sdpa,flex", rounds=1))
    assert [r["impl"] for r in report["results"]] == ["ours[sdpa]"]
    assert any("--attn-backend flex skipped" in n and "talking heads" in n for n in report["notes"])


# ------------------------------------------------------------------------------------------ NAME-compiled
def test_split_compiled_and_known_names() -> None:
    assert split_compiled("timm-compiled") == ("timm", True) and split_compiled("hf") == ("hf", False)
    assert {"timm", "timm-compiled", "hf", "hf-compiled", "torchvision"} <= set(known_references())
    with pytest.raises(ValueError, match="--compare: unknown reference 'nope-compiled'"):
        run_benchmark(_cfg(compare=["nope-compiled"]))


def test_timm_compiled_missing_is_reported_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm -> ImportError, as in a CPU-only env
    report = run_benchmark(_cfg(VIT, rounds=1, compare=["timm-compiled"]))
    assert [r["impl"] for r in report["results"]] == ["ours"]
    (note,) = report["notes"]
    assert "reference timm-compiled unavailable" in note and "cannot be imported" in note
    assert "note: " + note in format_table(report)


@pytest.mark.compile
def test_compiled_reference_is_its_own_participant() -> None:
    """``twin-compiled`` next to ``twin``: a compiled copy of the same reference (same weights), its ratio to the
    eager one, its compile report, and ours' ratio to both."""
    cfg = _cfg(VIT, compare=["twin", "twin-compiled"], compile_backend="eager")
    try:
        report = run_benchmark(cfg, references={"twin": _twin})
    finally:
        torch._dynamo.reset()
    rows = _rows(report)
    assert list(rows) == ["ours", "twin", "twin-compiled"]
    assert set(rows["ours"]["ratios"]) == {"twin", "twin-compiled"}
    tc = rows["twin-compiled"]
    assert set(tc["ratios"]) == {"twin"} and len(tc["ratios"]["twin"]["per_round"]) == 2
    assert tc["compile"]["settings"] == {"backend": "eager", "mode": "default", "freeze": False}
    assert tc["compile"]["compile"]["graphs"] >= 1 and tc["compile"]["compile_warmup_s"] > 0
    assert tc["parity"] is not None and tc["parity"] < 1e-5
    assert f"compile {VIT} [infer] twin-compiled (eager, mode default): graphs" in format_table(report)


@pytest.mark.compile
def test_compiled_reference_alone_builds_its_own() -> None:
    try:
        report = run_benchmark(_cfg(VIT, rounds=1, compare=["twin-compiled"], compile_backend="eager"),
                               references={"twin": _twin})
    finally:
        torch._dynamo.reset()
    rows = _rows(report)
    assert list(rows) == ["ours", "twin-compiled"] and rows["twin-compiled"]["parity"] < 1e-5
    assert rows["twin-compiled"]["ratios"] == {}  # no eager twin in the run to compare with


# ------------------------------------------------------------------------------------------ hf (transformers)
def _vitdet(**over: Any) -> BenchConfig:
    kw: dict[str, Any] = dict(models=[VITDET], img_size=64, batch_size=2, rounds=2, warmup=0, peak_size=64,
                              model_kwargs=dict(VITDET_SMALL), compare=["hf"])
    return BenchConfig(**{**kw, **over})


def test_hf_vitdet_reference_builds_with_our_weights() -> None:
    ours = create_model(VITDET, img_size=64, **VITDET_SMALL).eval()
    spec = build_reference_spec("hf", VITDET, ours, 64)
    assert spec.ours_method == "forward_features" and spec.loaded
    assert type(spec.module.model).__name__ == "VitDetModel"
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        a, b = ours.forward_features(x), spec.module.eval()(x)
    assert a.shape == b.shape == (2, 4, 4, 32)
    assert (a - b).abs().max() / b.abs().max() < 1e-5


@pytest.mark.parity
@pytest.mark.parametrize("mode", ["infer", "train"])
def test_compare_hf_vitdet(mode: str) -> None:
    report = run_benchmark(_vitdet(mode=mode))
    rows = _rows(report)
    assert list(rows) == ["ours", "hf"]
    ours, hf = rows["ours"], rows["hf"]
    assert ours["ours_method"] == "forward_features" and "ours_method" not in hf
    assert len(ours["ratios"]["hf"]["per_round"]) == 2 and ours["ratios"]["hf"]["min"] > 0
    assert hf["parity"] is not None and hf["parity"] < 1e-5
    assert ours["flops_per_step"] == hf["flops_per_step"] > 0
    assert any("compared on forward_features" in n for n in report["notes"])
    assert report["machine"]["transformers"] is not None
    assert "transformers " in format_table(report)


def test_compare_hf_with_backends() -> None:
    report = run_benchmark(_vitdet(rounds=1, attn_backend="sdpa,explicit"))
    rows = _rows(report)
    assert list(rows) == ["ours[sdpa]", "ours[explicit]", "hf"]
    assert set(rows["ours[explicit]"]["ratios"]) == {"ours[sdpa]", "hf"}
    assert rows["ours[explicit]"]["parity"] < 1e-5 and rows["hf"]["parity"] < 1e-5


def test_hf_without_a_counterpart_is_reported() -> None:
    report = run_benchmark(_cfg(rounds=1, compare=["hf"]))
    assert [r["impl"] for r in report["results"]] == ["ours"]
    (note,) = report["notes"]
    assert "reference hf unavailable" in note and "hf covers: vitdet" in note


def test_references_that_compare_different_outputs_are_not_mixed() -> None:
    """hf compares our features; a reference of the whole model after it is left out, said so."""
    report = run_benchmark(_vitdet(rounds=1, compare=["hf", "twin"]),
                           references={"twin": lambda n, o, i: create_model(n, img_size=i, **VITDET_SMALL)})
    assert [r["impl"] for r in report["results"]] == ["ours", "hf"]
    assert any("reference twin unavailable" in n and "separate benchmarks" in n for n in report["notes"])


# ------------------------------------------------------------------------------------------ --keep-going
def test_keep_going_records_a_failing_model_and_goes_on() -> None:
    seen: list[int] = []
    cfg = _cfg(VIT, models=["no_such_model_xyz", VIT], rounds=1, keep_going=True)
    report = run_benchmark(cfg, progress=lambda r: seen.append(len(r["results"])))
    assert [r["impl"] for r in report["results"]] == ["ours"]
    assert any(n.startswith("no_such_model_xyz [infer] failed: KeyError") for n in report["notes"])
    assert seen == [0, 1]  # the partial report after each model
    with pytest.raises(KeyError):
        run_benchmark(_cfg(VIT, models=["no_such_model_xyz"], rounds=1))


# ------------------------------------------------------------------------------------------ command line
def test_cli_backend_list_and_compare_hf(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.json"
    rc = main(["bench", SWIN, "--attn-backend", "explicit,sdpa", "--batch-size", "1", "--rounds", "1",
               "--warmup", "0", "--peak-size", "64", "--quiet", "--compare", "hf", "--keep-going",
               "--json", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    assert f"| {SWIN} | infer | ours[sdpa] |" in captured.out and "vs ours[explicit]:" in captured.out
    assert "reference hf unavailable" in captured.err
    report = json.loads(out.read_text())
    assert report["config"]["attn_backend"] == "explicit,sdpa" and report["config"]["keep_going"] is True
    assert [r["impl"] for r in report["results"]] == ["ours[explicit]", "ours[sdpa]"]


def test_cli_bad_backend_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", SWIN, "--attn-backend", "flex,natten", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--attn-backend must be one of auto, sdpa, explicit, flex, or a comma-separated list" in err
    assert "'flex,natten'" in err


# ------------------------------------------------------------------------------------------ --reduced, --model-arg
@pytest.mark.compile
def test_reduced_models_and_a_backend_that_cannot_train_is_left_out() -> None:
    """``--reduced``: the family's reduced form (its image size too); in training on CPU, flex (no CPU backward)
    fails in its warm-up and is left out with a note, the other backends are timed."""
    report = run_benchmark(BenchConfig(models=["nat_tiny"], reduced=True, mode="train", batch_size=2, rounds=1,
                                       warmup=0, peak_size=64, attn_backend="sdpa,flex,explicit"))
    rows = _rows(report)
    assert list(rows) == ["ours[sdpa]", "ours[explicit]"]
    assert rows["ours[sdpa]"]["img_size"] == [64, 64]
    assert any("ours[flex] failed in its warm-up" in n and "no backward on CPU" in n for n in report["notes"])
    assert report["config"]["reduced"] is True


def test_cli_model_arg_reaches_the_model(tmp_path) -> None:
    out = tmp_path / "b.json"
    assert main(["bench", VIT, "--img-size", "32", "--model-arg", "depth=1", "--model-arg", "embed_dim=32",
                 "--model-arg", "num_heads=2", "--batch-size", "1", "--rounds", "1", "--warmup", "0", "--peak-size",
                 "64", "--quiet", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["config"]["model_kwargs"] == {"depth": 1, "embed_dim": 32, "num_heads": 2}
    full = run_benchmark(_cfg(VIT, rounds=1))["results"][0]["flops_per_step"]  # depth 1, width 192
    assert 0 < report["results"][0]["flops_per_step"] < full / 10
