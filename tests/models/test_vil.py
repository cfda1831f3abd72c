"""ViL models: structure of the presets (the original arch strings), globals per stage, the heads,
features, other input sizes and the attention mechanism swap."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_model
from vit_attention.attention.longformer2d import Longformer2DAttention
from vit_attention.attention.mhsa import MultiHeadSelfAttention
from vit_attention.models.vil import VilConfig, VisionLongformer

SMALL = dict(img_size=64, embed_dims=(16, 32, 32, 32), depths=(1, 2, 1, 1), num_heads=(2, 2, 2, 2),
             window_sizes=(3, 3, 7, 7), num_classes=10)


def test_presets_follow_the_original_arch_strings():
    with torch.device("meta"):
        tiny = create_model("vil_tiny")
        base = create_model("vil_base_wide")
    assert tiny.cfg.embed_dims == (48, 96, 192, 384) and tiny.cfg.depths == (1, 1, 9, 1)
    assert [len(s.blocks) for s in tiny.stages] == [1, 1, 9, 1]
    assert isinstance(tiny.stages[0].blocks[0].attn, Longformer2DAttention)
    assert isinstance(tiny.stages[2].blocks[0].attn, MultiHeadSelfAttention)  # s0: full attention
    assert tiny.stages[1].blocks[0].attn.window_size == 7 and tiny.stages[3].downsample.cls_token is None
    assert base.cfg.img_size == 384 and base.stages[0].blocks[0].attn.window_size == 8
    assert base.stages[0].downsample.x_pos_embed.shape == (1, 96, 96)  # 384 / 4 rows, C/2 = 96


def test_forward_features_and_intermediates():
    model = VisionLongformer(VilConfig(**SMALL)).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        logits = model(x)
        feats = model.forward_features(x)
        final, maps = model.forward_intermediates(x)
    assert logits.shape == (2, 10) and feats.shape == (2, 4, 32)  # last stage: 2x2 map, no global token
    torch.testing.assert_close(model.forward_head(feats), logits)
    torch.testing.assert_close(final, feats)
    assert [tuple(m.shape) for m in maps] == [(2, 16, 16, 16), (2, 32, 8, 8), (2, 32, 4, 4), (2, 32, 2, 2)]
    assert [f["reduction"] for f in model.feature_info] == [4, 8, 16, 32]


def test_token_pool_reads_the_last_global():
    model = VisionLongformer(VilConfig(**SMALL, num_global_tokens=(1, 1, 1, 2), global_pool="token")).eval()
    with torch.no_grad():
        feats = model.forward_features(torch.randn(1, 3, 64, 64))
        assert feats.shape == (1, 6, 32)
        torch.testing.assert_close(model.forward_head(feats, pre_logits=True), feats[:, 0])
    with pytest.raises(ValueError, match="global_pool='token'"):
        VilConfig(**SMALL, global_pool="token")


def test_other_input_size_resamples_the_row_and_column_tables():
    model = VisionLongformer(VilConfig(**SMALL)).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 96, 64)).shape == (1, 10)


def test_attn_layer_swaps_the_longformer_stages_only():
    model = VisionLongformer(VilConfig(**SMALL, attn_layer="mhsa"))
    assert all(isinstance(s.blocks[0].attn, MultiHeadSelfAttention) for s in model.stages)
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 10)


@pytest.mark.parametrize(("bad", "match"), [
    (dict(sparse=(True, True)), "sparse"),
    (dict(embed_dims=(15, 32, 32, 32), num_heads=(1, 2, 2, 2)), "even"),
    (dict(img_size=60), "total stride"),
    (dict(num_global_tokens=(1, 1, -1, 0)), "num_global_tokens"),
])
def test_config_errors_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        VilConfig(**{**SMALL, **bad})
