"""Hiera checkpoint layouts (weights/hiera.py): live parity with Hugging Face transformers' Hiera (random small
configs, in memory and from a saved folder), the facebookresearch/hiera head names, a position table of another grid
resampled and a classifier of another class count dropped."""

import pytest
import torch
from fixture_utils import assert_loads, assert_parity, load_fixture
from hf_utils import assert_hf_logits_parity, perturb_fan_in
from transformers import HieraConfig, HieraForImageClassification, HieraModel

from vit_attention import create_model

pytestmark = pytest.mark.parity

_SMALL = dict(embed_dim=8, num_heads=[1, 2, 4, 8], depths=[1, 2, 2, 1])


def _ref(cls=HieraForImageClassification, size=(64, 96), **kw):
    return perturb_fan_in(cls(HieraConfig(**_SMALL, image_size=list(size), **kw)))


def _ours(size=(64, 96), **kw):
    return create_model("hiera_tiny_224", embed_dim=8, num_heads=1, depth=(1, 2, 2, 1), img_size=size, **kw).eval()


@pytest.mark.parametrize("size", [(64, 96), (128, 128), (224, 224)])
def test_hf_classifier_parity(size):
    """HieraForImageClassification's logits, on a non-square 16x24 token grid, a square 32x32 one and the presets'
    224 px (56x56 tokens, 7x7 mask units; transformers' Hiera is timm's, tests/fixtures hold the smaller sizes)."""
    ref = _ref(size=size, num_labels=5)
    assert_hf_logits_parity(_ours(size, num_classes=5), ref, size)


def test_hf_model_from_a_saved_folder(tmp_path):
    """HieraModel saved with save_pretrained: create_model(preset, pretrained=folder) takes its config.json (sizes,
    no classifier) and its last hidden state (the last stage's tokens, in image order) agrees."""
    ref = _ref(HieraModel, size=(64, 64))
    ref.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="another architecture"):  # the folder's widths win over the preset's
        model = create_model("hiera_tiny_224", pretrained=str(tmp_path), num_classes=0).eval()
    assert model.cfg.embed_dim == 8 and model.cfg.depth == (1, 2, 2, 1) and model.cfg.img_size == 64
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out = ref(pixel_values=x)
        feats = model.forward_features(x)
        assert_parity(feats.flatten(1, 2), out.last_hidden_state)
        assert_parity(model.forward_head(feats), out.pooler_output)


def test_hf_configs_of_another_geometry_are_refused_naming_the_field():
    from vit_attention.weights.hub import hf_config_overrides

    base = HieraConfig(**_SMALL, image_size=[64, 64]).to_dict()
    assert hf_config_overrides(base)["depth"] == (1, 2, 2, 1)
    for field, value in (("masked_unit_size", [4, 4]), ("query_stride", [2, 1]), ("patch_stride", [2, 2]),
                         ("num_heads", [1, 2, 3, 4])):
        with pytest.raises(ValueError, match=field):
            hf_config_overrides({**base, field: value})


def test_original_head_names_and_another_class_count():
    """facebookresearch/hiera wraps its weights in ``model_state`` and names its head ``norm`` / ``head.projection``
    (timm's filter renames them); a head of another class count is left fresh with a note."""
    state, t, _ = load_fixture("timm_hiera")
    original = {k.replace("head.norm.", "norm.").replace("head.fc.", "head.projection."): v for k, v in state.items()}
    model = _ours((128, 96), num_classes=10)
    assert_loads(model, {"model_state": original}, "timm")  # the original files' wrapper
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
    other = _ours((128, 96), num_classes=3)
    with pytest.warns(UserWarning, match="10 classes in the checkpoint"):
        report = assert_loads(other, state, "timm")
    assert "head.fc" in report.dropped


def test_position_table_of_another_square_grid_is_resampled():
    """A 16x16 table (64 px) into a 96 px model: bicubic, no antialias (transformers' interpolate_pos_encoding), the
    same as set_input_size on the 64 px model."""
    src = _ours((64, 64), num_classes=10)
    model = _ours((96, 96), num_classes=10)
    report = assert_loads(model, src.state_dict(), "vit_attention")
    assert any("pos_embed resampled from 16x16 to 24x24" in n for n in report.notes)
    src.set_input_size(96)
    torch.testing.assert_close(model.pos_embed, src.pos_embed)
