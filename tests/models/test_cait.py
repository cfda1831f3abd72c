"""CaiT backbones (models/cait.py): names, shapes, intermediates, other input sizes, stages' data flow."""

import pytest
import torch

from vit_attention import create_model
from vit_attention.attention.class_attn import ClassAttention
from vit_attention.attention.talking_heads import TalkingHeadsAttention
from vit_attention.layers import LayerScale
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.cait import Cait, CaitConfig

SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=4, num_classes=7, init_values=0.2)
NAMES = ["cait_xxs24_224", "cait_xxs24_384", "cait_xxs36_224", "cait_xxs36_384", "cait_xs24_384", "cait_s24_224",
         "cait_s24_384", "cait_s36_384", "cait_m36_384", "cait_m48_448"]


def _small(**kw) -> Cait:
    torch.manual_seed(0)
    model = Cait(CaitConfig(**{**SMALL, **kw})).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("gamma"):
                p.uniform_(0.1, 0.5)  # LayerScale away from its init, so both branches count
    return model


def test_registered_names_and_presets():
    assert set(list_models("cait*")) == set(NAMES)
    for name in NAMES:
        p = get_model_entry(name).preset
        assert p["init_values"] == (1e-6 if name.split("_")[1] in ("s36", "m36", "m48") else 1e-5), name
        assert str(p["img_size"]) == name.rsplit("_", 1)[1]
        meta = get_model_entry(name).meta
        assert meta["published_params_m"] > 0 and meta["published_gmacs"] > 0 and meta["published_gmacs_source"]


def test_structure_on_meta():
    with torch.device("meta"):
        m = create_model("cait_s24_224")
    assert len(m.blocks) == 24 and len(m.blocks_token_only) == 2
    assert all(isinstance(b.attn, TalkingHeadsAttention) and isinstance(b.ls1, LayerScale) for b in m.blocks)
    assert all(isinstance(b.attn, ClassAttention) for b in m.blocks_token_only)
    assert m.pos_embed.shape == (1, 196, 384) and m.cls_token.shape == (1, 1, 384)  # no class slot
    assert m.num_features == 384 and m.cfg.norm_eps == 1e-6
    assert [f["module"] for f in m.feature_info][:2] == ["blocks.0", "blocks.1"]
    assert {f["reduction"] for f in m.feature_info} == {16}


def test_forward_shapes_and_head():
    m = _small()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = m.forward_features(x)
        assert feats.shape == (2, 17, 32)  # class token + 4x4 patches
        assert m.forward_head(feats, pre_logits=True).shape == (2, 32)
        torch.testing.assert_close(m(x), m.head(feats[:, 0]))
        m.reset_classifier(0, "avg")
        torch.testing.assert_close(m(x), feats[:, 1:].mean(1))
        m.reset_classifier(5, "token")
        assert m(x).shape == (2, 5) and m.cfg.num_classes == 5
    with pytest.raises(ValueError, match="global_pool"):
        m.reset_classifier(3, "map")


def test_class_attention_stage_updates_the_class_token_only():
    """The patch tokens leave the SA stage and reach the final norm unchanged; the class token alone moves."""
    m = _small()
    x = torch.randn(2, 3, 32, 32)
    seen = {}
    m.blocks[-1].register_forward_hook(lambda mod, i, o: seen.update(patches=o))
    with torch.no_grad():
        feats = m.forward_features(x)
    torch.testing.assert_close(feats[:, 1:], m.norm(seen["patches"]))
    with torch.no_grad():  # the class token depends on every patch: change one patch token's input
        cls = m.forward_cls(seen["patches"])[:, 0]
        p2 = seen["patches"].clone()
        p2[:, 5] += torch.randn(32)  # not a constant shift: norm1 would remove that
        assert (m.forward_cls(p2)[:, 0] - cls).abs().max() > 1e-4
        assert torch.equal(m.forward_cls(p2)[:, 1:], p2)


