"""NaFlexViT (models/naflexvit.py, weights/naflexvit.py): presets, parity with timm's NaFlexVit (committed
fixtures: a standard tensor and a padded batch of a 3x5 and a 6x2 image), with Hugging Face
``Siglip2VisionModel`` live on a padded batch, and a list of images equal to each image alone."""

from __future__ import annotations

import pytest
import torch
from fixture_utils import add_noise, assert_fixture_parity, assert_parity, load_fixture
from transformers import Siglip2VisionConfig, Siglip2VisionModel

from vit_attention import create_model
from vit_attention.attention import AttentionCall
from vit_attention.layers import Block
from vit_attention.models import list_models
from vit_attention.models.naflexvit import NaFlexVit, NaFlexVitConfig, patchify_images, split_features
from vit_attention.weights import load_weights

CASES = ["timm_naflexvit_map", "timm_naflexvit_gap", "timm_naflexvit_parfac", "timm_naflexvit_siglip"]
NAMES = ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_par_gap", "naflexvit_base_patch16_parfac_gap",
         "naflexvit_base_patch16_map", "naflexvit_base_patch16_siglip", "naflexvit_so400m_patch16_siglip"]
TINY = dict(embed_dim=32, num_heads=2, depth=2, patch_size=8, img_size=(16, 24), pos_embed_grid_size=(4, 4))


def _ours_from_timm(cfg: dict) -> NaFlexVit:
    """Our model for a timm ``NaFlexVit`` fixture config."""
    kw = {k: v for k, v in cfg.items() if k not in ("act_layer", "pos_embed")}
    kw["act"] = cfg.get("act_layer", "gelu")
    kw["img_size"] = tuple(cfg["img_size"])
    kw["pos_embed_grid_size"] = tuple(cfg["pos_embed_grid_size"])
    kw["pos_embed_factorized"] = cfg.get("pos_embed") == "factorized"
    kw.setdefault("global_pool", "map")
    return NaFlexVit(NaFlexVitConfig(**kw)).eval()


def _timm_fixture_model(case: str) -> tuple[NaFlexVit, dict]:
    """Our model of a timm fixture with its weights (timm's keys are ours, one to one) -> (model, tensors)."""
    state, t, cfg = load_fixture(case)
    model = _ours_from_timm(cfg)
    model.load_state_dict(state, strict=True)
    return model, t


def _tiny(**over) -> NaFlexVit:
    torch.manual_seed(0)
    model = NaFlexVit(NaFlexVitConfig(**{**TINY, "num_classes": 5, **over})).eval()
    add_noise(model, 0.05)
    return model


# ---------------------------------------------------------------- presets
def test_registered_presets():
    assert set(NAMES) <= set(list_models("naflexvit*"))


@pytest.mark.registry
@pytest.mark.parametrize("name", ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_parfac_gap",
                                  "naflexvit_base_patch16_map", "naflexvit_base_patch16_siglip",
                                  "naflexvit_so400m_patch16_siglip"])
def test_params_on_meta_equal_timm(name):
    """timm 1.0.31 counts, to the thousand."""
    published = {"naflexvit_base_patch16_gap": 86.634, "naflexvit_base_patch16_parfac_gap": 86.462,
                 "naflexvit_base_patch16_map": 93.719, "naflexvit_base_patch16_siglip": 92.930,
                 "naflexvit_so400m_patch16_siglip": 427.888}[name]
    with torch.device("meta"):
        model = create_model(name)
    n = sum(p.numel() for p in model.parameters()) / 1e6
    assert abs(n - published) < 5e-4, (name, n)


def test_timm_key_layout():
    keys = set(_tiny(reg_tokens=2, class_token=True).state_dict())
    assert {"embeds.proj.weight", "embeds.pos_embed", "embeds.cls_token", "embeds.reg_token"} <= keys
    assert not any(k.startswith(("patch_embed.", "pos_embed", "cls_token")) for k in keys)
    fac = _tiny(pos_embed_factorized=True).state_dict()
    assert fac["embeds.pos_embed_y"].shape == (1, 4, 32) and fac["embeds.pos_embed_x"].shape == (1, 4, 32)


# ---------------------------------------------------------------- parity with timm (fixtures)
@pytest.mark.parity
@pytest.mark.parametrize("case", CASES)
def test_timm_standard_tensor(case):
    model, t = _timm_fixture_model(case)
    assert_fixture_parity(model, t)


