"""EfficientViT-MSRA (models/efficientvit_msra.py): presets, parameters equal timm 1.0.31's on meta, GMACs against
timm's table, parity with timm's EfficientVitMsra (committed fixtures made by
tests/fixtures/make_fixtures_efficientvit_msra.py) at 224 and on padded windows, BatchNorm folding, timm's window
rule and its set_input_size, and the refusals."""

import copy

import pytest
import torch
from fixture_utils import (
    assert_edited_table_takes_effect,
    assert_loads,
    assert_parity,
    load_fixture,
    meta_model_with_timm_params,
)

from vit_attention import create_model
from vit_attention.analysis.flops import flops
from vit_attention.attention.cascaded_group import CascadedGroupAttention, ConvNorm
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.efficientvit_msra import EfficientVitMsra, stage_windows

pytestmark = pytest.mark.parity

# timm 1.0.31 on the meta device: exact parameter counts with 1000 classes and with num_classes=0
TIMM_PARAMS = {"efficientvit_m0": (2_349_436, 2_156_052), "efficientvit_m1": (2_980_560, 2_787_176),
               "efficientvit_m2": (4_187_554, 3_962_106), "efficientvit_m3": (6_900_722, 6_579_082),
               "efficientvit_m4": (8_804_228, 8_418_460), "efficientvit_m5": (12_473_772, 12_088_004)}
# the fixtures' reduced timm models (tests/fixtures/make_fixtures_efficientvit_msra.py)
SMALL = dict(img_size=224, num_classes=10, embed_dim=(16, 24, 32), key_dim=(8, 8, 8), depth=(2, 1, 1),
             num_heads=(2, 3, 4), window_size=(7, 7, 7), kernels=(7, 5, 3, 3))
M2 = dict(img_size=160, num_classes=10, embed_dim=(16, 24, 32), key_dim=(8, 8, 8), depth=(1, 1, 2),
          num_heads=(4, 3, 2), window_size=(7, 7, 7), kernels=(7, 5, 3, 3))
RESIZES = {"img128": 128, "img96": 96}


def _fixture_model(name: str, preset: str, overrides: dict) -> tuple[EfficientVitMsra, dict]:
    state, t, _ = load_fixture(name)
    model = create_model(preset, **overrides).eval()
    assert_loads(model, state)
    return model, t


def _check(model: EfficientVitMsra, t: dict) -> None:
    """Features (timm's NCHW map is ours permuted), pooled features and logits equal the fixture's."""
    x = t["input"]
    with torch.no_grad():
        feats = model.forward_features(x)
        assert_parity(feats.permute(0, 3, 1, 2), t["features"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["pre_logits"])
        assert_parity(model(x), t["output"])


def test_registered_names_and_presets():
    assert set(list_models("efficientvit_m*")) == set(TIMM_PARAMS)
    for name in TIMM_PARAMS:
        e = get_model_entry(name)
        assert e.family == "efficientvit_msra" and e.config().key_dim == (16, 16, 16)
        assert e.meta["published_params_m"] == pytest.approx(TIMM_PARAMS[name][0] / 1e6, abs=5e-4)
        assert e.meta["published_gmacs"] > 0


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameters_equal_timm_and_structure_on_meta(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name][0])
    cfg = m.cfg
    assert stage_windows(cfg) == [(14, 7), (7, 7), (4, 4)]  # timm's resolutions and windows at 224
    for i, stage in enumerate(m.stages):
        attn = stage.blocks[0].attn
        assert isinstance(attn, CascadedGroupAttention) and attn.window_size == (stage_windows(cfg)[i][1],) * 2
        assert attn.num_heads == cfg.num_heads[i] and attn.val_dim == cfg.embed_dim[i] // cfg.num_heads[i]
        assert attn.kernels == cfg.kernels[:cfg.num_heads[i]] and attn.key_dim == 16
        assert attn.attention_biases.shape == (cfg.num_heads[i], stage_windows(cfg)[i][1] ** 2)
    with torch.device("meta"):
        headless = create_model(name, num_classes=0)
    assert sum(p.numel() for p in headless.parameters()) == TIMM_PARAMS[name][1]


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_gmacs_of_the_folded_model_are_within_2_percent_of_timms_table(name):
    """timm's table counts the BatchNorm-folded model (its bench parameter counts are the folded ones, CATALOGUE);
    folded, each preset is within 2 %; unfolded (the BatchNorms counted) a little more."""
    with torch.device("meta"):
        model = create_model(name).eval()
    raw = flops(model, (1, 3, 224, 224)).gmacs
    folded = flops(model.fuse(), (1, 3, 224, 224)).gmacs
    published = get_model_entry(name).meta["published_gmacs"]
    assert abs(folded - published) <= 0.02 * published, (folded, published)
    assert raw > folded


