"""BEiT checkpoint layouts (weights/beit.py): live parity with Hugging Face transformers' Beit (random small configs,
in memory and from a saved folder), the unilm originals' extra buffers, and tables of another grid resampled."""

import pytest
import torch
from fixture_utils import assert_loads, assert_parity, load_fixture
from hf_utils import assert_hf_logits_parity, load_from_hf, perturb_fan_in
from transformers import BeitConfig, BeitForImageClassification, BeitModel

from vit_attention import create_model

pytestmark = pytest.mark.parity

_SMALL = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=128, use_relative_position_bias=True, use_mean_pooling=True,
              layer_scale_init_value=0.1)


def _ref(cls=BeitForImageClassification, **kw):
    return perturb_fan_in(cls(BeitConfig(**{**_SMALL, **kw})), layer_scale="lambda_1")


def _ours(**kw):
    base = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, norm_eps=1e-12)
    return create_model("beit_base_patch16_224", **{**base, **kw}).eval()


@pytest.mark.parametrize("size,patch", [(32, 8), (48, 16), (64, 8)])
def test_hf_classifier_parity(size, patch):
    """transformers' default LayerNorm eps (1e-12) taken over; 4x4, 3x3 and 8x8 grids. Square only: transformers
    5.24 reads a non-square table transposed (its sub-table reshape is (width, height)), even at the trained size."""
    ref = _ref(num_labels=5, image_size=size, patch_size=patch)
    assert_hf_logits_parity(_ours(num_classes=5, img_size=size, patch_size=patch), ref, size)


def test_hf_model_shared_table_absolute_positions_from_a_folder(tmp_path):
    """BeitModel with one shared table, absolute positions and the final norm (no mean pooling), saved with
    save_pretrained: create_model(preset, pretrained=folder) takes its config.json and the last hidden state agrees."""
    ref = _ref(BeitModel, use_relative_position_bias=False, use_shared_relative_position_bias=True,
               use_absolute_position_embeddings=True, use_mean_pooling=False)
    ref.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="another architecture"):  # the folder's widths win over the preset's
        model = create_model("beit_base_patch16_224", pretrained=str(tmp_path)).eval()
    assert model.cfg.norm_eps == 1e-12 and model.cfg.pos_embed == "learn" and model.cfg.global_pool == "token"
    assert model.cfg.attn_layer == "beit_rel_pos" and model.cfg.init_values == 0.1
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_parity(model.forward_features(x), ref(pixel_values=x).last_hidden_state)
    assert load_from_hf(_ours(num_classes=0, pos_embed="learn", global_pool="token"), ref, "memory").ok


def test_unilm_original_buffers_are_dropped():
    """The unilm files keep relative_position_index as a persistent buffer (and timm's zero k_bias): dropped."""
    state, t, _ = load_fixture("timm_beit")
    full = dict(state)
    full.update({k.removeprefix("nonpersistent."): v for k, v in t.items() if k.startswith("nonpersistent.")})
    assert any(k.endswith("relative_position_index") for k in full)
    model = create_model("beit_base_patch16_224", img_size=(32, 48), patch_size=8, embed_dim=32, depth=2,
                         num_heads=4, num_classes=10).eval()
    assert_loads(model, full, "timm")
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


def test_tables_of_another_grid_are_resampled_as_set_input_size():
    """A 4x4-grid checkpoint loaded into a 48 px model (6x6) gives that of a 32 px model after set_input_size."""
    state, _, _ = load_fixture("timm_beit_shared")
    kw = dict(patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=10, pos_embed="learn",
              global_pool="token")
    small = create_model("beit_base_patch16_224", img_size=32, **kw).eval()
    assert_loads(small, state)
    small.set_input_size(48)
    big = create_model("beit_base_patch16_224", img_size=48, **kw).eval()
    report = assert_loads(big, state)
    assert any("relative-position tables resampled" in n for n in report.notes)
    for a, b in zip(small.blocks, big.blocks):
        torch.testing.assert_close(a.attn.relative_position_bias_table, b.attn.relative_position_bias_table)
