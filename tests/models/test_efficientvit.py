"""EfficientViT-MIT (models/efficientvit.py): presets, structure, parity with timm 1.0.31's EfficientVit /
EfficientVitLarge (committed fixtures made by tests/fixtures/make_fixtures_efficientvit.py) at 97x75 and 224x224,
any input size, swapped mechanisms, the head, and what is refused."""

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_loads, load_fixture, meta_model_with_timm_params

from vit_attention import create_model
from vit_attention.analysis import record_attention
from vit_attention.attention.lite_mla import LiteMLA
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.efficientvit import EfficientViT, EfficientViTBlock

pytestmark = pytest.mark.parity

# timm 1.0.31 on the meta device: exact parameter counts (1000 classes)
TIMM_PARAMS = {"efficientvit_b0": 3_410_008, "efficientvit_b1": 9_102_024, "efficientvit_b2": 24_330_712,
               "efficientvit_b3": 48_646_056, "efficientvit_l1": 52_654_088, "efficientvit_l2": 63_707_016,
               "efficientvit_l3": 246_037_288}
# the fixtures' reduced timm models (tests/fixtures/make_fixtures_efficientvit.py)
SMALL = dict(widths=(8, 8, 16, 16, 32), depths=(1, 2, 2, 1, 1), head_dim=8, head_widths=(32, 48), num_classes=10)
FIXTURES = {"timm_efficientvit": "efficientvit_b0", "timm_efficientvit_large": "efficientvit_l1"}


def _fixture_model(fixture: str) -> tuple[EfficientViT, dict]:
    state, t, _ = load_fixture(fixture)
    model = create_model(FIXTURES[fixture], **SMALL).eval()
    assert_loads(model, state, "timm")
    return model, t


def test_registered_names_and_presets():
    assert set(list_models(family="efficientvit")) == set(TIMM_PARAMS)
    for name in TIMM_PARAMS:
        e = get_model_entry(name)
        large = name.startswith("efficientvit_l")
        assert e.family == "efficientvit" and e.preset.get("large", False) == large
        assert e.config().attn_layer == "lite_mla" and e.config().attn_scales == (5,)
        assert e.config().act_layer == ("gelu_tanh" if large else "hardswish")
        assert e.config().norm_eps == (1e-7 if large else 1e-5) and e.config().head_bn_eps == 1e-5
        assert e.meta["published_params_m"] == round(TIMM_PARAMS[name] / 1e6, 3) and e.meta["published_gmacs"] > 0


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameters_equal_timm_and_structure_on_meta(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name])
    cfg = m.cfg
    for i, stage in enumerate(m.stages):
        blocks = list(stage.blocks)
        assert not blocks[0].shortcut  # the stride-2 downsampling block has no residual
        vit = [isinstance(b, EfficientViTBlock) for b in blocks[1:]]
        assert all(vit) if i in cfg.attention_stages() else not any(vit)
        for b in blocks[1:]:
            if isinstance(b, EfficientViTBlock):
                assert isinstance(b.attn, LiteMLA) and b.attn.head_dim == cfg.head_dim and b.attn.scales == (5,)
                assert b.attn.norm.eps == cfg.norm_eps
    assert m.num_features == cfg.head_widths[1] and m.get_classifier().in_features == cfg.head_widths[1]
    assert [d["reduction"] for d in m.feature_info] == [4, 8, 16, 32]


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_timm_fixture_parity_at_97x75_and_224(fixture):
    """The reduced B / L models with timm's weights (BatchNorm statistics drawn): features, pre-logits and logits
    on the fixture's 97x75 input and on a 224x224 image (``input_224``, stored as float16 values)."""
    model, t = _fixture_model(fixture)
    assert_fixture_parity(model, t)
    t["input_224"] = t["input_224"].float()
    assert_fixture_parity(model, t, "_224")


def test_runs_at_any_size_with_the_maps_of_its_strides():
    """No positional parameters: final maps 5², 7², 4x3 at 160, 224 and 97x75 (all convolutions padded)."""
    model = create_model("efficientvit_b0", **SMALL).eval()
    for size, final in (((160, 160), (5, 5)), ((224, 224), (7, 7)), ((97, 75), (4, 3))):
        with torch.no_grad():
            maps = model.forward_intermediates(torch.randn(1, 3, *size), intermediates_only=True)
            logits = model(torch.randn(1, 3, *size))
        assert tuple(maps[-1].shape[-2:]) == final and logits.shape == (1, 10)
        assert [m.shape[1] for m in maps] == [8, 16, 16, 32]


@pytest.mark.parametrize(("mechanism", "kwargs"), [("mhsa", {}), ("window", {"window_size": 2})])
def test_any_mechanism_replaces_lite_mla(mechanism, kwargs):
    model = create_model("efficientvit_b0", **SMALL, attn_layer=mechanism, attn_kwargs=kwargs).eval()
    blocks = [b for b in model.modules() if isinstance(b, EfficientViTBlock)]
    assert blocks and all(b.attn.attention_name == mechanism for b in blocks)
    with torch.no_grad():
        assert model(torch.randn(2, 3, 64, 48)).shape == (2, 10)


def test_head_pre_logits_reset_and_pruning():
    model = create_model("efficientvit_b0", **SMALL).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feats = model.forward_features(x)
        pre = model.forward_head(feats, pre_logits=True)
        head = model.head
        ref = head.drop(head.act(head.norm(head.hidden(head.in_conv(feats).mean(dim=(2, 3))))))
    assert feats.shape == (2, 32, 2, 2) and pre.shape == (2, 48)
    torch.testing.assert_close(pre, ref)
    model.reset_classifier(3)
    assert model.get_classifier().in_features == 48 and model(x).shape == (2, 3)
    with pytest.raises(ValueError, match="global_pool must be one of 'avg'"):
        model.reset_classifier(3, global_pool="")
    model.prune_intermediate_layers([1])
    assert model.num_features == 16 and model.num_classes == 0
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, [1])
    assert final.shape == maps[0].shape == (2, 16, 8, 8)