@pytest.mark.parity
@pytest.mark.parametrize("case", CASES)
def test_timm_packed_batch(case):
    """Valid tokens and pooled outputs equal timm's (padding rows differ: timm's symmetric mask)."""
    model, t = _timm_fixture_model(case)
    batch = {"patches": t["packed_patches"], "patch_coord": t["packed_coord"], "patch_valid": t["packed_valid"]}
    P = model.num_prefix_tokens
    with torch.no_grad():
        feats = model.forward_features(batch)
        keep = torch.cat([torch.ones(2, P, dtype=torch.bool), batch["patch_valid"]], dim=1)
        assert_parity(feats["patches"][keep], t["packed_features"][keep])
        assert_parity(model.forward_head(feats, pre_logits=True), t["packed_pre_logits"])
        assert_parity(model(batch), t["packed_output"])
        # keywords, as timm's forward_features(patches, patch_coord=, patch_valid=)
        kw = model.forward_features(batch["patches"], patch_coord=batch["patch_coord"],
                                    patch_valid=batch["patch_valid"])
        assert_parity(model.forward_head(kw), t["packed_output"])


def test_timm_vit_checkpoint_converts():
    """A classic timm ViT layout (conv kernel, [1, N, C] table) converts to the NaFlex layout."""
    model = _tiny(reg_tokens=1)
    sd = model.state_dict()
    O = sd["embeds.proj.weight"].shape[0]
    classic = {k: v for k, v in sd.items() if not k.startswith("embeds.")}
    classic["patch_embed.proj.weight"] = sd["embeds.proj.weight"].reshape(O, 8, 8, 3).permute(0, 3, 1, 2)
    classic["patch_embed.proj.bias"] = sd["embeds.proj.bias"]
    classic["pos_embed"] = sd["embeds.pos_embed"].reshape(1, 16, 32)
    classic["reg_token"] = sd["embeds.reg_token"]
    fresh = _tiny(reg_tokens=1)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    load_weights(fresh, classic)
    x = torch.randn(2, 3, 24, 16)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


# ---------------------------------------------------------------- list of images == each alone
@pytest.mark.parametrize("over", [dict(global_pool="map", reg_tokens=1), dict(global_pool="avg", class_token=True),
                                  dict(global_pool="avg", pos_embed_factorized=True, pos_embed_ar_preserving=True),
                                  dict(global_pool="token", class_token=True, reg_tokens=2)])
def test_list_of_images_equals_each_alone(over):
    model = _tiny(**over)
    g = torch.Generator().manual_seed(0)
    imgs = [torch.randn(3, 24, 40, generator=g), torch.randn(3, 48, 16, generator=g),
            torch.randn(3, 16, 24, generator=g)]
    with torch.no_grad():
        batched = model(imgs)
        feats = split_features(model.forward_features(imgs), model.num_prefix_tokens)
        for i, img in enumerate(imgs):
            alone = model(img[None])
            assert_parity(batched[i:i + 1], alone)
            alone_tokens = model.forward_features(img[None])[0]
            assert feats[i].shape == alone_tokens.shape
            assert_parity(feats[i], alone_tokens)


def test_padding_content_does_not_leak():
    """Garbage in the padding rows changes no valid token and no pooled output (mask on every block)."""
    model = _tiny(global_pool="map", reg_tokens=1)
    batch = patchify_images([torch.randn(3, 24, 40), torch.randn(3, 48, 16)], 8, max_seq_len=20)
    noisy = dict(batch, patches=torch.where(batch["patch_valid"][..., None], batch["patches"],
                                            100 * torch.randn_like(batch["patches"])))
    with torch.no_grad():
        a, b = model.forward_features(batch), model.forward_features(noisy)
        keep = torch.cat([torch.ones(2, 1, dtype=torch.bool), batch["patch_valid"]], dim=1)
        assert torch.allclose(a["patches"][keep], b["patches"][keep], atol=1e-5)
        assert torch.allclose(model.forward_head(a), model.forward_head(b), atol=1e-5)
        # without the mask the padding does leak: the test can fail
        x = model.embeds.forward_packed(noisy["patches"], noisy["patch_coord"], noisy["patch_valid"])
        unmasked = model.norm(model.blocks(x))
        assert not torch.allclose(unmasked[keep], a["patches"][keep], atol=1e-3)


def test_fused_and_explicit_attention_agree_with_mask():
    from vit_attention.functional.runtime import FUSED_ATTENTION
    model = _tiny(global_pool="avg", reg_tokens=1)
    imgs = [torch.randn(3, 24, 40), torch.randn(3, 48, 16)]
    with torch.no_grad():
        with FUSED_ATTENTION.override(True):
            a = model(imgs)
        with FUSED_ATTENTION.override(False):
            b = model(imgs)
    assert_parity(a, b)


