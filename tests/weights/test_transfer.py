"""Pretrained weights under a swapped attention mechanism: ``create_model(NAME, attn_layer=OTHER, pretrained=...)``
loads the weights into the model they were trained for, then carries them over
(:func:`vit_attention.weights.transfer_weights`), on one reduced preset of every family that takes another mechanism."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch
from fixture_utils import add_noise
from model_outputs import build, first_preset_per_family, small_overrides

import vit_attention as va
from vit_attention.attention import get_attention_spec, list_attention
from vit_attention.attention.transfer import get_projections
from vit_attention.weights import CheckpointMismatchError, transfer_weights
from vit_attention.weights.transfer import attention_modules


def _global_as_built(name: str) -> bool:
    """The mechanism attends globally as it is built (no keywords needed: mhsa, mha, talking heads)."""
    spec = get_attention_spec(name)
    return spec.global_kwargs is not None and spec.global_kwargs((2, 2)) == {}


def _preference(name: str) -> tuple[bool, bool, str]:
    """Targets tried first: those that can compute global attention (what most weights were trained with), of
    them those that do as built; then by name."""
    return get_attention_spec(name).global_kwargs is None, not _global_as_built(name), name


def _runs(name: str, overrides: dict, x: torch.Tensor) -> Exception | None:
    """None when the reduced model with ``overrides`` builds and runs on ``x``; else the error it raised."""
    try:
        model = va.create_model(name, **overrides).eval()
        with torch.no_grad():
            model(x)
    except (TypeError, ValueError, RuntimeError) as err:
        return err
    return None


def _swap(name: str, donor: torch.nn.Module, x: torch.Tensor) -> tuple[str, str, dict] | dict[str, Exception]:
    """The first mechanism field of the family's config (``*attn_layer``) that takes another registered mechanism
    of the same layout: ``(field, mechanism, its overrides)``, the mechanism the first by :func:`_preference` that
    builds and runs; where none does, every refusal by ``field=mechanism``."""
    over = small_overrides(name)
    fields = [f.name for f in dataclasses.fields(donor.cfg) if f.name.endswith("attn_layer")]
    used = {type(m).attention_name for m in attention_modules(donor).values()}
    refusals: dict[str, Exception] = {}
    for field in fields:
        current = getattr(donor.cfg, field)  # "" = the family's own (MobileViT's block types)
        layouts = {get_attention_spec(n).layout for n in ([current] if current else used)}
        kwargs = field[: -len("layer")] + "kwargs"
        reset = {kwargs: {}} if hasattr(donor.cfg, kwargs) else {}  # the file's options belong to its mechanism
        for new in sorted(list_attention(), key=_preference):
            if new in used or new == current or get_attention_spec(new).layout not in layouts:
                continue
            swap = {**over, field: new, **reset}
            err = _runs(name, swap, x)
            if err is None:
                return field, new, swap
            refusals[f"{field}={new}"] = err
    return refusals


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(first_preset_per_family().values()))
def test_pretrained_weights_into_another_mechanism(name: str, tmp_path: Path) -> None:
    """Every family's representative takes weights trained with its mechanism into another of the same layout
    (the first it accepts, :func:`_swap`); a family that accepts none refuses each by its field and reason."""
    donor, x = build(name, small_overrides(name))
    found = _swap(name, donor, x)
    if isinstance(found, dict):  # no other mechanism: its options belong to one (RoPE, EVA's q / v biases), Image
        fields = [f.name for f in dataclasses.fields(donor.cfg) if f.name.endswith("attn_layer")]  # GPT is causal
        if not fields:  # the mechanisms are fixed by the family (Twins alternates two): no field to set
            with pytest.raises(TypeError, match="unknown config option.*'attn_layer'"):
                va.create_model(name, **small_overrides(name), attn_layer="mhsa")
            return
        assert found, name
        for what, err in found.items():
            field, new = what.split("=")
            assert isinstance(err, ValueError) and f"{field}='{new}'" in str(err), (what, err)
        return
    field, new, swap = found
    va.save_weights(donor, tmp_path / "w.safetensors")  # records the mechanism and its options (HaloNet's blocks)
    old = getattr(donor.cfg, field)
    with pytest.warns(UserWarning, match=rf"weights trained with {field}='{old}' transferred to {field}='{new}'"):
        model = va.create_model(name, pretrained=tmp_path / "w.safetensors", **swap).eval()
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
    # global attention into global attention with every source parameter carried (the target's own set neutral,
    # talking heads' mixing the identity): the same model
    olds = {type(source[p]).attention_name for p in swapped}
    left = [n for n in transfer_weights(donor, va.create_model(name, **swap)).notes if "not carried from" in n]
    if _global_as_built(new) and all(_global_as_built(o) for o in olds) and not left:
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
