"""LeViT (models/levit.py): presets, parameters equal timm 1.0.31's on meta, GMACs against timm's table, parity with
timm's LevitDistilled / Levit (committed fixtures made by tests/fixtures/make_fixtures_levit.py) in linear and conv
layouts, BatchNorm folding, other input sizes against timm's resize rule, the distilled head and the refusals."""

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
from vit_attention.attention import AttentionCall
from vit_attention.attention.attention_bias import AttentionBias, AttentionBiasShrink, LinearNorm, norm_rows
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.levit import Levit, stage_grids

pytestmark = pytest.mark.parity

# timm 1.0.31 on the meta device: exact parameter counts with 1000 classes (both heads) and with num_classes=0
TIMM_PARAMS = {"levit_128s": (7_777_058, 7_005_522), "levit_128": (9_213_936, 8_442_400),
               "levit_192": (10_947_069, 10_175_533), "levit_256": (18_893_876, 17_865_828),
               "levit_384": (39_128_836, 37_587_764)}
# the fixtures' reduced timm models (tests/fixtures/make_fixtures_levit.py)
SMALL = dict(img_size=(80, 64), num_classes=10, embed_dim=(32, 48, 64), key_dim=8, num_heads=(2, 3, 4),
             depth=(2, 1, 1))
S8 = dict(img_size=64, num_classes=10, embed_dim=(32, 48, 64), key_dim=8, num_heads=(2, 3, 4), depth=(1, 1, 1),
          stem_type="s8", act_layer="silu", distilled=False)
RESIZES = {"img96": 96, "img48": 48}


def _fixture_model(name: str, preset: str, overrides: dict, layout: str | None = None) -> tuple[Levit, dict]:
    state, t, _ = load_fixture(name)
    model = create_model(preset, **overrides).eval()
    assert_loads(model, state, layout)
    return model, t


def _check(model: Levit, t: dict, conv: bool = False) -> None:
    """Features (timm's tokens are our map's rows; its conv mode's NCHW map ours permuted), pooled features and
    logits equal the fixture's."""
    x = t["input"]
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.dim() == 4
        want = feats.permute(0, 3, 1, 2) if conv else feats.reshape(feats.shape[0], -1, feats.shape[-1])
        assert_parity(want, t["features"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["pre_logits"])
        assert_parity(model(x), t["output"])


def test_registered_names_and_presets():
    names = {*TIMM_PARAMS, *(n.replace("levit_", "levit_conv_") for n in TIMM_PARAMS)}
    assert set(list_models("levit*")) == names
    for name in names:
        e = get_model_entry(name)
        assert e.family == "levit" and e.config().distilled and e.config().act_layer == "hard_swish"
        assert e.preset == get_model_entry(name.replace("_conv", "")).preset  # conv files: the same model
        assert e.meta["published_params_m"] > 0 and e.meta["published_gmacs"] > 0


CONV = {n.replace("levit_", "levit_conv_"): n for n in TIMM_PARAMS}  # timm 1.0.31: the same counts


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted([*TIMM_PARAMS, *CONV]))
def test_parameters_equal_timm_and_structure_on_meta(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[CONV.get(name, name)][0])
    cfg = m.cfg
    assert stage_grids(cfg) == [(14, 14), (7, 7), (4, 4)]
    for i, stage in enumerate(m.stages):
        attn = stage.blocks[0].attn
        assert isinstance(attn, AttentionBias) and attn.resolution == stage_grids(cfg)[i]
        assert attn.key_dim == cfg.key_dim and attn.val_dim == 2 * cfg.key_dim and attn.num_heads == cfg.num_heads[i]
        if i:
            shrink = stage.downsample.attn_downsample
            assert isinstance(shrink, AttentionBiasShrink) and shrink.resolution == stage_grids(cfg)[i - 1]
            assert shrink.num_heads == cfg.embed_dim[i - 1] // cfg.key_dim and shrink.val_dim == 4 * cfg.key_dim
    with torch.device("meta"):
        headless = create_model(name, num_classes=0)
    assert sum(p.numel() for p in headless.parameters()) == TIMM_PARAMS[CONV.get(name, name)][1]


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_gmacs_of_the_folded_model_are_within_2_percent_of_timms_table(name):
    """timm's table counts the BatchNorm-folded model (its bench parameter counts are the folded ones); the
    unfolded model adds fvcore's 5 per BatchNorm element."""
    with torch.device("meta"):
        model = create_model(name).eval()
    raw = flops(model, (1, 3, 224, 224)).gmacs
    folded = flops(model.fuse(), (1, 3, 224, 224)).gmacs
    published = get_model_entry(name).meta["published_gmacs"]
    assert abs(folded - published) <= 0.02 * published, (folded, published)
    assert raw > folded


@pytest.mark.parametrize("fused", [True, False])
def test_timm_fixture_parity_non_square_grid(fused):
    model, t = _fixture_model("timm_levit", "levit_128s", SMALL)
    from vit_attention.functional import switched

    with switched(model, fused_attention=fused):
        _check(model, t)


