"""MViTv2 (models/mvitv2.py): presets, parameters equal timm 1.0.31's on meta, GMACs against timm's table, the stage
schedule, parity with timm's MultiScaleVit (committed fixtures made by tests/fixtures/make_fixtures_mvitv2.py) with
and without the class token and in mvitv2_large's MLP-widening layout, another input size against timm's
checkpoint-filter rule, and the refusals."""

import copy

import pytest
import torch
from fixture_utils import assert_loads, assert_parity, load_fixture, meta_model_with_timm_params

from vit_attention import create_model
from vit_attention.analysis.flops import flops
from vit_attention.attention.pooling import PoolingAttention, PoolingAttentionTransition
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.mvitv2 import MViTv2, block_schedule, kv_strides

pytestmark = pytest.mark.parity

# timm 1.0.31 on the meta device: exact parameter counts with the default tag's head and with num_classes=0
TIMM_PARAMS = {"mvitv2_tiny": (24_173_320, 23_404_320), "mvitv2_small": (34_870_216, 34_101_216),
               "mvitv2_base": (51_472_744, 50_703_744), "mvitv2_large": (217_992_952, 216_839_952),
               "mvitv2_small_cls": (34_870_312, 34_101_312), "mvitv2_base_cls": (65_444_032, 50_703_840),
               "mvitv2_large_cls": (234_583_216, 212_482_512), "mvitv2_huge_cls": (694_804_128, 665_342_912)}
# the fixtures' reduced timm models (tests/fixtures/make_fixtures_mvitv2.py): (fixture, preset, overrides)
FIXTURES = [("timm_mvitv2", "mvitv2_tiny", dict(embed_dim=8, depths=(2, 1, 1, 1))),
            ("timm_mvitv2_cls", "mvitv2_small_cls", dict(embed_dim=8, depths=(2, 1, 1, 1))),
            ("timm_mvitv2_large", "mvitv2_large", dict(embed_dim=8, depths=(2, 2, 1, 2)))]


def _fixture_model(name: str, preset: str, overrides: dict) -> tuple[MViTv2, dict]:
    state, t, _ = load_fixture(name)
    model = create_model(preset, img_size=64, num_classes=10, **overrides).eval()
    assert_loads(model, state, "vit_attention")
    return model, t


def test_registered_names_and_presets():
    assert set(list_models("mvitv2*")) == set(TIMM_PARAMS)
    for name in TIMM_PARAMS:
        e = get_model_entry(name)
        cfg = e.config()
        assert e.family == "mvitv2" and cfg.use_cls_token == name.endswith("_cls")
        assert cfg.global_pool == ("token" if cfg.use_cls_token else "avg")
        assert cfg.expand_attn == (name != "mvitv2_large")
        assert e.meta["published_params_m"] == round(TIMM_PARAMS[name][0] / 1e6, 3) and e.meta["published_gmacs"] > 0
    assert get_model_entry("mvitv2_base_cls").config().num_classes == 19168


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameters_equal_timm_and_gmacs_within_published(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name][0])
    with torch.device("meta"):
        headless = create_model(name, num_classes=0)
    assert sum(p.numel() for p in headless.parameters()) == TIMM_PARAMS[name][1]
    published = get_model_entry(name).meta["published_gmacs"]
    macs = flops(m, (1, 3, 224, 224)).total
    assert abs(macs / 1e9 - published) / published < 0.02


def test_tiny_schedule_at_224_as_timm():
    """Per block: widths, heads, strides, query / key grids and table lengths (timm's mvitv2_tiny, read on meta)."""
    with torch.device("meta"):
        m = create_model("mvitv2_tiny")
    assert kv_strides(m.cfg) == (4, 2, 1, 1)
    want = [  # (C_in, C_out, nh, s_q, s_kv, q grid, kv grid, table rows)
        (96, 96, 1, 1, 4, 56, 14, 111), (96, 192, 2, 2, 2, 28, 28, 55), (192, 192, 2, 1, 2, 28, 14, 55),
        (192, 384, 4, 2, 1, 14, 28, 55), *[(384, 384, 4, 1, 1, 14, 14, 27)] * 4,
        (384, 768, 8, 2, 1, 7, 14, 27), (768, 768, 8, 1, 1, 7, 7, 13)]
    got, grid = [], (56, 56)
    for stage in m.stages:
        for blk in stage.blocks:
            a = blk.attn
            got.append((a.dim, a.dim_out, a.num_heads, a.stride_q[0], a.stride_kv[0], a.q_grid(grid)[0],
                        a.kv_grid(grid)[0], a.rel_pos_h.shape[0]))
            assert isinstance(a, PoolingAttention if a.stride_q == (1, 1) and a.dim == a.dim_out
                              else PoolingAttentionTransition)
            assert a.head_dim == 96 and a.rel_pos_w.shape == a.rel_pos_h.shape
            grid = a.q_grid(grid)
    assert got == want
    assert [f["reduction"] for f in m.feature_info] == [4, 8, 16, 32]


