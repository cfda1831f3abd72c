"""``set_input_size`` beyond ViT and Swin: CaiT (timm parity: tables resampled as timm does
to a checkpoint loaded at another size), the families with no size-dependent tables (the size is
checked and recorded: ``Backbone.set_input_size``), and the families whose resize would need tables
not handled yet (``NotImplementedError`` naming the family). A registry-wide test covers every family
explicitly: after ``set_input_size`` the model runs at the new size and gives what a model freshly built
from its (updated) config gives with the same weights."""

import copy
import dataclasses
import re

import pytest
import torch
from fixture_utils import assert_parity, load_fixture
from model_outputs import fill_by_key, first_preset_per_family, small_overrides

from vit_attention import create_model
from vit_attention.models import get_model_entry
from vit_attention.models.backbone import Backbone
from vit_attention.models.cait import Cait, CaitConfig
from vit_attention.weights import load_weights

# make_fixtures_cait_resize.py's RESIZES: tag -> (img_size, patch_size)
CAIT_RESIZES = {"img48": ((48, 48), 8), "rect": ((40, 48), 8), "p4": ((32, 32), 4)}
_TIMM_KEYS = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes", "qkv_bias",
              "init_values", "depth_token_only", "mlp_ratio_token_only")

FAMILIES = first_preset_per_family()


def _cait_from_fixture() -> tuple[Cait, dict]:
    state, t, cfg = load_fixture("timm_cait_resize")
    model = Cait(CaitConfig(**{k: v for k, v in cfg.items() if k in _TIMM_KEYS})).eval()
    report = load_weights(model, state)
    assert report.ok, report
    return model, t


# ---------------------------------------------------------------------------------------------- CaiT
@pytest.mark.parity
def test_cait_timm_parity_after_set_input_size():
    """timm's Cait built at the new size / patch with its pos_embed (and kernel) resampled by timm's functions."""
    model, t = _cait_from_fixture()
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
    for tag, (img, patch) in CAIT_RESIZES.items():
        m = copy.deepcopy(model)
        m.set_input_size(img_size=img, patch_size=patch)
        assert m.grid_size == (img[0] // patch, img[1] // patch)
        assert m.pos_embed.shape == (1, m.grid_size[0] * m.grid_size[1], m.embed_dim)
        with torch.no_grad():
            assert_parity(m(t[f"input_{tag}"]), t[f"output_{tag}"], rel=1e-6)  # measured <= 4e-7 relative


@pytest.mark.parity
def test_cait_state_after_set_input_size():
    model, _ = _cait_from_fixture()
    model.pos_embed.requires_grad_(False)
    model.set_input_size(img_size=(40, 48), patch_size=(10, 6))
    assert model.cfg.img_size == (40, 48) and model.cfg.patch_size == (10, 6)
    assert model.grid_size == model.patch_embed.grid_size == (4, 8)
    assert model.pos_embed.shape == (1, 32, 32) and not model.pos_embed.requires_grad
    assert model.patch_embed.proj.weight.shape[-2:] == (10, 6)
    assert [f["reduction"] for f in model.feature_info] == [10] * len(model.feature_info)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 40, 48)).shape == (1, 10)
    with pytest.raises(ValueError, match="img_size"):  # strict size: the old one is refused now
        model(torch.randn(1, 3, 32, 32))
    pos = model.pos_embed
    model.set_input_size()  # nothing changes
    model.set_input_size(img_size=(40, 48))  # same grid: the table is kept as it is
    assert model.pos_embed is pos


@pytest.mark.parity
def test_cait_set_input_size_checks_before_changing():
    model, _ = _cait_from_fixture()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = dataclasses.replace(model.cfg)
    with pytest.raises(ValueError, match="img_size"):
        model.set_input_size(img_size=36)  # not a multiple of the patch 8
    with pytest.raises(ValueError, match="img_size"):
        model.set_input_size(img_size=48, patch_size=5)
    with pytest.raises((TypeError, ValueError), match="patch_size"):
        model.set_input_size(patch_size=0)
    with pytest.raises((TypeError, ValueError), match="img_size"):
        model.set_input_size(img_size="big")
    assert model.cfg == cfg and model.grid_size == (4, 4)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parity
def test_cait_dynamic_img_size_after_set_input_size():
    """With dynamic_img_size the resized table is the one resampled at run time; the new size needs none."""
    model, t = _cait_from_fixture()
    dyn = Cait(dataclasses.replace(model.cfg, dynamic_img_size=True)).eval()
    dyn.load_state_dict(model.state_dict())
    dyn.set_input_size(img_size=48)
    with torch.no_grad():
        assert_parity(dyn(t["input_img48"]), t["output_img48"], rel=1e-6)
        assert dyn(torch.randn(1, 3, 40, 32)).shape == (1, 10)


# ------------------------------------------------------------------------------ the families without tables
def _reduced(name: str) -> Backbone:
    model = create_model(name, **small_overrides(name)).eval()
    fill_by_key(model)
    return model


def _size(cfg_img) -> tuple[int, int]:
    return (cfg_img, cfg_img) if isinstance(cfg_img, int) else tuple(cfg_img)


