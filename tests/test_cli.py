import subprocess
import sys

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