def test_fused_batch_norms_equal_timms_fused_model():
    model, t = _fixture_model("timm_levit", "levit_128s", SMALL)
    with torch.no_grad():
        before = model(t["input"])
        n = sum(p.numel() for p in model.parameters())
        model.fuse()
        assert_parity(model(t["input"]), t["output_fused"])
        assert_parity(model(t["input"]), before)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert sum(p.numel() for p in model.parameters()) < n
    assert model.stages[0].blocks[0].attn.qkv.fused and model.fuse() is model  # twice: nothing left to fold


def test_timm_conv_layout_loads_through_the_converter():
    model, t = _fixture_model("timm_levit_conv", "levit_conv_128s", SMALL, "timm_conv")
    _check(model, t, conv=True)
    state, _, _ = load_fixture("timm_levit_conv")
    assert sum(v.dim() == 4 and v.shape[2:] == (1, 1) for k, v in state.items() if k.startswith("stages.")) > 0


def test_s8_stem_silu_single_head_parity():
    model, t = _fixture_model("timm_levit_s8", "levit_128s", S8)
    assert model.head_dist is None and len(model.stem) == 5  # three convolutions, two activations
    assert isinstance(model.stem.act1, torch.nn.SiLU) and model.feature_info[0]["reduction"] == 8
    _check(model, t)


@pytest.mark.parametrize("tag", sorted(RESIZES))
def test_other_sizes_read_the_tables_resampled_by_timms_rule(tag):
    """timm has no resize path: the fixture is a timm model built at the new size holding the weights with each
    table resampled by ``resize_rel_pos_bias_table_levit``. Ours runs the new size as built (tables read
    resampled) and after ``set_input_size`` (resampled for good) with the same outputs."""
    model, t = _fixture_model("timm_levit_s8", "levit_128s", S8)
    x = t[f"input_{tag}"]
    with torch.no_grad():
        assert_parity(model(x), t[f"output_{tag}"])
        resized = copy.deepcopy(model)
        resized.set_input_size(RESIZES[tag])
        assert_parity(resized(x), t[f"output_{tag}"])
    torch.testing.assert_close(resized.stages[0].blocks[0].attn.attention_biases.detach(), t[f"table_{tag}"])
    assert resized.cfg.img_size == RESIZES[tag]
    built = create_model("levit_128s", **dict(S8, img_size=RESIZES[tag]))
    assert {k: v.shape for k, v in built.state_dict().items()} == {k: v.shape for k, v in resized.state_dict().items()}


def test_weights_of_another_size_load_with_their_tables_resampled():
    state, t, _ = load_fixture("timm_levit_s8")
    model = create_model("levit_128s", **dict(S8, img_size=96)).eval()
    report = assert_loads(model, state)
    assert any("attention_biases tables resampled" in n for n in report.notes)
    with torch.no_grad():
        assert_parity(model(t["input_img96"]), t["output_img96"])


def test_distilled_head_averages_in_eval_and_returns_both_when_training_distilled():
    model, t = _fixture_model("timm_levit", "levit_128s", SMALL)
    with torch.no_grad():
        feats = model.pool(model.forward_features(t["input"]))
        both = (model.head(feats) + model.head_dist(feats)) / 2
        assert_parity(model(t["input"]), both)
        assert not torch.allclose(model.head(feats), model.head_dist(feats))
        model.train()
        assert model(t["input"]).shape == (2, 10)  # distillation off: the mean
        model.set_distilled_training()
        out, dist = model(t["input"])
        assert out.shape == dist.shape == (2, 10)
    with pytest.raises(ValueError, match="needs a distilled model"):
        create_model("levit_128s", **S8).set_distilled_training()


def test_reset_classifier_replaces_both_heads():
    model = create_model("levit_128s", **SMALL)
    model.reset_classifier(5)
    assert model.head.linear.out_features == model.head_dist.linear.out_features == 5 and model.cfg.num_classes == 5
    model.reset_classifier(0, "")
    assert isinstance(model.head, torch.nn.Identity) and isinstance(model.head_dist, torch.nn.Identity)
    x = torch.randn(1, 3, 80, 64)
    assert model.eval()(x).shape == (1, 2, 1, 64)  # no pooling, no head: the last map (grid 2x1)
    with pytest.raises(ValueError, match="global_pool must be one of"):
        model.reset_classifier(3, "token")
    assert model.get_classifier() is model.head
    model.reset_classifier(4)
    assert model.get_classifier() is model.head.linear and model.get_classifier().out_features == 4


def test_new_weights_take_effect_at_once_after_an_eval_forward():
    """timm and the original cache the gathered bias in eval mode, so a ``load_state_dict`` after an eval forward
    keeps the old bias until ``train()`` / ``.to()``; here a kept bias is checked against its table on every call
    and the folded BatchNorm weights against their tensors' versions."""
    model, t = _fixture_model("timm_levit", "levit_128s", SMALL)
    assert_edited_table_takes_effect(model, t["input"], "levit_128s", SMALL, "stages.0.blocks.0.attn.attention_biases")


