"""DaViT checkpoint parity: timm fixtures (both forms), the original dingmyu/davit layout, Florence-2 live (HF).

Tolerance: max |ours - ref| <= 1e-5 * max |ref|.
"""

from __future__ import annotations

import re

import pytest
import torch
from einops import rearrange
from fixture_utils import assert_parity, load_fixture

from vit_attention import create_model
from vit_attention.functional import switched
from vit_attention.weights import load_weights
from vit_attention.weights.davit import ORIGINAL_RULES, TIMM_BLOCK_RULES
from vit_attention.weights.layouts import rename

CASES = ["timm_davit", "timm_davit_fl"]


def _model_for(cfg: dict, **overrides):
    """Our DaViT with the fixture's timm constructor kwargs."""
    kw = dict(depths=tuple(cfg["depths"]), embed_dims=tuple(cfg["embed_dims"]), num_heads=tuple(cfg["num_heads"]),
              window_size=cfg["window_size"], num_classes=cfg["num_classes"],
              down_kernel_size=cfg.get("down_kernel_size", 2),
              channel_form="florence2" if cfg.get("channel_attn_v2") else "davit")
    return create_model("davit_tiny", **{**kw, **overrides}).eval()


@pytest.mark.parity
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("name", CASES)
def test_timm_fixture_parity(name, fused):
    state, t, cfg = load_fixture(name)
    model = _model_for(cfg)
    report = load_weights(model, state)  # timm layout, detected: renamed by the adapter, loaded strictly
    assert report.ok and any("cpe1" in n for n in report.notes)
    if cfg.get("named_blocks"):
        assert any(".spatial_block." in k for k in state)  # the _fl key layout really was exercised
    x = t["input"]
    assert x.shape[-2:] == (58, 50)  # stem pads to 60x52; 15x13 maps pad to windows; 2x2 downsample pads
    with torch.no_grad(), switched(model, fused_attention=fused):
        feats = model.forward_features(x)  # [B, H', W', C]
        assert_parity(rearrange(feats, "b h w c -> b c h w"), t["features"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["pre_logits"])
        assert_parity(model(x), t["output"])


@pytest.mark.parity
@pytest.mark.parametrize("name", CASES)
def test_timm_layout_with_format_timm_and_intermediates(name):
    state, t, cfg = load_fixture(name)
    model = _model_for(cfg)
    load_weights(model, state, format="timm")  # explicit format: the block renames still apply
    with torch.no_grad():
        final, maps = model.forward_intermediates(t["input"])
    assert [m.shape[1] for m in maps] == list(cfg["embed_dims"])
    assert_parity(maps[-1], t["features"])  # DaViT has no final norm: the last map is forward_features


@pytest.mark.parity
def test_original_dingmyu_layout():
    """The timm fixture's weights under the original repository's names load and give timm's output."""
    state, t, cfg = load_fixture("timm_davit")
    inverse = [(r"^stem\.conv\.", "patch_embeds.0.proj."), (r"^stem\.norm\.", "patch_embeds.0.norm."),
               (r"^stages\.(\d+)\.downsample\.conv\.", r"patch_embeds.\1.proj."),
               (r"^stages\.(\d+)\.downsample\.norm\.", r"patch_embeds.\1.norm."),
               (r"^stages\.(\d+)\.blocks\.", r"main_blocks.\1."), (r"\.cpe1\.", ".cpe.0."), (r"\.cpe2\.", ".cpe.1."),
               (r"^head\.norm\.", "norms."), (r"^head\.fc\.", "head.")]
    original = rename(state, inverse)
    assert "norms.weight" in original and "main_blocks.1.1.1.cpe.1.proj.weight" in original
    assert rename(original, ORIGINAL_RULES) == state  # the table inverts exactly
    model = _model_for(cfg)
    report = load_weights(model, {"model": original})
    assert report.layout == "original" and report.ok
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


def test_block_rename_table():
    keys = {"stages.0.blocks.0.spatial_block.cpe1.proj.weight": "stages.0.blocks.0.0.pos.proj.weight",
            "stages.2.blocks.3.channel_block.cpe2.proj.bias": "stages.2.blocks.3.1.pos2.proj.bias",
            "stages.1.blocks.0.1.attn.qkv.weight": "stages.1.blocks.0.1.attn.qkv.weight"}
    out = rename({k: torch.zeros(1) for k in keys}, TIMM_BLOCK_RULES)
    assert sorted(out) == sorted(keys.values())


@pytest.mark.parity
def test_a_different_class_count_drops_the_classifier():
    state, _, cfg = load_fixture("timm_davit")
    model = _model_for(cfg, num_classes=3)
    with pytest.warns(UserWarning, match="classes"):
        report = load_weights(model, state)
    assert "head.fc" in report.dropped and not report.missing


# ---------------------------------------------------------------- Florence-2 (live Hugging Face)
def _hf_florence2_backbone():
    import transformers  # a dev dependency: a missing reference fails, never skips
    from transformers.models.florence2.modeling_florence2 import Florence2VisionBackbone

    cfg = transformers.Florence2VisionConfig(
        depths=(1, 2), embed_dim=(16, 32), num_heads=(2, 4), num_groups=(2, 4), window_size=5,
        patch_size=(7, 3), patch_stride=(4, 2), patch_padding=(3, 1), patch_prenorm=(False, True),
        drop_path_rate=0.0)
    torch.manual_seed(0)
    hf = Florence2VisionBackbone(cfg).eval()
    with torch.no_grad():  # no constant tensor: norms and biases perturbed too
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p) if p.dim() == 1 else torch.randn_like(p) / p[0].numel() ** 0.5)
    return hf


