"""Any resolution on VisionTransformer: ``set_input_size`` (timm parity: image size, patch size, non-square),
``dynamic_img_size`` on every plain-ViT path (register tokens, RoPE, sin-cos, PEG), and loading at another
patch size (the adapter resamples the kernel and the position table)."""


import pytest
import torch
from fixture_utils import add_noise, assert_parity, assert_resized_parity, load_fixture

from vit_attention import create_model
from vit_attention.functional import resample_abs_pos_embed, resample_patch_embed
from vit_attention.layers import PatchEmbed
from vit_attention.layers.patch_embed import ConvStemPatchEmbed
from vit_attention.models import get_model_entry, list_models, model_config
from vit_attention.models.features import features_class
from vit_attention.models.vit import VisionTransformer, VisionTransformerConfig
from vit_attention.weights import load_weights


def _from_fixture(name: str) -> tuple[VisionTransformer, dict]:
    state, t, cfg = load_fixture(name)
    model = VisionTransformer(VisionTransformerConfig(**cfg)).eval()
    report = load_weights(model, state)
    assert report.ok, report
    return model, t


def _small(**kw) -> VisionTransformer:
    torch.manual_seed(0)
    cfg = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    model = VisionTransformer(**{**cfg, **kw}).eval()
    add_noise(model, 0.1)
    return model


@pytest.mark.parity
def test_timm_parity_before_and_after_set_input_size():
    model, t = _from_fixture("timm_flexivit")
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
    assert_resized_parity(model, t)  # measured <= 1e-6 relative


@pytest.mark.parity
def test_timm_parity_dynamic_img_size_with_register_tokens():
    """dynamic_img_size with 2 register tokens and a class slot in pos_embed, at a non-square size."""
    model, t = _from_fixture("timm_vit_dynamic_reg")
    assert model.num_prefix_tokens == 3 and model.pos_embed.shape[1] == 3 + 16
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
        assert_parity(model(t["input_rect"]), t["output_rect"])


@pytest.mark.parity
def test_timm_parity_sbb_register_model():
    """timm's SBB register ViTs (``vit_*_patch16_reg4_gap_256``): no class token, 4 registers without position
    embedding, LayerScale, the patch mean; at the trained size and at a non-square one."""
    model, t = _from_fixture("timm_vit_sbb_reg")
    assert model.num_prefix_tokens == 4 and model.pos_embed.shape[1] == 16 and model.cls_token is None
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
        assert_parity(model(t["input_rect"]), t["output_rect"])
    sbb = model_config("vit_base_patch16_reg4_gap_256")
    assert (sbb.reg_tokens, sbb.class_token, sbb.no_embed_class, sbb.global_pool, sbb.img_size) == (
        4, False, True, "avg", 256)


def test_state_after_set_input_size():
    m = _small(no_embed_class=True)
    w, pos = m.patch_embed.proj.weight.detach().clone(), m.pos_embed.detach().clone()
    m.train()
    m.set_input_size(img_size=(40, 48), patch_size=(10, 6))
    assert m.patch_embed.patch_size == (10, 6) and m.patch_embed.img_size == (40, 48)
    assert m.grid_size == m.patch_embed.grid_size == (4, 8) and m.patch_embed.num_patches == 32
    assert m.feat_size((40, 48)) == (4, 8)
    assert m.cfg.img_size == (40, 48) and m.cfg.patch_size == (10, 6)
    assert [f["reduction"] for f in m.feature_info] == [10, 10]
    torch.testing.assert_close(m.patch_embed.proj.weight, resample_patch_embed(w, (10, 6)))
    assert m.patch_embed.proj.stride == (10, 6) and m.patch_embed.proj.training
    torch.testing.assert_close(m.pos_embed, resample_abs_pos_embed(pos, (4, 8), (4, 4), num_prefix_tokens=0))
    assert isinstance(m.pos_embed, torch.nn.Parameter) and m.pos_embed.requires_grad
    assert {"pos_embed", "patch_embed.proj.weight"} <= {n for n, _ in m.named_parameters()}
    assert m(torch.randn(2, 3, 40, 48)).shape == (2, 10)
    with pytest.raises(ValueError, match="expected image size"):
        m(torch.randn(2, 3, 32, 32))  # the old size is refused now
    m2 = VisionTransformer(m.cfg)  # the config rebuilds the resized model
    assert m2.state_dict().keys() == m.state_dict().keys()
    assert all(v.shape == m.state_dict()[k].shape for k, v in m2.state_dict().items())


def test_prefix_rows_kept_and_frozen_stay_frozen():
    m = _small(reg_tokens=2)  # pos_embed has class + register rows
    pos = m.pos_embed.detach().clone()
    m.pos_embed.requires_grad_(False)
    m.patch_embed.proj.weight.requires_grad_(False)
    m.set_input_size(img_size=48)
    assert m.pos_embed.shape == (1, 3 + 36, 32) and not m.pos_embed.requires_grad
    assert torch.equal(m.pos_embed[:, :3], pos[:, :3])
    assert not m.patch_embed.proj.weight.requires_grad


