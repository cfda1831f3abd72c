"""Register tokens (Darcet et al. 2024) in the analysis: left out of every map, pool and feature grid, and
shown on their own as the share of the patches' attention they take."""

from __future__ import annotations

import torch

from vit_attention.analysis.attention_maps import record_attention
from vit_attention.analysis.commands import attention_heatmap
from vit_attention.models.vit import VisionTransformer


def _model(**kw: object) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(embed_dim=32, num_heads=2, depth=2, img_size=24, patch_size=8, reg_tokens=3,
                             no_embed_class=True, dynamic_img_size=True, num_classes=5, **kw).eval()


def test_prefix_share_is_the_patches_attention_on_each_prefix_token() -> None:
    model = _model()
    with torch.no_grad():
        model.reg_token.normal_(0, 3.0)  # registers that differ, so their shares differ
    x = torch.randn(2, 3, 16, 40)  # a 2x5 grid
    with record_attention(model) as rec, torch.no_grad():
        model(x)
    r = rec.layer(-1)
    share = r.prefix_share()  # [B, 1 + 3]
    w = r.weights.mean(dim=1)  # [B, N, N], N = 4 + 10
    manual = w[:, 4:, :4].mean(dim=1)  # grid queries' weight on each prefix key
    torch.testing.assert_close(share, manual)
    assert share.shape == (2, 4) and not torch.allclose(share[:, 1], share[:, 2])
    # what the grid queries do not give the prefix they give the grid
    torch.testing.assert_close(share.sum(-1) + w[:, 4:, 4:].sum(-1).mean(-1), torch.ones(2))
    # the class token's map covers the grid only: its weight on registers is left out
    cls_map = r.query_map("cls")
    assert cls_map.shape == (2, 2, 5)
    torch.testing.assert_close(cls_map.sum(dim=(1, 2)), w[:, 0, 4:].sum(-1))


def test_attn_description_has_a_register_row_and_the_map_excludes_registers() -> None:
    model = _model()
    x = torch.randn(1, 3, 24, 24)
    heat, what, tag = attention_heatmap(model, x, method="layer")
    assert heat.shape == (3, 3) and tag == "layer-1"
    assert "registers (not in the map) take" in what and "reg2" in what and "reg3" not in what
    _, plain, _ = attention_heatmap(VisionTransformer(embed_dim=32, num_heads=2, depth=1, img_size=24,
                                                      patch_size=8).eval(), x, method="layer")
    assert "registers" not in plain


def test_registers_are_left_out_of_pooling_and_features() -> None:
    model = _model(global_pool="avg")
    x = torch.randn(2, 3, 24, 16)
    with torch.no_grad():
        feats = model.forward_features(x)  # [B, 1 + 3 + 6, C]
        assert feats.shape == (2, 4 + 6, 32)
        torch.testing.assert_close(model.pool(feats), feats[:, 4:].mean(dim=1))
        model.reg_token.add_(100.0)  # registers change the patches through attention, never the pool directly
        grids = model.forward_intermediates(x, intermediates_only=True)
        assert all(g.shape == (2, 32, 3, 2) for g in grids)
        pairs = model.forward_intermediates(x, return_prefix_tokens=True, intermediates_only=True)
        assert all(p.shape == (2, 4, 32) for _, p in pairs)
    assert "reg_token" in model.no_weight_decay()


def test_attention_pooling_sees_the_grid_tokens_only() -> None:
    """MAP pooling (SigLIP's head) over the grid tokens, class and registers left out (timm's default)."""
    model = _model(global_pool="map", class_token=True)
    x = torch.randn(2, 3, 16, 24)
    with torch.no_grad():
        feats = model.forward_features(x)
        pooled = model.forward_head(feats, pre_logits=True)
        torch.testing.assert_close(pooled, model.attn_pool(feats[:, 4:]))
        assert not torch.allclose(pooled, model.attn_pool(feats), atol=1e-4)
