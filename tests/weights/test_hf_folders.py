"""Every family whose transformers classes we read: a folder saved by ``save_pretrained`` loads through
``create_model(preset, pretrained=folder)``, its ``config.json`` honoured (widths, depths, eps, image size,
labels), with the transformers model's outputs (max |ours - ref| <= 1e-5 * max |ref|).

The transformers models are built here, tiny and on CPU, with a few non-default config values so that
reading them (or not) shows in the model's config and outputs.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as tf
from fixture_utils import assert_parity, perturb_like_trained

from vit_attention import create_model
from vit_attention.weights.hub import _HF_FAMILIES

LABELS = {i: f"kind {i}" for i in range(3)}


@dataclass(frozen=True)
class Case:
    """A transformers model of one ``model_type``, the preset to load it into and what must come out."""

    hf: Callable[[], torch.nn.Module]
    preset: str
    size: tuple[int, int]  # input H, W
    expect: dict[str, Any]  # our config fields the folder sets
    compare: str = "logits"  # "logits" (classification) or "features" (a bare backbone)
    options: dict[str, Any] = field(default_factory=dict)  # options the folder cannot give (given to create_model)


def _labels(**kw: Any) -> dict[str, Any]:
    return dict(num_labels=len(LABELS), id2label=LABELS, label2id={v: k for k, v in LABELS.items()}, **kw)


_VIT = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, layer_norm_eps=1e-5, hidden_act="gelu_new")
_SWIN = dict(image_size=32, patch_size=4, embed_dim=16, depths=[2, 1], num_heads=[2, 2], window_size=4)
_PVT = dict(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 32, 64], num_attention_heads=[1, 2, 2, 4],
            mlp_ratios=[2, 2, 2, 2], sr_ratios=[8, 4, 2, 1], layer_norm_eps=1e-5)
_MOBILEVIT = dict(image_size=64, patch_size=2, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                  num_attention_heads=2, mlp_ratio=2.0, expand_ratio=2.0, layer_norm_eps=1e-6)
_MOBILEVITV2 = dict(image_size=64, patch_size=2, width_multiplier=0.25, expand_ratio=2.0, layer_norm_eps=1e-6)

CASES: dict[str, Case] = {
    "vit": Case(lambda: tf.ViTForImageClassification(tf.ViTConfig(**_VIT, **_labels())), "vit_base_patch16_224",
                (32, 32), dict(norm_eps=1e-5, act="gelu_tanh", img_size=32, embed_dim=32, depth=2, patch_size=8)),
    "deit": Case(lambda: tf.DeiTForImageClassificationWithTeacher(tf.DeiTConfig(**_VIT, **_labels())),
                 "deit_tiny_distilled_patch16_224", (32, 32), dict(norm_eps=1e-5, distilled=True, img_size=32)),
    "swin": Case(lambda: tf.SwinForImageClassification(tf.SwinConfig(**_SWIN, **_labels())),
                 "swin_tiny_patch4_window7_224", (32, 32), dict(depths=(2, 1), window_size=4, img_size=32)),
    "swinv2": Case(lambda: tf.Swinv2ForImageClassification(tf.Swinv2Config(**_SWIN, **_labels())),
                   "swinv2_tiny_window8_256", (32, 32), dict(depths=(2, 1), window_size=4, img_size=32)),
    "pvt": Case(lambda: tf.PvtForImageClassification(tf.PvtConfig(image_size=64, **_PVT, **_labels())), "pvt_tiny",
                (64, 64), dict(norm_eps=1e-5, embed_norm_eps=1e-5, embed_dims=(16, 32, 32, 64), img_size=64)),
    "pvt_v2": Case(lambda: tf.PvtV2ForImageClassification(tf.PvtV2Config(**_PVT, **_labels())), "pvt_v2_b0",
                   (64, 64), dict(norm_eps=1e-5, embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1))),
    "cvt": Case(lambda: tf.CvtForImageClassification(tf.CvtConfig(
        embed_dim=[16, 32, 48], num_heads=[1, 2, 3], depth=[1, 2, 3], drop_path_rate=[0.0, 0.0, 0.0], **_labels())),
        "cvt_13_224", (64, 64), dict(embed_dims=(16, 32, 48), depths=(1, 2, 3), act_layer="gelu")),
    "mobilevit": Case(lambda: tf.MobileViTForImageClassification(tf.MobileViTConfig(**_MOBILEVIT, **_labels())),
                      "mobilevit_xxs", (64, 64), dict(norm_eps=1e-6, block_type="v1", img_size=64)),
    "mobilevitv2": Case(lambda: tf.MobileViTV2ForImageClassification(tf.MobileViTV2Config(**_MOBILEVITV2,
                                                                                          **_labels())),
                        "mobilevitv2_050", (64, 64), dict(norm_eps=1e-6, block_type="v2", img_size=64)),
    "vitdet": Case(lambda: tf.VitDetModel(tf.VitDetConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=64, patch_size=8,
        pretrain_image_size=32, window_size=3, window_block_indices=[0, 2], use_relative_position_embeddings=True,
        layer_norm_eps=1e-5)), "vitdet_base_patch16_1024", (64, 64),
        dict(pyramid=False, num_classes=0, embed_dim=32, depth=3, window_size=3, global_block_indices=(1,),
             norm_eps=1e-5, pretrain_img_size=32, img_size=64, patch_size=8), compare="features"),
}


# model types whose folder round trip (save_pretrained -> create_model(pretrained=folder) -> equal outputs) is
# tested in their family's own test file: the file and the transformers class it saves
ELSEWHERE: dict[str, tuple[str, str]] = {
    "imagegpt": ("tests/weights/test_hf_folders.py", "ImageGPTForCausalImageModeling"),  # below: token ids in
    "dinov2": ("tests/models/test_dinov2.py", "Dinov2Model"),
    "dinov2_with_registers": ("tests/models/test_dinov2.py", "Dinov2WithRegistersModel"),
    "siglip_vision_model": ("tests/models/test_siglip.py", "SiglipVisionModel"),
    "clip_vision_model": ("tests/models/test_clip.py", "CLIPVisionModelWithProjection"),
    "beit": ("tests/weights/test_beit.py", "BeitModel"),
    "levit": ("tests/weights/test_levit.py", "LevitForImageClassificationWithTeacher"),
    "hiera": ("tests/weights/test_hiera.py", "HieraModel"),
}
# read (a composite config's vision tower, or a DINOv3 folder) and converted, parity-tested on state dicts
# in the family tests, without a folder round trip yet
STATE_DICT_ONLY = {"siglip", "clip", "dinov3_vit"}


def test_every_transformers_model_type_we_read_has_a_case() -> None:
    """A converter that registers another transformers model_type must add its folder case here (or name the
    family test that saves and reloads such a folder)."""
    root = Path(__file__).resolve().parents[2]
    assert set(_HF_FAMILIES) == set(CASES) | set(ELSEWHERE) | STATE_DICT_ONLY
    for model_type, (path, cls) in ELSEWHERE.items():
        text = (root / path).read_text()
        assert "save_pretrained" in text and re.search(rf"\b{cls}\b", text), (model_type, path, cls)


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_transformers_folder_loads_with_its_config(model_type: str, tmp_path: Path) -> None:
    case = CASES[model_type]
    torch.manual_seed(0)
    ref = perturb_like_trained(case.hf())
    assert ref.config.model_type == model_type
    ref.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*describes another architecture")  # tiny folders, full-size presets
        model = create_model(case.preset, pretrained=tmp_path, **case.options).eval()
    for key, value in case.expect.items():
        assert getattr(model.cfg, key) == value, (key, getattr(model.cfg, key), value)
    x = torch.randn(2, 3, *case.size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = ref(pixel_values=x)
        if case.compare == "logits":
            assert model.num_classes == 3 and model.pretrained_cfg["label_names"] == list(LABELS.values())
            assert_parity(model(x), out.logits)
        else:
            assert model.num_classes == 0
            assert_parity(model.forward_features(x).permute(0, 3, 1, 2), out.last_hidden_state)
    if "img_size" in case.expect:
        assert tuple(model.pretrained_cfg["input_size"][1:]) == case.size


@pytest.mark.parity
def test_imagegpt_folder_loads_with_its_config(tmp_path: Path) -> None:
    """ImageGPT reads colour-cluster ids: the folder sets width, depth, vocabulary, image side and eps; the
    palette (not in the folder: the image processor's clusters) is given; logits over ids equal transformers'."""
    side, colours = 5, 16
    ref = perturb_like_trained(tf.ImageGPTForCausalImageModeling(tf.ImageGPTConfig(
        vocab_size=colours + 1, n_positions=side * side, n_embd=32, n_layer=2, n_head=4, tie_word_embeddings=False,
        layer_norm_epsilon=1e-6)))
    ref.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*describes another architecture")
        model = create_model("igpt_small", pretrained=tmp_path, palette="grey").eval()
    cfg = model.cfg
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.vocab_size, cfg.img_size, cfg.norm_eps) == (
        32, 2, 4, colours, side, 1e-6)
    ids = torch.randint(0, colours, (2, side * side), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = colours  # SOS first
    with torch.no_grad():
        assert_parity(model.forward_logits(ids), ref(input_ids=ids).logits)


@pytest.mark.parity
def test_stated_num_labels_wins_over_id2label(tmp_path: Path) -> None:
    """transformers' PvtConfig declares num_labels (default 1000) as a field: id2label alone does not size its
    classifier. The folder's stated num_labels builds ours too (strict load), without label names of 3 classes."""
    ref = perturb_like_trained(tf.PvtForImageClassification(tf.PvtConfig(image_size=64, **_PVT, id2label=LABELS)))
    assert ref.classifier.out_features == 1000
    ref.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*describes another architecture")
        model = create_model("pvt_tiny", pretrained=tmp_path).eval()
    assert model.num_classes == 1000 and "label_names" not in model.pretrained_cfg
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_parity(model(x), ref(pixel_values=x).logits)
