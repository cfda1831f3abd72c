"""MaxViT (models/maxvit.py): presets, structure and sizes against timm 1.0.31's ``maxvit_*_tf_*`` and torchvision
0.29's ``maxvit_t``, parity with timm's MaxxVit and torchvision's MaxVit (committed fixtures made by
tests/fixtures/make_fixtures_maxvit.py), the partition rule and set_input_size."""

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_loads, assert_parity, load_fixture, meta_model_with_timm_params

from vit_attention import create_model
from vit_attention.attention.multi_axis import BlockAttention, GridAttention, resize_tf_bias_table
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.maxvit import MaxViT, same_pad, stage_sizes

pytestmark = pytest.mark.parity

# timm 1.0.31 on the meta device: exact parameter counts (1000 classes)
TIMM_PARAMS = {"maxvit_tiny_tf_224": 30_916_528, "maxvit_tiny_tf_384": 30_977_008, "maxvit_tiny_tf_512": 31_049_584,
               "maxvit_small_tf_224": 68_927_956, "maxvit_small_tf_384": 69_018_676,
               "maxvit_small_tf_512": 69_127_540, "maxvit_base_tf_224": 119_467_708,
               "maxvit_base_tf_384": 119_653_468, "maxvit_base_tf_512": 119_876_380,
               "maxvit_large_tf_224": 211_785_560, "maxvit_large_tf_384": 212_033_240,
               "maxvit_large_tf_512": 212_330_456, "maxvit_xlarge_tf_224": 506_987_643,
               "maxvit_xlarge_tf_384": 475_323_472, "maxvit_xlarge_tf_512": 475_769_296,
               "maxvit_pico_rw_256": 7_457_996,
               "maxvit_nano_rw_256": 15_451_148, "maxvit_tiny_rw_224": 29_057_312, "maxvit_tiny_rw_256": 29_066_720,
               "maxvit_rmlp_pico_rw_256": 7_515_980, "maxvit_rmlp_nano_rw_256": 15_501_452,
               "maxvit_rmlp_tiny_rw_256": 29_148_896, "maxvit_rmlp_small_rw_224": 64_895_044,
               "maxvit_rmlp_small_rw_256": 64_895_044, "maxvit_rmlp_base_rw_224": 116_135_788,
               "maxvit_rmlp_base_rw_384": 116_135_788}
TORCHVISION_PARAMS = 30_919_624  # torchvision 0.29 maxvit_t (its weights' _num_params)
# the fixture's reduced timm MaxxVit (tests/fixtures/make_fixtures_maxvit.py)
SMALL = dict(embed_dims=(16, 32), depths=(1, 2), stem_width=16, head_hidden_size=32, dim_head=8, window_size=4,
             num_classes=10, img_size=(64, 96))


def _fixture_model() -> tuple[MaxViT, dict]:
    state, t, _ = load_fixture("timm_maxvit")
    model = create_model("maxvit_tiny_tf_224", **SMALL).eval()
    assert_loads(model, state, "timm")
    return model, t


