"""CvT checkpoints: live parity with Hugging Face ``CvtForImageClassification`` / ``CvtModel``, and the
original microsoft/CvT layout through ``load_weights`` (a fixture recorded from the original code by
``tests/fixtures/make_fixtures_cvt.py``).

HF's ``CvtStage`` indexes its drop-path list by the stage number, so a config needs
``depth[i] >= i + 1`` (transformers 5.23.0): the reduced configs use depths ``(1, 2, 3)``. Every BatchNorm
runs in eval mode with perturbed running statistics (HF initialises them to 0 / 1).
"""

from __future__ import annotations

import re

import pytest
import torch
from fixture_utils import assert_parity, load_fixture, perturb_like_trained
from hf_utils import assert_hf_logits_parity
from transformers import CvtConfig as HFCvtConfig
from transformers import CvtForImageClassification, CvtModel

from vit_attention.models.cvt import Cvt, CvtConfig
from vit_attention.weights import load_weights
from vit_attention.weights.hub import hf_config_overrides

_HF_SMALL = dict(embed_dim=[16, 32, 48], num_heads=[1, 2, 3], depth=[1, 2, 3], drop_path_rate=[0.0, 0.0, 0.0])
_OURS_SMALL = dict(embed_dims=(16, 32, 48), num_heads=(1, 2, 3), depths=(1, 2, 3), drop_path_rate=0.0)


def _ours(**kw) -> Cvt:
    return Cvt(CvtConfig(**{**_OURS_SMALL, "act_layer": "gelu", "img_size": 64, **kw})).eval()


@pytest.mark.parity
@pytest.mark.parametrize("size", [64, 72])  # 72: odd grids on the way (18 -> 9 -> 5) and odd key grids
def test_hf_classification_parity(size: int) -> None:
    ref = perturb_like_trained(CvtForImageClassification(HFCvtConfig(**_HF_SMALL, num_labels=10)))
    model = _ours(num_classes=10)
    assert_hf_logits_parity(model, ref, size)


@pytest.mark.parity
def test_hf_model_features_and_cls_token() -> None:
    ref = perturb_like_trained(CvtModel(HFCvtConfig(**_HF_SMALL), add_pooling_layer=False))
    model = _ours(num_classes=0)
    report = load_weights(model, ref.state_dict(), strict=False)
    assert report.layout == "huggingface"
    assert not report.unexpected, str(report)
    assert {k.split(".")[0] for k in report.missing} <= {"norm"}  # CvtModel has no final norm
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out = ref(pixel_values=x)
        final, maps = model.forward_intermediates(x)
        tokens = model.stages(model._embed(x)).x  # Tokens of the last stage: [B, 1 + H·W, C] before the final norm
    assert_parity(maps[-1], out.last_hidden_state)  # [B, C, H, W], class token dropped
    assert_parity(tokens[:, :1], out.cls_token_value)


@pytest.mark.parity
def test_hf_config_reader_builds_the_same_model() -> None:
    hf_cfg = HFCvtConfig(**_HF_SMALL, num_labels=7, architectures=["CvtForImageClassification"])
    over = hf_config_overrides(hf_cfg.to_dict(), CvtConfig)
    assert over["act_layer"] == "gelu" and over["depths"] == (1, 2, 3) and over["num_classes"] == 7
    assert over["embed_dims"] == (16, 32, 48) and over["cls_token"] is True
    ref = perturb_like_trained(CvtForImageClassification(hf_cfg))
    model = Cvt(CvtConfig(**over, img_size=64, drop_path_rate=0.0)).eval()
    assert load_weights(model, ref.state_dict()).ok
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert_parity(model(x), ref(pixel_values=x).logits)


def _original_state(model: Cvt) -> dict[str, torch.Tensor]:
    """Our state dict in the original microsoft/CvT key layout (``stage{i}.`` prefixes)."""
    return {re.sub(r"^stages\.(\d+)\.", r"stage\1.", k): v.clone() for k, v in model.state_dict().items()}


def test_original_layout_round_trip() -> None:
    src = perturb_like_trained(_ours(num_classes=10, act_layer="quick_gelu"))
    state = _original_state(src)
    assert "stage2.cls_token" in state and "stage0.blocks.0.attn.conv_proj_q.bn.running_var" in state
    dst = _ours(num_classes=10, act_layer="quick_gelu")
    report = load_weights(dst, state)
    assert report.layout == "original" and report.ok, str(report)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=0, atol=0)


def test_original_checkpoint_with_other_classes_keeps_the_backbone() -> None:
    src = perturb_like_trained(_ours(num_classes=10))
    dst = _ours(num_classes=5)
    with pytest.warns(UserWarning, match="classes"):
        report = load_weights(dst, _original_state(src))
    assert "head" in report.dropped
    torch.testing.assert_close(dst.stages[2].cls_token, src.stages[2].cls_token)


@pytest.mark.parity
def test_original_repository_fixture() -> None:
    """The original code (QuickGELU, its own keys, perturbed BN statistics) through load_weights: same outputs."""
    state, t, cfg = load_fixture("original_cvt")
    assert "stage2.cls_token" in state and "stage0.blocks.0.attn.conv_proj_k.bn.running_mean" in state
    model = Cvt(CvtConfig(embed_dims=tuple(cfg["dims"]), num_heads=tuple(cfg["heads"]), depths=tuple(cfg["depths"]),
                          num_classes=cfg["num_classes"], img_size=72, drop_path_rate=0.0)).eval()  # QuickGELU
    report = load_weights(model, state)
    assert report.layout == "original" and report.ok, str(report)
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
        feats = model.forward_features(t["input"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["features"])
