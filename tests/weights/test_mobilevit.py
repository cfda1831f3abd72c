"""MobileViT v1 / v2 checkpoints: timm fixtures, live Hugging Face parity, the apple/ml-cvnets layout.

Every BatchNorm runs in eval mode with perturbed running statistics (fixtures: set by
``tests/fixtures/make_fixtures_mobilevit.py``; HF: :func:`fixture_utils.perturb_like_trained`).
HF MobileViTV2 never resizes (its unfold drops the border rows of maps that are not patch multiples
and its fold writes zeros there, transformers 5.23.0), so the v2 parity runs at sides that are multiples
of 64; ours resizes as timm.
"""

from __future__ import annotations

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_parity, load_fixture, perturb_like_trained
from hf_utils import assert_hf_logits_parity
from transformers import MobileViTConfig as HFMobileViTConfig
from transformers import MobileViTForImageClassification, MobileViTV2ForImageClassification
from transformers import MobileViTV2Config as HFMobileViTV2Config

from vit_attention.functional import switched
from vit_attention.models.mobilevit import MobileViT, MobileViTConfig
from vit_attention.weights import load_weights
from vit_attention.weights.hub import hf_config_overrides

pytestmark = pytest.mark.parity  # every test here compares with a reference implementation

# the fixtures' timm ByoModelCfg, in our fields
_FIXTURE_CFG = {
    "timm_mobilevit": dict(block_type="v1", transformer_dims=(0, 0, 16, 24), transformer_depths=(0, 0, 2, 1),
                           num_features=32),
    "timm_mobilevitv2": dict(block_type="v2", transformer_dims=(0, 0, 8, 16), transformer_depths=(0, 0, 2, 1),
                             num_features=0, num_heads=1),
}


def _fixture_model(name: str, **kw) -> MobileViT:
    cfg = MobileViTConfig(**{**dict(stem_chs=8, channels=(8, 16, 16, 24), depths=(1, 2, 1, 1), expand_ratio=2.0,
                                    num_classes=10, img_size=(56, 40)), **_FIXTURE_CFG[name], **kw})
    return MobileViT(cfg).eval()


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", sorted(_FIXTURE_CFG))
def test_timm_fixture_parity(name: str, fused: bool) -> None:
    state, t, _ = load_fixture(name)
    model = _fixture_model(name)
    report = load_weights(model, state)
    assert report.ok, str(report)
    assert report.layout == ("timm" if name.endswith("v2") else "vit_attention")  # v1: timm's keys are ours
    assert_fixture_parity(model, t, fused=fused)


@pytest.mark.parametrize("name", sorted(_FIXTURE_CFG))
def test_timm_layout_with_format_timm(name: str) -> None:
    state, t, _ = load_fixture(name)
    model = _fixture_model(name)
    assert load_weights(model, state, format="timm").ok
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


_HF_V1 = dict(image_size=64, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 48],
              num_attention_heads=4, expand_ratio=2.0, num_labels=10,
              architectures=["MobileViTForImageClassification"])
_HF_V2 = dict(image_size=64, width_multiplier=0.25, num_labels=10, architectures=["MobileViTV2ForImageClassification"])


@pytest.mark.parametrize("size", [64, 80])  # 80: 5x5 map at stride 16, 3x3 at 32 (the bilinear resize path)
def test_hf_mobilevit_v1_parity(size: int) -> None:
    hf_cfg = HFMobileViTConfig(**_HF_V1)
    ref = perturb_like_trained(MobileViTForImageClassification(hf_cfg))
    over = hf_config_overrides(hf_cfg.to_dict(), MobileViTConfig)
    assert over["channels"] == (8, 16, 16, 24, 32) and over["num_features"] == 48 and over["num_classes"] == 10
    model = MobileViT(MobileViTConfig(**over)).eval()
    assert_hf_logits_parity(model, ref, size)


@pytest.mark.parametrize("size", [64, 128])
def test_hf_mobilevit_v2_parity(size: int) -> None:
    hf_cfg = HFMobileViTV2Config(**_HF_V2)
    ref = perturb_like_trained(MobileViTV2ForImageClassification(hf_cfg))
    over = hf_config_overrides(hf_cfg.to_dict(), MobileViTConfig)
    assert over["block_type"] == "v2" and over["stem_chs"] == 16 and over["channels"] == (16, 32, 64, 96, 128)
    model = MobileViT(MobileViTConfig(**over)).eval()
    assert_hf_logits_parity(model, ref, size)


