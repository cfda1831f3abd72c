"""Parity with timm and torchvision ViT / DeiT through committed fixtures (no skips)."""

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_parity, load_fixture

from vit_attention.models import VisionTransformer, VisionTransformerConfig
from vit_attention.weights import load_weights

pytestmark = pytest.mark.parity  # every test here compares with a reference implementation

_TIMM_KEYS = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes", "qkv_bias",
              "class_token", "global_pool", "fc_norm", "qk_norm", "init_values", "no_embed_class")


def _from_timm(cfg: dict, **extra) -> VisionTransformer:
    return VisionTransformer(VisionTransformerConfig(**{k: v for k, v in cfg.items() if k in _TIMM_KEYS}, **extra))


@pytest.mark.parametrize("name", ["timm_vit", "timm_vit_avg_qknorm_ls", "timm_deit3"])
def test_timm_vit(name):
    state, t, cfg = load_fixture(name)
    model = _from_timm(cfg).eval()
    report = load_weights(model, state)
    assert report.ok and report.layout == "vit_attention"
    assert_fixture_parity(model, t)


def test_timm_deit_distilled():
    state, t, cfg = load_fixture("timm_deit_distilled")
    model = _from_timm(cfg, distilled=True).eval()
    load_weights(model, state)
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
        model.train()
        model.head_drop.p = 0.0
        cls, dist = model(t["input"])
    assert_parity(cls, t["output_cls"])
    assert_parity(dist, t["output_dist"])


@pytest.mark.parametrize("name", ["torchvision_vit", "torchvision_vit_repr"])
def test_torchvision_vit(name):
    state, t, cfg = load_fixture(name)
    model = VisionTransformer(VisionTransformerConfig(
        img_size=cfg["image_size"], patch_size=cfg["patch_size"], embed_dim=cfg["hidden_dim"],
        depth=cfg["num_layers"], num_heads=cfg["num_heads"], mlp_ratio=cfg["mlp_dim"] / cfg["hidden_dim"],
        num_classes=cfg["num_classes"], representation_size=cfg.get("representation_size"))).eval()
    report = load_weights(model, state)
    assert report.layout == "torchvision" and report.ok
    with torch.no_grad():
        assert_parity(model.forward_features(t["input"]), t["features"])
        assert_parity(model(t["input"]), t["output"])
