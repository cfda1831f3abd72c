"""PVT v1 / PVTv2 checkpoints: live parity with Hugging Face, timm fixtures, the original whai362/PVT layout."""

from __future__ import annotations

import re

import pytest
import torch
from fixture_utils import assert_parity, load_fixture
from hf_utils import assert_hf_logits_parity
from transformers import PvtConfig, PvtForImageClassification, PvtModel, PvtV2Config, PvtV2ForImageClassification

from vit_attention import create_model
from vit_attention.weights import load_weights

_STAGES = dict(depths=[1, 2, 1, 2], hidden_sizes=[16, 32, 32, 64], num_attention_heads=[1, 2, 2, 4],
               mlp_ratios=[2, 3, 2, 2], sr_ratios=[8, 4, 2, 1])
_OURS = dict(depths=(1, 2, 1, 2), embed_dims=(16, 32, 32, 64), num_heads=(1, 2, 2, 4),
             mlp_ratios=(2.0, 3.0, 2.0, 2.0), sr_ratios=(8, 4, 2, 1), norm_eps=1e-6, embed_norm_eps=1e-6)


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Seeded noise on every parameter: weights ~ N(0, 1/fan_in) added, norms near 1, tables and biases ~ 0.1."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() >= 2 and not name.endswith(("position_embeddings", "cls_token")):
                p.add_(noise / p[0].numel() ** 0.5)
            else:
                p.add_(0.1 * noise)
    return model.eval()


def _hf_v1(**kw) -> torch.nn.Module:
    return _perturb(PvtForImageClassification(PvtConfig(image_size=64, num_labels=10, **_STAGES, **kw)))


def _hf_v2(**kw) -> torch.nn.Module:
    stages = {k: v for k, v in _STAGES.items() if k != "sr_ratios"}
    return _perturb(PvtV2ForImageClassification(PvtV2Config(num_labels=10, sr_ratios=[8, 4, 2, 1], **stages, **kw)))


# ---------------------------------------------------------------- Hugging Face, live
@pytest.mark.parity
def test_hf_pvt_v1_classification() -> None:
    ref = _hf_v1()
    model = create_model("pvt_tiny", num_classes=10, img_size=64, **_OURS).eval()
    report = load_weights(model, ref.state_dict())
    assert report.layout == "huggingface" and report.ok, str(report)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out = ref(pixel_values=x, output_hidden_states=True)
        assert_parity(model(x), out.logits)
        feats = model.forward_features(x)
        assert feats.shape == (2, 1 + 2 * 2, 64)  # the class token first, then the 2x2 map
        assert_parity(feats, ref.pvt(pixel_values=x).last_hidden_state)
        maps = model.forward_intermediates(x, intermediates_only=True)
        assert [tuple(m.shape) for m in maps] == [(2, 16, 16, 16), (2, 32, 8, 8), (2, 32, 4, 4), (2, 64, 2, 2)]
        hidden = out.hidden_states  # after every block (not normalised)
        assert_parity(maps[1], hidden[2].reshape(2, 8, 8, 32).permute(0, 3, 1, 2))
    assert out.logits.abs().max() > 0.5


@pytest.mark.parity
def test_hf_pvt_v1_model_folder_with_config(tmp_path) -> None:
    """A saved ``PvtModel`` folder: config.json builds the model (eps 1e-6 everywhere), weights load."""
    ref = _perturb(PvtModel(PvtConfig(image_size=64, **_STAGES)))
    ref.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="another architecture"):  # the folder's stages, not pvt_tiny's
        model = create_model("pvt_tiny", pretrained=str(tmp_path), num_classes=0).eval()
    assert model.cfg.embed_dims == (16, 32, 32, 64) and model.cfg.embed_norm_eps == 1e-6
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert_parity(model.forward_features(x), ref(pixel_values=x).last_hidden_state)


@pytest.mark.parity
@pytest.mark.parametrize("linear", [False, True], ids=["sra", "linear"])
@pytest.mark.parametrize("size", [(64, 64), (72, 56)], ids=["64", "72x56"])
def test_hf_pvt_v2_classification(linear: bool, size: tuple[int, int]) -> None:
    """72x56: stage maps 18x14 .. 3x2, not multiples of the reduction (floor, like HF and timm)."""
    ref = _hf_v2(linear_attention=linear)
    model = create_model("pvt_v2_b0", num_classes=10, linear=linear, **_OURS).eval()
    x = assert_hf_logits_parity(model, ref, size)
    with torch.no_grad():
        assert_parity(model.forward_features(x).permute(0, 3, 1, 2), ref.pvt_v2(pixel_values=x).last_hidden_state)


@pytest.mark.parity
def test_hf_pvt_v2_linear_folder_with_config(tmp_path) -> None:
    """A saved ``PvtV2ForImageClassification`` folder (linear attention): config.json builds the -Li model."""
    stages = {k: v for k, v in _STAGES.items() if k != "sr_ratios"}
    ref = _perturb(PvtV2ForImageClassification(PvtV2Config(num_labels=4, linear_attention=True, **stages)))
    ref.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="another architecture"):
        model = create_model("pvt_v2_b2_li", pretrained=str(tmp_path)).eval()
    assert model.cfg.linear and model.num_classes == 4 and model.cfg.norm_eps == model.cfg.embed_norm_eps == 1e-6
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert_parity(model(x), ref(pixel_values=x).logits)


