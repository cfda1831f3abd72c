import os
import subprocess
import sys

import pytest

from vit_attention.cli import main


def test_summary_prints_params_and_output_shape(capsys):
    assert main(["summary", "deit_tiny_patch16_224", "--img-size", "32", "--num-classes", "10"]) == 0
    out = capsys.readouterr().out
    assert "output shape: [1, 10]" in out and "parameters:" in out


def test_summary_meta_for_giant_models(capsys):
    assert main(["summary", "vit_22b", "--meta"]) == 0
    out = capsys.readouterr().out
    assert "vit_22b_patch14_224" in out and "22,209," in out


def test_unknown_model_is_a_clear_error(capsys):
    assert main(["summary", "vit_bse_patch16_224"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'vit_bse_patch16_224'" in err and "vit_base_patch16_224" in err


def test_lists(capsys):
    assert main(["models", "deit_*"]) == 0
    assert "deit_tiny_distilled_patch16_224" in capsys.readouterr().out
    assert main(["attention"]) == 0
    assert "mhsa" in capsys.readouterr().out


@pytest.mark.slow
def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "vit_attention.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "summary" in out.stdout


def test_lists_that_match_nothing_say_so(capsys):
    assert main(["models", "nosuch*"]) == 1
    err = capsys.readouterr().err
    assert "no registered model matches 'nosuch*'" in err
    assert main(["attention", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert "no registered mechanism matches 'nosuch'" in err and "mhsa" in err


def test_a_glob_that_matches_no_start_lists_the_names_holding_it(capsys):
    assert main(["models", "dino*"]) == 0  # the DINO names read vit_base_patch14_dinov2 ...
    out, err = capsys.readouterr()
    assert "no registered model matches 'dino*'; these match '*dino*'" in err
    names = out.split()
    assert "vit_base_patch14_dinov2" in names and all("dino" in n for n in names)


@pytest.mark.slow
def test_a_reader_that_leaves_early_is_not_an_error():
    """`vit-attention models | head -1`: no BrokenPipeError traceback, exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "vit_attention.cli", "models", "--aliases"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader leaves before the writer is done (here: before it starts)
    err = proc.stderr.read() if proc.stderr else b""
    proc.wait(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"BrokenPipeError" not in err and b"Traceback" not in err


def test_summary_negative_batch_is_a_clear_error(capsys):
    assert main(["summary", "deit_tiny_patch16_224", "--img-size", "32", "--batch-size", "-1"]) == 2
    assert "--batch-size must be >= 0, got -1" in capsys.readouterr().err


def test_version_prints_the_package_version(capsys):
    import re
    from pathlib import Path

    import pytest

    import vit_attention

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"vit-attention {vit_attention.__version__}\n"
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()  # (no tomllib on 3.10)
    assert re.search(r'^version = "(.+)"$', pyproject, re.M).group(1) == vit_attention.__version__  # one version


def test_every_command_and_option_has_help_without_markup():
    """Walk the whole parser: every sub-command has a help line, every argument (but -h) a plain help text."""
    import argparse
    import re

    from vit_attention.cli import build_parser

    markup = re.compile(r"``|:(func|class|mod|meth|data|attr|ref):`")
    problems: list[str] = []

    def walk(parser: argparse.ArgumentParser, where: str) -> None:
        if parser.description and markup.search(parser.description):
            problems.append(f"{where}: description has markup: {parser.description!r}")
        parser.format_help()  # renders (a stray % in a help text raises here)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    if not (helps.get(name) or "").strip():
                        problems.append(f"{where} {name}: no help line in the command list")
                    walk(sub, f"{where} {name}")
                continue
            if action.help == argparse.SUPPRESS:  # hidden on purpose
                continue
            name = "/".join(action.option_strings) or action.dest
            if not (action.help or "").strip():
                problems.append(f"{where} {name}: no help")
            elif markup.search(action.help):
                problems.append(f"{where} {name}: help has markup: {action.help!r}")

    parser = build_parser()
    walk(parser, "vit-attention")
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"train", "eval", "predict", "attn", "generate", "export", "bench", "summary"} <= set(commands)
    assert not problems, "\n".join(problems)


def test_generate_without_checkpoint_warns_like_export(tmp_path, capsys):
    import vit_attention as va

    assert main(["generate", "igpt_digits", "--num", "1", "--output", str(tmp_path / "noise.png")]) == 0
    out = capsys.readouterr()
    assert "warning: no --checkpoint: igpt_digits samples from its initial (random) weights" in out.err
    assert (tmp_path / "noise.png").is_file() and "wrote" in out.out
    va.save_weights(va.create_model("igpt_digits"), tmp_path / "run" / "model.safetensors")
    assert main(["generate", str(tmp_path / "run"), "--num", "1", "--output", str(tmp_path / "grid.png")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_models_pretrained_lists_the_tags_that_load(capsys):
    assert main(["models", "--pretrained", "deit_tiny_patch16_224"]) == 0  # a bare name: its tags
    assert capsys.readouterr().out.split() == ["deit_tiny_patch16_224.fb_in1k"]
    assert main(["models", "--pretrained", "vit_base_patch16_224*"]) == 0
    listed = capsys.readouterr().out.split()
    assert "vit_base_patch16_224.augreg_in21k" in listed and all("." in n for n in listed)
    assert main(["models", "--pretrained", "vit_digits*"]) == 1  # the digits presets publish no weights
    assert "no registered model with published weights matches 'vit_digits*'" in capsys.readouterr().err


def _size_options() -> list[tuple[str, str]]:
    """(sub-command, option) for every size option of every sub-command (``--img-size``)."""
    import argparse

    from vit_attention.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    return [(name, opt) for name, sub in commands.items() for action in sub._actions
            for opt in action.option_strings if opt == "--img-size"]


def test_size_options_refuse_zero_and_negatives_in_every_command(capsys):
    """`train --img-size 0` (digits or a folder), `compare --quick --img-size 0`, `summary`, `attn` ...: the same
    argparse error naming the option, before anything is built."""
    import pytest

    found = _size_options()
    assert {"train", "compare", "summary", "export", "info", "trace"} <= {name for name, _ in found}
    for name, opt in found:
        for bad in ("0", "-3"):
            with pytest.raises(SystemExit) as e:
                main([name, opt, bad])
            err = capsys.readouterr().err
            assert e.value.code == 2, (name, bad)
            assert f"argument {opt}: expected a positive integer" in err and bad in err, (name, err)


def test_export_refuses_num_classes_contradicting_the_run(tmp_path, capsys):
    """A run of 10 classes exported with --num-classes 5: refused naming the option (no random head)."""
    import vit_attention as va

    va.save_weights(va.create_model("vit_digits_patch2_8", num_classes=10), tmp_path / "run" / "model.safetensors")
    out = tmp_path / "m.pt"
    assert main(["export", str(tmp_path / "run"), "--num-classes", "5", "--format", "torchscript",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--num-classes 5 contradicts the checkpoint" in err and "num_classes=10" in err
    assert not out.exists()


def test_options_without_a_sub_command_go_to_train(tmp_path, capsys):
    """`vit-attention --epochs 1`: the default sub-command (train) with those options, not 'invalid choice'."""
    assert main(["--epochs", "1", "--model-arg", "depth=1", "--batch-size", "128", "--no-progress", "--no-plot",
                 "--output", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "epoch 1/1:" in out and out.strip().splitlines()[-1].startswith("test accuracy: ")


def test_summary_needs_a_model_and_names_the_argument(capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["summary"])
    assert e.value.code == 2 and "the following arguments are required: model" in capsys.readouterr().err


def test_summary_info_and_trace_take_a_run_folder(tmp_path, capsys):
    """The run records its model: summary / info / trace build that one (as attn, eval, generate take runs)."""
    import vit_attention as va

    run = tmp_path / "run"
    va.save_weights(va.create_model("vit_digits_patch2_8", depth=1, num_classes=7, in_chans=1),
                    run / "model.safetensors")
    assert main(["summary", str(run)]) == 0
    out = capsys.readouterr().out
    assert "model:        vit_digits_patch2_8" in out and "output shape: [1, 7]" in out and "[1, 1, 8, 8]" in out
    assert main(["info", str(run)]) == 0
    out = capsys.readouterr().out
    assert "vit_digits_patch2_8" in out and "output shape:  [1, 7]" in out
    assert main(["trace", str(run), "--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert "[1, 1, 8, 8] -> [1, 7]" in out and "blocks.1" not in out
    assert main(["trace", str(run), "--model-arg", "depth=3"]) == 2  # may repeat the run, never contradict it
    assert "--model-arg depth 3 contradicts the checkpoint" in capsys.readouterr().err


def test_trace_negative_depth_is_an_error(capsys):
    assert main(["trace", "vit_digits_patch2_8", "--depth", "-1"]) == 2
    assert "--depth must be >= 0" in capsys.readouterr().err


def test_command_line_errors_use_command_line_spellings(tmp_path, capsys):
    """An unknown mechanism and missing hub weights point at the commands and options, not Python calls."""
    from pathlib import Path

    from vit_attention.weights.hub import _how_to_place

    assert main(["summary", "vit_digits_patch2_8", "--model-arg", "attn_layer=nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown attention mechanism 'nosuch'" in err and "`vit-attention attention` lists them" in err
    assert "list_attention()" not in err
    advice = _how_to_place("timm/vit_tiny_patch16_224.augreg_in21k", "model.safetensors", Path("/cache"))
    assert "--pretrained PATH" in advice and "pretrained=" not in advice


def test_a_read_only_file_system_is_not_called_a_permission_problem(tmp_path, capsys, monkeypatch):
    import os

    class ReadOnly:
        f_flag = os.ST_RDONLY

    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p) == str(tmp_path) else real_access(p, mode))
    monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly())
    assert main(["export", "vit_digits_patch2_8", "-o", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert "read-only file system" in err and "--output" in err and "no permission" not in err


def test_a_decompression_bomb_is_called_too_large_not_a_non_image(tmp_path, monkeypatch):
    import numpy as np
    import pytest
    from PIL import Image

    from vit_attention.data import read_image

    path = tmp_path / "big.png"
    Image.fromarray(np.zeros((64, 64), dtype=np.uint8), mode="L").save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 4,096 pixels: over twice the limit, as a real bomb is
    with pytest.raises(ValueError, match="too large to read safely") as e:
        read_image(path)
    assert "not an image file" not in str(e.value) and "MAX_IMAGE_PIXELS" in str(e.value)


@pytest.mark.slow  # starts two interpreters
def test_a_torchrun_rank_ends_with_the_command_s_code_without_finalizing_the_interpreter():
    # As a torchrun rank (WORLD_SIZE > 1) the program ends itself once the command is done, so Gloo's worker
    # threads cannot abort it while the interpreter finalizes; its buffered output is flushed, its exit code kept.
    script = ("import atexit, sys; from vit_attention.cli import main; "
              "atexit.register(lambda: print('finalized', flush=True)); print('buffered'); "
              "sys.argv = ['vit-attention', 'summary', 'no_such_model']; code = main(); "
              "print('returned', code, flush=True); sys.exit(code)")
    for world, ends_itself in (("2", True), ("1", False)):
        env = {**os.environ, "WORLD_SIZE": world}
        env.pop("PYTHONUNBUFFERED", None)  # stdout to a pipe is block-buffered: only a flush gets it out
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 2 and "no_such_model" in out.stderr, out.stderr
        assert "buffered" in out.stdout
        assert ("finalized" in out.stdout) is not ends_itself and ("returned" in out.stdout) is not ends_itself