def test_img_size_only_keeps_kernel_and_equals_dynamic():
    """set_input_size(img) computes what a dynamic_img_size model computes at that size."""
    m = _small(dynamic_img_size=True)
    x = torch.randn(2, 3, 24, 40)
    with torch.no_grad():
        dyn = m(x)
    proj = m.patch_embed.proj
    m.set_input_size(img_size=(24, 40))
    assert m.patch_embed.proj is proj
    with torch.no_grad():
        torch.testing.assert_close(m(x), dyn)
        assert m(torch.randn(1, 3, 64, 16)).shape == (1, 10)  # still dynamic


def test_patch_upsampling_keeps_the_function_on_resized_patches():
    """Patch 8 -> 16 with every patch resized 2x on its own (bicubic, anti-aliased): the same tokens, the same
    logits (FlexiViT's identity; resizing the whole image differs at the patch borders)."""
    m = _small(no_embed_class=True)
    x = torch.randn(2, 3, 32, 32)
    patches = x.reshape(2, 3, 4, 8, 4, 8).permute(0, 2, 4, 1, 3, 5).reshape(-1, 3, 8, 8)  # [B·16, 3, 8, 8]
    big = torch.nn.functional.interpolate(patches, size=(16, 16), mode="bicubic", antialias=True,
                                          align_corners=False)
    x2 = big.reshape(2, 4, 4, 3, 16, 16).permute(0, 3, 1, 4, 2, 5).reshape(2, 3, 64, 64)
    with torch.no_grad():
        ref = m(x)
        m.set_input_size(img_size=64, patch_size=16)
        assert_parity(m(x2), ref, rel=1e-5)


def test_patch_only_keeps_img_size():
    m = _small()
    m.set_input_size(patch_size=4)
    assert m.patch_embed.img_size == (32, 32) and m.grid_size == (8, 8) and m.pos_embed.shape == (1, 1 + 64, 32)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_sincos_table_is_recomputed():
    m = _small(class_token=False, global_pool="avg", pos_embed="sincos", dynamic_img_size=True)
    x = torch.randn(1, 3, 24, 40)
    with torch.no_grad():
        dyn = m(x)
    m.set_input_size(img_size=(24, 40))
    assert m.sincos.shape == (1, 15, 32)
    with torch.no_grad():
        torch.testing.assert_close(m(x), dyn)


def test_errors_name_the_argument_and_change_nothing():
    m = _small()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ValueError, match=r"img_size=\(36, 36\) is not divisible by patch_size=\(8, 8\)"):
        m.set_input_size(img_size=36)
    with pytest.raises(ValueError, match=r"img_size=\(32, 32\) is not divisible by patch_size=\(6, 6\)"):
        m.set_input_size(patch_size=6)
    with pytest.raises(ValueError, match="patch_size"):
        m.set_input_size(patch_size=0)
    with pytest.raises(ValueError, match="img_size"):
        m.set_input_size(img_size=(32, "a"))
    assert m.grid_size == (4, 4) and m.patch_embed.patch_size == (8, 8) and m.cfg.img_size == 32
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    padded = _small(dynamic_img_pad=True)
    padded.set_input_size(img_size=36)  # padded up to 40: a 5x5 grid
    assert padded.grid_size == (5, 5) and padded(torch.randn(1, 3, 36, 36)).shape == (1, 10)


def test_conv_stem_keeps_its_patch_but_takes_an_image_size():
    m = create_model("vitc_1gf_patch16_224", embed_dim=32, num_heads=2, depth=1, conv_stem=(8, 8, 16, 16)).eval()
    assert isinstance(m.patch_embed, ConvStemPatchEmbed)
    with pytest.raises(ValueError, match="patch_size"):
        m.set_input_size(patch_size=8)
    m.set_input_size(img_size=(160, 96))
    assert m.grid_size == (10, 6) and m(torch.randn(1, 3, 160, 96)).shape == (1, 1000)


def test_patch_embed_layer_set_input_size():
    pe = PatchEmbed(32, 8, 3, 16)
    pe.set_input_size(img_size=(48, 24), patch_size=(12, 6))
    assert pe.grid_size == (4, 4) and pe.num_patches == 16 and pe.proj.kernel_size == (12, 6)
    assert pe(torch.randn(1, 3, 48, 24)).shape == (1, 16, 16)
    free = PatchEmbed(None, 8, 3, 16)
    free.set_input_size(patch_size=4)
    assert free.grid_size is None and free(torch.randn(1, 3, 12, 20)).shape == (1, 15, 16)