# ---------------------------------------------------------------- the original layout (whai362/PVT)
def _to_original(state: dict[str, torch.Tensor], v1: bool) -> dict[str, torch.Tensor]:
    """Our keys -> whai362/PVT's (written here independently of the converter, from the repository's names)."""
    out = {}
    for k, v in state.items():
        k = re.sub(r"^patch_embed\.pos_embed$", "pos_embed1", k)
        k = re.sub(r"^stages\.(\d+)\.downsample\.pos_embed$", lambda m: f"pos_embed{int(m.group(1)) + 1}", k)
        k = re.sub(r"^stages\.\d+\.downsample\.cls_token$", "cls_token", k)
        k = re.sub(r"^patch_embed\.", "patch_embed1.", k)
        k = re.sub(r"^stages\.(\d+)\.downsample\.", lambda m: f"patch_embed{int(m.group(1)) + 1}.", k)
        k = re.sub(r"^stages\.(\d+)\.blocks\.", lambda m: f"block{int(m.group(1)) + 1}.", k)
        k = re.sub(r"^stages\.(\d+)\.norm\.", lambda m: f"norm{int(m.group(1)) + 1}.", k)
        k = k.replace(".mlp.dwconv.", ".mlp.dwconv.dwconv.").replace("head.fc.", "head.")
        out[k] = v
    assert ("cls_token" in out and "pos_embed4" in out) == v1 and "block2.1.attn.kv.weight" in out
    return out


@pytest.mark.registry
@pytest.mark.parametrize("name", ["pvt_tiny", "pvt_v2_b0", "pvt_v2_b2_li"])
def test_original_and_timm_layouts_load_exactly(name: str) -> None:
    torch.manual_seed(0)
    src = _perturb(create_model(name, num_classes=10, img_size=64, **_OURS))
    state = src.state_dict()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = src(x)
    layouts = {"original": _to_original(state, name == "pvt_tiny")}
    if name.startswith("pvt_v2"):
        layouts["timm"] = {k.replace("head.fc.", "head."): v for k, v in state.items()}
    for layout, sd in layouts.items():
        model = create_model(name, num_classes=10, img_size=64, **_OURS).eval()
        report = load_weights(model, sd)
        assert report.layout == layout and report.ok, (layout, str(report))
        with torch.no_grad():
            torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
        # into a features model pruned after stage 0 (the converter reads the config, not the pruned stages)
        feats = create_model(name, num_classes=10, img_size=64, features_only=True, out_indices=(0,), **_OURS)
        report = load_weights(feats, sd)
        assert report.ok, (layout, str(report))
        with torch.no_grad():
            torch.testing.assert_close(feats.eval()(x)[0], src.eval().forward_intermediates(
                x, [0], intermediates_only=True)[0], rtol=0, atol=0)


def test_v1_position_tables_are_resampled_for_another_size() -> None:
    """A 64 px checkpoint into a 96 px model: every table resampled bilinearly (class row kept aside)."""
    src = _perturb(create_model("pvt_tiny", num_classes=10, img_size=64, **_OURS))
    model = create_model("pvt_tiny", num_classes=10, img_size=96, **_OURS).eval()
    report = load_weights(model, src.state_dict())
    assert report.ok and any("resampled" in n for n in report.notes)
    last = model.stages[3].downsample
    assert last.pos_embed.shape == (1, 1 + 3 * 3, 64)
    torch.testing.assert_close(last.pos_embed[:, 0], src.stages[3].downsample.pos_embed[:, 0])
    with torch.no_grad():  # the 64 px model resamples the same way at run time
        x = torch.randn(1, 3, 96, 96)
        torch.testing.assert_close(model(x), src.eval()(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- timm pvt_v2, through committed fixtures
@pytest.mark.parity
@pytest.mark.parametrize("case", ["timm_pvt_v2", "timm_pvt_v2_li"])
def test_timm_pvt_v2_fixture(case: str) -> None:
    state, tensors, meta = load_fixture(case)
    cfg = meta  # the timm constructor kwargs
    model = create_model("pvt_v2_b0", num_classes=cfg["num_classes"], embed_dims=tuple(cfg["embed_dims"]),
                         depths=tuple(cfg["depths"]), num_heads=tuple(cfg["num_heads"]),
                         mlp_ratios=tuple(float(r) for r in cfg["mlp_ratios"]),
                         sr_ratios=tuple(cfg["sr_ratios"]), linear=cfg.get("linear", False)).eval()
    report = load_weights(model, state)
    assert report.layout == "timm" and report.ok, str(report)
    with torch.no_grad():
        for suffix in ("", "_small"):
            if "input" + suffix not in tensors:
                continue
            x = tensors["input" + suffix]
            assert_parity(model(x), tensors["output" + suffix])
            if not suffix:
                feats = model.forward_features(x)
                assert_parity(feats.permute(0, 3, 1, 2), tensors["features"])  # timm: NCHW
                assert_parity(model.forward_head(feats, pre_logits=True), tensors["pre_logits"])
