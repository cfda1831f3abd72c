"""VOLO (models/volo.py): presets, parameters and GMACs against timm 1.0.31, parity with timm's VOLO (committed
fixtures made by tests/fixtures/make_fixtures_volo.py: features, pre-logits, logits with the token-labelling head,
every level's map), the heads, the input size and pruning."""

import copy
import dataclasses

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_loads, assert_parity, load_fixture, meta_model_with_timm_params

from vit_attention import create_model
from vit_attention.analysis.flops import flops
from vit_attention.attention.class_attn import ClassAttention
from vit_attention.attention.mhsa import MultiHeadSelfAttention
from vit_attention.attention.outlook import OutlookAttention
from vit_attention.functional import switched
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.volo import Volo, VoloConfig, volo_grid

pytestmark = pytest.mark.parity

# timm 1.0.31 on the meta device: exact parameter counts (1000 classes)
TIMM_PARAMS = {"volo_d1_224": 26_632_040, "volo_d1_384": 26_777_960, "volo_d2_224": 58_678_336,
               "volo_d2_384": 58_872_896, "volo_d3_224": 86_325_072, "volo_d3_448": 86_626_128,
               "volo_d4_224": 192_961_520, "volo_d4_448": 193_413_104, "volo_d5_224": 295_455_584,
               "volo_d5_448": 295_907_168, "volo_d5_512": 296_091_488}
# the fixtures' timm VOLO constructor keywords (make_fixtures_volo.py) that are ours by the same name
_SAME = ("img_size", "layers", "embed_dims", "num_heads", "stem_hidden_dim", "mlp_ratio", "num_classes")


def _fixture_model(name: str) -> tuple[Volo, dict]:
    state, t, cfg = load_fixture(name)
    model = Volo(VoloConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k in _SAME}))
    assert_loads(model.eval(), state, "timm")
    return model, t


