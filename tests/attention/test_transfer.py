"""``attention.transfer``: every mechanism says where its projections sit; carrying them into another mechanism
gives exactly the source's attention wherever the target can express it (its pattern covers the map and its
extra parameters start neutral), and the offset bias moves between Swin's table and NAT's ``rpb``."""

from __future__ import annotations

import pytest
import torch

import vit_attention as va
from vit_attention.attention import get_attention_spec, list_attention
from vit_attention.attention.transfer import (
    ROLES,
    carry_attention,
    fit_offset_grid,
    get_projections,
    set_projections,
)
from vit_attention.weights import transfer_weights

# a ViT on a 7 x 7 grid without a class token: every windowed mechanism below covers the whole map
GRID7 = {"img_size": 14, "patch_size": 2, "depth": 2, "class_token": False, "global_pool": "avg", "embed_dim": 64,
         "num_heads": 4, "conv_stem": None}


def _vit(attn: str = "mhsa", qkv_bias: bool = True, **attn_kwargs: object) -> torch.nn.Module:
    return va.create_model("vit_digits_patch2_8_gap", **GRID7, qkv_bias=qkv_bias, attn_layer=attn,
                           attn_kwargs=attn_kwargs).eval()


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (biases and tables too: zeros would hide a bias or table carried wrong)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def check_projections_round_trip(name: str) -> None:
    """The spec's example declares its q / k / v / o projections, and they carry into a second one exactly
    (a plain function of a registered name: ``tests/test_bring_your_own.py`` runs it on a mechanism from outside)."""
    a, _ = get_attention_spec(name).example()
    b, _ = get_attention_spec(name).example()
    _randomise(a, 1)
    proj = get_projections(a)
    assert proj.weight, f"{name} declares no transfer_slots"
    assert set(proj.weight) <= set(ROLES)
    roles, notes = set_projections(b, proj)
    assert sorted(roles) == sorted(proj.weight) and not notes
    again = get_projections(b)
    for role in proj.weight:
        torch.testing.assert_close(again.weight[role], proj.weight[role], rtol=0, atol=0)
        assert (again.bias[role] is None) == (proj.bias[role] is None)
        if proj.bias[role] is not None:
            torch.testing.assert_close(again.bias[role], proj.bias[role], rtol=0, atol=0)


@pytest.mark.parametrize("name", list_attention())
def test_every_mechanism_declares_its_projections_and_they_round_trip(name: str) -> None:
    check_projections_round_trip(name)


SOURCE = "mhsa"  # the global attention the weights come from
# every mechanism whose spec says how it computes global attention on a grid (global_kwargs): on the 7 x 7 grid,
# once its new parameters are neutral, the transferred model equals the source (CvT's conv projections with
# stride 1, PVT's without reduction; CvT's logit scale C^-1/2 is made up for in the queries)
GLOBAL = [n for n in list_attention() if get_attention_spec(n).global_kwargs is not None and n != SOURCE]


def test_the_mechanisms_that_can_attend_globally_say_so() -> None:
    assert {"mha", "talking_heads", "class_attn", "window", "lsa", "neighborhood", "rel_pos", "conv_proj", "sra",
            "longformer2d"} <= set(GLOBAL)
    assert get_attention_spec(SOURCE).global_kwargs is not None


@pytest.mark.parametrize("name", GLOBAL)
def test_global_attention_into_a_mechanism_that_covers_the_map_is_unchanged(name: str) -> None:
    check_transfer_from_global_attention_is_exact(name, get_attention_spec(name).global_kwargs((7, 7)))


def test_global_attention_into_eva_q_v_biases_is_unchanged() -> None:
    check_transfer_from_global_attention_is_exact(SOURCE, {"qkv_bias": "qv"})  # the dropped key bias changes no softmax