def test_attention_maps_and_token_merging_are_refused_with_the_reason():
    model = create_model("efficientvit_b0", **SMALL).eval()
    with pytest.raises(ValueError, match=r"stages\.2\.blocks\.1\.attn is 'lite_mla': ReLU linear attention forms no"):
        with record_attention(model):
            pass
    with pytest.raises(ValueError, match="token merging is not available for EfficientViT: its attention runs"):
        model.set_token_merging(2)


def test_drop_path_trains_and_does_nothing_at_inference():
    model = create_model("efficientvit_b0", **SMALL, drop_path_rate=0.3)
    assert sum(type(m).__name__ == "DropPath" for m in model.modules()) > 0
    x = torch.randn(2, 3, 64, 64)
    model.train()
    model(x).square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    plain = create_model("efficientvit_b0", **SMALL).eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x), rtol=0, atol=0)


def test_inference_folds_batch_norm_and_training_mode_normalises_with_batch_statistics():
    """Eval (BatchNorm folded into the convolutions and LiteMLA's projection) equals the unfolded computation (a
    global forward hook disables every fold); training mode normalises with the batch's statistics."""
    from torch.nn.modules.module import register_module_forward_hook

    model, t = _fixture_model("timm_efficientvit")
    x = t["input"]
    calls = []
    with torch.no_grad():
        folded = model(x)
        handle = register_module_forward_hook(lambda m, a, o: calls.append(type(m).__name__))
        try:
            unfolded = model(x)
        finally:
            handle.remove()
    assert "BatchNorm2d" in calls and "BatchNorm1d" in calls  # the norms ran as modules
    torch.testing.assert_close(folded, unfolded, atol=1e-5, rtol=1e-5)
    model.train()
    with torch.no_grad():
        trained = model.forward_features(x)
    assert not torch.allclose(trained, t["features"], atol=1e-3)


def test_inference_keeps_folds_only_while_the_tensors_are_unchanged_and_hooks_see_each_output():
    """The folded weights kept between calls follow an in-place edit of the statistics; a hook on a convolution
    sees its output as the convolution made it (the hardswish then runs as a module, not in place)."""
    from vit_attention.functional.fast_paths import use_fast_paths

    model, t = _fixture_model("timm_efficientvit")
    x = t["input"]
    unit = model.stem.in_conv  # conv, BatchNorm, hardswish
    seen = []
    with torch.no_grad():
        before = model(x)
        handle = unit.conv.register_forward_hook(lambda m, a, o: seen.append((o, o.clone())))
        try:
            model(x)
        finally:
            handle.remove()
        assert torch.equal(*seen[0])  # the activation did not overwrite what the hook holds
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_var.mul_(1.5)
        got = model(x)
        with use_fast_paths(False):  # nothing kept: every fold computed from the tensors as they are
            want = model(x)
    assert not torch.allclose(got, before, atol=1e-3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cpu_maps_run_channels_last_with_the_same_numbers():
    """On the CPU the stem takes the images in channels-last memory and every later map keeps that layout; with the
    fast paths off the maps stay NCHW-contiguous and the numbers are the same."""
    from vit_attention.functional.fast_paths import use_fast_paths

    model, t = _fixture_model("timm_efficientvit")
    x = t["input"]
    with torch.no_grad():
        maps = model.forward_intermediates(x, intermediates_only=True)
        with use_fast_paths(False):
            plain = model.forward_intermediates(x, intermediates_only=True)
    for m, p in zip(maps, plain):
        assert m.is_contiguous(memory_format=torch.channels_last) and p.is_contiguous()
        torch.testing.assert_close(m, p, atol=1e-5, rtol=1e-5)


def test_the_shortcut_goes_into_the_last_unit_only_where_no_hook_would_see_the_difference():
    """A residual block adds its shortcut in its last conv unit (the 1x1 convolution's GEMM); a hook on that unit
    still sees the unit's own output, and both ways give the same block output."""
    from vit_attention.models.efficientvit import Residual

    model, t = _fixture_model("timm_efficientvit")
    block = next(m for m in model.modules() if isinstance(m, Residual) and m.shortcut)
    x = torch.randn(2, block.main[0].conv.in_channels, 8, 8).contiguous(memory_format=torch.channels_last)
    seen = []
    with torch.no_grad():
        fused = block(x)
        handle = block.main[-1].register_forward_hook(lambda m, a, o: seen.append(o))
        try:
            hooked = block(x)
        finally:
            handle.remove()
        unit_alone = block.main(x)
    torch.testing.assert_close(hooked, fused, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seen[0], unit_alone, atol=0, rtol=0)  # without the shortcut
    torch.testing.assert_close(fused, x + unit_alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("override", "match"), [
    (dict(head_dim=12), r"widths\[3\]=16 \(stage 2, attention\) is not divisible by head_dim=12"),
    (dict(widths=(8, 8, 16, 16)), "widths"),
    (dict(act_layer="relu"), "act_layer must be one of 'hardswish', 'gelu_tanh'"),
    (dict(head_widths=(32,)), "head_widths"),
    (dict(large=1), "large must be a bool"),
    (dict(global_pool=""), "global_pool must be one of 'avg'"),
    (dict(attn_layer="nope"), "attn_layer"),
])
def test_bad_config_fields_are_refused_by_name(override, match):
    with pytest.raises((ValueError, TypeError, KeyError), match=match):
        create_model("efficientvit_b0", **{**SMALL, **override})