def test_block_without_mask_unchanged_and_mask_changes_output():
    torch.manual_seed(0)
    blk = Block(32, 2).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        ref = blk(x, None, 1)
        assert torch.equal(blk(x, None, 1, mask=None), ref)
        assert torch.equal(blk(x, None, 1, mask=torch.ones(2, 1, 1, 7, dtype=torch.bool)), ref)
        mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
        mask[:, ..., 5:] = False
        assert not torch.allclose(blk(x, None, 1, mask=mask), ref)
        blk.train()
        assert torch.allclose(blk(x, None, 1, mask=mask), blk.eval()(x, None, 1, mask=mask))


def test_packed_input_errors():
    model = _tiny()
    batch = patchify_images([torch.randn(3, 16, 16)], 8)
    with pytest.raises(ValueError, match="patch_valid"):
        model({"patches": batch["patches"], "patch_coord": batch["patch_coord"]})
    with pytest.raises(ValueError, match="multiple of the patch"):
        model([torch.randn(3, 20, 16)])


def test_grad_checkpointing_packed_matches():
    model = _tiny(global_pool="map", reg_tokens=1).train()
    imgs = [torch.randn(3, 24, 40), torch.randn(3, 48, 16)]
    torch.manual_seed(1)
    a = model(imgs)
    model.set_grad_checkpointing(True)
    b = model(imgs)
    assert torch.allclose(a, b, atol=1e-6)
    b.sum().backward()
    assert model.embeds.pos_embed.grad is not None and model.embeds.pos_embed.grad.abs().sum() > 0


def test_set_input_size_patch_resamples_linear_kernel():
    """A new patch size resamples embeds.proj (FlexiViT pinv on the (ph, pw, C) kernel): each 8x8 patch
    upsampled to 16x16 gives the same embedding; the model then runs at 16 px patches."""
    model = _tiny(global_pool="avg")
    patches = torch.randn(6, 3, 8, 8)
    flat = patches.permute(0, 2, 3, 1).reshape(6, -1)  # (ph, pw, C)
    up = torch.nn.functional.interpolate(patches, size=(16, 16), mode="bicubic", antialias=True,
                                         align_corners=False).permute(0, 2, 3, 1).reshape(6, -1)
    with torch.no_grad():
        ref = model.embeds.proj(flat)
        model.set_input_size(patch_size=16, img_size=(32, 48))
        out = model.embeds.proj(up)
        assert model(torch.randn(1, 3, 32, 48)).shape == (1, 5)
    assert model.patch_size == (16, 16) and model.embeds.proj.weight.shape == (32, 16 * 16 * 3)
    assert model.grid_size == (2, 3) and model.cfg.img_size == (32, 48)
    assert_parity(out, ref, rel=1e-4)


# ---------------------------------------------------------------- parity with Hugging Face Siglip2 (live)
@pytest.mark.parity
def test_hf_siglip2_padded_batch():
    """transformers Siglip2VisionModel's input: pixel_values [B, L, p·p·C], pixel_attention_mask, spatial_shapes;
    tanh GELU, bilinear + antialias table resize; key-only masks. Valid tokens (post_layernorm) and the MAP output
    agree."""
    torch.manual_seed(0)
    hf_cfg = Siglip2VisionConfig(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                 patch_size=8, num_patches=16, num_channels=3)
    hf = Siglip2VisionModel(hf_cfg).eval()
    add_noise(hf, 0.05)
    ours = create_model("naflexvit_base_patch16_siglip", embed_dim=32, num_heads=2, depth=2, patch_size=8,
                        pos_embed_grid_size=(4, 4), img_size=32).eval()
    report = load_weights(ours, hf.state_dict())
    assert not report.missing and not report.unexpected
    imgs = [torch.randn(3, 24, 40), torch.randn(3, 48, 16)]
    batch = patchify_images(imgs, 8, max_seq_len=18)
    with torch.no_grad():
        out = hf(pixel_values=batch["patches"], pixel_attention_mask=batch["patch_valid"].long(),
                 spatial_shapes=torch.tensor([[3, 5], [6, 2]]))
        feats = ours.forward_features(batch)
        valid = batch["patch_valid"]
        assert_parity(feats["patches"][valid], out.last_hidden_state[valid])
        assert_parity(ours.forward_head(feats, pre_logits=True), out.pooler_output)
        assert_parity(ours(imgs), out.pooler_output)


