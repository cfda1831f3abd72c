"""``vit-attention attn``: run folders, model / checkpoint agreement, random-weight warning, output place, errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit_attention as va
from vit_attention.analysis.commands import _heatmap_and_logits, build_model
from vit_attention.cli import main

CLASSES = [f"digit {i}" for i in range(10)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder holding a 1-channel 10-class digits ViT (as `train` writes it), with class names."""
    root = tmp_path_factory.mktemp("attn") / "run"
    torch.manual_seed(0)
    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=2).eval()
    va.save_weights(model, root / "model.safetensors", metadata={"classes": CLASSES, "mean": [0.3], "std": [0.3]})
    return root


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("img") / "digit.png"
    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8), mode="L").save(path)
    return path


def test_attn_on_a_run_folder_writes_under_it(run: Path, image: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["attn", "vit_digits_patch2_8", str(image), "--checkpoint", str(run)]) == 0
    out = capsys.readouterr()
    png = run / "attention_maps" / "digit_vit_digits_patch2_8_rollout.png"
    assert png.is_file() and str(png) in out.out
    assert "warning" not in out.err
    # the run folder in place of the model name: the run says which model it holds
    assert main(["attn", str(run), str(image), "--layer", "-1", "--head", "1", "--save-map"]) == 0
    capsys.readouterr()
    npy = run / "attention_maps" / "digit_vit_digits_patch2_8_layer-1_head1.npy"
    assert npy.is_file() and np.load(npy).shape == (4, 4)
    # the training checkpoint file works too; its maps go beside it
    assert main(["attn", "vit_digits_patch2_8", str(image), "--checkpoint", str(run / "model.safetensors"),
                 "--method", "mean"]) == 0
    assert (run / "attention_maps" / "digit_vit_digits_patch2_8_mean.png").is_file()