def test_hf_v2_silently_zeroes_borders_and_ours_does_not() -> None:
    """At 96 px (a 3x3 map at stride 32) HF v2 drops the last row / column in its unfold; ours resizes (timm)."""
    hf_cfg = HFMobileViTV2Config(**_HF_V2)
    ref = perturb_like_trained(MobileViTV2ForImageClassification(hf_cfg))
    model = MobileViT(MobileViTConfig(**hf_config_overrides(hf_cfg.to_dict(), MobileViTConfig))).eval()
    load_weights(model, ref.state_dict())
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        ours, theirs = model(x), ref(pixel_values=x).logits
        _, maps = model.forward_intermediates(x)
    assert (ours - theirs).abs().max() > 1e-3 * theirs.abs().max()
    assert maps[-1].shape[-2:] == (4, 4)  # 3x3 resized up to the patch multiple, as timm does
    assert torch.isfinite(ours).all()


_CN = {"conv": "conv", "bn": "norm"}  # ConvLayer2d's block.{conv, norm}


def _cvnets_keys(state: dict, model: MobileViT) -> dict:
    """Our state dict renamed into apple/ml-cvnets' key layout (written from cvnets' module definitions:
    ``ConvLayer2d.block.{conv, norm}``, ``InvertedResidual.block.{exp_1x1, conv_3x3, red_1x1}``, MobileViT
    ``local_rep`` / ``global_rep`` / ``conv_proj`` / ``fusion``, ``TransformerEncoder.pre_norm_mha`` /
    ``pre_norm_ffn``, ``LinearAttnFFN.pre_norm_attn`` / ``pre_norm_ffn``), with 1x1 convs as 4-D weights."""
    import re

    v2 = model.cfg.block_type == "v2"
    out = {}
    for k, v in state.items():
        k2 = re.sub(r"^stem\.(conv|bn)\.", lambda m: f"conv_1.block.{_CN[m[1]]}.", k)
        k2 = re.sub(r"^final_conv\.(conv|bn)\.", lambda m: f"conv_1x1_exp.block.{_CN[m[1]]}.", k2)
        k2 = re.sub(r"^head\.fc\.", "classifier.fc.", k2)
        m = re.match(r"^stages\.(\d)\.(\d+)\.(conv[123]_\w+)\.(conv|bn)\.(.*)$", k2)
        if m:
            part = {"conv1_1x1": "exp_1x1", "conv2_kxk": "conv_3x3", "conv3_1x1": "red_1x1"}[m[3]]
            k2 = f"layer_{int(m[1]) + 1}.{m[2]}.block.{part}.block.{_CN[m[4]]}.{m[5]}"
        m = re.match(r"^stages\.(\d)\.(\d+)\.(.*)$", k2)
        if m:
            layer, rest = f"layer_{int(m[1]) + 1}.1.", m[3]
            depth = model.cfg.transformer_depths[int(m[1])]
            attn_norm = "pre_norm_attn.0." if v2 else "pre_norm_mha.0."
            fc2 = "3.block.conv." if v2 else "4."
            rules = [
                (r"^conv_kxk\.conv\.", ("local_rep.0" if v2 else "local_rep.conv_3x3") + ".block.conv."),
                (r"^conv_kxk\.bn\.", ("local_rep.0" if v2 else "local_rep.conv_3x3") + ".block.norm."),
                (r"^conv_1x1\.", ("local_rep.1" if v2 else "local_rep.conv_1x1") + ".block.conv."),
                (r"^norm\.", f"global_rep.{depth}."),
                (r"^transformer\.(\d+)\.norm1\.", r"global_rep.\1." + attn_norm),
                (r"^transformer\.(\d+)\.norm2\.", r"global_rep.\1.pre_norm_ffn.0."),
                (r"^transformer\.(\d+)\.attn\.qkv\.", r"global_rep.\1.pre_norm_mha.1.qkv_proj."),
                (r"^transformer\.(\d+)\.attn\.proj\.", r"global_rep.\1.pre_norm_mha.1.out_proj."),
                (r"^transformer\.(\d+)\.attn\.(qkv_proj|out_proj)\.", r"global_rep.\1.pre_norm_attn.1.\2.block.conv."),
                (r"^transformer\.(\d+)\.mlp\.fc1\.", r"global_rep.\1.pre_norm_ffn.1." + ("block.conv." if v2 else "")),
                (r"^transformer\.(\d+)\.mlp\.fc2\.", r"global_rep.\1.pre_norm_ffn." + fc2),
                (r"^conv_proj\.conv\.", "conv_proj.block.conv."), (r"^conv_proj\.bn\.", "conv_proj.block.norm."),
                (r"^conv_fusion\.conv\.", "fusion.block.conv."), (r"^conv_fusion\.bn\.", "fusion.block.norm."),
            ]
            for pat, rep in rules:
                rest = re.sub(pat, rep, rest)
            k2 = layer + rest
            if v2 and ("pre_norm_attn.1" in k2 or "pre_norm_ffn.1.block" in k2 or "pre_norm_ffn.3" in k2) \
                    and k2.endswith("weight"):
                v = v[:, :, None, None]
        out[k2] = v
    return out


