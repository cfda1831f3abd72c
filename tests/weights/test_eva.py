"""weights/eva.py: timm Eva, original (EVA-02, DINOv3, RoPE-ViT) and HF layouts onto ours, checked through the
timm fixtures (tests/fixtures/make_fixtures_{eva02,dinov3,rope_vit}.py) rewritten into the other layouts."""

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_loads, load_fixture

from vit_attention import create_model
from vit_attention.weights import convert_state_dict, load_weights
from vit_attention.weights.eva import from_timm, to_timm

pytestmark = pytest.mark.parity  # every test here compares with a reference implementation

SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10, dynamic_img_size=True)
EVA_SMALL = dict(SMALL, rope_kwargs={"convention": "eva", "ref_feat_shape": (6, 6)})
CASES = {  # fixture -> (preset, overrides)
    "timm_eva02_ts": ("eva02_tiny_patch14_224", EVA_SMALL),
    "timm_eva02_bl": ("eva02_base_patch14_224", EVA_SMALL),
    "timm_eva02_clip": ("eva02_base_patch16_clip_224", EVA_SMALL),
    "timm_dinov3": ("vit_small_patch16_dinov3", SMALL),
    "timm_dinov3_qkvb_swiglu": ("vit_small_plus_patch16_dinov3_qkvb", SMALL),
    "timm_rope_vit_axial": ("vit_base_patch16_rope_224", SMALL),
    "timm_rope_vit_mixed_ape": ("vit_base_patch16_rope_mixed_ape_224", SMALL),
}


def _model(case: str):
    name, over = CASES[case]
    return create_model(name, **over).eval()


def _check(model, t) -> None:
    assert_fixture_parity(model, t)
    assert_fixture_parity(model, t, "_nonsquare", outputs=("output",))


def _loads_and_matches(case: str, state: dict, t: dict, layout: str | None = "original", **kwargs):
    """A fresh model of ``case`` loads ``state`` (``load_weights(**kwargs)``) as ``layout`` and reproduces the
    fixture -> (model, report)."""
    model = _model(case)
    report = assert_loads(model, state, layout, **kwargs)
    _check(model, t)
    return model, report


