"""Swin / SwinV2 ``set_input_size``: timm 1.0.31 parity after a new image size, new windows, a window
ratio on a non-square image and ``always_partition`` (fixtures of make_fixtures_swin_resize.py), the
state after the call and argument errors (nothing changed by a refused call).

Tolerance: max |ours - ref| <= 1e-5 * max |ref|.
"""

import copy
import json

import pytest
import torch
from fixture_utils import add_noise, assert_parity, load_fixture

from vit_attention.attention.window import resize_window_bias_table
from vit_attention.functional import switched
from vit_attention.models.swin import SwinTransformer
from vit_attention.models.swinv2 import SwinTransformerV2
from vit_attention.weights import load_weights

# tag -> our set_input_size kwargs (timm's in make_fixtures_swin_resize.RESIZES)
RESIZES = {
    "img80": dict(img_size=(80, 80)),
    "win8": dict(window_size=8),
    "ratio_rect": dict(img_size=(64, 96), window_ratio=(4, 2)),
    "win8_ap": dict(window_size=8, always_partition=True),
}


def _from_fixture(name: str) -> tuple[SwinTransformer, dict]:
    state, t, cfg = load_fixture(name)
    cls = SwinTransformerV2 if "v2" in name else SwinTransformer
    model = cls(img_size=cfg["img_size"], patch_size=cfg["patch_size"], window_size=cfg["window_size"],
                embed_dim=cfg["embed_dim"], depths=tuple(cfg["depths"]), num_heads=tuple(cfg["num_heads"]),
                num_classes=cfg["num_classes"], pad_mode="timm").eval()
    report = load_weights(model, state)
    assert report.ok, report
    return model, t


def _small(cls=SwinTransformer, **kw) -> SwinTransformer:
    torch.manual_seed(0)
    cfg = dict(img_size=64, patch_size=4, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 2),
               num_classes=5)
    model = cls(**{**cfg, **kw}).eval()
    add_noise(model, 0.1)
    return model


@pytest.mark.parity
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("tag", list(RESIZES))
@pytest.mark.parametrize("name", ["timm_swin_resize", "timm_swinv2_resize"])
def test_timm_parity_after_set_input_size(name, tag, fused):
    model, t = _from_fixture(name)
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
    model.set_input_size(**RESIZES[tag])
    x = t.get(f"input_{tag}", t["input"][:1])
    with torch.no_grad(), switched(model, fused_attention=fused):
        assert_parity(model(x), t[f"output_{tag}"])  # measured <= 1e-6 relative
    if f"table_{tag}" in t:  # Swin v1: the resized table itself (timm's geometric-grid interpolation)
        assert_parity(model.layers[0].blocks[1].attn.relative_position_bias_table.detach(), t[f"table_{tag}"])


def test_state_after_set_input_size():
    m = _small(ape=True)
    pos = m.absolute_pos_embed.detach().clone()
    m.set_input_size(img_size=(64, 96), window_ratio=(4, 2))
    assert m.grid_size == m.patch_embed.grid_size == (16, 24) and m.patch_embed.img_size == (64, 96)
    assert m.cfg.img_size == (64, 96) and m.cfg.window_size == (4, 6) and m.window_sizes == ((4, 6), (8, 12))
    a0, a1 = m.layers[0].blocks[1].attn, m.layers[1].blocks[1].attn
    assert (a0.window_size, a0.shift_size) == ((4, 6), (2, 3))
    assert (a1.window_size, a1.shift_size) == ((8, 12), (0, 0))  # the 8x12 stage fits in one window: clamped
    assert a0.relative_position_bias_table.shape == (7 * 11, 2)
    assert m.absolute_pos_embed.shape == (1, 16 * 24, 16) and m.absolute_pos_embed.requires_grad
    assert m.feature_info[-1]["reduction"] == 8
    torch.testing.assert_close(m.absolute_pos_embed[0, 0], pos[0, 0], rtol=0.5, atol=0.5)
    assert m(torch.randn(1, 3, 64, 96)).shape == (1, 5)
    # no argument: windows scale with the grid from the last explicit reference, so the call is a no-op
    before = {k: v.clone() for k, v in m.state_dict().items()}
    m.set_input_size()
    assert m.window_sizes == ((4, 6), (8, 12)) and all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    # img only: windows scale with the grid; always_partition kept until given
    m.set_input_size(img_size=(32, 48))
    assert m.window_sizes == ((2, 3), (4, 6)) and m.cfg.always_partition is False
    m.set_input_size(always_partition=True)
    assert m.cfg.always_partition and m.layers[1].blocks[1].attn.shift_size == (2, 3)


