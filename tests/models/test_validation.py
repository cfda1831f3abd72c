"""Every bad model argument raises an error that names it and says what was expected.

Configs check their fields on construction (``__post_init__``), so ``create_model``,
``model_config`` and ``from_dict`` fail at once; models check the few arguments of their methods.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from model_outputs import first_preset_per_family

from vit_attention import create_model
from vit_attention.cli import main
from vit_attention.models import VisionTransformer, VisionTransformerConfig, model_config
from vit_attention.models.swin import SwinTransformer, SwinTransformerConfig
from vit_attention.models.swinv2 import SwinTransformerV2, SwinTransformerV2Config

VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=7)
SWIN = dict(img_size=32, patch_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4, num_classes=5)


@pytest.mark.parametrize("bad,err,match", [
    (dict(patch_size=0), ValueError, r"patch_size must be an int >= 1 or a pair of them, got 0"),
    (dict(patch_size=(8, 0)), ValueError, r"patch_size must be an int >= 1"),
    (dict(embed_dim="abc"), TypeError, r"embed_dim must be an int >= 1, got 'abc' \(str\)"),
    (dict(embed_dim=32.0), TypeError, r"embed_dim must be an int >= 1, got 32.0 \(float\)"),
    (dict(img_size=0), ValueError, r"img_size must be an int >= 1 or a pair of them, got 0"),
    (dict(img_size=-224), ValueError, r"img_size must be an int >= 1 or a pair of them, got -224"),
    (dict(img_size=(32, 32, 3)), TypeError, r"img_size must be an int >= 1 or a pair of them"),
    (dict(img_size="224"), TypeError, r"img_size must be"),
    (dict(depth=-1), ValueError, r"depth must be an int >= 0, got -1"),
    (dict(num_heads=0), ValueError, r"num_heads must be an int >= 1, got 0"),
    (dict(num_heads=5), ValueError, r"embed_dim=32 must be divisible by num_heads=5"),
    (dict(in_chans=0), ValueError, r"in_chans must be an int >= 1"),
    (dict(num_classes=-1), ValueError, r"num_classes must be .*, got -1"),
    (dict(mlp_ratio=0), ValueError, r"mlp_ratio must be > 0, got 0"),
    (dict(mlp_ratio="4"), TypeError, r"mlp_ratio must be a number \(> 0\)"),
    (dict(mlp_dim=-5), ValueError, r"mlp_dim must be an int >= 1"),
    (dict(norm_eps=-1e-6), ValueError, r"norm_eps must be >= 0"),
    (dict(init_values=float("nan")), ValueError, r"init_values must be finite"),
    (dict(representation_size=-1), ValueError, r"representation_size must be an int >= 0"),
    (dict(conv_stem=(24, -48)), ValueError, r"conv_stem must be a non-empty sequence of ints >= 1"),
    (dict(act="gleu"), ValueError, r"act must be one of 'gelu', 'gelu_tanh', 'quick_gelu', 'relu', 'silu'; got 'gleu'"),
    (dict(mlp_layer="geglu"), ValueError, r"mlp_layer must be one of 'mlp', 'glu', 'swiglu'; got 'geglu'"),
    (dict(mlp_norm=True), ValueError, r"mlp_norm=True is the sub-LN of mlp_layer='swiglu'"),
    (dict(qkv_bias="k"), ValueError, r"qkv_bias must be one of True, False, 'qv'; got 'k'"),
    (dict(reg_tokens=-1), ValueError, r"reg_tokens"),
    (dict(rope="spiral"), ValueError, r"rope must be one of 'axial', 'mixed'; got 'spiral'"),
    (dict(rope_kwargs={"theta": 10.0}), ValueError, r"rope_kwargs given without rope"),
    (dict(block="pre-norm"), ValueError, r"block must be one of"),
    (dict(pos_embed="rope"), ValueError, r"pos_embed must be one of"),
    (dict(attn_layer=3), TypeError, r"attn_layer must be a registered mechanism name"),
    (dict(attn_layer="windw"), KeyError, r"attn_layer: unknown attention mechanism 'windw'; did you mean 'window'"),
    (dict(attn_kwargs=[("window_size", 4)]), TypeError, r"attn_kwargs must be a dict"),
    (dict(drop_path_rate=1.5), ValueError, r"drop_path_rate must be in \[0, 1\), got 1.5"),
    (dict(drop_path_rate=-0.1), ValueError, r"drop_path_rate must be in \[0, 1\)"),
    (dict(drop_rate=1.0), ValueError, r"drop_rate must be in \[0, 1\)"),
    (dict(attn_drop_rate=2), ValueError, r"attn_drop_rate must be in \[0, 1\)"),
    (dict(proj_drop_rate=-1), ValueError, r"proj_drop_rate must be in \[0, 1\)"),
    (dict(pos_drop_rate=1), ValueError, r"pos_drop_rate must be in \[0, 1\)"),
    (dict(img_size=36), ValueError, r"img_size=36 is not divisible by patch_size=8; .*dynamic_img_pad=True"),
])
def test_vit_config_errors_name_the_argument(bad: dict[str, Any], err: type[Exception], match: str) -> None:
    with pytest.raises(err, match=match):
        VisionTransformerConfig(**{**VIT, **bad})
    with pytest.raises(err, match=match):  # the same through the registry
        create_model("vit_tiny_patch16_224", **{**VIT, **bad})


@pytest.mark.parametrize("bad,err,match", [
    (dict(patch_size=0), ValueError, r"patch_size must be an int >= 1, got 0"),
    (dict(patch_size=(4, 4)), TypeError, r"patch_size must be an int >= 1, got \(4, 4\) \(tuple\)"),
    (dict(embed_dim="abc"), TypeError, r"embed_dim must be an int >= 1, got 'abc'"),
    (dict(embed_dim=0), ValueError, r"embed_dim must be an int >= 1, got 0"),
    (dict(img_size=0), ValueError, r"img_size must be an int >= 1 or a pair of them, got 0"),
    (dict(img_size=-224), ValueError, r"img_size must be an int >= 1"),
    (dict(depths=(2, -1)), ValueError, r"depths must be a non-empty sequence of ints >= 0, got \(2, -1\)"),
    (dict(depths=()), ValueError, r"depths must be a non-empty sequence"),
    (dict(depths=4), TypeError, r"depths must be a non-empty sequence"),
    (dict(depths=(2, 2.0)), TypeError, r"depths must be a non-empty sequence of ints"),
    (dict(num_heads=(2, 0)), ValueError, r"num_heads must be a sequence of 2 ints >= 1 \(one per stage\)"),
    (dict(num_heads=4), TypeError, r"num_heads must be a sequence of 2 ints"),
    (dict(num_heads=(2,)), ValueError, r"depths \(2, 2\) and num_heads \(2,\) must be non-empty and equally long"),
    (dict(num_heads=(3, 4)), ValueError, r"stage 0 width 16 .* not divisible by num_heads=3 \(num_heads\[0\]\)"),
    (dict(window_size=0), ValueError, r"window_size must be an int >= 1 or a pair of them, got 0"),
    (dict(window_size=(4, -4)), ValueError, r"window_size must be an int >= 1"),
    (dict(mlp_ratio=-1), ValueError, r"mlp_ratio must be > 0, got -1"),
    (dict(mlp_ratio=None), TypeError, r"mlp_ratio must be a number"),
    (dict(drop_path_rate=1.5), ValueError, r"drop_path_rate must be in \[0, 1\), got 1.5"),
    (dict(attn_drop_rate=1.0), ValueError, r"attn_drop_rate must be in \[0, 1\)"),
    (dict(num_classes=-1), ValueError, r"num_classes must be an int >= 0"),
    (dict(in_chans=-3), ValueError, r"in_chans must be an int >= 1"),
    (dict(norm_eps=float("inf")), ValueError, r"norm_eps must be >= 0"),
    (dict(global_pool="token"), ValueError, r"global_pool must be one of 'avg', ''; got 'token'"),
    (dict(pad_mode="zeros"), ValueError, r"pad_mode must be one of 'swin', 'timm', 'torchvision'"),
    (dict(attn_layer="mhsa"), ValueError,
     r"attn_layer must be a spatial mechanism \(one of .*'window'.*got 'mhsa', which takes tokens"),
    (dict(pretrained_window_sizes=(8,)), ValueError, r"pretrained_window_sizes \(8,\) needs one entry per stage"),
    (dict(pretrained_window_sizes=(8, -1)), ValueError, r"pretrained_window_sizes\[1\] must be an int >= 0"),
    (dict(img_size=30), ValueError, r"img_size=30 is not divisible by patch_size=4; .*strict_img_size=False"),
])
@pytest.mark.parametrize("cls", [SwinTransformerConfig, SwinTransformerV2Config])
def test_swin_config_errors_name_the_argument(cls: type, bad: dict[str, Any], err: type[Exception],
                                              match: str) -> None:
    with pytest.raises(err, match=match):
        cls(**{**SWIN, **bad})
    name = "swin_tiny_patch4_window7_224" if cls is SwinTransformerConfig else "swinv2_tiny_window8_256"
    with pytest.raises(err, match=match):
        model_config(name, **{**SWIN, **bad})


def test_valid_edge_values_still_build() -> None:
    vit = VisionTransformer(**{**VIT, "depth": 0, "patch_size": (8, 8), "img_size": [32, 32]}).eval()
    assert vit(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    swin = SwinTransformer(**{**SWIN, "depths": [1, 0], "num_heads": [2, 4], "img_size": (32, 32)}).eval()
    assert swin(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    assert SwinTransformerV2(**{**SWIN, "pretrained_window_sizes": (0, (4, 4))}).cfg.depths == (2, 2)


def test_fields_assigned_after_construction_are_checked_by_the_model() -> None:
    cfg = VisionTransformerConfig(**VIT)
    cfg.depth = -1
    with pytest.raises(ValueError, match="depth must be an int >= 0"):
        VisionTransformer(cfg)
    scfg = SwinTransformerConfig(**SWIN)
    scfg.window_size = 0
    with pytest.raises(ValueError, match="window_size must be an int >= 1"):
        SwinTransformer(scfg)


@pytest.mark.parametrize("make", [lambda: VisionTransformer(**VIT), lambda: SwinTransformer(**SWIN)])
def test_reset_classifier_checks_num_classes(make: Any) -> None:
    model = make()
    with pytest.raises(ValueError, match=r"num_classes must be an int >= 0, got -1"):
        model.reset_classifier(-1)
    with pytest.raises(TypeError, match=r"num_classes must be an int >= 0, got 2.5"):
        model.reset_classifier(2.5)
    with pytest.raises(ValueError, match="global_pool must be one of"):
        model.reset_classifier(3, global_pool="max")
    assert model.num_classes == model.cfg.num_classes == (7 if isinstance(model, VisionTransformer) else 5)
    model.reset_classifier(0)
    assert model.num_classes == 0


def test_drop_path_rate_error_names_the_config_field() -> None:
    with pytest.raises(ValueError, match=r"^drop_path_rate must be in \[0, 1\), got 1.5$"):
        VisionTransformer(**VIT, drop_path_rate=1.5)
    with pytest.raises(ValueError, match=r"^drop_path_rate must be in \[0, 1\), got 1.5$"):
        SwinTransformer(**SWIN, drop_path_rate=1.5)


@pytest.mark.parametrize("cls", [SwinTransformer, SwinTransformerV2])
def test_swin_size_hint_names_swin_options(cls: type) -> None:
    model = cls(**SWIN).eval()
    with pytest.raises(ValueError, match=r"got \(30, 30\); .*strict_img_size=False") as e:
        model(torch.randn(1, 3, 30, 30))
    assert "dynamic_img_size" not in str(e.value) and "img_size=(30, 30)" not in str(e.value)
    with pytest.raises(ValueError, match=r"img_size=\(64, 64\) or strict_img_size=False") as e:
        model(torch.randn(1, 3, 64, 64))
    assert "dynamic_img_size" not in str(e.value)
    # the hinted option works
    loose = cls(**SWIN, strict_img_size=False).eval()
    assert loose(torch.randn(1, 3, 30, 30)).shape == (1, 5)


def test_vit_size_hint_names_both_vit_options() -> None:
    model = VisionTransformer(**VIT).eval()
    with pytest.raises(ValueError, match=r"dynamic_img_size=True and dynamic_img_pad=True"):
        model(torch.randn(1, 3, 30, 30))
    with pytest.raises(ValueError, match=r"img_size=\(40, 40\) or dynamic_img_size=True"):
        model(torch.randn(1, 3, 40, 40))
    dynamic = VisionTransformer(**VIT, dynamic_img_size=True).eval()
    with pytest.raises(ValueError, match=r"not divisible by patch_size \(8, 8\); .*dynamic_img_pad=True"):
        dynamic(torch.randn(1, 3, 30, 30))
    padded = VisionTransformer(**VIT, dynamic_img_size=True, dynamic_img_pad=True).eval()
    assert padded(torch.randn(1, 3, 30, 30)).shape == (1, 7)


@pytest.mark.registry
@pytest.mark.parametrize("name,kw,img", [
    ("vit_tiny_patch16_224", dict(depth=1), 32),
    ("deit_tiny_distilled_patch16_224", dict(depth=1), 32),
    ("swin_tiny_patch4_window7_224", dict(depths=(2, 2), num_heads=(2, 4), embed_dim=16, window_size=4), 32),
    ("swin_tiny_patch4_window7_224", dict(depths=(2, 2), num_heads=(2, 4), embed_dim=16, window_size=4,
                                          strict_img_size=False), 30),
    ("swinv2_tiny_window8_256", dict(depths=(2, 2), num_heads=(2, 4), embed_dim=16, window_size=4), 32),
])
@pytest.mark.parametrize("train", [False, True])
def test_empty_batch(name: str, kw: dict[str, Any], img: int, train: bool) -> None:
    model = create_model(name, img_size=32, num_classes=3, **kw).train(train)
    x = torch.randn(0, 3, img, img)
    out = model(x)
    for logits in out if isinstance(out, tuple) else (out,):
        assert logits.shape == (0, 3)
    feats = model.forward_features(x)
    assert feats.shape[0] == 0
    assert model.forward_head(feats, pre_logits=True).shape == (0, model.num_features)
    final, inter = model.forward_intermediates(x)
    assert final.shape[0] == 0 and inter and all(t.shape[0] == 0 for t in inter)


@pytest.mark.parametrize("args,message", [
    (["summary", "swin_t", "--img-size", "0"], "argument --img-size: expected a positive integer (>= 1), got 0"),
    (["summary", "swin_t", "--img-size", "30"], "img_size=30 is not divisible by patch_size=4"),
    (["summary", "vit_tiny_patch16_224", "--img-size", "-224"], "argument --img-size: expected a positive integer"),
])
def test_cli_summary_prints_the_argument_error(args: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(args)
    except SystemExit as e:  # sizes below 1: argparse's own check of the option
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert "vit-attention summary: error: " in err and message in err


def test_cli_summary_empty_batch_of_swin(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", "swin_t", "--batch-size", "0", "--img-size", "64"]) == 0
    assert "output shape: [0, 1000]" in capsys.readouterr().out


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(first_preset_per_family().values()))
def test_every_family_checks_the_common_fields(name: str) -> None:
    """Every family's config rejects a bad image size, channel or class count, and any ``*_rate`` outside [0, 1),
    naming the field (``_config.check_common``)."""
    cfg = model_config(name)
    rates = [f.name for f in dataclasses.fields(cfg) if f.name.endswith("_rate")]
    assert "drop_path_rate" in rates
    for field, value, match in [("img_size", 0, r"^img_size must be an int >= 1 or a pair of them, got 0$"),
                                ("in_chans", 0, r"^in_chans must be an int >= 1, got 0$"),
                                ("num_classes", -1, r"^num_classes must be an int >= 0, got -1$"),
                                *[(rate, 1.5, rf"^{rate} must be in \[0, 1\), got 1.5$") for rate in rates]]:
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(cfg, **{field: value})
