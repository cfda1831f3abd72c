"""PVT v1 / PVTv2 models: structure, any input size, the class token, intermediates, their own layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_model
from vit_attention.layers.conv_embed import ConvEmbed
from vit_attention.layers.mlp_dwconv import MlpDWConv

SMALL = dict(embed_dims=(16, 32, 32, 32), depths=(1, 2, 1, 1), num_heads=(1, 2, 2, 2), num_classes=7)


def _model(name: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model(name, **{**SMALL, **kw}).eval()


@pytest.mark.registry
@pytest.mark.parametrize("name", ["pvt_v2_b0", "pvt_v2_b2_li"])
def test_pvt_v2_runs_at_any_size_and_its_maps_match_feature_info(name: str) -> None:
    model = _model(name)
    x = torch.randn(2, 3, 70, 90)  # not a multiple of 32: every conv floors / pads as timm's
    with torch.no_grad():
        logits = model(x)
        final, maps = model.forward_intermediates(x)
    assert logits.shape == (2, 7) and torch.isfinite(logits).all()
    sides = [(18, 23), (9, 12), (5, 6), (3, 3)]  # the overlapping convs: ceil(70 / 4) ... (padding k // 2)
    for m, info, (h, w) in zip(maps, model.feature_info, sides):
        assert m.shape == (2, info["num_chs"], h, w)
    torch.testing.assert_close(final, maps[-1].permute(0, 2, 3, 1))  # the stage norm is the last thing
    with torch.no_grad():
        torch.testing.assert_close(model.forward_head(final), logits)
    assert [i["reduction"] for i in model.feature_info] == [4, 8, 16, 32]


def test_pvt_v2_blocks_take_the_stage_reduction_and_eps() -> None:
    model = _model("pvt_v2_b0", embed_norm_eps=1e-5, norm_eps=1e-6)
    attns = [s.blocks[0].attn for s in model.stages]
    assert [a.sr_ratio for a in attns] == [8, 4, 2, 1] and attns[-1].sr is None
    assert attns[0].norm.eps == 1e-5 and model.stages[0].blocks[0].norm1.eps == 1e-6
    assert model.patch_embed.norm.eps == 1e-5 and model.stages[1].downsample.proj.kernel_size == (3, 3)
    assert isinstance(model.stages[0].blocks[0].mlp, MlpDWConv)
    li = _model("pvt_v2_b2_li")
    a = li.stages[3].blocks[0].attn
    assert a.linear and a.pool is not None and a.sr.kernel_size == (1, 1)  # every stage, sr_ratio 1 included
    assert isinstance(li.stages[0].blocks[0].mlp.relu, torch.nn.ReLU)
    assert "head.fc.weight" in model.state_dict() and "stages.0.blocks.0.mlp.dwconv.weight" in model.state_dict()


@pytest.mark.parametrize("mech, kw", [("mhsa", {}), ("window", {"window_size": 2})])
def test_any_mechanism_replaces_sra(mech: str, kw: dict) -> None:
    model = _model("pvt_v2_b0", attn_layer=mech, attn_kwargs=kw)
    assert type(model.stages[0].blocks[0].attn).attention_name == mech
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 7)


def test_pvt_v1_class_token_joins_in_the_last_stage() -> None:
    model = _model("pvt_tiny", img_size=64)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feats = model.forward_features(x)  # [B, 1 + 2x2, C]
        final, maps = model.forward_intermediates(x)
        logits = model(x)
    assert feats.shape == (2, 5, 32)
    torch.testing.assert_close(final, feats)
    assert [tuple(m.shape) for m in maps] == [(2, 16, 16, 16), (2, 32, 8, 8), (2, 32, 4, 4), (2, 32, 2, 2)]
    torch.testing.assert_close(model.norm(maps[-1].permute(0, 2, 3, 1)).flatten(1, 2), feats[:, 1:])
    with torch.no_grad():
        torch.testing.assert_close(model.head(feats[:, 0]), logits)  # the head reads the class token
    keys = model.state_dict()
    assert {"stages.3.downsample.cls_token", "stages.3.downsample.pos_embed", "patch_embed.pos_embed"} <= set(keys)
    assert keys["stages.3.downsample.pos_embed"].shape == (1, 1 + 2 * 2, 32)
    assert keys["stages.2.downsample.pos_embed"].shape == (1, 4 * 4, 32)
    assert model.no_weight_decay() == {"stages.3.downsample.cls_token"}


def test_pvt_v1_other_sizes_resample_the_tables_and_avg_pool_needs_no_class_token() -> None:
    model = _model("pvt_tiny", img_size=64)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 96, 128)).shape == (1, 7)  # tables resampled to 24x32 .. 3x4
    avg = _model("pvt_tiny", img_size=64, class_token=False, global_pool="avg")
    with torch.no_grad():
        feats = avg.forward_features(torch.randn(1, 3, 64, 64))
    assert feats.shape == (1, 2, 2, 32) and "stages.3.downsample.cls_token" not in avg.state_dict()
    with pytest.raises(ValueError, match="class_token"):
        create_model("pvt_tiny", class_token=False)
    with pytest.raises(ValueError, match="img_size"):
        create_model("pvt_tiny", img_size=48)  # the 4th-stage table needs a multiple of 32
    with pytest.raises(ValueError, match="num_heads"):
        create_model("pvt_v2_b0", num_heads=(1, 2, 3, 8))  # 160 is not divisible by 3


@pytest.mark.registry
@pytest.mark.parametrize("name", ["pvt_tiny", "pvt_v2_b0"])
def test_reset_classifier_and_features_only(name: str) -> None:
    model = _model(name, img_size=64)
    model.reset_classifier(3, "avg")
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
    model.reset_classifier(0)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 32)
    feats = create_model(name, features_only=True, out_indices=(1, 3), **{**SMALL, "img_size": 64}).eval()
    with torch.no_grad():
        outs = feats(torch.randn(1, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == [(1, 32, 8, 8), (1, 32, 2, 2)]
    assert feats.feature_info.reduction() == [8, 32]


def test_grad_checkpointing_gives_the_same_gradients() -> None:
    model = _model("pvt_tiny", img_size=64).train()
    x = torch.randn(2, 3, 64, 64)
    model(x).square().sum().backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).square().sum().backward()
    for g, r in zip((p.grad for p in model.parameters()), ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the layers PVT adds
@pytest.mark.parametrize("extra_relu", [False, True])
def test_mlp_dwconv_matches_its_formula(extra_relu: bool) -> None:
    torch.manual_seed(0)
    mlp = MlpDWConv(8, 24, extra_relu=extra_relu).eval()
    x = torch.randn(2, 5, 7, 8)  # [B, H, W, C]
    h = F.linear(x, mlp.fc1.weight, mlp.fc1.bias)
    h = F.relu(h) if extra_relu else h
    h = F.conv2d(h.permute(0, 3, 1, 2), mlp.dwconv.weight, mlp.dwconv.bias, padding=1, groups=24)
    ref = F.linear(F.gelu(h.permute(0, 2, 3, 1)), mlp.fc2.weight, mlp.fc2.bias)
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mlp(x, residual=x), x + ref, rtol=1e-5, atol=1e-6)  # the fused residual
    assert set(mlp.state_dict()) == {f"{m}.{t}" for m in ("fc1", "dwconv", "fc2") for t in ("weight", "bias")}
    with pytest.raises(ValueError, match="channels-last map"):
        mlp(torch.randn(2, 35, 8))


def test_conv_embed_takes_images_or_maps() -> None:
    torch.manual_seed(0)
    stem = ConvEmbed(3, 8, kernel_size=7, stride=4, padding=3).eval()
    down = ConvEmbed(8, 16, kernel_size=3, stride=2, padding=1, channels_last_input=True).eval()
    x = torch.randn(2, 3, 30, 34)
    with torch.no_grad():
        m = stem(x)
        ref = F.layer_norm(stem.proj(x).permute(0, 2, 3, 1), (8,), stem.norm.weight, stem.norm.bias, 1e-5)
        torch.testing.assert_close(m, ref)
        assert m.shape == (2, 8, 9, 8) and down(m).shape == (2, 4, 5, 16)  # [B, H', W', C]
    with pytest.raises(ValueError, match="in_chans"):
        down(x)
    with pytest.raises(ValueError, match="kernel_size"):
        ConvEmbed(3, 8, kernel_size=0, stride=1)


@pytest.mark.parametrize("act", [None, "gelu", "relu"])
def test_conv2d_act_equals_conv_then_activation(act: str | None) -> None:
    from vit_attention.functional.conv_act import conv2d_act

    torch.manual_seed(0)
    w, b = torch.randn(24, 1, 3, 3), torch.randn(24)
    x = torch.randn(2, 5, 7, 24).permute(0, 3, 1, 2)  # channels-last memory: the fused oneDNN path
    ref = F.conv2d(x, w, b, padding=1, groups=24)
    ref = ref if act is None else F.gelu(ref) if act == "gelu" else F.relu(ref)
    with torch.no_grad():
        torch.testing.assert_close(conv2d_act(x, w, b, padding=1, groups=24, act=act), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(conv2d_act(x.contiguous(), w, b, padding=1, groups=24, act=act), ref)  # eager
    xg = x.detach().requires_grad_()
    conv2d_act(xg, w, b, padding=1, groups=24, act=act).sum().backward()  # autograd: the eager ops
    assert xg.grad is not None and torch.isfinite(xg.grad).all()
    with pytest.raises(ValueError, match="act"):
        conv2d_act(x, w, b, act="tanh")


@pytest.mark.registry
@pytest.mark.parametrize(("name", "side"), [("pvt_tiny", 32), ("pvt_v2_b0", 29), ("pvt_v2_b2_li", 1),
                                            ("twins_pcpvt_small", 32), ("twins_svt_small", 32)])
def test_minimum_input_size_is_exact_and_named(name: str, side: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """PVT v1 floors (kernel = stride convs): 4·2^i·sr_ratio; PVTv2 pads (ceil): 4·2^i·(sr_ratio - 1) + 1, so
    29 px; the linear variant pools its keys: any size. At the minimum the model runs; one pixel less on
    one side raises ``ValueError`` naming the minimum and the options, before SRA's bare error."""
    from vit_attention.models.pvt_v2 import MinInputSize

    model = _model(name, **({} if name.startswith("pvt") else dict(embed_dims=(16, 32, 32, 32), num_heads=(1,) * 4,
                                                                      depths=(2,) * 4)))
    assert model.min_input_size == (side, side)
    with torch.no_grad():
        assert model(torch.randn(1, 3, side, side)).shape == (1, 7)
        if side == 1:
            return
        small = torch.randn(1, 3, side - 1, side + 8)
        with pytest.raises(ValueError, match=rf"input {side - 1}x{side + 8} px is below the minimum input size of "
                                             rf"this model, {side}x{side} px: stage 0 .* sr_ratio=8 .*img_size=.*"
                                             r"--img-size"):
            model(small)
        monkeypatch.setattr(model, "_min_input", MinInputSize((1,) * 4, (1,) * 4))  # without the check ...
        with pytest.raises(ValueError, match="smaller than sr_ratio=8"):  # ... SRA's own error: the minimum is tight
            model(small)


