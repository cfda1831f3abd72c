"""XCiT (models/xcit.py): presets and parameters against timm 1.0.31, parity with timm's Xcit (committed fixtures
made by tests/fixtures/make_fixtures_xcit.py) at the fixture size and at a size no patch divides, the Fourier
encoding and the class-attention residual rule written out, published GMACs, token merging refused."""

import math

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_loads, assert_parity, load_fixture, meta_model_with_timm_params

from vit_attention import create_model
from vit_attention.analysis.flops import flops
from vit_attention.attention.class_attn import ClassAttention
from vit_attention.attention.xca import CrossCovarianceAttention
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.pretrained_tags import expand
from vit_attention.models.xcit import (
    PRETRAINED,
    ConvPatchEmbed,
    LPIBranch,
    Xcit,
    XcitClassAttentionBlock,
    XcitConfig,
    fourier_features,
)

pytestmark = pytest.mark.parity

# timm 1.0.31 on the meta device: exact parameter counts (1000 classes); a _384 name is its _224 architecture
_PARAMS = {"nano_12_p16": 3_053_224, "tiny_12_p16": 6_716_272, "tiny_24_p16": 12_116_896,
           "small_12_p16": 26_253_304, "small_24_p16": 47_671_384, "medium_24_p16": 84_395_752,
           "large_24_p16": 189_096_136, "nano_12_p8": 3_049_016, "tiny_12_p8": 6_706_504, "tiny_24_p8": 12_107_128,
           "small_12_p8": 26_213_032, "small_24_p8": 47_631_112, "medium_24_p8": 84_323_624,
           "large_24_p8": 188_932_648}
TIMM_PARAMS = {f"xcit_{k}_{img}": v for k, v in _PARAMS.items() for img in (224, 384)}

# the fixtures' reduced timm Xcit (tests/fixtures/make_fixtures_xcit.py)
P16 = dict(img_size=(48, 64), patch_size=16, embed_dim=32, depth=2, num_heads=4, num_classes=10, eta=1.0,
           tokens_norm=True)
P8 = dict(img_size=(32, 24), patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10, eta=1e-5,
          tokens_norm=False)


def _fixture_model(name: str = "timm_xcit", over: dict = P16) -> tuple[Xcit, dict]:
    state, t, cfg = load_fixture(name)
    assert {k: cfg[k] for k in over} == {k: list(v) if isinstance(v, tuple) else v for k, v in over.items()}
    model = create_model("xcit_nano_12_p16_224", **over).eval()
    assert_loads(model, state, "timm")
    return model, t


def test_registered_names_and_presets():
    assert set(list_models("xcit*")) == set(TIMM_PARAMS)
    for name in TIMM_PARAMS:
        e = get_model_entry(name)
        c, size = XcitConfig(**e.preset), name.split("_")[1]
        assert e.family == "xcit" and c.attn_layer == "xca" and c.img_size == int(name[-3:])
        assert c.patch_size == int(name.split("_p")[1].split("_")[0])
        assert c.eta == (1e-5 if "_24_" in name else 1.0) and c.tokens_norm == (size != "nano")
        assert c.cls_attn_layers == 2 and c.global_pool == "token" and c.qkv_bias is True
        assert e.meta["published_params_m"] == round(TIMM_PARAMS[name] / 1e6, 3) and e.meta["published_gmacs"] > 0


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameters_equal_timm_and_structure_on_meta(name):
    m = meta_model_with_timm_params(name, TIMM_PARAMS[name])
    C = m.embed_dim
    assert len(m.patch_embed.proj) == 2 * int(math.log2(m.cfg.patch_size)) - 1  # conv+BN stages, GELUs between
    assert all(isinstance(b.attn, CrossCovarianceAttention) and isinstance(b.pos2, LPIBranch) for b in m.blocks)
    assert all(isinstance(b, XcitClassAttentionBlock) and isinstance(b.attn, ClassAttention)
               for b in m.cls_attn_blocks)
    assert len(m.cls_attn_blocks) == 2 and m.cls_token.shape == (1, 1, C) and m.num_prefix_tokens == 1
    assert m.blocks[0].attn.temperature.shape == (m.cfg.num_heads, 1, 1) and m.blocks[0].norm1.eps == 1e-6
    assert {f["reduction"] for f in m.feature_info} == {m.cfg.patch_size}