@pytest.mark.parity
@pytest.mark.parametrize("prefix", ["", "model.vision_tower."])
def test_florence2_vision_tower_parity(prefix):
    hf = _hf_florence2_backbone()
    state = {prefix + k: v for k, v in hf.state_dict().items()}
    if prefix:
        state["model.language_model.shared.weight"] = torch.zeros(3, 2)  # the rest of Florence-2: ignored
    model = create_model("davit_base_fl", depths=(1, 2), embed_dims=(16, 32), num_heads=(2, 4), window_size=5,
                         features_only=True).eval()
    report = load_weights(model, state)
    assert report.layout == "florence2" and report.ok
    x = torch.randn(2, 3, 60, 52)  # a multiple of 4 (HF's stem does not pad); 15x13 maps: window padding
    with torch.no_grad():
        ref = hf(x).last_hidden_state  # [B, C, H', W']
        ours = model(x)[-1]
    assert_parity(ours, ref)


@pytest.mark.parity
def test_florence2_remote_code_names():
    """The hub checkpoints' remote-code names (``.fn.dw``, ``window_attn.fn``, ``ffn.fn.net``) map like HF's."""
    hf = _hf_florence2_backbone()
    sd = hf.state_dict()

    def remote(k: str) -> str:
        k = re.sub(r"^convs\.(\d+)\.conv\.", r"convs.\1.proj.", k)
        k = re.sub(r"\.conv([12])\.", r".conv\1.fn.dw.", k)
        k = re.sub(r"\.(window|channel)_attn\.", r".\1_attn.fn.", k)
        k = re.sub(r"\.norm1\.", ".NORM1.", k)
        k = re.sub(r"\.ffn\.", ".ffn.fn.net.", k)
        k = re.sub(r"\.norm2\.", ".ffn.norm.", k)
        return "vision_tower." + k

    state = {}
    for k, v in sd.items():
        r = remote(k)
        if ".NORM1." in r:
            kind = "window_attn" if ".spatial_block." in r else "channel_attn"
            r = r.replace(".NORM1.", f".{kind}.norm.")
        state[r] = v
    assert any(".conv1.fn.dw." in k for k in state) and any(".ffn.fn.net.fc1." in k for k in state)
    ours = create_model("davit_base_fl", depths=(1, 2), embed_dims=(16, 32), num_heads=(2, 4), window_size=5,
                        features_only=True).eval()
    direct = create_model("davit_base_fl", depths=(1, 2), embed_dims=(16, 32), num_heads=(2, 4), window_size=5,
                          features_only=True).eval()
    assert load_weights(ours, state).ok and load_weights(direct, sd).ok
    for (k, a), (_, b) in zip(sorted(ours.state_dict().items()), sorted(direct.state_dict().items())):
        assert torch.equal(a, b), k


@pytest.mark.parity
def test_headless_florence2_tower_loads_into_the_preset_by_default(tmp_path):
    """timm's davit_base_fl defaults to num_classes=0 (msft_florence2 has no classifier): its checkpoint, without
    head.fc, loads into create_model("davit_base_fl", pretrained=path) strictly, with no num_classes given."""
    from safetensors.torch import save_file

    state, t, cfg = load_fixture("timm_davit_fl")
    headless = {k: v.contiguous() for k, v in state.items() if not k.startswith("head.fc.")}
    save_file(headless, str(tmp_path / "model.safetensors"))
    model = create_model("davit_base_fl", pretrained=tmp_path / "model.safetensors", depths=tuple(cfg["depths"]),
                         embed_dims=tuple(cfg["embed_dims"]), num_heads=tuple(cfg["num_heads"]),
                         window_size=cfg["window_size"]).eval()
    assert model.num_classes == 0 and not any(k.startswith("head.fc.") for k in model.state_dict())
    with torch.no_grad():
        assert_parity(model(t["input"]), t["pre_logits"])  # no classifier: the pooled, normed features
