"""BEiT / BEiT v2 (models/beit.py): presets, structure, parity with timm 1.0.31's Beit (committed fixtures made by
tests/fixtures/make_fixtures_beit.py), set_input_size against timm's, and token merging refused."""

import copy

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_loads, assert_parity, load_fixture, meta_model_with_timm_params

from vit_attention import create_model
from vit_attention.attention.beit_rel_pos import BeitRelPosAttention
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.beit import Beit

pytestmark = pytest.mark.parity

# timm 1.0.31 on the meta device: exact parameter counts (1000 classes)
TIMM_PARAMS = {"beit_base_patch16_224": 86_530_984, "beit_base_patch16_384": 86_744_104,
               "beit_large_patch16_224": 304_430_568, "beit_large_patch16_384": 304_998_888,
               "beit_large_patch16_512": 305_674_728, "beitv2_base_patch16_224": 86_530_984,
               "beitv2_large_patch16_224": 304_430_568}
# the fixtures' reduced timm Beit (tests/fixtures/make_fixtures_beit.py); RESIZES as there
SMALL = dict(img_size=(32, 48), patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=10)
RESIZES = {"img48": (48, 48), "img24x64": (24, 64)}


def _fixture_model() -> tuple[Beit, dict]:
    state, t, _ = load_fixture("timm_beit")
    model = create_model("beit_base_patch16_224", **SMALL).eval()
    assert_loads(model, state, "timm")
    return model, t


def test_registered_names_and_presets():
    assert set(list_models("beit*")) == set(TIMM_PARAMS)
    for name in TIMM_PARAMS:
        e = get_model_entry(name)
        p = e.preset
        assert e.family == "beit" and p["attn_layer"] == "beit_rel_pos" and p["pos_embed"] == "none"
        assert p["global_pool"] == "avg" and p["qkv_bias"] is True
        assert p["init_values"] == (0.1 if name.startswith("beit_base") else 1e-5)
        assert e.meta["published_params_m"] > 0 and e.meta["published_gmacs"] > 0


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameters_equal_timm_and_structure_on_meta(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name])
    grid = m.grid_size
    attn = m.blocks[0].attn
    assert isinstance(m, Beit) and m.pos_embed is None and m.num_prefix_tokens == 1
    assert isinstance(attn, BeitRelPosAttention) and attn.window_size == grid
    assert attn.relative_position_bias_table.shape == ((2 * grid[0] - 1) * (2 * grid[1] - 1) + 3, attn.num_heads)
    assert attn.qkv.bias is None and attn.q_bias.shape == (m.embed_dim,) and m.blocks[0].norm1.eps == 1e-6
    assert m.blocks[0].ls1.gamma.shape == (m.embed_dim,)
    assert isinstance(m.norm, torch.nn.Identity) and isinstance(m.fc_norm, torch.nn.LayerNorm)


def test_table_rows_of_the_presets():
    """(2·14-1)² + 3 = 732 at 224, 47² + 3 = 2212 at 384, 63² + 3 = 3972 at 512 (timm's shapes)."""
    for name, rows in (("beit_base_patch16_224", 732), ("beit_large_patch16_384", 2212),
                       ("beit_large_patch16_512", 3972)):
        with torch.device("meta"):
            m = create_model(name)
        assert all(b.attn.relative_position_bias_table.shape[0] == rows for b in m.blocks)


@pytest.mark.parametrize("fused", [True, False])
def test_timm_fixture_parity_non_square_grid(fused):
    model, t = _fixture_model()
    assert model.grid_size == (4, 6)
    assert_fixture_parity(model, t, fused=fused)


def test_timm_fixture_parity_shared_table_absolute_positions_token_pooling():
    """A shared table (timm's rel_pos_bias) is copied into every block: the same logits as timm's shared bias."""
    state, t, _ = load_fixture("timm_beit_shared")
    model = create_model("beit_base_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                         num_classes=10, pos_embed="learn", global_pool="token").eval()
    assert_loads(model, state, "timm")
    for blk in model.blocks:
        torch.testing.assert_close(blk.attn.relative_position_bias_table,
                                   state["rel_pos_bias.relative_position_bias_table"])
    assert_fixture_parity(model, t)


@pytest.mark.parametrize("tag", sorted(RESIZES))
def test_set_input_size_equals_timm(tag):
    """timm's Beit.set_input_size (resize_rel_pos_bias_table) and ours give the same tables and logits."""
    model, t = _fixture_model()
    model.set_input_size(RESIZES[tag])
    attn = model.blocks[0].attn
    assert model.grid_size == (RESIZES[tag][0] // 8, RESIZES[tag][1] // 8) and attn.window_size == model.grid_size
    assert_parity(attn.relative_position_bias_table.detach(), t[f"table_{tag}"])
    with torch.no_grad():
        assert_parity(model(t[f"input_{tag}"]), t[f"output_{tag}"])
    fresh = Beit(copy.deepcopy(model.cfg)).eval()  # a model built at the new size takes the resized weights as they are
    fresh.load_state_dict(model.state_dict(), strict=True)


def test_dynamic_size_reads_the_table_resampled_as_set_input_size_does():
    model, t = _fixture_model()
    dynamic = create_model("beit_base_patch16_224", **SMALL, dynamic_img_size=True).eval()
    dynamic.load_state_dict(model.state_dict())
    model.set_input_size((48, 48))
    with torch.no_grad():
        x = t["input_img48"]
        torch.testing.assert_close(dynamic(x), model(x), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="dynamic_img_size"):  # a fixed-size model refuses another size
        model(torch.randn(1, 3, 32, 32))


def test_token_merging_is_refused_with_the_reason():
    model, _ = _fixture_model()
    with pytest.raises(ValueError, match="token merging: BEiT's relative-position tables .* merged token"):
        model.set_token_merging(2)
    assert model.token_merging is None
    swapped = create_model("beit_base_patch16_224", **SMALL, attn_layer="mhsa")  # no table: merging works
    swapped.set_token_merging(2)
    assert swapped.token_merging is not None


def test_no_weight_decay_and_timm_init_rules():
    """timm's no_weight_decay (cls_token and every table) and its from-scratch init: a zero table, LayerScale at
    init_values, attn.proj / mlp.fc2 of block l scaled by 1 / sqrt(2 (l + 1)) against the other linears, the head
    scaled by 0.001."""
    torch.manual_seed(0)
    m = create_model("beit_base_patch16_224", embed_dim=256, depth=3, num_heads=4, img_size=64)
    nwd = m.no_weight_decay()
    assert "cls_token" in nwd and {f"blocks.{i}.attn.relative_position_bias_table" for i in range(3)} <= nwd
    assert not any("qkv" in n for n in nwd)
    for i, blk in enumerate(m.blocks):
        assert (blk.attn.relative_position_bias_table == 0).all() and torch.allclose(blk.ls1.gamma, torch.tensor(0.1))
        ratio = blk.attn.proj.weight.std() / blk.attn.qkv.weight.std()
        assert abs(ratio.item() * (2 * (i + 1)) ** 0.5 - 1) < 0.1
    assert m.head.weight.std() < 0.02 * 0.01 and m.blocks[0].mlp.fc1.weight.std() > 0.015