def check_transfer_from_global_attention_is_exact(name: str, kwargs: dict) -> None:
    """A random global-attention ViT on a 7 x 7 grid carried into ``name`` built with ``kwargs`` (under which it
    computes global attention there once its new parameters are neutral) gives the same logits."""
    src, tgt = _randomise(_vit(SOURCE)), _vit(name, **kwargs)
    report = transfer_weights(src, tgt)
    assert report.ok, report
    assert report.notes and f"{SOURCE} -> {name}" in report.notes[0]
    x = torch.randn(2, 3, 14, 14)
    with torch.no_grad():
        torch.testing.assert_close(tgt(x), src(x), rtol=1e-5, atol=1e-5)


def test_a_mechanism_that_differs_is_reported_and_differs() -> None:
    src, tgt = _randomise(_vit()), _vit("halo", qkv_bias=False, block_size=7, halo_size=0)
    report = transfer_weights(src, tgt)
    note = report.notes[0]
    assert "q/k/v projections" in note and "o: no counterpart here" in note and "q: bias dropped" in note
    attn, own = tgt.blocks[0].attn, get_projections(src.blocks[0].attn)
    hd = attn.dim_head_qk
    kv = attn.kv.weight.view(attn.num_heads, 2, hd, -1)  # per head: key rows, then value rows
    torch.testing.assert_close(kv[:, 0].reshape(-1, kv.shape[-1]), own.weight["k"], rtol=0, atol=0)
    torch.testing.assert_close(kv[:, 1].reshape(-1, kv.shape[-1]), own.weight["v"], rtol=0, atol=0)


@pytest.mark.parametrize(("a", "b"), [("window", "neighborhood"), ("neighborhood", "window")])
def test_the_offset_bias_moves_between_swin_tables_and_nat_rpb(a: str, b: str) -> None:
    opts = {"window": {"window_size": 7}, "neighborhood": {"kernel_size": 7}}
    src, tgt = _randomise(_vit(a, **opts[a]), 3), _vit(b, **opts[b])
    report = transfer_weights(src, tgt)
    assert "offset bias" in report.notes[0] and "zeros" not in report.notes[0]
    x = torch.randn(2, 3, 14, 14)
    with torch.no_grad():  # one 7 x 7 window == the clamped 7 x 7 neighbourhood on a 7 x 7 map, biases included
        torch.testing.assert_close(tgt(x), src(x), rtol=1e-5, atol=1e-5)


def test_offset_grid_into_a_dilated_neighbourhood_reads_every_d_th_offset() -> None:
    grid = torch.randn(2, 13, 13)  # offsets -6..6
    nat = va.create_attention("neighborhood", 16, 2, kernel_size=3, dilation=4)  # rpb [2, 5, 5]: offsets -8..8 by 4
    assert nat.set_offset_bias(grid)
    for i in range(5):
        for j in range(5):
            dr, dc = (i - 2) * 4, (j - 2) * 4
            want = grid[:, dr + 6, dc + 6] if max(abs(dr), abs(dc)) <= 6 else torch.zeros(2)
            torch.testing.assert_close(nat.rpb[:, i, j], want, rtol=0, atol=0)
    assert nat.get_offset_bias() is None  # a dilated table has no full offset grid to give


def test_fit_offset_grid_pads_and_crops_about_the_centre() -> None:
    g = torch.arange(9.0).view(1, 3, 3)
    padded = fit_offset_grid(g, (5, 5))
    assert padded[0, 2, 2] == 4 and padded.sum() == g.sum() and padded[0, 0].abs().sum() == 0
    torch.testing.assert_close(fit_offset_grid(padded, (3, 3)), g)


def test_carry_between_two_of_the_same_mechanism_with_other_options() -> None:
    src = _randomise(va.create_attention("window", 32, 4, window_size=7), 5)
    dst = va.create_attention("window", 32, 4, window_size=3)  # a smaller table: the centre offsets
    what, notes = carry_attention(src, dst)
    assert "q/k/v/o projections" in what and "offset bias" in what and not notes
    torch.testing.assert_close(dst.get_offset_bias(), src.get_offset_bias()[:, 4:9, 4:9])