def test_forward_intermediates_are_sa_block_tokens():
    m = _small()
    x = torch.randn(2, 3, 32, 32)
    outs = {}
    for i, b in enumerate(m.blocks):
        b.register_forward_hook(lambda mod, inp, o, i=i: outs.update({i: o}))
    with torch.no_grad():
        final, inter = m.forward_intermediates(x)
        torch.testing.assert_close(final, m.forward_features(x))
        assert len(inter) == 3 and inter[0].shape == (2, 32, 4, 4)
        torch.testing.assert_close(inter[1], outs[1].transpose(1, 2).reshape(2, 32, 4, 4))
        nlc = m.forward_intermediates(x, indices=[-1], output_fmt="NLC", norm=True, intermediates_only=True)
        torch.testing.assert_close(nlc[0], m.norm(outs[2]))
        assert len(m.forward_intermediates(x, indices=2, intermediates_only=True)) == 2
    with pytest.raises(ValueError, match="output_fmt"):
        m.forward_intermediates(x, output_fmt="NHWC")


def test_features_only():
    m = create_model("cait_xxs24_224", img_size=32, patch_size=8, embed_dim=32, num_heads=2, depth=4,
                     features_only=True, out_indices=(1, 3)).eval()
    with torch.no_grad():
        maps = m(torch.randn(1, 3, 32, 32))
    assert [t.shape for t in maps] == [(1, 32, 4, 4)] * 2


def test_other_input_size_resamples_the_position_embedding():
    m = _small(dynamic_img_size=True)
    with torch.no_grad():
        assert m(torch.randn(2, 3, 48, 40)).shape == (2, 7)
        assert m.forward_features(torch.randn(1, 3, 48, 40)).shape == (1, 1 + 6 * 5, 32)
    fixed = _small()
    with pytest.raises(ValueError, match="dynamic_img_size=True"):
        fixed(torch.randn(1, 3, 48, 48))


def test_grad_checkpointing_matches():
    m = _small().train()
    x = torch.randn(2, 3, 32, 32)
    m(x).sum().backward()
    g = m.blocks[0].attn.proj_l.weight.grad.clone()
    m.zero_grad()
    m.set_grad_checkpointing()
    m(x).sum().backward()
    torch.testing.assert_close(m.blocks[0].attn.proj_l.weight.grad, g)
    assert m.cls_token.grad is not None and m.cls_token.grad.abs().sum() > 0


@pytest.mark.parametrize("field,value,match", [("embed_dim", 30, "divisible by num_heads"),
                                               ("img_size", 30, "not divisible by patch_size"),
                                               ("global_pool", "map", "global_pool"),
                                               ("token_attn_layer", "window", "token_attn_layer"),
                                               ("depth_token_only", -1, "depth_token_only")])
def test_config_errors_name_the_field(field, value, match):
    with pytest.raises((ValueError, TypeError, KeyError), match=match):
        CaitConfig(**{**SMALL, field: value})


def test_attention_maps_land_on_the_patch_grid():
    """Talking-heads maps are patch x patch on the 4x4 grid; class attention: the class token over the grid."""
    from vit_attention.analysis.attention_maps import record_attention

    m = _small()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), record_attention(m) as rec:
        out = m(x)
    torch.testing.assert_close(out, m(x))  # recording changes no number
    sa = [r for r in rec.records if r.module.startswith("blocks.")]
    ca = [r for r in rec.records if r.module.startswith("blocks_token_only.")]
    assert len(sa) == 3 and len(ca) == 2
    assert sa[0].grid == (4, 4) and sa[0].weights.shape == (2, 4, 16, 16) and sa[0].is_self_attention
    r = ca[1]
    assert r.grid == (4, 4) and r.weights.shape == (2, 4, 1, 17)
    cls_map = r.query_map("cls")  # [B, H, W]: where the class token looks, mean over heads
    assert cls_map.shape == (2, 4, 4)
    w = r.weights.mean(1)[:, 0]  # [B, 17]: key 0 is the class token itself, then the 16 patches
    torch.testing.assert_close(cls_map.flatten(1), w[:, 1:])
    torch.testing.assert_close(cls_map.flatten(1).sum(1) + w[:, 0], torch.ones(2))