def _new_size(model: Backbone) -> tuple[int, int]:
    """A larger, non-square size every family takes: whole patches (isotropic) or whole 32 px strides."""
    h, w = _size(model.cfg.img_size)
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    unit = patch if isinstance(patch, tuple) and not hasattr(model, "stages") and not hasattr(model, "layers") \
        else (32, 32)
    return h + unit[0], w + 2 * unit[1]


def _behaviour(model: Backbone) -> str:
    """What the model's set_input_size does, read from its class: "not_implemented" (it declares
    ``resize_needs``: NotImplementedError naming the family and what it would need), "tables" (its own override
    resamples / rebuilds size-dependent tables), "record" (Backbone.set_input_size: checked and recorded)."""
    if type(model).resize_needs:
        return "not_implemented"
    return "record" if type(model).set_input_size is Backbone.set_input_size else "tables"


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(FAMILIES.values()))
def test_set_input_size_every_family(name):
    """The family's representative: set_input_size works and the model then equals one freshly built from
    its config at the new size with the same weights, or it raises NotImplementedError naming the family."""
    family = get_model_entry(name).family
    model = _reduced(name)
    behaviour = _behaviour(model)
    if behaviour == "not_implemented":
        cfg = dataclasses.replace(model.cfg)
        with pytest.raises(NotImplementedError, match=f"for {family} .*it would need {re.escape(model.resize_needs)}"):
            model.set_input_size(_new_size(model))
        with pytest.raises(NotImplementedError, match=family):
            model.set_input_size()  # refused whatever the arguments: never a silent no-op
        assert model.cfg == cfg
        return
    new = _new_size(model)
    if behaviour == "record":  # no size-dependent tables: a model built at the new size has the same state shapes
        built = type(model)(dataclasses.replace(copy.deepcopy(model.cfg), img_size=new))
        assert {k: v.shape for k, v in built.state_dict().items()} == \
            {k: v.shape for k, v in model.state_dict().items()}, f"{family} has size-dependent tables: override " \
            "set_input_size or declare resize_needs"
    model.set_input_size(new)
    assert _size(model.cfg.img_size) == new
    fresh = type(model)(copy.deepcopy(model.cfg)).eval()
    fresh.load_state_dict(model.state_dict(), strict=True)
    assert fresh.feature_info == model.feature_info
    x = torch.randn(1, model.cfg.in_chans, *new, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out, ref = model(x), fresh(x)
    assert out.shape == ref.shape == (1, 10)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_record_families_check_their_constraints():
    """PVTv2 / Twins: below min_input_size is refused naming img_size, before anything changes; bad types too."""
    for fam in ("pvt_v2", "twins"):
        model = _reduced(FAMILIES[fam])
        cfg = dataclasses.replace(model.cfg)
        m = model.min_input_size[0]
        with pytest.raises(ValueError, match=f"img_size={m - 1} is below the minimum input size"):
            model.set_input_size(m - 1)
        assert model.cfg == cfg
        model.set_input_size((m, m + 8))
        assert model.cfg.img_size == (m, m + 8)
    model = _reduced(FAMILIES["cvt"])
    for bad, err in (("big", TypeError), (0, ValueError), ((64, 64, 3), TypeError)):
        with pytest.raises(err, match="img_size"):
            model.set_input_size(bad)
    assert model.cfg.img_size == 64
    model.set_input_size(96)  # square: recorded as an int, as the presets
    assert model.cfg.img_size == 96
    model.set_input_size(None)
    assert model.cfg.img_size == 96


def test_not_implemented_message_names_what_is_needed():
    """iGPT: its autoregressive pixel sequence has no resize that keeps its meaning."""
    with pytest.raises(NotImplementedError, match="pos_embed"):
        _reduced(FAMILIES["igpt"]).set_input_size(96)


def test_pvt_v1_tables_follow_the_new_size_as_the_forward_resamples_them():
    """PVT v1 resamples each stage's table once, with the rule its forward uses at another size: the resized
    model gives what the unresized one gives at that size (same weights), the class token's table keeps its
    prefix row, and a size below min_input_size is refused before anything changes."""
    model = _reduced(FAMILIES["pvt"]).eval()
    before = copy.deepcopy(model)
    x = torch.randn(2, 3, 96, 64)
    model.set_input_size((96, 64))
    with torch.no_grad():
        torch.testing.assert_close(model(x), before(x), rtol=1e-5, atol=1e-6)
    strides = [info["reduction"] for info in model.feature_info]
    assert model.patch_embed.grid == (96 // strides[0], 64 // strides[0])
    assert model.cfg.img_size == (96, 64)
    with pytest.raises(ValueError, match="img_size"):
        model.set_input_size(8)
    assert model.cfg.img_size == (96, 64)



def test_vitdet_tables_follow_the_new_size_as_the_forward_resizes_them():
    """ViTDet: the global blocks' rel_pos_h / rel_pos_w are resized once to 2·grid - 1 rows (the resize the
    mechanism applies at run time), window blocks' tables and the pre-training pos_embed are kept; the resized
    model gives what the unresized one gives at that size (backbone, probe and pyramid); a bad size is refused
    naming img_size before anything changes."""
    model = _reduced(FAMILIES["vitdet"]).eval()
    before = copy.deepcopy(model)
    glob = [i for i, b in enumerate(model.blocks) if not b.attn.is_windowed]
    assert glob and len(glob) < len(model.blocks)
    win = {k: v.clone() for k, v in model.state_dict().items() if not any(f"blocks.{i}." in k for i in glob)}
    x = torch.randn(2, 3, 96, 128, generator=torch.Generator().manual_seed(0))
    model.set_input_size((96, 128))  # grid 6x8 (built for 4x4)
    assert model.cfg.img_size == (96, 128) and model.grid_size == (6, 8)
    for i, blk in enumerate(model.blocks):
        assert blk.attn.input_size == (6, 8)
        if i in glob:
            assert blk.attn.rel_pos_h.shape[0] == 11 and blk.attn.rel_pos_w.shape[0] == 15
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in win.items())  # pos_embed, window tables, pyramid: kept
    with torch.no_grad():
        torch.testing.assert_close(model(x), before(x), rtol=1e-5, atol=1e-6)
        got, ref = model.forward_pyramid(x), before.forward_pyramid(x)
    assert got.keys() == ref.keys()
    for p in got:
        s = model.output_shape()[p].stride  # p6 (stride 64) rounds up: max-pool kernel 1 stride 2 of p5's 3x4
        assert got[p].shape[-2:] == (-(-96 // s), -(-128 // s))
        torch.testing.assert_close(got[p], ref[p], rtol=1e-5, atol=1e-6)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for bad, err in (("big", TypeError), (0, ValueError), ((64, 64, 3), TypeError)):
        with pytest.raises(err, match="img_size"):
            model.set_input_size(bad)
    assert model.cfg.img_size == (96, 128) and model.grid_size == (6, 8)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    model.set_input_size(64)  # back to the built size: square recorded as an int
    assert model.cfg.img_size == 64 and model.blocks[glob[0]].attn.rel_pos_h.shape[0] == 7


def test_vil_tables_follow_the_new_size_as_the_forward_resamples_them():
    """ViL: each stage's x / y position tables are resampled once to the new grid img_size / stride_i (linear,
    the forward's rule), the global tokens' rows kept; the resized model gives what the unresized one gives at
    that size; a size not divisible by the total stride is refused naming img_size before anything changes."""
    model = _reduced(FAMILIES["vil"]).eval()
    before = copy.deepcopy(model)
    x = torch.randn(2, 3, 96, 128, generator=torch.Generator().manual_seed(0))
    model.set_input_size((96, 128))
    assert model.cfg.img_size == (96, 128)
    strides = [info["reduction"] for info in model.feature_info]
    for st, old, s in zip(model.stages, before.stages, strides, strict=True):
        emb = st.downsample
        assert emb.grid == (96 // s, 128 // s)
        assert emb.x_pos_embed.shape[1] == 96 // s and emb.y_pos_embed.shape[1] == 128 // s
        if emb.cls_pos_embed is not None:
            assert torch.equal(emb.cls_pos_embed, old.downsample.cls_pos_embed)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before(x), rtol=1e-5, atol=1e-6)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"img_size=\(96, 100\) must be divisible by the total stride 32"):
        model.set_input_size((96, 100))
    with pytest.raises(TypeError, match="img_size"):
        model.set_input_size("big")
    assert model.cfg.img_size == (96, 128)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


# Where loading at another size and set_input_size legitimately differ: Swin's set_input_size also scales the
# window with the image (timm's rule), loading keeps the preset's window and resamples the bias tables; FlexiViT
# checkpoints resample by their own rule (bilinear, no anti-aliasing), set_input_size by timm's ViT rule.
_LOAD_DIFFERS = {"swin": "window scaled by set_input_size", "flexivit": "the FlexiViT checkpoint resampling rule"}


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(n for n in FAMILIES.values() if not get_model_entry(n).model_cls.resize_needs))
def test_weights_saved_at_one_size_load_at_another(name, tmp_path):
    """``create_model(name, pretrained=FILE, img_size=2·s)`` with weights trained at ``s`` loads strictly (every
    size-dependent table resampled, ViL's row / column tables included), runs, and, where the two rules agree,
    equals ``set_input_size(2·s)`` on the same weights."""
    from vit_attention import save_weights

    over = small_overrides(name)
    model = create_model(name, **over).eval()
    size = model.cfg.img_size if isinstance(model.cfg.img_size, int) else model.cfg.img_size[0]
    path = save_weights(model, tmp_path / "w.safetensors")
    big = create_model(name, pretrained=path, img_size=2 * size,
                       **{k: v for k, v in over.items() if k != "img_size"}).eval()
    x = torch.randn(1, model.cfg.in_chans, 2 * size, 2 * size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = big(x)
        assert out.shape == (1, model.num_classes) and torch.isfinite(out).all()
        if get_model_entry(name).family not in _LOAD_DIFFERS:
            model.set_input_size(2 * size)
            torch.testing.assert_close(out, model(x), rtol=0, atol=0)