def test_timm_fixture_parity_on_padded_windows_and_at_224():
    """Built at 224 (windows 7, 7, 4): the fixture's 104x72 input pads every window; one 224 image fills them."""
    model, t = _fixture_model("timm_efficientvit_msra", "efficientvit_m1", SMALL)
    assert [s.blocks[0].attn.window_size for s in model.stages] == [(7, 7), (7, 7), (4, 4)]
    _check(model, t)
    with torch.no_grad():
        assert_parity(model(t["input_224"].float()), t["output_224"])


@pytest.mark.parametrize("fused", [True, False])
def test_m2_heads_parity_with_either_attention_kernel(fused):
    """m2's head layout (4 / 3 / 2 heads, windows 7, 5, 3 at 160) through the fused and the explicit core."""
    from vit_attention.functional import switched

    model, t = _fixture_model("timm_efficientvit_msra_m2", "efficientvit_m2", M2)
    assert [s.blocks[0].attn.window_size for s in model.stages] == [(7, 7), (5, 5), (3, 3)]
    with switched(model, fused_attention=fused):
        _check(model, t)


def test_fused_batch_norms_equal_timms_fused_model():
    model, t = _fixture_model("timm_efficientvit_msra", "efficientvit_m1", SMALL)
    with torch.no_grad():
        before = model(t["input"])
        n = sum(p.numel() for p in model.parameters())
        assert model.fuse() is model
        assert_parity(model(t["input"]), t["output_fused"])
        assert_parity(model(t["input"]), before)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert sum(p.numel() for p in model.parameters()) < n
    assert all(m.fused for m in model.modules() if isinstance(m, ConvNorm))


@pytest.mark.parametrize("tag", sorted(RESIZES))
def test_set_input_size_follows_timms_window_rule_and_resamples_the_tables(tag):
    """timm's ``set_input_size``: windows ``min(7, resolution)`` of the new size, each changed table resampled
    (bicubic, antialiased); ours gives timm's outputs and tables; a model built at the size has the same shapes."""
    model, t = _fixture_model("timm_efficientvit_msra_m2", "efficientvit_m2", M2)
    size = RESIZES[tag]
    resized = copy.deepcopy(model)
    resized.set_input_size(size)
    assert [s.blocks[0].attn.window_size[0] for s in resized.stages] == [w for _, w in stage_windows(resized.cfg)]
    with torch.no_grad():
        assert_parity(resized(t[f"input_{tag}"].float()), t[f"output_{tag}"])
    torch.testing.assert_close(resized.stages[2].blocks[0].attn.attention_biases.detach(), t[f"table_{tag}"])
    assert resized.cfg.img_size == size
    built = create_model("efficientvit_m2", **dict(M2, img_size=size))
    assert {k: v.shape for k, v in built.state_dict().items()} == {k: v.shape for k, v in resized.state_dict().items()}


def test_windows_follow_the_smaller_side_and_small_sizes_are_refused():
    cfg = get_model_entry("efficientvit_m0").config(img_size=(320, 192))
    assert stage_windows(cfg) == [(12, 7), (6, 6), (3, 3)]  # min(320, 192) // 16 = 12
    with pytest.raises(ValueError, match="img_size"):
        create_model("efficientvit_m0", img_size=8)
    with pytest.raises(ValueError, match="kernels"):
        create_model("efficientvit_m0", kernels=(5, 5, 5))
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_model("efficientvit_m0", embed_dim=(64, 128, 190))
    with pytest.raises(ValueError, match="one entry per stage"):
        create_model("efficientvit_m0", window_size=(7, 7))


def test_reset_classifier_and_get_classifier():
    model = create_model("efficientvit_m0", **SMALL)
    assert model.get_classifier() is model.head.linear
    model.reset_classifier(0, "")
    assert isinstance(model.head, torch.nn.Identity) and model.get_classifier() is model.head
    assert model.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 1, 1, 32)  # no pooling, no head: the last map
    model.reset_classifier(4, "avg")
    assert model.get_classifier().out_features == 4 and model.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 4)
    with pytest.raises(ValueError, match="global_pool must be one of"):
        model.reset_classifier(3, "token")


def test_new_weights_take_effect_at_once_after_an_eval_forward():
    """timm and the original cache the gathered bias in eval mode, so a ``load_state_dict`` after an eval forward
    keeps the old bias until ``train()`` / ``.to()``; here a kept bias is checked against its table on every call
    and the folded BatchNorm weights against their tensors' versions."""
    model, t = _fixture_model("timm_efficientvit_msra", "efficientvit_m1", SMALL)
    key = "stages.0.blocks.0.mixer.m.attn.attention_biases"
    assert_edited_table_takes_effect(model, t["input"], "efficientvit_m1", SMALL, key)
