"""Pretrained RGB weights into a model of other ``in_chans`` (timm's ``in_chans=1`` fine-tuning): the loader
fits the image-reading convolution, for every family that reads images with one."""

from __future__ import annotations

import pytest
import torch
from model_outputs import build, first_preset_per_family, small_overrides

import vit_attention as va
from vit_attention.weights import load_weights
from vit_attention.weights.load import adapt_input_channels

FAMILIES = first_preset_per_family()


def _reads_images_with_a_conv(name: str) -> bool:
    """The model has a dense 2-D convolution over its ``in_chans`` image channels. Not so where the image goes
    through something else first: iGPT quantises pixels to colour tokens (one embedding table), NaFlexViT
    patchifies and projects with a Linear (any patch size)."""
    with torch.device("meta"):
        model = va.create_model(name, **small_overrides(name))
    return any(isinstance(m, torch.nn.Conv2d) and m.in_channels == model.cfg.in_chans and m.groups == 1
               for m in model.modules())


@pytest.mark.parametrize("family", sorted(f for f, n in FAMILIES.items() if _reads_images_with_a_conv(n)))
def test_rgb_weights_load_into_one_and_six_channels(family: str) -> None:
    name = FAMILIES[family]
    rgb, x = build(name, small_overrides(name))
    state = rgb.state_dict()
    grey = va.create_model(name, **{**small_overrides(name), "in_chans": 1}).eval()
    report = load_weights(grey, state)  # strict: every key fits
    assert any("adapted from 3 to 1 channels" in n for n in report.notes), report
    six = va.create_model(name, **{**small_overrides(name), "in_chans": 6}).eval()
    load_weights(six, state)
    g = x[:, :1]
    with torch.no_grad():
        # a grey image through the summed kernels is that image as RGB (g, g, g) through the RGB model; six
        # channels (x, x) through the repeated, halved kernels are x through the RGB model
        torch.testing.assert_close(grey(g), rgb(g.expand(-1, 3, -1, -1)), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(six(torch.cat([x, x], 1)), rgb(x), rtol=1e-4, atol=1e-5)


def test_only_the_input_convolution_of_a_three_channel_checkpoint_changes() -> None:
    model = va.create_model("vit_digits_patch2_8", in_chans=1)  # a conv stem: the first conv reads the image
    rgb = va.create_model("vit_digits_patch2_8", in_chans=3).state_dict()
    out = adapt_input_channels(rgb, model)
    changed = [k for k in rgb if out[k] is not rgb[k]]
    assert changed == [key := "patch_embed.proj.0.weight"]
    torch.testing.assert_close(out[key], rgb[key].sum(1, keepdim=True))
    two = {**rgb, key: rgb[key][:, :2]}  # not an RGB kernel: left to the strict check, which names it
    assert adapt_input_channels(two, model)[key].shape[1] == 2
    with pytest.raises(va.weights.CheckpointMismatchError, match=key):
        load_weights(model, two)


def test_create_model_pretrained_file_with_in_chans(tmp_path) -> None:
    rgb = va.create_model("deit_tiny_patch16_224", depth=1, img_size=32)
    va.save_weights(rgb, tmp_path / "rgb.safetensors")
    grey = va.create_model("deit_tiny_patch16_224", depth=1, img_size=32, in_chans=1, num_classes=3,
                           pretrained=str(tmp_path / "rgb.safetensors"))
    torch.testing.assert_close(grey.patch_embed.proj.weight, rgb.patch_embed.proj.weight.sum(1, keepdim=True))
    torch.testing.assert_close(grey.blocks[0].mlp.fc1.weight, rgb.blocks[0].mlp.fc1.weight)