def test_attn_refuses_a_model_that_contradicts_the_checkpoint(run: Path, image: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    assert main(["attn", "swin_digits_patch2_window2_8", str(image), "--checkpoint", str(run),
                 "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "contradicts the checkpoint" in err and "describes model 'vit_digits_patch2_8'" in err
    assert "Traceback" not in err and not list(tmp_path.glob("*.png"))


def test_attn_model_args(run: Path, image: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--model-arg`` on ``attn``: builds the named model with those options (another mechanism here), may repeat
    what a run records, never contradict it (the option is named); ``attn_backend`` goes with a run too."""
    assert main(["attn", "vit_digits_patch2_8", str(image), "--output", str(tmp_path), "--model-arg", "in_chans=1",
                 "--model-arg", "attn_layer=talking_heads", "--model-arg", "depth=1", "--layer", "0"]) == 0
    assert "layer 1 of 1 (blocks.0.attn)" in capsys.readouterr().out and list(tmp_path.glob("*.png"))  # depth=1
    assert main(["attn", str(run), str(image), "--output", str(tmp_path / "same"), "--model-arg", "depth=2",
                 "--model-arg", "attn_backend=explicit"]) == 0
    capsys.readouterr()
    assert main(["attn", str(run), str(image), "--output", str(tmp_path / "other"), "--model-arg", "depth=3"]) == 2
    err = capsys.readouterr().err
    assert "--model-arg depth 3 contradicts the checkpoint" in err and "Traceback" not in err


def test_attn_on_a_non_image_file_names_it(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    for bad in (notes, run / "model.safetensors"):
        assert main(["attn", "vit_digits_patch2_8", str(bad), "--checkpoint", str(run), "--output", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"{bad} is not an image file" in err and "Traceback" not in err
    assert main(["attn", "vit_digits_patch2_8", str(tmp_path / "missing.png")]) == 2
    assert "image file not found" in capsys.readouterr().err


def test_attn_without_checkpoint_warns_and_says_so_in_the_title(image: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    titles = _spy_titles(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["attn", "vit_digits_patch2_8", str(image), "--img-size", "8"]) == 0
    err = capsys.readouterr().err
    assert "warning: no --checkpoint" in err and "random" in err
    assert (tmp_path / "attention_maps" / "digit_vit_digits_patch2_8_rollout.png").is_file()  # git-ignored folder
    assert "RANDOM weights" in titles[-1] and "predicted: class " in titles[-1]
    assert "rollout through all 4 layers" in titles[-1] and "mean over all 4 heads" in titles[-1]


def test_titles_name_layer_heads_and_prediction(run: Path, image: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import vit_attention.analysis.commands as commands

    seen: list[dict[str, str]] = []
    real = commands.save_attention_png

    def spy(*args: object, **kwargs: object) -> Path:
        seen.append({k: str(v) for k, v in kwargs.items()})
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(commands, "save_attention_png", spy)
    assert main(["attn", str(run), str(image), "--layer", "0", "--head", "1", "--output", str(tmp_path)]) == 0
    model = build_model(None, checkpoint=run)
    from vit_attention.analysis.commands import load_image

    x, _ = load_image(image, model.data_config)
    _, _, _, logits = _heatmap_and_logits(model, x, layer=0, head=1, method="auto")
    k = int(logits.argmax())
    title, what = seen[-1]["title"], seen[-1]["description"]
    assert f"predicted: {CLASSES[k]} (" in title and "weights: run/" in title
    assert what.startswith("layer 1 of 2 (blocks.0.attn)") and "class token" in what and "head 1 (of heads 0-3)" in what
    assert seen[-1]["colorbar_label"]
    # the swin family: no class token, the mean over layers of the attention each patch receives
    swin = va.create_model("swin_digits_patch2_window2_8", num_classes=10, in_chans=1).eval()
    va.save_weights(swin, tmp_path / "swin" / "model.safetensors")
    assert main(["attn", str(tmp_path / "swin"), str(image)]) == 0
    assert "attention each patch receives" in seen[-1]["description"]
    assert "mean over all 4 attention layers" in seen[-1]["description"]
    with Image.open(tmp_path / "swin" / "attention_maps" / "digit_swin_digits_patch2_window2_8_mean.png") as im:
        assert im.size[0] > 600  # input, overlay and colour bar side by side


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ViT trained 1 epoch on a 3-class RGB image folder at 16x16 (crop_pct 0.875, its own mean / std)."""
    from train._utils import TINY, make_image_folder  # (tests/ is on the path)

    root = tmp_path_factory.mktemp("folder_run")
    data = make_image_folder(root / "images", {"cat": 6, "dog": 6, "fox": 6})
    out = root / "run"
    assert main(["train", *TINY, "--model-arg", "patch_size=4", "--img-size", "16", "--epochs", "1",
                 "--batch-size", "9", "--lr", "0.05", "--data", str(data), "--val-fraction", "0.34", "--no-progress",
                 "--no-plot", "--output", str(out)]) == 0
    return out


def test_attn_and_predict_give_the_same_probabilities(folder_run: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    """One preprocessing for both: the model's eval data config (resize, centre crop, the run's mean / std)."""
    from vit_attention.analysis.commands import load_image

    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (23, 40, 3), dtype=np.uint8)  # wide: cropping and squashing differ
    pixels[:, :8] = 255
    path = tmp_path / "wide.png"
    Image.fromarray(pixels).save(path)
    capsys.readouterr()
    for weights in (folder_run, folder_run / "checkpoint.safetensors"):
        assert main(["predict", str(path), "--checkpoint", str(weights), "--topk", "3"]) == 0
        shown = dict(re.findall(r"(cat|dog|fox) \((\d\.\d{3})\)", capsys.readouterr().out))
        assert len(shown) == 3
        assert main(["attn", str(weights), str(path), "--output", str(tmp_path / "maps")]) == 0
        label, p = re.search(r"predicted (cat|dog|fox) (\d\.\d{3})\)", capsys.readouterr().out).groups()  # type: ignore[union-attr]
        assert shown[label] == p and float(p) == max(float(v) for v in shown.values())
        # attn's reading at full precision against predict's printed probabilities
        model = build_model(None, checkpoint=weights)
        x, img = load_image(path, model.data_config)
        assert x.shape == (1, 3, 16, 16) and img.shape == (3, 16, 16)
        _, _, _, logits = _heatmap_and_logits(model, x, layer=None, head=None, method="auto")
        prob = logits.float().softmax(-1)[0]
        for i, name in enumerate(["cat", "dog", "fox"]):
            assert abs(prob[i].item() - float(shown[name])) <= 5e-4, (weights.name, name)


def test_attn_writes_to_output_and_refuses_out(run: Path, image: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    """``--output DIR`` is the one spelling: ``--out`` (nor its abbreviation of ``--output``) is no option of attn."""
    png = "digit_vit_digits_patch2_8_rollout.png"
    assert main(["attn", str(run), str(image), "--output", str(tmp_path / "new")]) == 0
    assert (tmp_path / "new" / png).is_file()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["attn", str(run), str(image), "--out", str(tmp_path / "old")])
    assert e.value.code == 2 and "unrecognized arguments: --out" in capsys.readouterr().err
    assert not (tmp_path / "old").exists()
    with pytest.raises(SystemExit):
        main(["attn", "--help"])
    text = capsys.readouterr().out
    assert "--output" in text and "--out " not in text


def _spy_titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record ``title | description | colorbar label`` of every attention PNG the command writes."""
    import vit_attention.analysis.commands as commands

    titles: list[str] = []
    real = commands.save_attention_png

    def spy(*args: object, **kwargs: object) -> Path:
        titles.append(f"{kwargs['title']} | {kwargs['description']} | {kwargs['colorbar_label']}")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(commands, "save_attention_png", spy)
    return titles


def test_rollout_without_a_class_token_is_not_labelled_class_token(image: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A GAP ViT (no prefix tokens): the rollout map is what each patch receives, and says so; with a class
    token it stays class token -> patches."""
    titles = _spy_titles(monkeypatch)
    root = tmp_path / "gap"
    va.save_weights(va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=2, class_token=False,
                                    global_pool="avg"), root / "model.safetensors")
    assert main(["attn", str(root), str(image), "--method", "rollout", "--output", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert "class token" in titles[-1] and "class token -> patches" not in titles[-1]
    assert "no class token: the rolled-out attention each patch receives, mean over all tokens" in titles[-1]
    assert "share of the class token's attention" not in titles[-1]
    cls = tmp_path / "cls"
    va.save_weights(va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=2),
                    cls / "model.safetensors")
    assert main(["attn", str(cls), str(image), "--method", "rollout", "--output", str(tmp_path / "m")]) == 0
    assert "class token -> patches" in titles[-1] and "share of the class token's attention" in titles[-1]


def test_token_merging_shows_in_the_picture_and_the_file_name(run: Path, image: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    titles = _spy_titles(monkeypatch)
    assert main(["attn", str(run), str(image), "--tome", "2", "--output", str(tmp_path)]) == 0
    assert "ToMe r=2" in titles[-1].split(" | ")[0] and "ToMe r=2" in titles[-1].split(" | ")[1]
    assert (tmp_path / "digit_vit_digits_patch2_8_rollout_tome2.png").is_file()
    assert main(["attn", str(run), str(image), "--output", str(tmp_path)]) == 0  # without: neither
    assert "ToMe" not in titles[-1] and (tmp_path / "digit_vit_digits_patch2_8_rollout.png").is_file()


def test_registers_without_a_class_token_are_not_called_a_class_token(image: Path) -> None:
    """Registers only: no map reads a register's row as if it were a class token's. Rollout, mean and layer
    maps show what each patch receives (mean over all queries), as for a model without prefix tokens, and the
    library's recorder agrees (no class token, the received map)."""
    from vit_attention.analysis.attention_maps import record_attention

    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=2, class_token=False,
                            global_pool="avg", reg_tokens=2).eval()
    x = torch.randn(1, 1, 8, 8)
    for method, layer in (("auto", None), ("rollout", None), ("mean", None), ("layer", -1)):
        _, what, tag, _ = _heatmap_and_logits(model, x, layer=layer, head=None, method=method)
        assert (tag == "rollout") == (method == "rollout"), (method, tag)
        assert "class token to" not in what and "class token's" not in what and "register token 0" not in what
        assert "receives" in what, what
    with record_attention(model) as rec, torch.no_grad():
        model(x)
    assert rec.records and not any(r.has_class_token for r in rec.records)
    last = rec.layer(-1)
    assert torch.equal(rec.image_map(-1), last.received())  # not register 0's row
    assert not torch.allclose(last.received(), last.query_map("cls"))
