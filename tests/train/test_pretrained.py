"""``train --pretrained``: fine-tuning starts from the weights (a file here; the hub path is create_model's, tested
in tests/weights), re-makes the head, fits the input channels, normalises with the weights' statistics, and a
resumed run never reloads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vit_attention as va
from vit_attention.cli import main

from ._utils import TINY, TINY_KWARGS

QUICK = [*TINY, "--epochs", "1", "--batch-size", "128", "--no-progress", "--no-plot"]
# a SigLIP tower (mean / std 0.5: not the image folders' ImageNet default), reduced
SIGLIP = "vit_base_patch16_siglip_224"
SIGLIP_ARGS = {"depth": 1, "embed_dim": 32, "num_heads": 2}


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model.safetensors"))


def test_fine_tuning_starts_from_the_weights(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *QUICK, "--output", str(tmp_path / "a")]) == 0
    start = tmp_path / "a" / "model.safetensors"
    # a learning rate too small to move anything: the fine-tuned run ends where its weights began
    still = ["--lr", "1e-12", "--min-lr", "1e-12"]
    assert main(["train", *QUICK, *still, "--pretrained", str(start), "--output", str(tmp_path / "b")]) == 0
    assert main(["train", *QUICK, *still, "--output", str(tmp_path / "scratch")]) == 0
    a, b, scratch = _weights(tmp_path / "a"), _weights(tmp_path / "b"), _weights(tmp_path / "scratch")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    assert any(not torch.allclose(scratch[k], a[k]) for k in a)  # without --pretrained: a fresh model
    accs = [json.loads((tmp_path / r / "metrics.json").read_text())[-1]["test_acc"] for r in ("a", "b")]
    assert accs[0] == accs[1]
    saved = json.loads((tmp_path / "b" / "config.json").read_text())["train"]
    assert saved["pretrained"] == str(start)


def test_pretrained_rgb_weights_on_a_grey_folder_and_an_rgb_one(tmp_path: Path, image_folder: Path) -> None:
    tower = va.create_model(SIGLIP, num_classes=1000, **SIGLIP_ARGS)
    va.save_weights(tower, tmp_path / "tower.safetensors")
    args = ["--model", SIGLIP, *[a for k, v in SIGLIP_ARGS.items() for a in ("--model-arg", f"{k}={v}")],
            "--img-size", "32", "--data", str(image_folder), "--epochs", "1", "--batch-size", "8",
            "--lr", "1e-12", "--min-lr", "1e-12", "--no-progress", "--no-plot",
            "--pretrained", str(tmp_path / "tower.safetensors")]
    own = tower.state_dict()
    for chans in ("3", "1"):
        out = tmp_path / f"run{chans}"
        assert main(["train", *args, "--in-chans", chans, "--output", str(out)]) == 0
        got = _weights(out)
        assert got["head.weight"].shape == (3, 32)  # the folder's three classes: a new head
        torch.testing.assert_close(got["blocks.0.mlp.fc1.weight"], own["blocks.0.mlp.fc1.weight"], rtol=0, atol=1e-6)
        conv = own["patch_embed.proj.weight"]
        torch.testing.assert_close(got["patch_embed.proj.weight"], conv if chans == "3" else conv.sum(1, keepdim=True),
                                   rtol=0, atol=1e-5)
        config = json.loads((out / "config.json").read_text())
        # RGB: normalised as the tower was trained (SigLIP: 0.5), not with the folders' ImageNet default
        want = [0.5, 0.5, 0.5] if chans == "3" else [0.5]
        assert config["mean"] == want and config["std"] == want


def test_resumed_fine_tuning_does_not_reload_the_weights(tmp_path: Path) -> None:
    start = tmp_path / "start.safetensors"
    va.save_weights(va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, **TINY_KWARGS), start)
    two = [*TINY, "--epochs", "2", "--batch-size", "128", "--no-progress", "--no-plot", "--pretrained", str(start)]
    assert main(["train", *two, "--output", str(tmp_path / "ref")]) == 0
    assert main(["train", *two, "--stop-after", "12", "--output", str(tmp_path / "cut")]) == 0
    start.unlink()  # the run continues from its checkpoint, which holds the weights
    assert main(["train", *two, "--resume", "--output", str(tmp_path / "cut")]) == 0
    ref, cut = _weights(tmp_path / "ref"), _weights(tmp_path / "cut")
    for k in ref:
        torch.testing.assert_close(cut[k], ref[k], rtol=0, atol=0, msg=k)


def test_a_tagged_name_trains_like_eval_and_predict_take_it(tmp_path: Path, image_folder: Path) -> None:
    tiny = {"depth": 1, "embed_dim": 32, "num_heads": 2}
    start = tmp_path / "deit.safetensors"
    va.save_weights(va.create_model("deit_tiny_patch16_224", **tiny), start)
    args = ["--model", "deit_tiny_patch16_224.fb_in1k",
            *[a for k, v in tiny.items() for a in ("--model-arg", f"{k}={v}")], "--img-size", "32",
            "--data", str(image_folder), "--epochs", "1", "--batch-size", "8", "--no-progress", "--no-plot",
            "--pretrained", str(start), "--output", str(tmp_path / "run")]
    assert main(["train", *args]) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model_name"] == "deit_tiny_patch16_224" and config["train"]["model"].endswith(".fb_in1k")
    assert va.load_model(tmp_path / "run").num_classes == 3


def test_a_tag_trained_at_another_size_sets_the_folders_default(image_folder: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    from vit_attention.train.config import TrainConfig
    from vit_attention.train.distributed import DistInfo
    from vit_attention.train.engine import _load_data

    # MobileViT v2 1.5x: the preset is 256 px, its cvnets_in22k_ft_in1k_384 weights were trained at 384
    name = "mobilevitv2_150.cvnets_in22k_ft_in1k_384"
    data = _load_data(TrainConfig(model=name, data=str(image_folder), batch_size=8), DistInfo())
    assert data.img_size == (384, 384)
    assert capsys.readouterr().out.startswith(f"input 384x384 px (the input size of {name}'s weights")
    # the bare preset, or an explicit size, keep theirs
    assert _load_data(TrainConfig(model="mobilevitv2_150", data=str(image_folder), batch_size=8),
                      DistInfo()).img_size == (256, 256)
    assert _load_data(TrainConfig(model=name, data=str(image_folder), batch_size=8, img_size=64),
                      DistInfo()).img_size == (64, 64)


def test_compare_mechanisms_from_pretrained_weights(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``compare --attention A,B --pretrained FILE``: each mechanism starts from the file's weights (the swapped one
    through the transfer: its projections are the file's, its new parameters neutral)."""
    start = va.create_model("vit_digits_patch2_8_gap", num_classes=10)
    va.save_weights(start, tmp_path / "start.safetensors")
    out = tmp_path / "cmp"
    assert main(["compare", "--attention", "mhsa,talking_heads", "--quick", "--batch-size", "128",
                 "--lr", "1e-12", "--min-lr", "1e-12", "--no-progress", "--no-plot",
                 "--pretrained", str(tmp_path / "start.safetensors"), "--output", str(out)]) == 0
    err = capsys.readouterr().err  # the transfer's report: a plain warning line on the command line
    assert any(line.startswith("warning: ") and "attn_layer='mhsa' transferred to attn_layer='talking_heads'" in line
               for line in err.splitlines())
    own = start.state_dict()
    runs = sorted(out.glob("*-vit_digits_patch2_8_gap"))
    assert len(runs) == 2
    for run in runs:
        got = _weights(run)
        for key in ("patch_embed.proj.3.weight", "blocks.3.attn.qkv.weight", "blocks.3.attn.proj.bias"):
            torch.testing.assert_close(got[key], own[key], rtol=0, atol=1e-6, msg=f"{run.name} {key}")
    heads = _weights(runs[1])["blocks.0.attn.proj_l.weight"]
    torch.testing.assert_close(heads, torch.eye(heads.shape[0]), rtol=0, atol=1e-6)  # the identity mixing
    rows = json.loads((out / "compare.json").read_text())
    assert rows[0]["test_acc"] == pytest.approx(rows[1]["test_acc"], abs=0.01)  # the same model, to rounding


def test_pretrained_run_of_another_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`train --model A --pretrained RUN` where RUN holds a B: one line saying it contradicts, no traceback, no
    run folder."""
    run = tmp_path / "vit"
    va.save_weights(va.create_model("vit_digits_patch2_8", depth=1, num_classes=10, in_chans=1),
                    run / "model.safetensors")
    out = tmp_path / "deit"
    assert main(["train", *QUICK, "--model", "deit_digits_distilled_patch2_8", "--pretrained", str(run),
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "shape mismatch" not in err
    assert (f"--pretrained {run} holds a vit_digits_patch2_8 (the file records its model), which contradicts "
            "--model deit_digits_distilled_patch2_8") in err
    assert not out.exists()
    # a foreign file (no record of its model) that does not fit: one line too, the first problem and a count
    bare = tmp_path / "bare.pth"
    torch.save(va.create_model("vit_digits_patch2_8", depth=1, num_classes=10, in_chans=1).state_dict(), bare)
    assert main(["train", *QUICK, "--model", "deit_digits_distilled_patch2_8", "--pretrained", str(bare),
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--pretrained {bare} does not fit --model deit_digits_distilled_patch2_8" in err
    assert "more)" in err
    assert not out.exists()
