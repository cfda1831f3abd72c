"""``python -m vit_attention.bench.mechanisms``: every patterned mechanism on every backend (tiny sizes, CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from vit_attention.bench.mechanisms import CASES, format_rows, main, run, run_case

KW = dict(device=torch.device("cpu"), amp=None, batch=2, rounds=2, iters=1, warmup=0, smoke=True)


@pytest.mark.compile
def test_one_row_per_backend_same_weights_ratio_to_the_first() -> None:
    rows = run_case(CASES["swin_t_s1"], backends=["explicit", "sdpa", "flex"], mode="infer", **KW)
    assert [r["backend"] for r in rows] == ["explicit", "sdpa", "flex"]
    first, *others = rows
    assert first["ratio"] is None and first["parity"] is None and first["ms"] > 0
    for r in others:
        assert r["error"] is None and r["ms"] > 0 and len(r["ms_per_round"]) == 2
        assert r["ratio"]["vs"] == "explicit" and r["ratio"]["min"] <= r["ratio"]["median"] <= r["ratio"]["max"]
        assert r["parity"] is not None and r["parity"] < 1e-5
    assert first["kwargs"] == {"window_size": 4, "shift_size": 2}


@pytest.mark.compile
def test_a_failing_backend_is_recorded_and_the_others_run() -> None:
    rows = run_case(CASES["nat_t_s1"], backends=["sdpa", "flex", "explicit"], mode="train", **KW)
    by = {r["backend"]: r for r in rows}
    assert by["flex"]["ms"] is None and "no backward on CPU" in by["flex"]["error"]  # torch's CPU flex: forward only
    assert by["sdpa"]["ms"] > 0 and by["explicit"]["ms"] > 0 and by["explicit"]["ratio"]["vs"] == "sdpa"
    assert by["explicit"]["parity"] < 1e-5
    table = format_rows(rows)
    assert "| nat_t_s1 | neighborhood | train | fp32 |" in table and "failed (NotImplementedError" in table


@pytest.mark.parametrize("case", ["vil_s_s1", "vitdet_b_global", "igpt_s_causal", "halonet26t_s3"])
def test_token_and_spatial_cases_run(case: str) -> None:
    rows = run([case], backends=["sdpa", "explicit"], rounds=1, iters=1, warmup=0, batch=1, smoke=True)
    assert [r["backend"] for r in rows] == ["sdpa", "explicit"]
    assert all(r["error"] is None and r["ms"] > 0 for r in rows) and rows[1]["parity"] < 1e-5


def test_cli_writes_json_and_markdown(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    js, md = tmp_path / "m.json", tmp_path / "m.md"
    assert main(["--smoke", "--cases", "swin_t_s1", "--backends", "sdpa,explicit", "--rounds", "1", "--iters", "1",
                 "--warmup", "0", "--batch", "1", "--json", str(js), "--markdown", str(md)]) == 0
    data = json.loads(js.read_text())
    assert data["device"] == "cpu" and [r["backend"] for r in data["rows"]] == ["sdpa", "explicit"]
    assert "| swin_t_s1 | window | infer | fp32 | 1 | 8x8 |" in md.read_text()
    assert "explicit vs sdpa" in capsys.readouterr().out


def test_cli_bad_input_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--smoke", "--backends", "flex,natten"])
    assert "--backends must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--smoke", "--cases", "nope"])
    assert "--cases: unknown ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--smoke", "--batch", "0"])
    assert "--batch must be >= 1" in capsys.readouterr().err


@pytest.mark.slow  # inductor codegen for two backends
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compile_runs_every_backend_compiled_and_checks_parity() -> None:
    # SwinV2's shifted cosine windows: compiled flex on CPU was silently wrong before flex_attention copied q / k / v
    torch._dynamo.reset()
    try:
        rows = run_case(CASES["swinv2_t_s1"], backends=["auto", "flex"], mode="infer", compile=True, **KW)
    finally:
        torch._dynamo.reset()
    assert [r["mode"] for r in rows] == ["infer+compile"] * 2
    assert all(r["error"] is None and r["ms"] > 0 for r in rows) and rows[1]["parity"] < 1e-5
    assert "| swinv2_t_s1 | cosine_window | infer+compile | fp32 |" in format_rows(rows)


def test_every_registered_mechanism_has_an_example_case() -> None:
    # the cases come from the registry: each mechanism's spec example, with the input its layout and grid need
    from vit_attention.attention import list_attention

    names = list_attention()
    rows = run(["examples"], backends=["explicit", "sdpa"], batch=1, rounds=1, iters=1, warmup=1, smoke=True)
    assert sorted({r["mechanism"] for r in rows}) == names
    assert {r["case"] for r in rows} == {f"{n}_example" for n in names}
    ran = [r for r in rows if r["error"] is None]
    assert all(r["ms"] > 0 for r in ran) and all(r["parity"] < 1e-5 for r in ran if r["backend"] == "sdpa")
    assert {r["mechanism"] for r in rows if r["error"]} == {"talking_heads"}  # no sdpa: refused by name
