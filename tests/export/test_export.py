"""``to_onnx`` / ``to_torchscript`` / ``to_exported_program`` and ``vit-attention export``: formats, checkpoints,
eval mode, atomic writes, and errors that name the argument."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from model_outputs import fill_by_key, small_overrides

from vit_attention import create_model
from vit_attention.cli import main
from vit_attention.export import MAX_OPSET, MIN_OPSET, export_model, to_onnx, verify_onnx
from vit_attention.weights import save_weights

pytestmark = pytest.mark.compile

DIGITS = "vit_digits_patch2_8"  # 8 px, a few hundred thousand parameters: quick to export
SWIN = "swin_digits_patch2_window2_8"


def _model(name: str = DIGITS, **kw: object) -> torch.nn.Module:
    model = create_model(name, **{**small_overrides(name), **kw}).eval()
    fill_by_key(model)
    return model


def _x(model: torch.nn.Module, b: int) -> torch.Tensor:
    cfg = model.cfg
    return torch.randn(b, cfg.in_chans, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(b))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load
@pytest.mark.parametrize("fmt", ["torchscript", pytest.param("exported-program", marks=pytest.mark.slow)])
def test_torch_formats_load_back_and_take_any_batch(fmt: str, tmp_path: Path) -> None:
    model = _model(SWIN if fmt == "exported-program" else DIGITS)  # Swin: the harder one for torch.export
    path = export_model(model, tmp_path / ("m.pt2" if fmt == "exported-program" else "m.pt"), fmt)
    loaded = torch.jit.load(str(path)) if fmt == "torchscript" else torch.export.load(str(path)).module()
    with torch.no_grad():
        for b in (1, 3):
            x = _x(model, b)
            ref = model(x)
            assert type(ref) is torch.Tensor  # exporting left no fake tensor in a cache of the eager model
            torch.testing.assert_close(loaded(x), ref, rtol=1e-5, atol=1e-5)


def test_exports_in_eval_mode_and_restores_the_mode(tmp_path: Path) -> None:
    model = _model(drop_rate=0.5, drop_path_rate=0.5).train()
    path = to_onnx(model, tmp_path / "m.onnx")
    assert model.training
    errors = verify_onnx(model, path)  # eager in eval mode too: equal only if dropout was off in the graph
    assert max(errors.values()) < 1e-4 and model.training


def test_static_batch_fixes_the_batch(tmp_path: Path) -> None:
    import onnx

    path = to_onnx(_model(), tmp_path / "m.onnx", dynamic_batch=False)
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2


@pytest.mark.parametrize("argv, batch", [([], 1), (["--batch-size", "4"], 4)])
def test_cli_static_batch_is_the_batch_asked(argv: list[str], batch: int, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import onnx

    out_file = tmp_path / "m.onnx"
    code, out, err = _run(["export", DIGITS, "-o", str(out_file), "--static-batch", *argv, "--verify"], capsys)
    assert code == 0, err
    assert onnx.load(str(out_file)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == batch
    assert f"pixel_values [{batch}, 3, 8, 8]" in out and f"batch {batch}:" in out  # verified at its own batch
    path = export_model(_model(), tmp_path / "m.pt2", "exported-program", dynamic_batch=False,
                        example_input=torch.randn(batch, 3, 6, 6))
    loaded = torch.export.load(str(path)).module()
    with pytest.raises(Exception):  # noqa: B017 - the program's own guard error, whatever its class
        loaded(torch.randn(batch + 1, 3, 6, 6))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load
def test_cli_exports_a_naflexvit_run_with_a_resized_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "naflexvit_base_patch16_siglip"  # bilinear, anti-aliased: no ONNX op for it
    model = create_model(name, **{**small_overrides(name), "pos_embed_grid_size": (3, 5)}).eval()
    fill_by_key(model)
    save_weights(model, tmp_path / "run" / "model.safetensors")
    for fmt, file in (("onnx", "m.onnx"), ("torchscript", "m.pt"), ("exported-program", "m.pt2")):
        argv = ["export", str(tmp_path / "run"), "--format", fmt, "-o", str(tmp_path / file)]
        code, out, err = _run(argv + (["--verify"] if fmt == "onnx" else []), capsys)
        assert code == 0, err
    assert max(verify_onnx(model, tmp_path / "m.onnx").values()) < 1e-4
    x = torch.randn(3, 3, 16, 24)
    with torch.no_grad():
        ref = model(x)
        for loaded in (torch.jit.load(str(tmp_path / "m.pt")), torch.export.load(str(tmp_path / "m.pt2")).module()):
            torch.testing.assert_close(loaded(x), ref, rtol=1e-5, atol=1e-5)


def test_write_is_atomic_and_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")

    def broken(model: object, args: object, f: str, **kw: object) -> None:
        Path(f).write_bytes(b"half")
        raise RuntimeError("exporter crashed")

    monkeypatch.setattr(torch.onnx, "export", broken)
    with pytest.raises(RuntimeError, match="crashed"):
        to_onnx(_model(), path)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["m.onnx"]


def test_written_file_has_ordinary_permissions(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        path = to_onnx(_model(), tmp_path / "m.onnx")
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("opset", [MIN_OPSET - 1, MAX_OPSET + 1])
def test_opset_out_of_range_is_named(opset: int, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="opset"):
        to_onnx(_model(), tmp_path / "m.onnx", opset=opset)


# ---------------------------------------------------------------------------- command line
def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_checkpoint_of_ours_run_folder_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(num_classes=7)
    save_weights(model, tmp_path / "run" / "model.safetensors")
    out_file = tmp_path / "out" / "m.onnx"  # parent folder created
    code, out, err = _run(["export", "--checkpoint", str(tmp_path / "run"), "--output", str(out_file), "--verify"],
                          capsys)
    assert code == 0, err
    assert "pixel_values [batch, 3, 6, 6] -> logits [batch, 7]" in out and "batch 3:" in out
    assert max(verify_onnx(model, out_file).values()) < 1e-4  # the file holds the checkpoint's weights
    import onnxruntime

    meta = onnxruntime.InferenceSession(str(out_file)).get_modelmeta().custom_metadata_map
    assert meta["model"] == DIGITS and '"num_classes": 7' in meta["config"] and "pixel_values" in meta["input"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load
def test_cli_run_folder_as_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``export RUN`` (as ``attn RUN IMAGE``): the run folder in MODEL's place is the checkpoint; no warning about
    random weights, and the file holds the run's weights."""
    model = _model(num_classes=7).eval()
    save_weights(model, tmp_path / "run" / "model.safetensors")
    out_file = tmp_path / "m.pt"
    code, out, err = _run(["export", str(tmp_path / "run"), "--format", "torchscript", "--output", str(out_file)],
                          capsys)
    assert code == 0, err
    assert "random" not in err and "logits [batch, 7]" in out
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(out_file))(x), model(x))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load
def test_cli_foreign_checkpoint_needs_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = create_model(DIGITS, num_classes=10).eval()
    fill_by_key(model)
    ckpt = tmp_path / "bare.pth"
    torch.save(model.state_dict(), ckpt)  # no record of the model
    code, _, err = _run(["export", "--checkpoint", str(ckpt), "-o", str(tmp_path / "m.pt")], capsys)
    assert code == 2 and "give MODEL" in err
    code, out, err = _run(["export", DIGITS, "--checkpoint", str(ckpt), "-o", str(tmp_path / "m.pt"),
                           "--format", "torchscript", "--num-classes", "10"], capsys)
    assert code == 0, err
    assert "forward(x [batch, 3, 8, 8]) -> logits [batch, 10]" in out
    x = _x(model, 3)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(tmp_path / "m.pt"))(x), model(x))


