"""Twins PCPVT / SVT backbones (models/twins.py): structure, sizes, API. Parity: tests/weights/test_twins.py."""

import pytest
import torch

from vit_attention import create_model
from vit_attention.analysis.flops import flops
from vit_attention.attention import LocallyGroupedAttention
from vit_attention.attention.sra import SpatialReductionAttention
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.twins import Twins, TwinsConfig, TwinsPosConv

SMALL = dict(img_size=64, embed_dims=(8, 16, 16, 32), num_heads=(1, 2, 2, 2), mlp_ratios=(2, 2, 2, 2),
             depths=(2, 1, 2, 1), sr_ratios=(4, 2, 2, 1), num_classes=5)
NAMES = ["twins_pcpvt_small", "twins_pcpvt_base", "twins_pcpvt_large",
         "twins_svt_small", "twins_svt_base", "twins_svt_large"]


def test_registered():
    assert set(NAMES) == set(list_models("twins*"))


@pytest.mark.registry
@pytest.mark.parametrize("name", NAMES)
def test_params_and_gmacs_match_published_on_meta(name):
    meta = get_model_entry(name).meta
    with torch.device("meta"):
        model = create_model(name)
    n = sum(p.numel() for p in model.parameters()) / 1e6
    assert abs(n - meta["published_params_m"]) / meta["published_params_m"] < 0.002, (n, meta)
    g = flops(model, (1, 3, 224, 224)).gmacs
    assert abs(g - meta["published_gmacs"]) / meta["published_gmacs"] < 0.01, (g, meta)


def test_svt_alternates_lsa_and_gsa_and_pcpvt_is_gsa_everywhere():
    svt = Twins(**SMALL, wss=(4, 4, 4, 4))
    for stage, sr in zip(svt.stages, SMALL["sr_ratios"]):
        kinds = [type(b.attn) for b in stage.blocks]
        assert kinds == [LocallyGroupedAttention, SpatialReductionAttention][:len(kinds)]
        assert stage.blocks[0].attn.window_size == (4, 4)
        if len(kinds) > 1:
            assert stage.blocks[1].attn.sr_ratio == sr
        assert isinstance(stage.pos, TwinsPosConv) and stage.pos_index == 0  # PEG after the first block
    pcpvt = Twins(**SMALL)
    assert all(isinstance(b.attn, SpatialReductionAttention) for s in pcpvt.stages for b in s.blocks)


def test_norm_eps_and_patch_strides():
    m = Twins(**SMALL)
    assert m.norm.eps == 1e-6 and m.stages[0].blocks[0].norm1.eps == 1e-6
    assert m.stages[0].downsample.norm.eps == 1e-5 and m.stages[1].blocks[0].attn.norm.eps == 1e-5
    assert [s.downsample.proj.stride for s in m.stages] == [(4, 4), (2, 2), (2, 2), (2, 2)]
    assert [f["reduction"] for f in m.feature_info] == [4, 8, 16, 32]
    assert [f["num_chs"] for f in m.feature_info] == list(SMALL["embed_dims"])


@pytest.mark.parametrize("wss", [None, (4, 4, 4, 4)], ids=["pcpvt", "svt"])
def test_forward_head_intermediates_and_backward(wss):
    torch.manual_seed(0)
    m = Twins(**SMALL, wss=wss).eval()
    x = torch.randn(2, 3, 72, 80)  # any size: LSA pads, patch convs floor
    with torch.no_grad():
        feats = m.forward_features(x)
        assert feats.shape == (2, 2, 2, 32)
        assert m.forward_head(feats).shape == (2, 5)
        torch.testing.assert_close(m.forward_head(feats, pre_logits=True), feats.mean(dim=(1, 2)))
        final, maps = m.forward_intermediates(x)
        assert [tuple(t.shape) for t in maps] == [(2, 8, 18, 20), (2, 16, 9, 10), (2, 16, 4, 5), (2, 32, 2, 2)]
        torch.testing.assert_close(final, feats)
        nhwc = m.forward_intermediates(x, indices=[1], output_fmt="NHWC", intermediates_only=True)
        torch.testing.assert_close(nhwc[0].permute(0, 3, 1, 2), maps[1])
    m.train()
    m.set_grad_checkpointing(True)
    m(x).sum().backward()
    assert m.stages[2].pos.proj[0].weight.grad is not None


def test_reset_classifier_config_round_trip_and_errors():
    m = Twins(**SMALL, wss=(4, 4, 4, 4))
    m.reset_classifier(0)
    assert m(torch.randn(1, 3, 64, 64)).shape == (1, 32)
    cfg = TwinsConfig.from_dict(m.cfg.to_dict())
    assert cfg == m.cfg
    with pytest.raises(ValueError, match="num_heads"):
        TwinsConfig(**{**SMALL, "num_heads": (3, 2, 2, 2)})
    with pytest.raises(ValueError, match="wss"):
        TwinsConfig(**SMALL, wss=(4, 4))
    with pytest.raises(TypeError, match="lsa_pad_mask"):
        TwinsConfig(**SMALL, lsa_pad_mask=1)
    with pytest.raises(ValueError, match="images"):
        m(torch.randn(1, 4, 64, 64))
    assert m.no_weight_decay() == {f"stages.{i}.pos.proj.0.{p}" for i in range(4) for p in ("weight", "bias")}


def test_lsa_pad_mask_reaches_every_lsa_block():
    m = Twins(**SMALL, wss=(4, 4, 4, 4), lsa_pad_mask=True)
    assert all(b.attn.pad_mask for s in m.stages for b in s.blocks if isinstance(b.attn, LocallyGroupedAttention))
