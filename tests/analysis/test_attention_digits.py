"""Attention maps of a model TRAINED on the embedded digits data (sklearn's 8x8 digits).

A tiny ViT (16x16 input = digits upsampled 2x, 4x4 patches, 2 blocks) trains for a few seconds;
its maps must be deterministic for a fixed seed and put more attention on the digit's strokes
than their share of the image area (an untrained model does not).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from vit_attention import create_model, save_weights
from vit_attention.analysis import record_attention
from vit_attention.analysis.commands import attention_heatmap, build_model, load_image
from vit_attention.cli import main

pytestmark = pytest.mark.slow

STEPS, SEED = 300, 0
NORM = ([0.5], [0.5])


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0  # [n, 1, 8, 8] in [0, 1]
    return F.interpolate(x, scale_factor=2, mode="nearest"), torch.tensor(d.target)  # [n, 1, 16, 16]


def _new_model() -> torch.nn.Module:
    return create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, in_chans=1, num_classes=10, depth=2,
                        embed_dim=32, num_heads=2)


def _train(seed: int = SEED) -> torch.nn.Module:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest and bit-reproducible
    try:
        torch.manual_seed(seed)
        x, y = _digits()
        x = (x - 0.5) / 0.5
        model = _new_model()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
        g = torch.Generator().manual_seed(seed)
        for _ in range(STEPS):
            idx = torch.randint(0, 1500, (64,), generator=g)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


@pytest.fixture(scope="module")
def trained() -> torch.nn.Module:
    return _train()


def _stroke_mass(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Share of rollout mass on non-zero pixels, and those pixels' share of the area, per image."""
    with record_attention(model) as rec, torch.no_grad():
        model((x - 0.5) / 0.5)
    heat = F.interpolate(rec.rollout()[:, None], size=x.shape[-2:], mode="nearest")[:, 0]  # [B, 16, 16]
    heat = heat / heat.sum(dim=(-2, -1), keepdim=True)
    strokes = (x[:, 0] > 0).float()
    return (heat * strokes).sum(dim=(-2, -1)), strokes.mean(dim=(-2, -1))


def test_trained_attention_concentrates_on_strokes(trained):
    x, y = _digits()
    held_out = x[1500:]
    with torch.no_grad():
        acc = (trained((held_out - 0.5) / 0.5).argmax(-1) == y[1500:]).float().mean()
    assert acc > 0.5  # it did learn
    mass, share = _stroke_mass(trained, held_out)
    assert mass.mean() > share.mean() + 0.15  # measured: ~0.77 vs 0.50
    assert (mass > share).float().mean() > 0.9
    untrained_mass, _ = _stroke_mass(_new_model().eval(), held_out)
    assert mass.mean() > untrained_mass.mean() + 0.1  # training, not the architecture, put it there


def test_maps_are_deterministic_for_a_fixed_seed(trained):
    x, _ = _digits()
    again = _train()
    for model_a, model_b in ((trained, again),):
        for (ka, a), (kb, b) in zip(model_a.state_dict().items(), model_b.state_dict().items()):
            assert ka == kb and torch.equal(a, b), ka
    heat_a, *_ = attention_heatmap(trained, (x[1500:1501] - 0.5) / 0.5)
    heat_b, *_ = attention_heatmap(again, (x[1500:1501] - 0.5) / 0.5)
    assert torch.equal(heat_a, heat_b)


def test_attn_command_writes_png_from_a_checkpoint(trained, tmp_path, capsys):
    x, _ = _digits()
    ckpt = save_weights(trained, tmp_path / "digits.safetensors", metadata={"mean": NORM[0], "std": NORM[1]})
    img_path = tmp_path / "digit.png"
    Image.fromarray((x[1500, 0].numpy() * 255).round().astype(np.uint8), mode="L").save(img_path)
    out = tmp_path / "maps"
    assert main(["attn", "vit_tiny_patch16_224", str(img_path), "--checkpoint", str(ckpt), "--output", str(out),
                 "--save-map"]) == 0
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 1 and "rollout" in pngs[0].name
    with Image.open(pngs[0]) as im:
        assert im.size[0] > 100 and im.size[1] > 100
    saved = np.load(pngs[0].with_suffix(".npy"))
    rebuilt = build_model("vit_tiny_patch16_224", checkpoint=ckpt)
    x_png, _ = load_image(img_path, rebuilt.data_config)  # what attn reads: the model's eval data config
    expected, *_ = attention_heatmap(rebuilt, x_png)
    np.testing.assert_allclose(saved, expected.numpy(), rtol=1e-5, atol=1e-6)
    # one layer and one head
    assert main(["attn", "vit_tiny_patch16_224", str(img_path), "--checkpoint", str(ckpt), "--output", str(out),
                 "--layer", "-1", "--head", "1"]) == 0
    assert (out / "digit_vit_tiny_patch16_224_layer-1_head1.png").is_file()
    assert main(["attn", "vit_tiny_patch16_224", str(img_path), "--checkpoint", str(ckpt), "--layer", "7",
                 "--output", str(out)]) == 2
    assert "out of range" in capsys.readouterr().err


def test_attn_on_a_checkpoint_from_the_training_engine(tmp_path, capsys):
    """`vit-attention train` output (model.safetensors with config, mean / std) -> `vit-attention attn`."""
    from vit_attention.train import TrainConfig, train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(TrainConfig(model="vit_digits_patch2_8", epochs=1, output=str(tmp_path / "run"), progress=False,
                          plot=False, seed=0))
    finally:
        torch.set_num_threads(threads)
    ckpt = tmp_path / "run" / "model.safetensors"
    x, _ = _digits()
    img_path = tmp_path / "seven.png"
    Image.fromarray((x[7, 0, ::2, ::2].numpy() * 255).round().astype(np.uint8), mode="L").save(img_path)  # 8x8
    capsys.readouterr()
    assert main(["attn", "vit_digits_patch2_8", str(img_path), "--checkpoint", str(ckpt), "--output",
                 str(tmp_path / "maps"), "--save-map"]) == 0
    (png,) = (tmp_path / "maps").glob("*.png")
    heat = np.load(png.with_suffix(".npy"))
    model = build_model("vit_digits_patch2_8", checkpoint=ckpt)
    assert tuple(model.cfg.img_size) == (8, 8) and model.cfg.in_chans == 1  # rebuilt from the checkpoint's config
    mean, std = model.normalization
    assert mean != (0.5,)  # the data set's statistics, stored by the engine
    x_png, _ = load_image(img_path, model.data_config)
    expected, _, method = attention_heatmap(model, x_png)
    assert method == "rollout" and heat.shape == (4, 4)
    np.testing.assert_allclose(heat, expected.numpy(), rtol=1e-5, atol=1e-7)