def test_cli_model_contradicting_the_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_weights(_model(), tmp_path / "model.safetensors")
    code, _, err = _run(["export", SWIN, "--checkpoint", str(tmp_path / "model.safetensors"),
                         "-o", str(tmp_path / "m.onnx")], capsys)
    assert code == 2 and "MODEL" in err and DIGITS in err


@pytest.mark.parametrize("argv, words", [
    (["--format", "tflite"], ["--format", "tflite"]),
    (["--opset", "9"], ["--opset", "9"]),
    (["--verify", "--format", "torchscript"], ["--verify", "--format onnx"]),
    (["--format", "exported-program"], ["--output", ".pt2"]),
    (["--batch-size", "4"], ["--batch-size", "--static-batch"]),
    (["--static-batch", "--format", "torchscript"], ["--static-batch", "torchscript"]),
])
def test_cli_bad_options_name_the_option(argv: list[str], words: list[str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code, _, err = _run(["export", DIGITS, "-o", str(tmp_path / "m.onnx"), *argv], capsys)
    except SystemExit as e:  # argparse's own choice check
        code, err = int(e.code or 0), capsys.readouterr().err
    assert code == 2 and all(w in err for w in words), err
    assert not (tmp_path / "m.onnx").exists()


def test_cli_unwritable_output_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    code, _, err = _run(["export", DIGITS, "-o", str(tmp_path / "file" / "m.onnx")], capsys)
    assert code == 2 and "--output" in err
    code, _, err = _run(["export", DIGITS, "-o", str(tmp_path)], capsys)
    assert code == 2 and "--output" in err and "folder" in err


def test_cli_missing_onnx_says_how_to_install(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ModuleNotFoundError
    code, _, err = _run(["export", DIGITS, "-o", str(tmp_path / "m.onnx")], capsys)
    assert code == 2 and "pip install vit_attention[onnx]" in err
    assert not (tmp_path / "m.onnx").exists()


def test_help_lists_every_option_with_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for opt in ("--checkpoint", "--format", "--output", "--opset", "--static-batch", "--batch-size", "--img-size",
                "--num-classes", "--verify"):
        assert opt in text
    assert "(default: onnx)" in text and "(default: 17)" in text and "pixel_values" in text
