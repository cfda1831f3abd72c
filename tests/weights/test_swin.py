"""Swin / SwinV2 checkpoint parity: timm and torchvision fixtures, Hugging Face live, original-repo layout.

Tolerance: max |ours - ref| <= 1e-5 * max |ref|.
"""

import json
import re

import pytest
import torch
import transformers
from fixture_utils import fixture_metadata, load_fixture, rel_err

from vit_attention.functional import switched
from vit_attention.models.swin import SwinTransformer
from vit_attention.models.swinv2 import SwinTransformerV2
from vit_attention.weights import load_weights
from vit_attention.weights.swin import resize_relative_position_bias_table

pytestmark = pytest.mark.parity  # every test here compares with a reference implementation

CASES = ["timm_swin", "timm_swin_pad60", "timm_swinv2", "timm_swinv2_pretrained_ws", "torchvision_swin",
         "torchvision_swin_v2"]


def _fixture(name: str):
    state, t, _ = load_fixture(name)
    return t, fixture_metadata(name), state


def _model_for(meta: dict, input_hw: int) -> SwinTransformer:
    cfg = json.loads(meta["config"])
    v2 = meta["model"].endswith("SwinTransformerV2") or cfg.get("block") == "SwinTransformerBlockV2"
    cls = SwinTransformerV2 if v2 else SwinTransformer
    if meta["reference"].startswith("timm"):
        kw = dict(img_size=cfg["img_size"], window_size=cfg["window_size"], pad_mode="timm")
        if "pretrained_window_sizes" in cfg:
            kw["pretrained_window_sizes"] = tuple(cfg["pretrained_window_sizes"])
    else:  # torchvision: no fixed input size, pad before the shift, no window clamp
        kw = dict(img_size=input_hw, window_size=tuple(cfg["window_size"]), strict_img_size=False,
                  pad_mode="torchvision")
    return cls(patch_size=4, embed_dim=cfg["embed_dim"], depths=tuple(cfg["depths"]),
               num_heads=tuple(cfg["num_heads"]), num_classes=cfg["num_classes"], **kw).eval()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("name", CASES)
def test_fixture_parity(name, fused):
    t, meta, state = _fixture(name)
    model = _model_for(meta, t["input"].shape[-1])
    report = load_weights(model, state)
    assert report.ok and report.layout == ("torchvision" if name.startswith("torchvision") else "vit_attention")
    with torch.no_grad(), switched(model, fused_attention=fused):
        assert rel_err(model(t["input"]), t["output"]) <= 1e-5
        feats = model.forward_features(t["input"])
        assert rel_err(model.forward_head(feats, pre_logits=True), t["pre_logits"]) <= 1e-5
        if "input_small" in t:  # 28x28: padding, and a stage that fits in one window (no shift)
            assert rel_err(model(t["input_small"]), t["output_small"]) <= 1e-5
        # The SwinV2 fixtures keep every temperature far below the x100 clamp (make_fixtures.perturb), so
        # the fused path (temperature folded into q) meets the same tolerance as the explicit one.
        assert rel_err(feats, t["features"]) <= 1e-5


def test_torchvision_v2_ignores_the_k_third_of_qkv_bias():
    t, meta, state = _fixture("torchvision_swin_v2")
    key = "features.1.0.attn.qkv.bias"
    C = state[key].shape[0] // 3
    assert state[key][C:2 * C].abs().sum() > 0  # the fixture holds a non-zero k bias on purpose
    model = _model_for(meta, 64)
    load_weights(model, state)
    torch.testing.assert_close(model.layers[0].blocks[0].attn.q_bias, state[key][:C])
    torch.testing.assert_close(model.layers[0].blocks[0].attn.v_bias, state[key][2 * C:])


def _to_original_layout(state: dict, tensors: dict) -> dict:
    """timm layout -> microsoft/Swin-Transformer layout (downsample at stage ends, head., persistent buffers)."""
    out = {}
    for k, v in state.items():
        k = re.sub(r"^layers\.(\d+)\.downsample\.", lambda m: f"layers.{int(m.group(1)) - 1}.downsample.", k)
        out[re.sub(r"^head\.fc\.", "head.", k)] = v
    for k, v in tensors.items():  # the original repo persists these buffers
        if k.startswith("nonpersistent.") and not k.endswith("k_bias"):
            out[k[len("nonpersistent."):]] = v
    return {"model": out}


@pytest.mark.parametrize("name", ["timm_swin_pad60", "timm_swinv2"])
def test_original_repo_layout(name):
    t, meta, state = _fixture(name)
    ckpt = _to_original_layout(state, t)
    assert "layers.0.downsample.reduction.weight" in ckpt["model"] and "head.weight" in ckpt["model"]
    assert any(k.endswith("attn_mask") for k in ckpt["model"])
    model = _model_for(meta, t["input"].shape[-1])
    report = load_weights(model, ckpt)
    assert report.layout == "original" and report.ok
    with torch.no_grad():
        assert rel_err(model(t["input"]), t["output"]) <= 1e-5