def test_stem_activations_run_in_place_only_where_nothing_else_holds_the_map():
    """At inference the stem's hardswish runs inside the convolution (or overwrites its output); a hook on the
    convolution keeps the output it saw, autograd keeps what it needs, and every path gives the same numbers (up to
    oneDNN's hardswish rounding)."""
    model, t = _fixture_model("timm_levit", "levit_128s", SMALL)
    x = t["input"]
    with torch.no_grad():
        want = model.stem(x)
        seen = []
        handle = model.stem.conv1.register_forward_hook(lambda m, a, o: seen.append((o, o.clone())))
        try:
            hooked = model.stem(x)
        finally:
            handle.remove()
    assert torch.equal(*seen[0])
    torch.testing.assert_close(hooked, want, atol=1e-5, rtol=1e-5)
    x = x.clone().requires_grad_()
    out = model.stem(x)
    out.sum().backward()  # the activations' inputs are intact for their gradients
    torch.testing.assert_close(out.detach(), want, atol=1e-5, rtol=1e-5)
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_residual_adds_go_into_the_last_gemm_only_where_no_hook_would_see_the_difference():
    """At inference a block adds its residuals inside the attention's and the MLP's last projections; a hook on the
    MLP or on the attention's projection sees its own output (without the residual), with the same block output."""
    model, t = _fixture_model("timm_levit", "levit_128s", SMALL)
    block = model.stages[0].blocks[0]
    x = model._embed(t["input"]).detach()
    seen = {}
    with torch.no_grad():
        fused = block(x)
        hooks = [block.mlp.register_forward_hook(lambda m, a, o: seen.__setitem__("mlp", (a[0], o))),
                 block.attn.proj.ln.register_forward_hook(lambda m, a, o: seen.__setitem__("proj", o))]
        try:
            hooked = block(x)
        finally:
            for h in hooks:
                h.remove()
        mid, mlp_out = seen["mlp"]
        torch.testing.assert_close(hooked, fused, atol=1e-5, rtol=1e-5)
        # the MLP's output had no residual, nor had the projection's
        torch.testing.assert_close(hooked.reshape(mid.shape), mid + mlp_out, atol=0, rtol=0)
        torch.testing.assert_close(mid, x.reshape(mid.shape) + seen["proj"], atol=0, rtol=0)
        grid = x.shape[1:3]
        tokens = x.reshape(x.shape[0], -1, x.shape[-1])
        alone = block.attn(tokens, AttentionCall(grid))
        torch.testing.assert_close(alone, seen["proj"].reshape(alone.shape), atol=1e-5, rtol=1e-5)


def test_linear_norm_statistics_run_over_every_token_in_training():
    """LeViT's BatchNorm1d normalises each channel over all B·N tokens (not per sample)."""
    layer = LinearNorm(8, 6).train()
    x = torch.randn(3, 5, 8)
    y = layer(x)
    torch.testing.assert_close(y.reshape(-1, 6).mean(0), torch.zeros(6), atol=1e-5, rtol=0)
    assert not torch.allclose(y[0].mean(0), torch.zeros(6), atol=1e-3)


def test_a_single_row_in_training_is_normalised_with_the_running_statistics():
    """A batch of one image has no batch statistics for the head's BatchNorm (torch raises): it reads the running
    ones, as in eval mode, and leaves them unchanged; two images use their batch statistics."""
    model = create_model("levit_128s", **SMALL)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_()
    bn = model.head.bn
    before = bn.running_mean.clone()
    x = torch.randn(1, 3, 80, 64)
    train = model.train()(x)
    torch.testing.assert_close(bn.running_mean, before, rtol=0, atol=0)
    feats = model.pool(model.forward_features(x))
    torch.testing.assert_close(norm_rows(bn.train(), feats), bn.eval()(feats), rtol=0, atol=0)
    assert train.shape == (1, 10) and torch.isfinite(train).all()
    model.train()(torch.randn(2, 3, 80, 64))
    assert not torch.equal(bn.running_mean, before)


@pytest.mark.parametrize(("overrides", "err", "match"), [
    (dict(key_dim=24), ValueError, r"embed_dim\[0\]=128 must be divisible by key_dim=24"),
    (dict(num_heads=(4, 6)), ValueError, "num_heads .* must have one entry per stage"),
    (dict(stem_type="s4"), ValueError, "stem_type must be one of 's16', 's8'"),
    (dict(act_layer="swish"), ValueError, "act_layer must be one of 'hard_swish'"),
    (dict(attn_act_layer="mish"), ValueError, "attn_act_layer must be one of"),
    (dict(attn_ratio=0), ValueError, "attn_ratio must be > 0"),
    (dict(distilled="yes"), TypeError, "distilled must be a bool"),
    (dict(embed_dim=(100, 256, 384), key_dim=4), ValueError, r"embed_dim\[0\]=100 must be divisible by 8"),
])
def test_bad_config_is_refused_by_name(overrides, err, match):
    with pytest.raises(err, match=match):
        create_model("levit_128s", **overrides)


def test_token_merging_is_refused_naming_why():
    with pytest.raises(ValueError, match="bias table by each token's place"):
        create_model("levit_128s", **SMALL).set_token_merging(2)