@pytest.mark.parametrize("name", ["xcit_nano_12_p16_224", "xcit_small_12_p8_384"])
def test_gmacs_within_two_percent_of_timms_table(name):
    """timm's results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv: nano p16 0.56, small_12 p8 @384 54.92."""
    with torch.device("meta"):
        m = create_model(name).eval()
    img = m.cfg.img_size
    published = get_model_entry(name).meta["published_gmacs"]
    assert abs(flops(m, (1, 3, img, img)).gmacs - published) <= 0.02 * published


@pytest.mark.parametrize("fused", [True, False])
def test_timm_fixture_parity_patch16(fused):
    model, t = _fixture_model()
    assert model.feat_size((48, 64)) == (3, 4)
    assert_fixture_parity(model, t, fused=fused)


def test_timm_fixture_parity_at_a_size_no_patch_divides_and_intermediates():
    """40x72: the stem halves with ceil (3x5 grid) and the Fourier encoding follows the grid, as timm's."""
    model, t = _fixture_model()
    assert model.feat_size((40, 72)) == (3, 5)
    with torch.no_grad():
        assert_parity(model(t["input_other"]), t["output_other"])
        outs = model.forward_intermediates(t["input"], intermediates_only=True)
    assert len(outs) == 2
    for i, o in enumerate(outs):
        assert o.shape == (2, 32, 3, 4)
        assert_parity(o, t[f"intermediate_{i}"])


def test_timm_fixture_parity_patch8_class_token_norm_only():
    model, t = _fixture_model("timm_xcit_p8", P8)
    assert not model.cls_attn_blocks[0].tokens_norm and len(model.patch_embed.proj) == 5
    assert_fixture_parity(model, t)
    with torch.no_grad():
        assert_parity(model(t["input_other"]), t["output_other"])