def test_registered_names_and_presets():
    assert set(list_models("volo*")) == set(TIMM_PARAMS)
    for name in TIMM_PARAMS:
        e = get_model_entry(name)
        size = int(name.rsplit("_", 1)[1])
        assert e.family == "volo" and e.preset["img_size"] == size
        assert e.preset.get("mlp_ratio", 3.0) == (4.0 if "_d5_" in name else 3.0)
        assert e.meta["published_params_m"] == round(TIMM_PARAMS[name] / 1e6, 3) and e.meta["published_gmacs"] > 0
        cfg = e.config()
        assert cfg.attn_layer == "outlook" and cfg.kernel_size == 3 and cfg.outlook_stride == 2
        assert cfg.global_pool == "token" and cfg.num_class_blocks == 2 and cfg.use_aux_head and not cfg.qkv_bias


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameters_equal_timm_and_gmacs_within_two_percent_of_timms_table(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name])
    size = m.cfg.img_size
    assert m.pos_embed.shape == (1, size // 16, size // 16, m.num_features)
    assert isinstance(m.network[0][0].attn, OutlookAttention) and m.network[0][0].attn.stride == 2
    assert isinstance(m.network[2][0].attn, MultiHeadSelfAttention) and m.network[2][0].attn.qkv.bias is None
    assert isinstance(m.post_network[0].attn, ClassAttention) and m.post_network[0].attn.k.bias is None
    macs = flops(m, (1, 3, size, size)).total / 1e9
    published = get_model_entry(name).meta["published_gmacs"]
    assert abs(macs - published) / published < 0.02, (macs, published)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("name", ["timm_volo", "timm_volo_odd"])
def test_timm_fixture_parity(name, fused):
    """Features, pre-logits, the logits (class head + 0.5 max of the token-labelling head) and the four levels'
    maps equal timm's; ``timm_volo_odd`` runs the outlooker on a 5x7 map (ceil pooling, border windows)."""
    model, t = _fixture_model(name)
    assert_fixture_parity(model, t, fused=fused)
    with torch.no_grad(), switched(model, fused_attention=fused):
        maps = model.forward_intermediates(t["input"], intermediates_only=True)
    assert len(maps) == 4
    for i, m in enumerate(maps):
        assert_parity(m, t[f"intermediate_{i}"])


def test_logits_are_the_class_head_plus_half_the_max_of_the_token_labelling_head():
    model, t = _fixture_model("timm_volo")
    with torch.no_grad():
        f = model.forward_features(t["input"])  # [B, 1 + N, C]
        want = model.head(f[:, 0]) + 0.5 * model.aux_head(f[:, 1:]).max(dim=1).values
        torch.testing.assert_close(model(t["input"]), want)
        model.aux_head = None
        assert not torch.allclose(model(t["input"]), want)  # dropping the aux head changes the logits


def test_classifier_reset_and_no_classes():
    model = create_model("volo_d1_224", **get_model_entry("volo_d1_224").reduced_overrides(), num_classes=5)
    assert model.aux_head.out_features == 5
    model.reset_classifier(7)
    assert model.head.out_features == 7 and model.aux_head.out_features == 7 and model.cfg.num_classes == 7
    model.reset_classifier(0)
    assert isinstance(model.head, torch.nn.Identity) and model.aux_head is None
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert model(x).shape == (2, 32)
    bare = create_model("volo_d1_224", **get_model_entry("volo_d1_224").reduced_overrides(), num_classes=0)
    assert bare.aux_head is None and isinstance(bare.head, torch.nn.Identity)
    with pytest.raises(ValueError, match="global_pool='token' needs the class token"):
        VoloConfig(num_class_blocks=0)


def test_another_input_size_names_set_input_size_which_resamples_as_the_original_repository():
    model, t = _fixture_model("timm_volo")
    x = torch.randn(1, 3, 48, 48)
    with pytest.raises(ValueError, match="set_input_size"):
        model(x)
    resized = copy.deepcopy(model)
    resized.set_input_size((48, 48))
    assert resized.grid_size == volo_grid((48, 48), 8) == (3, 3) and resized.pos_embed.shape == (1, 3, 3, 32)
    want = torch.nn.functional.interpolate(model.pos_embed.permute(0, 3, 1, 2), size=(3, 3), mode="bicubic",
                                           align_corners=False).permute(0, 2, 3, 1)
    torch.testing.assert_close(resized.pos_embed, want)
    built = Volo(dataclasses.replace(model.cfg, img_size=48)).eval()
    assert_loads(built, model.state_dict())  # the adapter resamples the same way
    with torch.no_grad():
        torch.testing.assert_close(built(x), resized.eval()(x))


def test_forward_intermediates_stop_early_and_pruning():
    model, t = _fixture_model("timm_volo")
    x = t["input"]
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=[0, 1], stop_early=True, output_fmt="NHWC")
        assert final.shape == maps[-1].shape == (2, 2, 3, 32) and maps[0].shape == (2, 4, 6, 16)
        full, normed = model.forward_intermediates(x, indices=[-1], norm=True)
        torch.testing.assert_close(full, model.forward_features(x))
        torch.testing.assert_close(normed[0], model.norm(t["intermediate_3"].permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
        pruned = copy.deepcopy(model)
        assert pruned.prune_intermediate_layers([0]) == [0]
        assert pruned.pos_embed is None and pruned.cls_token is None and len(pruned.network) == 1
        assert pruned.num_classes == 0 and pruned.aux_head is None and pruned.num_features == 16
        assert_parity(pruned.forward_intermediates(x, intermediates_only=True)[0], t["intermediate_0"])


def test_token_merging_is_refused_with_the_reason():
    model = create_model("volo_d1_224", **get_model_entry("volo_d1_224").reduced_overrides())
    with pytest.raises(ValueError, match="outlooker stage generates window weights"):
        model.set_token_merging(2)


@pytest.mark.parametrize("kw,match", [
    (dict(layers=(2,), embed_dims=(8,), num_heads=(2,)), "transformer stage"),
    (dict(embed_dims=(192, 384, 192, 384)), "one width"),
    (dict(patch_size=12), "patch_size must be 4, 8 or 16"),
    (dict(img_size=8), "too small"),
    (dict(class_attn_layer="talking_heads"), "takes a context"),
    (dict(attn_layer="mhsa"), "spatial mechanism"),
])
def test_bad_configs_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        VoloConfig(**kw)
