"""RoPE-ViT (models/rope_vit.py): presets, structure, parity with timm's Eva (committed fixtures)."""

import pytest
import torch
from fixture_utils import assert_fixture_parity, load_fixture

from vit_attention import create_model
from vit_attention.attention.rope import RotaryEmbedding
from vit_attention.layers import LayerScale
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.rope_vit import RopeViT
from vit_attention.train.optim import param_groups
from vit_attention.weights import load_weights

VARIANTS = ["rope", "rope_mixed", "rope_ape", "rope_mixed_ape"]
NAMES = [f"vit_{s}_patch16_{v}_224" for s in ("small", "base", "large") for v in VARIANTS]
SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10, dynamic_img_size=True)
CASES = [("timm_rope_vit_axial", "vit_base_patch16_rope_224"),
         ("timm_rope_vit_mixed_ape", "vit_base_patch16_rope_mixed_ape_224")]


def test_registered_names_and_presets():
    assert set(list_models("vit_*_rope*")) == set(NAMES)
    for name in NAMES:
        e = get_model_entry(name)
        p = e.preset
        assert e.family == "rope_vit" and p["init_values"] == 1e-5 and p["patch_size"] == 16
        assert p["rope"] == ("mixed" if "mixed" in name else "axial")
        assert p["pos_embed"] == ("learn" if "ape" in name else "none")
        assert p.get("no_embed_class", False) == ("ape" in name)
        assert e.meta["published_params_m"] > 0 and e.meta["published_gmacs"] > 0


def test_structure_on_meta():
    with torch.device("meta"):
        axial = create_model("vit_base_patch16_rope_224")
        mixed = create_model("vit_base_patch16_rope_mixed_ape_224")
    assert isinstance(axial, RopeViT) and axial.pos_embed is None and axial.global_pool == "token"
    r = axial.blocks[0].attn.rope
    assert isinstance(r, RotaryEmbedding) and (r.convention, r.theta, r.axes, r.coords) == ("naver", 100.0, "xy",
                                                                                         "index")
    assert isinstance(axial.blocks[0].ls1, LayerScale) and axial.blocks[0].attn.qkv.bias is not None
    assert mixed.pos_embed.shape == (1, 196, 768)  # patches only
    assert mixed.blocks[3].attn.rope.freqs.shape == (2, 12, 32) and mixed.blocks[0].attn.rope.theta == 10.0
    assert isinstance(mixed.norm, torch.nn.LayerNorm) and isinstance(mixed.fc_norm, torch.nn.Identity)


@pytest.mark.registry
@pytest.mark.parity
@pytest.mark.parametrize("case,name", CASES)
def test_timm_parity(case, name):
    state, t, cfg = load_fixture(case)
    assert any(k.endswith("gamma_1") for k in state)
    m = create_model(name, **SMALL).eval()
    report = load_weights(m, state)
    assert report.ok and report.layout == "timm", report
    assert_fixture_parity(m, t)
    assert_fixture_parity(m, t, "_nonsquare", outputs=("output",))  # 3x5: x and y not swapped


@pytest.mark.parity
def test_mixed_frequencies_are_per_block_and_learned():
    state, t, _ = load_fixture("timm_rope_vit_mixed_ape")
    m = create_model("vit_base_patch16_rope_mixed_ape_224", **SMALL).eval()
    load_weights(m, state)
    for i, blk in enumerate(m.blocks):
        torch.testing.assert_close(blk.attn.rope.freqs.detach(), state["rope.freqs"][:, i], rtol=0, atol=0)
    swapped = dict(state)
    swapped["rope.freqs"] = state["rope.freqs"].flip(1)  # block 0 gets block 1's frequencies
    load_weights(m, swapped)
    with torch.no_grad():
        assert (m(t["input"]) - t["output"]).abs().max() > 1e-3 * t["output"].abs().max()
    m.train()
    loss = m(t["input"]).square().mean()
    loss.backward()
    assert m.blocks[0].attn.rope.freqs.grad.abs().max() > 0
    no_decay = {id(p) for g in param_groups(m, weight_decay=0.05) if g["weight_decay"] == 0 for p in g["params"]}
    assert id(m.blocks[0].attn.rope.freqs) in no_decay  # timm / Naver: no weight decay on the frequencies


@pytest.mark.parity
def test_axial_parity_needs_xy():
    state, t, _ = load_fixture("timm_rope_vit_axial")
    m = create_model("vit_base_patch16_rope_224", **{**SMALL, "rope_kwargs": {"convention": "naver", "axes": "yx"}})
    load_weights(m, state)
    with torch.no_grad():
        assert (m.eval()(t["input"]) - t["output"]).abs().max() > 1e-3 * t["output"].abs().max()