# ---------------------------------------------------------------- Hugging Face, live
HF_CFG = dict(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2, 2], num_heads=[2, 4, 4], window_size=4,
              num_labels=10)
OURS_CFG = dict(img_size=64, window_size=4, embed_dim=16, depths=(2, 2, 2), num_heads=(2, 4, 4), num_classes=10)


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            scale = 0.5 if "relative_position_bias_table" in n else 0.1
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def _hub_naming(state: dict) -> dict:
    """transformers-5 Swin keys -> the naming of Swin checkpoints on the hub (attention.self.query, ...)."""
    rules = [(r"\.attention\.([qkv])_proj\.", lambda m: ".attention.self." + {"q": "query", "k": "key", "v": "value"}[
        m.group(1)] + "."), (r"\.attention\.o_proj\.", ".attention.output.dense."),
             (r"\.attention\.relative_position_bias\.", ".attention.self."), (r"\.mlp\.fc1\.", ".intermediate.dense."),
             (r"\.mlp\.fc2\.", ".output.dense.")]
    out = {}
    for k, v in state.items():
        for pat, rep in rules:
            k = re.sub(pat, rep, k)
        out[k] = v
    # hub checkpoints also carry the index buffer
    for k in [k for k in out if k.endswith("attention.self.relative_position_bias_table")]:
        out[k.replace("relative_position_bias_table", "relative_position_index")] = torch.zeros(16, 16).long()
    return out


@pytest.mark.parametrize("ape", [False, True])
@pytest.mark.parametrize("hub_naming", [False, True])
def test_huggingface_swin_classifier(ape, hub_naming):
    hf = _perturb(transformers.SwinForImageClassification(transformers.SwinConfig(**HF_CFG,
                                                                                   use_absolute_embeddings=ape)))
    state = _hub_naming(hf.state_dict()) if hub_naming else hf.state_dict()
    ours = SwinTransformer(**OURS_CFG, ape=ape).eval()
    report = load_weights(ours, state)
    assert report.layout == "huggingface" and report.ok
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert rel_err(ours(x), hf(x).logits) <= 1e-5


@pytest.mark.parametrize("v2", [False, True])
def test_huggingface_base_model_features(v2):
    cfg_cls = transformers.Swinv2Config if v2 else transformers.SwinConfig
    base_cls = transformers.Swinv2Model if v2 else transformers.SwinModel
    hf = _perturb(base_cls(cfg_cls(**HF_CFG)))
    ours = (SwinTransformerV2 if v2 else SwinTransformer)(**OURS_CFG).eval()
    report = load_weights(ours, hf.state_dict(), strict=False)
    assert report.missing == ["head.fc.weight", "head.fc.bias"] and not report.unexpected
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad(), switched(ours, fused_attention=False):
        out = hf(x)
        assert rel_err(ours.forward_features(x).flatten(1, 2), out.last_hidden_state) <= 1e-5
        assert rel_err(ours.forward_head(ours.forward_features(x), pre_logits=True), out.pooler_output) <= 1e-5


@pytest.mark.parametrize("pretrained_ws", [None, (8, 8, 8)])
def test_huggingface_swinv2_classifier(pretrained_ws):
    extra = {} if pretrained_ws is None else {"pretrained_window_sizes": list(pretrained_ws)}
    hf = _perturb(transformers.Swinv2ForImageClassification(transformers.Swinv2Config(**HF_CFG, **extra)))
    ours = SwinTransformerV2(**OURS_CFG, pretrained_window_sizes=pretrained_ws).eval()
    assert load_weights(ours, hf.state_dict()).ok
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert rel_err(ours(x), hf(x).logits) <= 1e-5


# ---------------------------------------------------------------- shape fitting
def test_bias_table_resized_bicubically_for_a_larger_window():
    t, meta, state = _fixture("timm_swin")
    big = SwinTransformer(img_size=64, window_size=8, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
                          num_classes=10)
    report = load_weights(big, state)
    assert report.ok and any("resized bicubically" in n for n in report.notes)
    table = big.layers[0].blocks[0].attn.relative_position_bias_table
    assert table.shape == (15 * 15, 2)
    torch.testing.assert_close(table, resize_relative_position_bias_table(
        state["layers.0.blocks.0.attn.relative_position_bias_table"], (8, 8)))
    # resizing to the same size is the identity; corners of the grid are interpolated values, not copies
    same = resize_relative_position_bias_table(state["layers.0.blocks.0.attn.relative_position_bias_table"], (4, 4))
    torch.testing.assert_close(same, state["layers.0.blocks.0.attn.relative_position_bias_table"])
    with torch.no_grad():
        assert torch.isfinite(big(t["input"])).all()


def test_mismatched_head_dropped_with_warning():
    t, meta, state = _fixture("timm_swinv2")
    model = SwinTransformerV2(img_size=64, window_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
                              num_classes=3)
    with pytest.warns(UserWarning, match="10 classes in the checkpoint and 3 in the model"):
        report = load_weights(model, state)
    assert report.ok and report.dropped == ["head.fc"]
    torch.testing.assert_close(model.norm.weight, state["norm.weight"])
