"""Data configs and eval transforms against timm's (committed fixture from tests/fixtures/make_data_fixtures.py)."""

from __future__ import annotations

import json

import pytest
import torch
from fixture_utils import FIXTURES
from PIL import Image
from safetensors import safe_open

from vit_attention import create_model
from vit_attention.data import DataConfig, create_transform, imagenet_class_names, resolve_data_config

_NAMES = {"vit": "vit_base_patch16_224", "deit": "deit_small_patch16_224", "swin": "swin_tiny_patch4_window7_224"}


def _fixture() -> tuple[dict, dict]:
    with safe_open(str(FIXTURES / "timm_transforms.safetensors"), "pt") as f:
        cases = json.loads(f.metadata()["cases"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return cases, tensors


CASES, U8 = _fixture()


def _timm_output(case: dict) -> torch.Tensor:
    """timm's transform output, rebuilt exactly from the stored uint8 image (the fixture script asserts it)."""
    cfg = case["config"]
    x = U8[f"u8.{case['geometry']}"].permute(2, 0, 1).to(torch.float32).div(255)
    return (x - torch.tensor(cfg["mean"]).view(-1, 1, 1)) / torch.tensor(cfg["std"]).view(-1, 1, 1)


@pytest.fixture(scope="module")
def image() -> Image.Image:
    return Image.open(FIXTURES / "transform_image.png").convert("RGB")


@pytest.mark.parametrize("case", ["vit", "deit", "swin"])
def test_preset_data_config_is_timms(case):
    ref = CASES[case]["config"]
    ours = resolve_data_config(_NAMES[case])
    assert list(ours.input_size) == ref["input_size"] and ours.interpolation == ref["interpolation"]
    assert ours.crop_pct == ref["crop_pct"] and ours.crop_mode == ref["crop_mode"]
    assert list(ours.mean) == ref["mean"] and list(ours.std) == ref["std"]
    assert ours.hf_hub_id == f"timm/{CASES[case]['timm_name']}" and ours.num_classes == 1000


@pytest.mark.parity
@pytest.mark.parametrize("case", sorted(CASES))
def test_eval_transform_equals_timms(case, image):
    cfg = DataConfig.from_dict(CASES[case]["config"])
    out = create_transform(cfg)(image)
    ref = _timm_output(CASES[case])
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert torch.equal(out, ref)  # both resize with Pillow: exact


def test_model_data_config_follows_the_model(image):
    model = create_model("deit_small_patch16_224", depth=1, img_size=64)
    cfg = resolve_data_config(model)
    assert cfg.input_size == (3, 64, 64) and cfg.crop_pct == 0.9 and cfg.tag == "fb_in1k"
    assert create_transform(cfg)(image).shape == (3, 64, 64)
    assert resolve_data_config(model, crop_pct=1.0).crop_pct == 1.0
    grey = resolve_data_config(create_model("deit_small_patch16_224", depth=1, img_size=32, in_chans=1))
    assert grey.input_size == (1, 32, 32) and grey.mean == pytest.approx((sum((0.485, 0.456, 0.406)) / 3,))
    assert create_transform(grey)(image).shape == (1, 32, 32)


@pytest.mark.parametrize("name, size", [("volo_d4_448", 448), ("volo_d5_448.sail_in1k", 448),
                                        ("volo_d5_512.sail_in1k", 512)])
def test_crop_pct_above_one_pads_black(name, size):
    """timm's VOLO 448 / 512 px tags (crop_pct 1.15): the shorter side resized to floor(size / 1.15), padded black
    as torchvision's CenterCrop does ((crop - side) // 2 rows above, the rest below), the longer side cropped."""
    with torch.device("meta"):
        model = create_model(name)
    cfg = resolve_data_config(model)
    assert cfg.crop_pct == 1.15 and cfg.crop_mode == "center" and cfg.input_size == (3, size, size)
    side = int(size // 1.15)
    top = (size - side) // 2
    out = create_transform(cfg)(Image.new("RGB", (500, 400), (200, 150, 100)))  # landscape: pads rows only
    assert out.shape == (3, size, size) and side < size
    mean, std = torch.tensor(cfg.mean).view(3, 1, 1), torch.tensor(cfg.std).view(3, 1, 1)
    black = ((0 - mean) / std).expand(3, 1, size)
    assert torch.equal(out[:, :top], black.expand(3, top, size))
    assert torch.equal(out[:, top + side:], black.expand(3, size - top - side, size))
    inside = out[:, top:top + side] * std + mean  # back to [0, 1]: the grey of the image, no black column
    assert torch.allclose(inside, torch.tensor([200, 150, 100]).view(3, 1, 1) / 255, atol=1e-5)


def test_border_mode_pads_with_the_mean_colour():
    """crop_mode "border" pads with the mean colour (timm's CenterCropOrPad(fill=mean)), at any crop_pct."""
    cfg = DataConfig(input_size=(3, 32, 32), crop_pct=1.15, crop_mode="border")
    out = create_transform(cfg)(Image.new("RGB", (40, 20), (255, 255, 255)))  # resized to 27x14, padded
    fill = torch.tensor([round(255 * m) for m in cfg.mean]).view(3, 1, 1) / 255
    pad = (fill - torch.tensor(cfg.mean).view(3, 1, 1)) / torch.tensor(cfg.std).view(3, 1, 1)
    assert torch.equal(out[:, :, :2], pad.expand(3, 32, 2)) and torch.equal(out[:, :2], pad.expand(3, 2, 32))
    assert out[:, 16, 16].tolist() == pytest.approx(((1 - torch.tensor(cfg.mean)) / torch.tensor(cfg.std)).tolist())


def test_train_transform_is_seeded(image):
    cfg = resolve_data_config("swin_tiny_patch4_window7_224", input_size=(3, 32, 32))
    a = create_transform(cfg, training=True, generator=torch.Generator().manual_seed(3))(image)
    b = create_transform(cfg, training=True, generator=torch.Generator().manual_seed(3))(image)
    assert a.shape == (3, 32, 32) and torch.equal(a, b)


def test_bad_configs_name_the_field(image):
    for bad in (0, -0.5, float("nan"), float("inf"), "x", True):
        with pytest.raises(ValueError, match="crop_pct must be a positive number"):
            DataConfig(crop_pct=bad)
    with pytest.raises(ValueError, match="less than 1 pixel"):
        DataConfig(input_size=(3, 8, 16), crop_pct=9)
    assert DataConfig(input_size=(3, 8, 16), crop_pct=8).crop_pct == 8  # floor(8 / 8) = 1 pixel: allowed
    with pytest.raises(ValueError, match="interpolation"):
        DataConfig(interpolation="cubic")
    with pytest.raises(ValueError, match="mean has 3 values for 1 channels"):
        DataConfig(input_size=(1, 8, 8))
    with pytest.raises(TypeError, match="Pillow images or paths"):
        create_transform(DataConfig())(torch.zeros(3, 8, 8))


def test_imagenet_class_names():
    names = imagenet_class_names()
    assert len(names) == 1000 and names[0] == "tench" and names[1] == "goldfish" and names[999] == "toilet tissue"