def test_fourier_features_written_out():
    """Row features first, then column ones; sin for even k, cos for odd k, d_k = 10000^(2⌊k/2⌋/32)."""
    H, W = 3, 5
    f = fourier_features(H, W)
    assert f.shape == (H * W, 64)
    for i in range(H):
        for j in range(W):
            y, x = (i + 1) / (H + 1e-6) * 2 * math.pi, (j + 1) / (W + 1e-6) * 2 * math.pi
            for k in (0, 1, 6, 31):
                d = 10000 ** (2 * (k // 2) / 32)
                trig = math.sin if k % 2 == 0 else math.cos
                assert f[i * W + j, k].item() == pytest.approx(trig(y / d), abs=1e-5)
                assert f[i * W + j, 32 + k].item() == pytest.approx(trig(x / d), abs=1e-5)


@pytest.mark.parametrize("tokens_norm", [True, False])
def test_class_attention_block_updates_the_patches_as_the_reference(tokens_norm):
    """Patches leave a class-attention block as 2·LN2(x + γ1·LN1(x)) (tokens_norm) or 2·(x + γ1·LN1(x)); the
    class token as x_cls + γ1·CA + γ2·MLP(...) (timm's ClassAttentionBlock)."""
    torch.manual_seed(0)
    blk = XcitClassAttentionBlock(16, 2, tokens_norm=tokens_norm).eval()
    with torch.no_grad():
        for p in blk.parameters():
            p.add_(0.2 * torch.randn_like(p))
        x = torch.randn(2, 1 + 6, 16)
        out = blk(x, (2, 3))
        u = blk.norm1(x)
        patches = x[:, 1:] + blk.ls1.gamma * u[:, 1:]
        patches = blk.norm2(patches) if tokens_norm else patches
        torch.testing.assert_close(out[:, 1:], 2 * patches, atol=1e-5, rtol=1e-5)
        q, k, v = (lin(t) for lin, t in ((blk.attn.q, u[:, :1]), (blk.attn.k, u), (blk.attn.v, u)))
        q, k, v = (t.view(2, -1, 2, 8).transpose(1, 2) for t in (q, k, v))
        a = blk.attn.proj(((q @ k.transpose(-2, -1) * 8 ** -0.5).softmax(-1) @ v).transpose(1, 2).reshape(2, 1, 16))
        cls = x[:, :1] + blk.ls1.gamma * a
        y = blk.norm2(cls)
        torch.testing.assert_close(out[:, :1], y + blk.ls2.gamma * blk.mlp(y), atol=1e-5, rtol=1e-5)


def test_any_size_runs_and_set_input_size_records_it():
    model, t = _fixture_model()
    with torch.no_grad():
        ref = model(t["input"])
        model.set_input_size((40, 72))  # nothing is resampled: the same weights, the nominal size recorded
        assert model.cfg.img_size == (40, 72)
        torch.testing.assert_close(model(t["input"]), ref)
        assert_parity(model(t["input_other"]), t["output_other"])


def test_token_merging_is_refused_with_the_reason():
    model, _ = _fixture_model()
    with pytest.raises(ValueError, match="XCA attends over channels"):
        model.set_token_merging(2)


def test_dist_tags_are_weights_of_the_same_single_head_model():
    """fb_dist_in1k: DeiT-style hard distillation through the one head; no distillation token, 1000 classes."""
    tags = expand(PRETRAINED)
    dist = [k for k in tags if k.endswith(".fb_dist_in1k")]
    assert len(dist) == 28 and len(tags) == 42  # every preset has dist weights; in1k ones only at 224
    assert all(tags[k]["num_classes"] == 1000 for k in dist)
    assert {k.split(".")[0] for k in tags} == set(TIMM_PARAMS)
    for key, cfg in tags.items():
        size = int(key.split(".")[0][-3:])
        assert cfg["input_size"] == (3, size, size) and cfg["crop_pct"] == 1.0
    with torch.device("meta"):
        m = create_model("xcit_small_12_p16_224")
    assert not any("dist" in n for n, _ in m.named_parameters()) and m.num_prefix_tokens == 1


def test_no_weight_decay_and_head_pooling():
    m = create_model("xcit_nano_12_p16_224", embed_dim=32, num_heads=2, depth=2, img_size=48).eval()
    nwd = m.no_weight_decay()
    assert "cls_token" in nwd and "blocks.0.attn.temperature" in nwd and "pos_embed.token_projection.weight" in nwd
    assert not any("qkv" in n for n in nwd)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        feats = m.forward_features(x)
        assert feats.shape == (2, 1 + 9, 32)
        torch.testing.assert_close(m(x), m.head(feats[:, 0]))
        m.reset_classifier(0, "avg")
        torch.testing.assert_close(m(x), feats[:, 1:].mean(1))


def test_bad_config_raises_naming_the_field():
    with pytest.raises(ValueError, match="patch_size"):
        create_model("xcit_nano_12_p16_224", patch_size=4)
    with pytest.raises(ValueError, match="embed_dim"):
        create_model("xcit_nano_12_p16_224", embed_dim=36, num_heads=4)  # the p16 stem needs C / 8
    with pytest.raises(ValueError, match="global_pool='token'"):
        create_model("xcit_nano_12_p16_224", cls_attn_layers=0)


def test_lpi_branch_written_out_and_its_refusals():
    """x + γ3 · dw3x3(BN(GELU(dw3x3(LN3 x)))) on the grid; prefix tokens pass unchanged; the grid is required."""
    torch.manual_seed(1)
    branch = LPIBranch(8, init_values=0.5).eval()
    with torch.no_grad():
        for p in branch.parameters():
            p.add_(0.2 * torch.randn_like(p))
        branch.lpi.bn.running_mean.normal_(0, 0.1)
        branch.lpi.bn.running_var.uniform_(0.5, 1.5)
        x = torch.randn(2, 1 + 12, 8)
        out = branch(x, (3, 4), 1)
        m = branch.norm(x[:, 1:]).transpose(1, 2).reshape(2, 8, 3, 4)
        m = torch.nn.functional.conv2d(m, branch.lpi.conv1.weight, branch.lpi.conv1.bias, padding=1, groups=8)
        m = torch.nn.functional.gelu(m)
        bn = branch.lpi.bn
        m = (m - bn.running_mean[:, None, None]) / (bn.running_var[:, None, None] + bn.eps).sqrt()
        m = m * bn.weight[:, None, None] + bn.bias[:, None, None]
        m = torch.nn.functional.conv2d(m, branch.lpi.conv2.weight, branch.lpi.conv2.bias, padding=1, groups=8)
        ref = x[:, 1:] + branch.ls.gamma * m.flatten(2).transpose(1, 2)
    torch.testing.assert_close(out[:, 1:], ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[:, :1], x[:, :1])
    with pytest.raises(ValueError, match="feat_size"):
        branch(x[:, 1:])
    with pytest.raises(ValueError, match="feat_size"):
        branch(x, (3, 5), 1)


def test_the_stem_refuses_another_patch_size_and_halves_with_ceil():
    with pytest.raises(ValueError, match="patch_size must be 8 or 16"):
        ConvPatchEmbed(4, 3, 32)
    stem = ConvPatchEmbed(8, 3, 32).eval()
    with torch.no_grad():
        tokens, grid = stem(torch.randn(1, 3, 17, 9))
    assert grid == (3, 2) and tokens.shape == (1, 6, 32)