def test_registered_names_and_presets():
    assert set(list_models("maxvit*")) == set(TIMM_PARAMS) | {"maxvit_t"}
    for name in TIMM_PARAMS:
        e = get_model_entry(name)
        assert e.family == "maxvit" and e.preset["img_size"] == int(name[-3:])
        assert e.meta["published_params_m"] > 0 and e.meta["published_gmacs"] > 0


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameters_equal_timm_and_structure_on_meta(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name])
    P = int(name[-3:]) // 32  # 7, 12, 16: timm's img_size // 32
    blk = m.stages[0].blocks[0]
    assert isinstance(blk.attn_block.attn, BlockAttention) and isinstance(blk.attn_grid.attn, GridAttention)
    for attn in (blk.attn_block.attn, blk.attn_grid.attn):
        assert attn.window_size == (P, P) and attn.head_dim == 32
        if "rmlp" in name:  # the table is an MLP's: nothing depends on the resolution
            assert attn.rel_pos == "mlp" and attn.rel_pos_mlp.fc1.weight.shape == (512, 2)
            assert not hasattr(attn, "relative_position_bias_table")
        else:
            assert attn.relative_position_bias_table.shape == (attn.num_heads, 2 * P - 1, 2 * P - 1)
    assert hasattr(blk.attn_block.ls1, "gamma") == hasattr(blk.attn_grid.ls2, "gamma") == ("rmlp_small" in name)
    if "_tf_" in name:  # TF: BN eps 1e-3, LN 1e-5, tanh GELU, LayerNorm after pooling, hidden tanh layer
        assert blk.conv.pre_norm.eps == 1e-3 and blk.attn_block.norm1.eps == 1e-5
        assert blk.attn_block.mlp.act.approximate == "tanh" and isinstance(blk.conv.act1, torch.nn.GELU)
        assert isinstance(m.norm, torch.nn.Identity) and m.head.pre_logits.fc.out_features == m.num_features
    else:  # timm rw: BN eps 1e-5, LN 1e-6, SiLU MBConv, exact GELU MLP, LayerNorm on the map, no bias on conv3
        assert blk.conv.pre_norm.eps == 1e-5 and blk.attn_block.norm1.eps == 1e-6
        assert blk.attn_block.mlp.act.approximate == "none" and isinstance(blk.conv.act1, torch.nn.SiLU)
        if "rmlp_base" in name:  # the NormMlp head: LayerNorm after pooling, a 768-wide tanh layer
            assert isinstance(m.norm, torch.nn.Identity) and m.head.pre_logits.fc.out_features == 768
        else:
            assert m.norm.eps == 1e-6 and isinstance(m.head.norm, torch.nn.Identity) and len(m.head.pre_logits) == 0
        assert blk.conv.conv3_1x1.bias is None and blk.conv.conv1_1x1.out_channels == 4 * m.cfg.stem_width[1]


@pytest.mark.registry
@pytest.mark.parametrize("name", ["maxvit_t"])
def test_torchvision_preset_parameters_and_differences_on_meta(name):
    """maxvit_t: 3096 parameters more than maxvit_tiny_tf_224 (the 64 -> 64 shortcut conv, 4160, less timm's stem
    conv1 bias and classifier bias, 64 + 1000)."""
    with torch.device("meta"):
        m = create_model(name)
    n = sum(p.numel() for p in m.parameters())
    assert n == TORCHVISION_PARAMS and round(n / 1e6, 3) == get_model_entry(name).meta["published_params_m"]
    blk = m.stages[0].blocks[0]
    assert isinstance(blk.conv.shortcut.expand, torch.nn.Conv2d) and m.stem.conv1.bias is None
    assert m.head.fc.bias is None and blk.attn_block.mlp.act.approximate == "none"
    assert blk.conv.conv2_kxk.padding == (1, 1) and m.stem.conv1.padding == (1, 1)


def test_stage_maps_and_the_partition_rule():
    """224: maps 56, 28, 14, 7 with P = G = 7; (224, 320) gives partitions (7, 10); 240 is refused naming the rule."""
    assert stage_sizes((224, 224), 4) == [(56, 56), (28, 28), (14, 14), (7, 7)]
    with torch.device("meta"):
        m = create_model("maxvit_tiny_tf_224", img_size=(224, 320))
    assert m.stages[0].blocks[0].attn_grid.attn.window_size == (7, 10)
    with pytest.raises(ValueError, match=r"img_size=\(240, 240\) gives stage 0 a 60x60 map, not a multiple"):
        create_model("maxvit_tiny_tf_224", img_size=240)
    with torch.device("meta"):
        m = create_model("maxvit_tiny_tf_224", img_size=240, allow_padding=True)
    assert m.stages[0].blocks[0].attn_block.attn.allow_padding


def test_same_padding_is_tfs():
    """Stride-2 3x3 'same': (0, 1) at even sizes, (1, 1) at odd ones (timm's pad_same)."""
    x = torch.ones(1, 1, 6, 7)
    y = same_pad(x, 3, 2)
    assert y.shape == (1, 1, 7, 9)
    assert y[0, 0, 0].sum() == 7 and y[0, 0, -1].sum() == 0  # H = 6: nothing on top, one row below
    assert y[0, 0, :, 0].sum() == 0 and y[0, 0, :, -1].sum() == 0  # W = 7: one column each side


@pytest.mark.parametrize("fused", [True, False])
def test_timm_fixture_parity_non_square(fused):
    model, t = _fixture_model()
    assert_fixture_parity(model, t, fused=fused)