def test_same_window_keeps_the_table_and_round_trip_of_the_resampler():
    m = _small()
    table = m.layers[0].blocks[0].attn.relative_position_bias_table
    m.set_input_size(window_size=4)
    assert m.layers[0].blocks[0].attn.relative_position_bias_table is table
    t = torch.randn(7 * 7, 3)
    assert resize_window_bias_table(t, (4, 4), (4, 4)) is t
    big = resize_window_bias_table(t, (4, 4), (6, 6))
    assert big.shape == (11 * 11, 3)
    grid, src = big.T.reshape(3, 11, 11), t.T.reshape(3, 7, 7)
    torch.testing.assert_close(grid[:, 5, 5], src[:, 3, 3])  # offset 0 stays where it was
    torch.testing.assert_close(grid[:, 0, 0], src[:, 0, 0])  # the far corner is held constant
    with pytest.raises(ValueError, match="window"):
        resize_window_bias_table(t, (3, 3), (4, 4))


def test_swinv2_keeps_pretrained_window_and_recomputes_coords():
    m = _small(SwinTransformerV2, pretrained_window_sizes=(8, 0))
    n_params = sum(p.numel() for p in m.parameters())
    m.set_input_size(window_size=(6, 8))
    attn = m.layers[0].blocks[1].attn
    assert attn.window_size == (6, 8) and attn.shift_size == (3, 4) and attn.pretrained_window_size == (8, 8)
    assert m.layers[1].blocks[0].attn.pretrained_window_size == (0, 0)
    assert attn.position_bias().shape == (2, 48, 48)
    assert sum(p.numel() for p in m.parameters()) == n_params  # the CPB MLP is window-free
    assert m(torch.randn(1, 3, 64, 64)).shape == (1, 5)


def test_caches_follow_the_new_window():
    m = _small()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        m(x)  # fills the bias / mask caches at window 4
        m.set_input_size(window_size=2)
        got = m(x)
        fresh = copy.deepcopy(m)
        for mod in fresh.modules():
            if hasattr(mod, "_mask_cache"):
                mod._mask_cache.clear()
                mod._bias_cache.clear()
        torch.testing.assert_close(got, fresh(x), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(img_size=62), ValueError, "img_size"),
    (dict(img_size=0), ValueError, "img_size"),
    (dict(window_size=0), ValueError, "window_size"),
    (dict(window_size=(4, 4, 4)), ValueError, "window_size"),
    (dict(window_size=[(4, 4), "a"]), TypeError, r"window_size\[1\]"),
    (dict(window_size=2.5), TypeError, "window_size"),
    (dict(window_ratio=(2, 2, 2)), ValueError, "window_ratio"),
    (dict(window_ratio=0), ValueError, "window_ratio"),
    (dict(window_ratio=1.5), TypeError, "window_ratio"),
    (dict(always_partition="yes"), TypeError, "always_partition"),
    (dict(img_size=62, window_size=8), ValueError, "img_size"),
])
def test_argument_errors_change_nothing(kwargs, err, match):
    m = _small(ape=True)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    cfg = json.dumps(m.cfg.to_dict(), sort_keys=True, default=str)
    windows = [(b.attn.window_size, b.attn.shift_size) for s in m.layers for b in s.blocks]
    with pytest.raises(err, match=match):
        m.set_input_size(**kwargs)
    assert json.dumps(m.cfg.to_dict(), sort_keys=True, default=str) == cfg and m.grid_size == (16, 16)
    assert [(b.attn.window_size, b.attn.shift_size) for s in m.layers for b in s.blocks] == windows
    assert m.state_dict().keys() == before.keys() and all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())


def test_mechanism_without_window_is_refused():
    m = _small(attn_layer="neighborhood", attn_kwargs=dict(kernel_size=3))
    with pytest.raises(TypeError, match="attn_layer"):
        m.set_input_size(img_size=32)
    assert m.grid_size == (16, 16) and m.cfg.img_size == 64
