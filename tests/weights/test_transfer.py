"""Pretrained weights under a swapped attention mechanism: ``create_model(NAME, attn_layer=OTHER, pretrained=...)``
loads the weights into the model they were trained for, then carries them over
(:func:`vit_attention.weights.transfer_weights`), on one reduced preset of every family that takes another mechanism."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from fixture_utils import add_noise
from model_outputs import build, first_preset_per_family, small_overrides

import vit_attention as va
from vit_attention.attention.transfer import get_projections
from vit_attention.weights import CheckpointMismatchError, transfer_weights
from vit_attention.weights.transfer import attention_modules

# family -> (the config field, the mechanism swapped in, its attn_kwargs or None to keep the file's)
SWAPS: dict[str, tuple[str, str, dict | None]] = {
    "beit": ("attn_layer", "mhsa", None),
    "cait": ("attn_layer", "mhsa", None), "clip": ("attn_layer", "talking_heads", None),
    "cpvt": ("attn_layer", "talking_heads", None), "cvt": ("attn_layer", "mhsa", None),
    "davit": ("spatial_attn_layer", "neighborhood", None), "dinov2": ("attn_layer", "talking_heads", None),
    "flexivit": ("attn_layer", "talking_heads", None), "halonet": ("attn_layer", "neighborhood", {"kernel_size": 3}),
    "mobilevit": ("attn_layer", "neighborhood", None), "naflexvit": ("attn_layer", "talking_heads", None),
    "nat": ("attn_layer", "window", None), "pvt": ("attn_layer", "mhsa", None), "pvt_v2": ("attn_layer", "mhsa", None),
    "siglip": ("attn_layer", "talking_heads", None), "swin": ("attn_layer", "neighborhood", None),
    "swinv2": ("attn_layer", "window", None), "vil": ("attn_layer", "mhsa", None),
    "vit": ("attn_layer", "talking_heads", None), "vitdet": ("attn_layer", "neighborhood", None),
}
# families that take no other mechanism: their attention options belong to one mechanism (RoPE, EVA's q / v
# biases), Image GPT must stay causal, Twins alternates two fixed ones
NO_SWAP = {"dinov3", "eva02", "igpt", "rope_vit", "twins"}
# global attention into talking heads with the identity mixing: the same model
EXACT = {"clip", "cpvt", "dinov2", "flexivit", "naflexvit", "siglip", "vit"}


def test_every_family_is_listed() -> None:
    assert set(SWAPS) | NO_SWAP == set(first_preset_per_family())


@pytest.mark.registry
@pytest.mark.parametrize(("family", "name"), [(f, n) for f, n in sorted(first_preset_per_family().items())
                                              if f in SWAPS])
def test_pretrained_weights_into_another_mechanism(family: str, name: str, tmp_path: Path) -> None:
    donor, x = build(name, small_overrides(name))
    va.save_weights(donor, tmp_path / "w.safetensors")  # records the mechanism and its options (HaloNet's blocks)
    field, new, kwargs = SWAPS[family]
    old = getattr(donor.cfg, field)
    extra = {} if kwargs is None else {field[: -len("layer")] + "kwargs": kwargs}
    with pytest.warns(UserWarning, match=rf"weights trained with {field}='{old}' transferred to {field}='{new}'"):
        model = va.create_model(name, pretrained=tmp_path / "w.safetensors", **{**small_overrides(name), field: new,
                                                                                **extra}).eval()
    swapped = {p: m for p, m in attention_modules(model).items() if type(m).attention_name == new}
    assert swapped
    theirs, ours = donor.state_dict(), model.state_dict()
    for key, value in ours.items():  # everything outside the swapped mechanisms: the weights'
        if not key.startswith(tuple(p + "." for p in swapped)) and key in theirs:
            torch.testing.assert_close(value, theirs[key], rtol=0, atol=0, msg=key)
    source = attention_modules(donor)
    for path, m in swapped.items():  # each swapped module's projections: the weights' (queries rescaled
        a, b = get_projections(source[path]), get_projections(m)  # where the logit scales differ, CvT's)
        ratio = (a.scale / b.scale) if a.scale and b.scale else 1.0
        for role in set(a.weight) & set(b.weight):
            want = a.weight[role] * (ratio if role == "q" else 1.0)
            torch.testing.assert_close(b.weight[role], want.reshape(b.weight[role].shape), msg=f"{path} {role}")
    if family in EXACT:
        with torch.no_grad():
            torch.testing.assert_close(model(x), donor(x), rtol=1e-4, atol=1e-5)


def test_the_same_mechanism_loads_directly_and_a_wrong_file_still_fails(tmp_path: Path) -> None:
    name = "vit_base_patch16_224"
    donor, _ = build(name, small_overrides(name))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # attn_layer equal to the weights': no transfer, no warning
        model = va.create_model(name, **small_overrides(name), attn_layer="mhsa", pretrained=donor.state_dict())
    key = "blocks.0.attn.qkv.weight"
    torch.testing.assert_close(model.state_dict()[key], donor.state_dict()[key])
    wider = {**small_overrides(name), "embed_dim": 48}
    # the weights must fit the model they were trained for
    with pytest.raises(CheckpointMismatchError, match="shape mismatch blocks.0.attn.qkv.weight"):
        va.create_model(name, **wider, attn_layer="talking_heads", pretrained=donor.state_dict())


def test_features_only_with_a_swapped_mechanism(tmp_path: Path) -> None:
    name = "swin_tiny_patch4_window7_224"
    donor, x = build(name, small_overrides(name))
    with pytest.warns(UserWarning, match="offset bias"):
        feats = va.create_model(name, **small_overrides(name), attn_layer="neighborhood", features_only=True,
                                pretrained=donor.state_dict())
    assert len(feats(x)) == len(donor.feature_info)
    table = donor.layers[0].blocks[0].attn.get_offset_bias()  # [nh, 3, 3]: Swin's 2 x 2 windows
    rpb = feats.layers[0].blocks[0].attn.rpb  # NAT's 7 x 7 kernel: [nh, 13, 13], the centre offsets carried
    torch.testing.assert_close(rpb[:, 5:8, 5:8], table)
    assert float(rpb.detach()[:, 0].abs().max()) == 0.0


def test_transfer_report_lists_what_it_could_not_copy() -> None:
    name = "pvt_v2_b0"
    donor, _ = build(name, small_overrides(name))
    target = va.create_model(name, **small_overrides(name), attn_layer="mhsa")
    report = transfer_weights(donor, target)
    assert report.layout == "transfer" and not report.missing and not report.unexpected
    assert any("sra -> mhsa" in n and "not carried from the source: norm, sr" in n for n in report.notes)


@pytest.mark.parity
def test_a_transformers_folder_into_another_mechanism(tmp_path: Path) -> None:
    """Foreign weights (a transformers ViT folder: converted, configured by its config.json) into talking heads:
    the donor is the preset with the folder's config, and the identity head mixing keeps the HF model's logits."""
    import transformers as tf

    torch.manual_seed(0)
    ref = tf.ViTForImageClassification(tf.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=64, num_labels=3)).eval()
    add_noise(ref, 0.05)  # biases off zero: a dropped bias would show
    ref.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="attn_layer='mhsa' transferred to attn_layer='talking_heads'"):
        model = va.create_model("vit_base_patch16_224", attn_layer="talking_heads", pretrained=tmp_path).eval()
    assert model.cfg.embed_dim == 32 and model.num_classes == 3
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(pixel_values=x).logits, rtol=1e-4, atol=1e-4)
