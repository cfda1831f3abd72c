"""CPVT (models/cpvt.py): DeiT with a PEG after block 0. No reference code exists: structure, sizes, any input size.

The PEG itself is checked against timm's Twins PosConv in tests/layers/test_peg.py.
"""

import pytest
import torch

from vit_attention import create_model
from vit_attention.analysis.flops import flops
from vit_attention.layers import PosConv
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.cpvt import CPVT

NAMES = [f"cpvt_{g}{s}_patch16_224" for g in ("", "gap_") for s in ("tiny", "small", "base")]


def test_registered():
    assert set(NAMES) == set(list_models("cpvt*"))


@pytest.mark.registry
@pytest.mark.parametrize("name", NAMES)
def test_params_match_deit_minus_pos_embed_plus_peg_on_meta(name):
    with torch.device("meta"):
        model = create_model(name)
        deit = create_model(name.replace("cpvt_gap_", "deit_").replace("cpvt_", "deit_"))
    C = model.embed_dim
    n, n_deit = (sum(p.numel() for p in m.parameters()) for m in (model, deit))
    gap = "gap" in name
    assert n == n_deit - deit.pos_embed.numel() + 10 * C - (C if gap else 0)  # CPVT: DeiT - position embedding + PEG
    meta = get_model_entry(name).meta
    assert abs(n / 1e6 - meta["published_params_m"]) / meta["published_params_m"] < 0.001
    macs = flops(model, (1, 3, 224, 224)).total
    deit_macs = flops(deit, (1, 3, 224, 224)).total
    if not gap:
        assert macs - deit_macs == 9 * 196 * C  # + the PEG's depthwise conv (prefix tokens excluded)
    assert abs(macs / 1e9 - meta["published_gmacs"]) / meta["published_gmacs"] < 0.01


def test_structure_peg_after_block_0_and_no_position_table():
    m = create_model("cpvt_tiny_patch16_224")
    assert isinstance(m, CPVT) and m.family == "cpvt"
    assert m.pos_embed is None and list(m.pos_block) == ["0"] and isinstance(m.pos_block["0"], PosConv)
    assert m.num_prefix_tokens == 1 and m.global_pool == "token"
    gap = create_model("cpvt_gap_tiny_patch16_224")
    assert gap.cls_token is None and gap.num_prefix_tokens == 0 and gap.global_pool == "avg"


@pytest.mark.registry
@pytest.mark.parametrize("name", ["cpvt_tiny_patch16_224", "cpvt_gap_tiny_patch16_224"])
def test_forward_equals_written_out_flow_at_any_size(name):
    torch.manual_seed(0)
    m = create_model(name, depth=3, num_classes=4).eval()
    x = torch.randn(2, 3, 96, 160)  # not 224: nothing to resample
    P = m.num_prefix_tokens
    with torch.no_grad():
        t = m.patch_embed(x)  # [B, 6·10, C]
        if P:
            t = torch.cat([m.cls_token.expand(2, -1, -1), t], 1)
        t = m.blocks[0](t, (6, 10), P)
        t = m.pos_block["0"](t, (6, 10), P)  # the PEG: grid only, class token passed around
        for blk in m.blocks[1:]:
            t = blk(t, (6, 10), P)
        t = m.norm(t)
        torch.testing.assert_close(m.forward_features(x), t)
        pooled = t[:, 0] if P else t.mean(dim=1)  # GAP: norm, then the mean of the patch tokens
        torch.testing.assert_close(m(x), m.head(pooled))


def test_position_depends_on_content_location():
    """Without a position table the PEG still breaks permutation symmetry: shifting the image changes the output."""
    torch.manual_seed(0)
    m = create_model("cpvt_gap_tiny_patch16_224", depth=2, num_classes=4).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        m.pos_block["0"].proj.weight.normal_()
        y = m.forward_features(x)
        y_rolled = m.forward_features(torch.roll(x, 16, dims=-1))
    assert not torch.allclose(y.mean(1), y_rolled.mean(1), atol=1e-4)