@pytest.mark.parametrize("case", sorted(CASES))
def test_key_tables_round_trip(case):
    """from_timm gives exactly our keys and shapes; to_timm gives timm's back (the same tensors)."""
    state, _, _ = load_fixture(case)
    model = _model(case)
    ours = from_timm(dict(state), model)
    own = model.state_dict()
    assert set(ours) == set(own) and all(ours[k].shape == own[k].shape for k in own)
    back = to_timm(ours, split_qkv=case in ("timm_eva02_bl", "timm_eva02_clip"))
    assert set(back) == set(state)
    for k, v in state.items():
        torch.testing.assert_close(back[k], v, rtol=0, atol=0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_format_timm_and_ours(case):
    """format='timm' names the converter; our own layout (converted once, saved) loads as it is."""
    state, t, _ = load_fixture(case)
    model, _ = _loads_and_matches(case, state, t, "timm", format="timm")
    _loads_and_matches(case, model.state_dict(), t, "vit_attention")


def _eva02_original(state: dict) -> dict:
    """baaivision/EVA (asuka) MIM file from timm's keys: w12 / w1 / w2 / w3 / ffn_ln, q_bias / v_bias beside split
    q_proj / k_proj / v_proj, the final norm as ``norm``, the MIM mask token and head, RoPE buffers."""
    out = {}
    for k, v in state.items():
        k = (k.replace("mlp.fc1_g", "mlp.w1").replace("mlp.fc1_x", "mlp.w2").replace("mlp.fc1.", "mlp.w12.")
             .replace("mlp.fc2", "mlp.w3").replace("mlp.norm", "mlp.ffn_ln").replace("fc_norm", "norm")
             .replace("q_proj.bias", "q_bias").replace("v_proj.bias", "v_bias"))
        out[k] = v
    C = state["cls_token"].shape[-1]
    out.update({"mask_token": torch.randn(1, 1, C), "lm_head.weight": torch.randn(7, C), "lm_head.bias": torch.randn(7),
                "rope.freqs_cos": torch.randn(16, 16), "rope.freqs_sin": torch.randn(16, 16),
                "blocks.0.attn.rope.freqs_cos": torch.randn(16, 16)})
    return out


@pytest.mark.parametrize("case", ["timm_eva02_ts", "timm_eva02_bl"])
def test_eva02_original_mim_layout(case):
    state, t, _ = load_fixture(case)
    orig = _eva02_original({k: v for k, v in state.items() if not k.startswith("head.")})
    assert "norm.weight" in orig and "fc_norm.weight" not in orig
    model = _model(case)
    report = load_weights(model, orig, strict=False)
    assert report.layout == "original" and any("fc_norm" in n for n in report.notes)
    assert report.missing == ["head.weight", "head.bias"] and not report.unexpected and not report.mismatched
    model.head.load_state_dict({"weight": state["head.weight"], "bias": state["head.bias"]})
    _check(model, t)


def _dinov3_original(state: dict, k_bias_noise: bool = True) -> dict:
    """facebookresearch/dinov3 file from timm's keys: storage_tokens, ls{1,2}.gamma, packed qkv.bias (key third
    masked at run time: garbage here), bias_mask, rope_embed.periods, mask_token, SwiGLU w1 / w2 / w3."""
    out = {}
    for k, v in state.items():
        k = (k.replace("reg_token", "storage_tokens").replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma")
             .replace("mlp.fc1_g", "mlp.w1").replace("mlp.fc1_x", "mlp.w2").replace("mlp.fc2", "mlp.w3"))
        out[k] = v
    for p in sorted({k.rsplit(".", 1)[0] for k in out if k.endswith(".q_bias")}):
        q, v = out.pop(f"{p}.q_bias"), out.pop(f"{p}.v_bias")
        k = torch.randn_like(q) if k_bias_noise else torch.zeros_like(q)
        out[f"{p}.qkv.bias"] = torch.cat([q, k, v])
        out[f"{p}.qkv.bias_mask"] = torch.cat([torch.ones_like(q), torch.zeros_like(q), torch.ones_like(q)])
    C = out["cls_token"].shape[-1]
    out.update({"mask_token": torch.randn(1, C), "rope_embed.periods": torch.randn(4).bfloat16()})
    return out


def test_dinov3_original_layout():
    state, t, _ = load_fixture("timm_dinov3_qkvb_swiglu")
    orig = _dinov3_original(state)
    _loads_and_matches("timm_dinov3_qkvb_swiglu", orig, t)


def test_dinov3_original_zero_biases_into_the_bias_free_model():
    state, t, _ = load_fixture("timm_dinov3")
    C = state["cls_token"].shape[-1]
    withb = dict(state)
    for i in range(2):
        withb[f"blocks.{i}.attn.q_bias"] = torch.zeros(C)
        withb[f"blocks.{i}.attn.v_bias"] = torch.zeros(C)
    orig = _dinov3_original(withb)
    _, report = _loads_and_matches("timm_dinov3", orig, t, layout=None)
    assert any("all-zero" in n for n in report.notes)


def test_naver_original_mixed_layout():
    """naver-ai/rope-vit: model-level ``freqs [2, depth, nh·hd/2]`` and the coordinate buffers ``freqs_t_x/y``."""
    state, t, _ = load_fixture("timm_rope_vit_mixed_ape")
    orig = dict(state)
    freqs = orig.pop("rope.freqs")
    orig["freqs"] = freqs.flatten(2)
    orig["freqs_t_x"], orig["freqs_t_y"] = torch.arange(16.0) % 4, torch.arange(16.0) // 4
    _loads_and_matches("timm_rope_vit_mixed_ape", orig, t)


def test_packed_qkv_bias_is_kept_whole():
    """A packed qkv.bias outside the DINOv3 original (RoPE-ViT's AttentionRope) keeps its key third."""
    state, _, _ = load_fixture("timm_rope_vit_axial")
    ours = convert_state_dict(state, _model("timm_rope_vit_axial"))
    torch.testing.assert_close(ours["blocks.0.attn.qkv.bias"], state["blocks.0.attn.qkv.bias"], rtol=0, atol=0)
    assert state["blocks.0.attn.qkv.bias"][32:64].abs().max() > 0


def test_non_zero_biases_are_not_dropped():
    state, _, _ = load_fixture("timm_dinov3_qkvb_swiglu")
    model = create_model("vit_small_plus_patch16_dinov3", **SMALL)
    report = load_weights(model, state, strict=False)
    assert {"blocks.0.attn.q_bias", "blocks.0.attn.v_bias"} <= set(report.unexpected)


def test_eva_clip_original_inner_attn_ln():
    """EVA-CLIP (baaivision/EVA, EVA-CLIP ``eva_vit_model``) keys: ``attn.inner_attn_ln`` -> ``attn.norm``, with the
    EVA-02 MLP / bias names; the tower's final ``norm`` stays the final norm (class-token pooling)."""
    state, t, _ = load_fixture("timm_eva02_clip")
    assert any(".attn.norm." in k for k in state)
    orig = {k.replace(".attn.norm.", ".attn.inner_attn_ln."): v for k, v in state.items()}
    orig = _eva02_original({k: v for k, v in orig.items() if k != "fc_norm.weight"})
    assert any(".attn.inner_attn_ln." in k for k in orig) and not any(".attn.norm." in k for k in orig)
    ours = from_timm(dict(orig), _model("timm_eva02_clip"))
    assert "blocks.1.attn.norm.weight" in ours and not any("inner_attn_ln" in k for k in ours)
    _loads_and_matches("timm_eva02_clip", orig, t)