def test_large_widens_in_the_last_block_mlp():
    sched = block_schedule(get_model_entry("mvitv2_large").config())
    for s, blocks in enumerate(sched):
        assert all(b["att_dim"] == b["dim"] for b in blocks)
        assert [b["dim_out"] != b["dim"] for b in blocks] == [False] * (len(blocks) - 1) + [s < 3]
    with torch.device("meta"):
        m = create_model("mvitv2_large")
    last = m.stages[0].blocks[-1]
    assert last.shortcut_proj_attn is None and last.shortcut_proj_mlp.weight.shape == (288, 144)


@pytest.mark.parametrize("name,preset,overrides", FIXTURES)
def test_parity_with_timm(name, preset, overrides):
    model, t = _fixture_model(name, preset, overrides)
    x = t["input"]
    with torch.no_grad():
        feats = model.forward_features(x)
        tokens = feats.reshape(feats.shape[0], -1, feats.shape[-1]) if feats.dim() == 4 else feats
        assert feats.dim() == (3 if model.cfg.use_cls_token else 4)
        assert_parity(tokens, t["features"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["pre_logits"])
        assert_parity(model(x), t["output"])


def test_parity_at_another_size_tables_resized():
    """timm built at 96 px holding the 64-px weights through its checkpoint_filter_fn (tables resized linearly):
    our 64-px model reads its tables resized on the call, and after set_input_size(96) for good."""
    model, t = _fixture_model(*FIXTURES[0])
    other = copy.deepcopy(model)
    with torch.no_grad():
        assert_parity(model(t["input_img96"]), t["output_img96"])
        other.set_input_size(96)
        assert other.cfg.img_size == 96 and other.stages[0].blocks[0].attn.rel_pos_h.shape[0] == 47
        assert_parity(other(t["input_img96"]), t["output_img96"])
        rebuilt = create_model("mvitv2_tiny", img_size=96, num_classes=10, **FIXTURES[0][2]).eval()
        assert_loads(rebuilt, model.state_dict())  # the adapter resizes the tables on load
        assert_parity(rebuilt(t["input_img96"]), t["output_img96"])


def test_non_square_and_odd_sizes_build_and_run():
    """One table per axis (timm builds square only): a model built at 128x64 (grids 32x16 ... 4x2) holding the
    64-px weights (tables resized on load) equals the 64-px model run at 128x64 (tables resized on the call). Odd
    grids pool with ceil (timm's build sizes are floor: its tables are then read out of range)."""
    model, _ = _fixture_model(*FIXTURES[1])
    x = torch.randn(1, 3, 128, 64)
    with torch.no_grad():
        out = model(x)
        rect = create_model("mvitv2_small_cls", img_size=(128, 64), num_classes=10, **FIXTURES[1][2]).eval()
        assert_loads(rect, model.state_dict())
        assert rect.stages[0].blocks[0].attn.rel_pos_h.shape[0] == 63
        assert rect.stages[0].blocks[0].attn.rel_pos_w.shape[0] == 31
        assert_parity(rect(x), out)
        odd = torch.randn(1, 3, 72, 52)  # grids 18x13, 9x7, 5x4, 3x2
        maps = model.forward_intermediates(odd, intermediates_only=True)
        logits = model(odd)
    assert [tuple(f.shape[2:]) for f in maps] == [(18, 13), (9, 7), (5, 4), (3, 2)]
    assert logits.shape == (1, 10) and torch.isfinite(logits).all()


def test_class_row_out_of_the_residual_pooling_changes_only_through_the_class_token():
    model, t = _fixture_model(*FIXTURES[1])
    orig = create_model("mvitv2_small_cls", img_size=64, num_classes=10, residual_cls=False,
                        **FIXTURES[1][2]).eval()
    orig.load_state_dict(model.state_dict())
    with torch.no_grad():
        a, b = model(t["input"]), orig(t["input"])
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("overrides,err,match", [
    (dict(global_pool="token"), ValueError, "needs the class token"),
    (dict(embed_dim=(96, 192)), ValueError, "embed_dim"),
    (dict(num_heads=5), ValueError, "divisible by num_heads"),
    (dict(stride_q=(1, 2, 2)), ValueError, "stride_q"),
    (dict(residual_cls=1), TypeError, "residual_cls"),
])
def test_bad_config_is_refused_by_name(overrides, err, match):
    with pytest.raises(err, match=match), torch.device("meta"):
        create_model("mvitv2_tiny", **overrides)


def test_token_merging_is_refused_naming_why():
    with pytest.raises(ValueError, match="pools queries, keys and values"):
        create_model("mvitv2_tiny", **get_model_entry("mvitv2_tiny").reduced_overrides()).set_token_merging(2)