@pytest.mark.parametrize("name", sorted(_FIXTURE_CFG))
def test_cvnets_layout_loads(name: str) -> None:
    state, t, _ = load_fixture(name)
    model = _fixture_model(name)
    load_weights(model, state)
    cvnets = _cvnets_keys(model.state_dict(), model)
    assert any(k.startswith("layer_3.1.global_rep.0.") for k in cvnets)
    fresh = _fixture_model(name)
    report = load_weights(fresh, cvnets)
    assert report.layout == "cvnets" and report.ok, str(report)
    with torch.no_grad():
        assert_parity(fresh(t["input"]), t["output"])


def test_a_checkpoint_for_other_classes_drops_the_head() -> None:
    state, _, _ = load_fixture("timm_mobilevit")
    model = _fixture_model("timm_mobilevit", num_classes=5)
    with pytest.warns(UserWarning, match="classes"):
        report = load_weights(model, state)
    assert report.dropped == ["head.fc"] and report.ok


# the original-repository fixtures' reduced get_configuration, in our fields (v1 / v3_v1 and v2 / v3_v2 share one)
_V3_FIXTURE_CFG = {
    "original_mobilevit": dict(block_type="v1", channels=(8, 16, 16, 24, 24), transformer_dims=(0, 0, 16, 24, 16),
                               num_features=96, num_heads=4),
    "original_mobilevitv2": dict(block_type="v2", channels=(16, 16, 24, 24, 32), transformer_dims=(0, 0, 16, 16, 24),
                                 num_features=0, num_heads=1),
    "original_mobilevitv3": dict(block_type="v3_v1", channels=(8, 16, 16, 24, 24), transformer_dims=(0, 0, 16, 24, 16),
                                 num_features=96, num_heads=4),
    "original_mobilevitv3_v2": dict(block_type="v3_v2", channels=(16, 16, 24, 24, 32),
                                    transformer_dims=(0, 0, 16, 16, 24), num_features=0, num_heads=1),
}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", sorted(_V3_FIXTURE_CFG))
def test_original_repository_parity(name: str, fused: bool) -> None:
    """apple/ml-cvnets' MobileViT / MobileViTv2 and micronDLA/MobileViTv3 (both kinds) in the ml-cvnets layout,
    through the ``cvnets`` converter."""
    state, t, _ = load_fixture(name)
    model = MobileViT(MobileViTConfig(stem_chs=16, depths=(1, 2, 1, 1, 1), expand_ratio=2.0,
                                      transformer_depths=(0, 0, 2, 1, 1), num_classes=10, img_size=(56, 40),
                                      **_V3_FIXTURE_CFG[name])).eval()
    report = load_weights(model, state)
    assert report.layout == "cvnets" and report.ok, str(report)
    with torch.no_grad(), switched(model, fused_attention=fused):
        assert_parity(model.forward_features(t["input"]), t["features"])
        assert_parity(model(t["input"]), t["output"])