def test_timm_fixture_parity_odd_sizes():
    """61x62: the stride-2 'same' convolutions and pooling pad both sides (the pooling counting the zeros)."""
    model, t = _fixture_model()
    with torch.no_grad():
        assert_parity(model(t["input_odd"]), t["output_odd"])


@pytest.mark.compile
def test_timm_fixture_parity_on_flex_and_in_training_mode_batch_norm_folding_off():
    model, t = _fixture_model()
    with torch.no_grad():
        flex = create_model("maxvit_tiny_tf_224", **SMALL, attn_backend="flex").eval()
        flex.load_state_dict(model.state_dict())
        assert_parity(flex(t["input"]), t["output"])
        model.train()
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eval()  # running statistics, the conv and norm unfolded (training mode modules)
        assert_parity(model(t["input"]), t["output"])


def test_set_input_size_follows_the_rule_and_resamples_the_tables():
    torch.manual_seed(0)
    m = create_model("maxvit_tiny_tf_224", embed_dims=(32, 64), depths=(1, 1), stem_width=16, dim_head=16,
                     head_hidden_size=0, img_size=128)  # partitions 128 // 32 = 4
    table = m.stages[0].blocks[0].attn_grid.attn.relative_position_bias_table.detach().clone()
    m.set_input_size(192)  # 6
    attn = m.stages[0].blocks[0].attn_grid.attn
    assert attn.window_size == (6, 6) and m.cfg.img_size == 192
    torch.testing.assert_close(attn.relative_position_bias_table.detach(), resize_tf_bias_table(table, (6, 6)))
    assert m(torch.randn(1, 3, 192, 192)).shape == (1, 1000)
    with pytest.raises(ValueError, match="img_size=.*not a multiple"):
        m.set_input_size(200)
    assert attn.window_size == (6, 6)  # unchanged after the refusal
    fresh = create_model("maxvit_tiny_tf_224", embed_dims=(32, 64), depths=(1, 1), stem_width=16, dim_head=16,
                         head_hidden_size=0, img_size=192)
    assert {k: v.shape for k, v in fresh.state_dict().items()} == {k: v.shape for k, v in m.state_dict().items()}


def test_checkpoint_tables_of_another_partition_are_resampled_on_load():
    model, _ = _fixture_model()
    state, _, _ = load_fixture("timm_maxvit")
    bigger = create_model("maxvit_tiny_tf_224", **{**SMALL, "window_size": 8, "img_size": (128, 192)})
    report = assert_loads(bigger, state, "timm")
    assert any("resampled" in n for n in report.notes)
    key = "stages.0.blocks.0.attn_block.attn.relative_position_bias_table"
    torch.testing.assert_close(bigger.state_dict()[key], resize_tf_bias_table(model.state_dict()[key], (8, 8)))


RW_SMALL = dict(embed_dims=(16, 32), depths=(1, 2), stem_width=(8, 16), dim_head=8, window_size=4, num_classes=10,
                img_size=(64, 96))


@pytest.mark.parametrize("fused", [True, False])
def test_timm_rw_fixture_parity(fused):
    """timm's own rw settings: Swin-layout tables and per-head qkv rows converted, LayerNorm on the map."""
    state, t, _ = load_fixture("timm_maxvit_rw")
    model = create_model("maxvit_nano_rw_256", **RW_SMALL).eval()
    assert_loads(model, state, "timm")
    assert_fixture_parity(model, t, fused=fused)


@pytest.mark.parametrize("fused", [True, False])
def test_timm_rmlp_fixture_parity(fused):
    """timm's rmlp settings: the relative-position MLP, LayerScale and the NormMlp head."""
    state, t, _ = load_fixture("timm_maxvit_rmlp")
    model = create_model("maxvit_rmlp_base_rw_224", **RW_SMALL, head_hidden_size=32, init_values=1e-6).eval()
    assert_loads(model, state, "timm")
    assert_fixture_parity(model, t, fused=fused)


def test_torchvision_fixture_parity():
    """torchvision's MaxVit: its Swin-layout tables flipped to the TF layout, q rescaled from C^-1/2 to hd^-1/2."""
    state, t, _ = load_fixture("torchvision_maxvit")
    model = create_model("maxvit_t", **{**SMALL, "img_size": 64}).eval()
    assert_loads(model, state, "torchvision")
    assert_fixture_parity(model, t)
