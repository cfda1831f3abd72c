"""CvT model (models/cvt.py): sizes against Hugging Face's port, the forward API, options."""

from __future__ import annotations

import pytest
import torch
from transformers import CvtConfig as HFCvtConfig
from transformers import CvtForImageClassification

from vit_attention import create_model, list_models
from vit_attention.models.cvt import Cvt, CvtConfig

PRESETS = ["cvt_13_224", "cvt_13_384", "cvt_21_224", "cvt_21_384", "cvt_w24_384"]
HF_SIZES = {"13": {}, "21": dict(depth=[1, 4, 16]),
            "w24": dict(embed_dim=[192, 768, 1024], num_heads=[3, 12, 16], depth=[2, 2, 20])}
SMALL = dict(embed_dims=(16, 32, 48), num_heads=(1, 2, 3), depths=(1, 1, 2), img_size=64, num_classes=10,
             drop_path_rate=0.0)


def test_presets_registered() -> None:
    assert set(PRESETS) <= set(list_models(family="cvt"))


@pytest.mark.parity
@pytest.mark.parametrize("size", ["13", "21", "w24"])
def test_parameter_count_equals_hugging_face(size: str) -> None:
    """Every parameter of HF's port, no more (both on the meta device)."""
    with torch.device("meta"):
        ours = create_model(f"cvt_{size}_384" if size == "w24" else f"cvt_{size}_224")
        ref = CvtForImageClassification(HFCvtConfig(**HF_SIZES[size], num_labels=1000))
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


def _small(**kw) -> Cvt:
    torch.manual_seed(0)
    return Cvt(CvtConfig(**{**SMALL, **kw})).eval()


def test_forward_api_shapes_and_head() -> None:
    model = _small()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feats = model.forward_features(x)  # [B, 1 + 4·4, C]
        assert feats.shape == (2, 17, 48)
        logits = model(x)
        torch.testing.assert_close(logits, model.head(feats[:, 0]))  # the class token
        torch.testing.assert_close(model.forward_head(feats, pre_logits=True), feats[:, 0])
        final, maps = model.forward_intermediates(x)
    torch.testing.assert_close(final, feats)
    assert [tuple(m.shape) for m in maps] == [(2, 16, 16, 16), (2, 32, 8, 8), (2, 48, 4, 4)]
    assert [f["reduction"] for f in model.feature_info] == [4, 8, 16]
    assert [f["num_chs"] for f in model.feature_info] == [16, 32, 48]
    with torch.no_grad():
        nhwc = model.forward_intermediates(x, indices=[-1], norm=True, output_fmt="NHWC", intermediates_only=True)
    torch.testing.assert_close(nhwc[0], feats[:, 1:].reshape(2, 4, 4, 48))  # the normed map, no class token


def test_without_class_token_the_head_averages() -> None:
    model = _small(cls_token=False)
    assert not any("cls_token" in k for k in model.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feats = model.forward_features(x)  # [B, 16, C]
        assert feats.shape == (2, 16, 48)
        torch.testing.assert_close(model(x), model.head(feats.mean(dim=1)))


def test_activation_is_configurable_and_quick_gelu_by_default() -> None:
    assert CvtConfig().act_layer == "quick_gelu"
    quick, exact = _small(), _small(act_layer="gelu")
    exact.load_state_dict(quick.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert not torch.allclose(quick(x), exact(x), atol=1e-4)
    assert type(quick.stages[0].blocks[0].mlp.act).__name__ == "QuickGELU"
    assert isinstance(exact.stages[0].blocks[0].mlp.act, torch.nn.GELU)


def test_other_token_mechanisms_plug_in() -> None:
    model = _small(attn_layer="mhsa")
    assert not any("conv_proj" in k for k in model.state_dict())
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 10)


def test_any_input_size_and_grad_checkpointing() -> None:
    model = _small().train()
    model.set_grad_checkpointing()
    x = torch.randn(2, 3, 72, 56)  # grids 18x14 -> 9x7 -> 5x4
    model(x).square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert model.stages[2].cls_token.grad.abs().sum() > 0


def test_reset_classifier_and_no_weight_decay() -> None:
    model = _small()
    model.reset_classifier(3)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 48)
    assert model.no_weight_decay() == {"stages.2.cls_token"}


@pytest.mark.parametrize(("kw", "match"), [
    (dict(num_heads=(1, 3, 3)), "num_heads"), (dict(act_layer="swish"), "act_layer"),
    (dict(depths=(1, 1)), "depths"), (dict(proj_method="max"), "proj_method"),
    (dict(attn_layer="window"), "attn_layer"),
])
def test_bad_config_is_named(kw: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        CvtConfig(**{**SMALL, **kw})


def test_quick_gelu_mlp_fused_at_inference_equals_eager() -> None:
    """layers.Mlp with QuickGELU: silu on a·fc1, fc2 / a (one oneDNN kernel each) == fc2(x·σ(1.702·fc1(x)))."""
    from vit_attention.layers import Mlp
    from vit_attention.layers.activation import QuickGELU, get_act_layer

    torch.manual_seed(0)
    mlp = Mlp(32, 128, act_layer=QuickGELU).eval()
    x, r = torch.randn(2, 10, 32), torch.randn(2, 10, 32)
    with torch.no_grad():
        eager = r + mlp.fc2(QuickGELU()(mlp.fc1(x)))
        torch.testing.assert_close(mlp(x, residual=r), eager, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mlp.train()(x), eager - r, atol=1e-5, rtol=1e-5)  # the eager path itself
    assert get_act_layer("quick_gelu") is QuickGELU
    with pytest.raises(ValueError, match="act_layer"):
        get_act_layer("swish")


def test_training_mode_never_splits_the_batch() -> None:
    """BatchNorm in training normalises over the whole batch: no CPU batch chunking then, even without autograd."""
    from vit_attention.functional.chunking import CHUNK_ELEMENTS

    model = _small().train()
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        whole = model.stages[0](x.permute(0, 2, 3, 1))[0]
        with CHUNK_ELEMENTS.override(1):  # would split every batch into single images at inference
            chunked = model.stages[0](x.permute(0, 2, 3, 1))[0]
            model.eval()
            eval_chunked = model.stages[0](x.permute(0, 2, 3, 1))[0]
        eval_whole = model.stages[0](x.permute(0, 2, 3, 1))[0]
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(eval_chunked, eval_whole, atol=1e-5, rtol=1e-5)
