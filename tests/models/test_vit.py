import pytest
import torch
from model_outputs import distinct_reduced_presets, small_overrides

from vit_attention import create_model, list_models
from vit_attention.functional import switched
from vit_attention.models import VisionTransformer, VisionTransformerConfig, model_config
from vit_attention.models.registry import get_model_entry


def _small_name_ok(name):
    return model_config(name).embed_dim <= 1024


@pytest.mark.registry
@pytest.mark.parametrize("name", [n for n in list_models(family="vit") if _small_name_ok(n)])
def test_small_forward_backward(name):
    cfg = model_config(name)
    img = 2 * cfg.patch_size
    model = create_model(name, img_size=img, depth=1, num_classes=5)
    x = torch.randn(2, 3, img, img)
    out = model.train()(x)
    logits = out[0] + out[1] if isinstance(out, tuple) else out
    assert logits.shape == (2, 5)
    logits.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def _tiny(**kw):
    base = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=7)
    return VisionTransformer(VisionTransformerConfig(**{**base, **kw})).eval()


@pytest.mark.parametrize("kw", [{}, dict(global_pool="avg", class_token=False), dict(qk_norm=True, init_values=0.1),
                                dict(block="post"), dict(block="parallel"), dict(distilled=True),
                                dict(global_pool="map", class_token=False), dict(pos_embed="sincos")])
def test_fused_equals_explicit(kw):
    model = _tiny(**kw)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        a = model(x)
        with switched(model, fused_attention=False):
            b = model(x)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_distilled_heads_train_vs_eval():
    model = _tiny(distilled=True)
    x = torch.randn(2, 3, 32, 32)
    model.train()
    cls, dist = model(x)
    model.eval()
    torch.testing.assert_close(model(x), (cls + dist) / 2)  # no dropout: same forward
    assert model.num_prefix_tokens == 2 and model.pos_embed.shape[1] == 16 + 2


def test_representation_layer_and_pre_logits():
    model = _tiny(representation_size=24)
    x = torch.randn(2, 3, 32, 32)
    feats = model.forward_head(model.forward_features(x), pre_logits=True)
    assert feats.shape == (2, 24) and model.num_features == 24
    assert feats.abs().max() <= 1  # tanh
    assert model(x).shape == (2, 7)


def test_dynamic_img_size_resamples_pos_embed():
    model = _tiny(dynamic_img_size=True)
    assert model(torch.randn(1, 3, 48, 40)).shape == (1, 7)
    strict = _tiny()
    with pytest.raises(ValueError, match=r"expected image size \(32, 32\)"):
        strict(torch.randn(1, 3, 48, 40))


def test_forward_intermediates():
    model = _tiny(depth=3)
    x = torch.randn(2, 3, 32, 32)
    final, inter = model.forward_intermediates(x, indices=[0, -1])
    assert [t.shape for t in inter] == [(2, 32, 4, 4)] * 2
    torch.testing.assert_close(final, model.forward_features(x))
    nlc = model.forward_intermediates(x, 1, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True)
    grid, prefix = nlc[0]
    assert grid.shape == (2, 16, 32) and prefix.shape == (2, 1, 32)
    with pytest.raises(ValueError, match="out of range"):
        model.forward_intermediates(x, indices=[5])


def test_reset_classifier_and_grad_checkpointing():
    model = _tiny()
    assert model.feature_info[-1] == dict(num_chs=model.embed_dim, reduction=model.cfg.patch_size,
                                          module=f"blocks.{len(model.blocks) - 1}")
    model.reset_classifier(3)
    x = torch.randn(2, 3, 32, 32)
    assert model(x).shape == (2, 3) and model.cfg.num_classes == 3
    model.reset_classifier(0)
    assert model(x).shape == (2, 32)
    model = _tiny().train()
    torch.manual_seed(0)
    ref = model(x)
    ref.sum().backward()
    g_ref = model.patch_embed.proj.weight.grad.clone()
    model.zero_grad()
    model.set_grad_checkpointing(True)
    out = model(x)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(model.patch_embed.proj.weight.grad, g_ref)


def test_deit3_no_embed_class():
    model = _tiny(no_embed_class=True, init_values=1e-6)
    assert model.pos_embed.shape[1] == 16
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)


def test_conv_stem_model():
    model = create_model("vitc_1gf_patch16_224", img_size=32, depth=1, num_classes=4)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 4)


def test_spatial_mechanism_in_vit_backbone():
    model = _tiny(attn_layer="window", attn_kwargs=dict(window_size=2), class_token=False, global_pool="avg")
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    with_cls = _tiny(attn_layer="window", attn_kwargs=dict(window_size=2, shift_size=1))
    assert with_cls(torch.randn(2, 3, 32, 32)).shape == (2, 7)  # class token passes the spatial attention


@pytest.mark.parametrize("bad,match", [
    (dict(embed_dim=30, num_heads=4), "divisible by num_heads"),
    (dict(global_pool="max"), "global_pool"),
    (dict(class_token=False), "needs class_token"),
    (dict(attn_layer="windw"), "unknown attention"),
    (dict(img_size=30), "not divisible by patch_size"),
])
def test_bad_config_errors(bad, match):
    with pytest.raises((ValueError, KeyError), match=match):
        _tiny(**bad)


def test_wrong_channels_error():
    with pytest.raises(ValueError, match="expected 3 input channels"):
        _tiny()(torch.randn(1, 1, 32, 32))


def _vit_family_init(model):
    """ViT's init written out: the position table ~ truncated N(0, 0.02), prefix tokens ~ N(0, 1e-6), then in
    module order every ``Linear`` ~ truncated N(0, 0.02) with zero bias (timm 1.0.31's ``init_weights_vit_timm``)
    and the patch convolution ``patch_embed.proj`` as a flattened linear map."""
    if model.pos_embed is not None:
        torch.nn.init.trunc_normal_(model.pos_embed, std=0.02)
    for tok in (model.cls_token, model.dist_token, model.reg_token):
        if tok is not None:
            torch.nn.init.normal_(tok, std=1e-6)
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)
        elif isinstance(m, torch.nn.Conv2d) and name == "patch_embed.proj":
            torch.nn.init.trunc_normal_(m.weight.view(m.weight.shape[0], -1), std=0.02)


@pytest.mark.registry
@pytest.mark.parametrize("name", [n for n in distinct_reduced_presets()
                                  if issubclass(get_model_entry(n).model_cls, VisionTransformer)])
def test_init_is_vits_draw_for_draw(name):
    """Every ViT-based family initialises as ViT's rule, the same random draws in the same order (seeded runs and
    anything trained from scratch keep their numbers)."""
    model = create_model(name, **small_overrides(name))
    torch.manual_seed(0)
    _vit_family_init(model)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    VisionTransformer._init_weights(model)
    for key, value in model.state_dict().items():
        assert torch.equal(value, want[key]), key