def test_features_model_strides_follow():
    m = features_class(VisionTransformer)(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                          num_classes=10, out_indices=(0, 1)).eval()
    m.set_input_size(img_size=48, patch_size=12)
    assert m.feature_info.reduction() == [12, 12]
    maps = m(torch.randn(1, 3, 48, 48))
    assert [tuple(f.shape) for f in maps] == [(1, 32, 4, 4)] * 2


# ---------------------------------------------------------------- dynamic_img_size on the plain-ViT presets
_PICK = ["deit3_small_patch16_224", "deit_tiny_distilled_patch16_224", "vit_base_patch16_224_gap",
         "vit_small_patch16_224_sincos", "vit_base_patch16_224_postnorm", "vit_enormous_patch14_224",
         "vit_small_parallel_qknorm_patch16_224", "vit_base_patch16_224_in21k"]


def _reduced(name: str, **kw) -> VisionTransformer:
    torch.manual_seed(0)
    m = create_model(name, embed_dim=32, num_heads=2, depth=2, mlp_dim=None, num_classes=5, **kw).eval()
    add_noise(m, 0.1)
    return m


@pytest.mark.registry
@pytest.mark.parametrize("name", _PICK)
@pytest.mark.parametrize("extra", [{}, {"reg_tokens": 2}, {"reg_tokens": 1, "rope": "axial"}],
                         ids=["plain", "reg", "reg_rope"])
def test_dynamic_img_size_on_presets(name, extra):
    """Every plain-ViT path takes a non-square size with dynamic_img_size, and equals set_input_size there."""
    m = _reduced(name, dynamic_img_size=True, **extra)
    p = m.patch_embed.patch_size[0]
    x = torch.randn(2, 3, 2 * p, 5 * p)
    with torch.no_grad():
        out = m(x)
        feats = m.forward_features(x)
        _, inter = m.forward_intermediates(x, indices=1)
    assert feats.shape == (2, m.num_prefix_tokens + 10, 32) and inter[0].shape == (2, 32, 2, 5)
    assert torch.isfinite(torch.as_tensor(out)).all()
    m.set_input_size(img_size=(2 * p, 5 * p))
    with torch.no_grad():
        torch.testing.assert_close(m(x), out)


def test_rope_coordinates_follow_the_grid():
    """RoPE reads feat_size: a transposed image is not the same sequence (positions differ by axis)."""
    m = _reduced("vit_small_patch16_224", dynamic_img_size=True, pos_embed="none", rope="axial")
    x = torch.randn(1, 3, 32, 80)
    with torch.no_grad():
        a = m.forward_features(x)
        b = m.forward_features(x.transpose(-1, -2).contiguous())
    assert a.shape == b.shape and (a - b).abs().max() > 1e-3


def test_every_plain_vit_preset_has_dynamic_img_size():
    """The config flag is accepted by every registered ViT / DeiT preset (built on meta; a non-square grid)."""
    names = [n for n in list_models() if get_model_entry(n).family == "vit"]  # other families: their own tests
    assert len(names) > 40
    for name in names:
        with torch.device("meta"):
            m = create_model(name, dynamic_img_size=True)
        p = m.patch_embed.patch_size[0]
        assert m.feat_size((3 * p, 7 * p)) == (3, 7), name


# ---------------------------------------------------------------- loading at another patch size
def test_load_checkpoint_at_another_patch_size():
    """A patch-8 / 4x4 checkpoint into a patch-12 / 3x3 ViT: kernel and table resampled (bicubic, anti-aliased)."""
    src = _small()
    state = src.state_dict()
    dst = VisionTransformer(img_size=36, patch_size=12, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    report = load_weights(dst, state)
    assert report.ok, report
    assert any("patch_embed.proj.weight resampled" in n for n in report.notes)
    assert any("pos_embed resampled from 4x4 to 3x3" in n for n in report.notes)
    torch.testing.assert_close(dst.patch_embed.proj.weight, resample_patch_embed(state["patch_embed.proj.weight"], 12))
    torch.testing.assert_close(dst.pos_embed, resample_abs_pos_embed(state["pos_embed"], (3, 3), (4, 4)))
    # the same as set_input_size on the source model
    src.set_input_size(img_size=36, patch_size=12)
    x = torch.randn(1, 3, 36, 36)
    with torch.no_grad():
        torch.testing.assert_close(dst.eval()(x), src(x))


def test_load_non_square_grid_from_kernel_and_image_size():
    """A 4x8 table (not a square count) is read with the model's image size over the checkpoint's kernel."""
    src = _small(img_size=(32, 64), no_embed_class=True)
    dst = VisionTransformer(img_size=(32, 64), patch_size=16, embed_dim=32, depth=2, num_heads=2, num_classes=10,
                            no_embed_class=True)
    report = load_weights(dst, src.state_dict())
    assert report.ok and any("pos_embed resampled from 4x8 to 2x4" in n for n in report.notes), report