def test_img_size_below_the_minimum_fails_at_construction() -> None:
    with pytest.raises(ValueError, match=r"img_size=16 is below the minimum input size of this model, 29x29 px.*"
                                         r"create_model\(\.\.\., img_size=29\); --img-size 29"):
        create_model("pvt_v2_b0", img_size=16)
    with pytest.raises(ValueError, match=r"img_size=32 .* 64x64 px: stage 0 would see a 8x8 map, smaller than its "
                                         r"sr_ratio=16"):
        create_model("pvt_tiny", img_size=32, sr_ratios=(16, 4, 2, 1))
    with pytest.raises(ValueError, match=r"img_size=\(64, 16\) .* 32x32 px"):
        create_model("twins_pcpvt_small", img_size=(64, 16))
    assert _model("pvt_v2_b0", sr_ratios=(4, 2, 1, 1), img_size=13).min_input_size == (13, 13)  # 4·3 + 1
    assert _model("pvt_v2_b0", attn_layer="mhsa", img_size=8).min_input_size == (1, 1)  # nothing reduces


def test_cli_names_the_minimum_input_size(capsys: pytest.CaptureFixture[str]) -> None:
    from vit_attention.cli import main

    assert main(["info", "pvt_v2_b0", "--img-size", "16"]) != 0
    err = capsys.readouterr().err
    assert "minimum input size of this model, 29x29 px" in err and "--img-size 29" in err