# ---------------------------------------------------------------- RoPE on a packed batch
@pytest.mark.parametrize("kind,kw", [("axial", dict(convention="dinov3")), ("axial", dict(convention="naver")),
                                     ("mixed", {})])
def test_rope_per_sample_coords_equal_each_grid_alone(kind, kw):
    """RotaryEmbedding(coords=, valid=): each sample rotated on its own grid, padding rows unrotated."""
    from vit_attention.attention.rope import RotaryEmbedding
    from vit_attention.models.naflexvit import grid_coords
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 2, kind, **kw)
    grids, L, P = [(3, 5), (6, 2)], 16, 1
    coords = torch.zeros(2, L, 2, dtype=torch.long)
    valid = torch.zeros(2, L, dtype=torch.bool)
    for b, g in enumerate(grids):
        coords[b, :g[0] * g[1]] = grid_coords(g)
        valid[b, :g[0] * g[1]] = True
    q, k = torch.randn(2, 2, P + L, 16), torch.randn(2, 2, P + L, 16)
    rq, rk = rope(q, k, None, P, coords=coords, valid=valid)
    for b, (h, w) in enumerate(grids):
        n = P + h * w
        aq, ak = rope(q[b:b + 1, :, :n], k[b:b + 1, :, :n], (h, w), P)
        assert torch.allclose(rq[b:b + 1, :, :n], aq, atol=1e-6) and torch.allclose(rk[b:b + 1, :, :n], ak, atol=1e-6)
        assert torch.equal(rq[b, :, n:], q[b, :, n:])  # padding: identity
    assert not torch.allclose(rq[:, :, P:], q[:, :, P:])


@pytest.mark.parametrize("rope,kw", [("axial", dict(convention="dinov3")), ("mixed", {})])
@pytest.mark.parametrize("pool", ["avg", "map"])
def test_rope_model_list_equals_each_alone_and_packed_equals_list(rope, kw, pool):
    """NaFlexVit(rope=): the list form rotates each image on its own grid (per-sample coords through the
    blocks), so every image's logits and valid tokens equal that image run alone; the packed form (padded
    further, to 20 rows) equals the list form; the standard tensor form equals a list of one."""
    model = _tiny(rope=rope, rope_kwargs=kw, global_pool=pool, reg_tokens=1)
    imgs = [torch.randn(3, 24, 40), torch.randn(3, 48, 16)]  # grids 3x5 and 6x2
    with torch.no_grad():
        logits = model(imgs)
        feats = split_features(model.forward_features(imgs), model.num_prefix_tokens)
        for i, img in enumerate(imgs):
            alone = model(img[None])  # the standard tensor form: RoPE from feat_size
            assert (logits[i] - alone[0]).abs().max() <= 1e-5 * alone.abs().max()
            tok = model.forward_features(img[None])[0]  # [P + h·w, C]
            assert (feats[i] - tok).abs().max() <= 1e-5 * tok.abs().max()
        packed = patchify_images(imgs, 8, max_seq_len=20)
        assert (model(packed) - logits).abs().max() <= 1e-5 * logits.abs().max()
        pf = model.forward_features(packed["patches"], patch_coord=packed["patch_coord"],
                                    patch_valid=packed["patch_valid"])
        for a, b in zip(split_features(pf, model.num_prefix_tokens), feats):
            assert (a - b).abs().max() <= 1e-5 * b.abs().max()
    model.train().set_grad_checkpointing(True)  # the checkpointed path passes the coordinates too
    model(imgs).sum().backward()
    assert model.blocks[0].attn.qkv.weight.grad is not None


def test_rope_coords_refused_without_rope():
    """rope_coords / rope_valid reach only a mechanism with a rotary embedding; others raise naming them."""
    blk = Block(32, 2)  # mhsa without rope
    x, coords = torch.randn(1, 7, 32), torch.zeros(1, 6, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="rope_coords"):
        blk(x, (2, 3), 1, rope_coords=coords)
    with pytest.raises(ValueError, match="rope_coords"):
        blk.attn(x, AttentionCall(rope_coords=coords))
    with pytest.raises(ValueError, match="rope_coords"):  # a mechanism with no rotary embedding at all
        Block(32, 2, attn_layer="talking_heads")(x, (2, 3), 1, rope_coords=coords)
    roped = Block(32, 2, attn_kwargs=dict(rope="axial")).eval()
    full = torch.stack(torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij"), -1).reshape(1, 6, 2)
    assert torch.allclose(roped(x, (2, 3), 1, rope_coords=full), roped(x, (2, 3), 1), atol=1e-6)
