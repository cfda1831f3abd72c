"""Hiera (models/hiera.py): presets and their parameters against timm 1.0.31 on the meta device, the block schedule
(pooling, the lagged mask-unit flag, unit sizes), parity with timm's Hiera from committed fixtures
(tests/fixtures/make_fixtures_hiera.py: features, pre-logits, logits and every stage's map), the size rule, and
set_input_size."""

import copy

import pytest
import torch
from fixture_utils import assert_loads, assert_parity, load_fixture, meta_model_with_timm_params

from vit_attention import create_model
from vit_attention.attention.mask_unit import MaskUnitAttention, MaskUnitPoolAttention
from vit_attention.functional import switched
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.hiera import Hiera

pytestmark = pytest.mark.parity

# timm 1.0.31 on the meta device: exact parameter counts (1000 classes)
TIMM_PARAMS = {"hiera_tiny_224": 27_910_216, "hiera_small_224": 35_008_072, "hiera_base_224": 51_524_968,
               "hiera_base_plus_224": 69_896_616, "hiera_large_224": 213_739_912, "hiera_huge_224": 672_779_752,
               "hiera_small_abswin_256": 34_361_800, "hiera_base_abswin_256": 51_267_304}
# the fixtures' reduced timm Hiera (tests/fixtures/make_fixtures_hiera.py)
SMALL = dict(embed_dim=8, num_heads=1, depth=(1, 2, 2, 1), num_classes=10)
FIXTURES = {"timm_hiera": ("hiera_tiny_224", dict(img_size=(128, 96))),
            "timm_hiera_abswin": ("hiera_small_abswin_256", dict(img_size=(64, 96), global_pos_size=(4, 4)))}


def _fixture_model(name: str) -> tuple[Hiera, dict]:
    state, t, _ = load_fixture(name)
    preset, kw = FIXTURES[name]
    model = create_model(preset, **SMALL, **kw).eval()
    assert_loads(model, state, "timm")
    return model, t


def test_registered_names_and_presets():
    assert set(list_models("hiera*")) == set(TIMM_PARAMS)
    for name in TIMM_PARAMS:
        e = get_model_entry(name)
        assert e.family == "hiera" and e.meta["published_params_m"] > 0 and e.meta["published_gmacs"] > 0
        assert e.preset.get("abs_win_pos_embed", False) == ("abswin" in name)


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameters_equal_timm_and_structure_on_meta(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name])
    assert isinstance(m, Hiera) and [len(s.blocks) for s in m.stages] == list(m.cfg.depth)
    assert m.stages[0].blocks[0].norm1.eps == 1e-6 and m.head.norm.eps == 1e-6


def test_block_schedule_pooling_lag_and_units():
    """timm's schedule: the first block of stages 2-4 pools q (and doubles the width); it keeps the previous stage's
    kind of attention (stage 3's first block is mask-unit); units 8, 4, 2, 1 tokens a side after pooling."""
    with torch.device("meta"):
        m = create_model("hiera_tiny_224")
    kinds = []
    for s, stage in enumerate(m.stages):
        for j, blk in enumerate(stage.blocks):
            attn = blk.attn
            pooled = s > 0 and j == 0
            assert isinstance(attn, MaskUnitPoolAttention if pooled else MaskUnitAttention)
            assert attn.q_stride == (4 if pooled else 1) and attn.mask_unit == 8 >> s
            kinds.append(attn.mask_unit_attn)
    assert kinds == [True] + [True] * 2 + [True] + [False] * 6 + [False] * 2


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("fused", [True, False])
def test_timm_fixture_parity_features_logits_and_stage_maps(name, fused):
    """timm's forward_features (tokens of the last stage), pre-logits, logits and each stage's map (its Reroll)."""
    model, t = _fixture_model(name)
    x = t["input"]
    with torch.no_grad(), switched(model, fused_attention=fused):
        feats = model.forward_features(x)  # [B, h, w, C]
        assert_parity(feats.flatten(1, 2), t["features"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["pre_logits"])
        assert_parity(model(x), t["output"])
        maps = model.forward_intermediates(x, output_fmt="NHWC", intermediates_only=True)
    assert len(maps) == 4
    for i, mp in enumerate(maps):
        assert_parity(mp, t[f"stage{i}"])


def test_sizes_that_do_not_fill_mask_units_are_refused_naming_the_rule():
    with pytest.raises(ValueError, match="multiples of 32"):
        create_model("hiera_tiny_224", **SMALL, img_size=240)
    m = create_model("hiera_tiny_224", **SMALL, img_size=64).eval()
    with pytest.raises(ValueError, match="multiples of 32"):
        m(torch.randn(1, 3, 80, 64))
    with pytest.raises(ValueError, match="set_input_size"):
        m(torch.randn(1, 3, 96, 64))
    with pytest.raises(ValueError, match="multiples of 32"):
        m.set_input_size(72)


def test_set_input_size_resamples_the_position_embedding_and_abswin_runs_at_any_allowed_size():
    m = create_model("hiera_tiny_224", **SMALL, img_size=64).eval()
    r = copy.deepcopy(m)
    r.set_input_size((96, 64))
    assert r.pos_embed.shape == (1, 24 * 16, 8) and r.cfg.img_size == (96, 64) and r.grid_size == (24, 16)
    ref = torch.nn.functional.interpolate(m.pos_embed.detach().reshape(1, 16, 16, 8).permute(0, 3, 1, 2),
                                          size=(24, 16), mode="bicubic", align_corners=False)
    torch.testing.assert_close(r.pos_embed.detach(), ref.permute(0, 2, 3, 1).reshape(1, -1, 8))
    with torch.no_grad():
        assert r(torch.randn(1, 3, 96, 64)).shape == (1, 10)
    a = create_model("hiera_small_abswin_256", **SMALL, img_size=64, global_pos_size=(4, 4)).eval()
    with torch.no_grad():
        assert a(torch.randn(1, 3, 96, 128)).shape == (1, 10)


def test_token_merging_is_refused_with_the_reason():
    m = create_model("hiera_tiny_224", **SMALL, img_size=64)
    with pytest.raises(ValueError, match="unrolled order"):
        m.set_token_merging(2)
