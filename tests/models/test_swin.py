"""Swin / SwinV2 backbones (models/swin.py, models/swinv2.py)."""

import pytest
import torch

from vit_attention import create_model
from vit_attention.functional.observers import register_attention_hook
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.swin import SwinTransformer, SwinTransformerConfig
from vit_attention.models.swinv2 import SwinTransformerV2, SwinTransformerV2Config

SMALL = dict(img_size=64, patch_size=4, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4), num_classes=7)


def _count(model: torch.nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def test_registered_names_and_aliases():
    names = set(list_models("swin*"))
    assert {"swin_tiny_patch4_window7_224", "swin_small_patch4_window7_224", "swin_base_patch4_window7_224",
            "swin_base_patch4_window12_384", "swin_large_patch4_window7_224", "swin_large_patch4_window12_384",
            "swinv2_tiny_window8_256", "swinv2_tiny_window16_256", "swinv2_base_window12_192",
            "swinv2_base_window12to24_192to384", "swinv2_large_window12to16_192to256",
            "swinv2_giant_window12_192"} <= names
    for alias, target in [("swin_t", "swin_tiny_patch4_window7_224"), ("swin_s", "swin_small_patch4_window7_224"),
                          ("swin_b", "swin_base_patch4_window7_224"), ("swin_v2_t", "swinv2_tiny_window8_256"),
                          ("swin_v2_s", "swinv2_small_window8_256"), ("swin_v2_b", "swinv2_base_window8_256")]:
        assert get_model_entry(alias).name == target
    assert get_model_entry("swinv2_base_window12to24_192to384").preset["pretrained_window_sizes"] == (12, 12, 12, 6)


PUBLISHED = [n for n in list_models("swin*") if "published_params_m" in get_model_entry(n).meta]


@pytest.mark.registry
@pytest.mark.parametrize("name", PUBLISHED)
def test_published_param_counts_on_meta(name):
    with torch.device("meta"):
        model = create_model(name)
    published = get_model_entry(name).meta["published_params_m"]
    assert abs(_count(model) - published) / published < 0.01, (name, _count(model), published)
    assert all(p.is_meta for p in model.parameters())


def test_family_sizes_table():
    expect = {"swin_t": 28.3, "swin_s": 49.6, "swin_b": 87.8, "swin_large_patch4_window7_224": 197.0,
              "swin_v2_t": 28.3, "swin_v2_s": 49.7, "swin_v2_b": 87.9, "swinv2_large_window12to16_192to256": 196.7,
              "swinv2_giant": 3000.0}
    for name, m in expect.items():
        with torch.device("meta"):
            assert abs(_count(create_model(name)) - m) / m < 0.01, name


def test_worked_shape_example_on_meta():
    """[32, 3, 224, 224] -> [32, 56, 56, 96] -> [2048, 49, 96] windows -> logits [2048, 3, 49, 49] -> C..8C."""
    with torch.device("meta"):
        model = create_model("swin_t").eval()
        x = torch.empty(32, 3, 224, 224)
    seen: dict[str, tuple[int, ...]] = {}
    model.patch_embed.register_forward_hook(lambda m, i, o: seen.update(patch=tuple(o.shape)))
    model.layers[0].blocks[0].attn.qkv.register_forward_hook(lambda m, i, o: seen.update(windows=tuple(i[0].shape)))
    logits = []
    handle = register_attention_hook(lambda q, k, v, info: logits.append((*q.shape[:-1], k.shape[-2])),
                                     weights=False)
    try:
        with torch.no_grad():
            final, stages = model.forward_intermediates(x)
    finally:
        handle.remove()
    assert seen["patch"] == (32, 56, 56, 96)
    assert seen["windows"] == (2048, 49, 96)  # 64 windows of 49 tokens per image
    assert logits[0] == (2048, 3, 49, 49)
    assert [tuple(s.shape) for s in stages] == [(32, 96, 56, 56), (32, 192, 28, 28), (32, 384, 14, 14),
                                                 (32, 768, 7, 7)]
    assert tuple(final.shape) == (32, 7, 7, 768)
    assert len(logits) == 12  # one attention call per block


@pytest.mark.parametrize("cls", [SwinTransformer, SwinTransformerV2])
def test_forward_backward_head_api(cls):
    model = cls(**SMALL)
    x = torch.randn(2, 3, 64, 64)
    out = model(x)
    assert out.shape == (2, 7)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, 8, 8, 32) and model.num_features == 32
        assert model.forward_head(feats, pre_logits=True).shape == (2, 32)
        model.reset_classifier(3)
        assert model(x).shape == (2, 3)
        model.reset_classifier(0)
        assert model(x).shape == (2, 32)


def test_forward_intermediates_formats_and_indices():
    model = SwinTransformer(**SMALL).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        assert [m.shape for m in maps] == [(1, 16, 16, 16), (1, 32, 8, 8)]
        nhwc = model.forward_intermediates(x, indices=1, output_fmt="NHWC", norm=True, intermediates_only=True)
        assert len(nhwc) == 1 and nhwc[0].shape == (1, 8, 8, 32)
        torch.testing.assert_close(nhwc[0], final)
        torch.testing.assert_close(final, model.forward_features(x))
    assert [f["reduction"] for f in model.feature_info] == [4, 8]
    with pytest.raises(ValueError, match="out of range"):
        model.forward_intermediates(x, indices=[5])


def test_strict_img_size_and_any_input_size():
    strict = SwinTransformer(**SMALL).eval()
    with pytest.raises(ValueError, match="expected image size"):
        strict(torch.randn(1, 3, 60, 44))
    free = SwinTransformer(**{**SMALL, "strict_img_size": False}).eval()
    free.load_state_dict(strict.state_dict())
    with torch.no_grad():
        assert free(torch.randn(1, 3, 60, 44)).shape == (1, 7)  # 15x11 then 8x6 maps, padded per block
        x = torch.randn(1, 3, 64, 64)
        torch.testing.assert_close(free(x), strict(x))


def test_sizes_that_are_not_patch_multiples():
    timm_like = SwinTransformer(**{**SMALL, "strict_img_size": False, "pad_mode": "timm"}).eval()
    tv_like = SwinTransformer(**{**SMALL, "strict_img_size": False, "pad_mode": "torchvision"}).eval()
    tv_like.load_state_dict(timm_like.state_dict())
    x = torch.randn(1, 3, 66, 45)
    with torch.no_grad():
        assert timm_like.forward_features(x).shape == (1, 9, 6, 32)  # 66x45 padded to 68x48: 17x12 -> 9x6
        torch.testing.assert_close(tv_like(x), tv_like(x[..., :64, :44]))  # torchvision's conv floors
        torch.testing.assert_close(timm_like(x), timm_like(torch.nn.functional.pad(x, (0, 3, 0, 2))))


def test_window_clamped_to_small_stages_in_timm_mode_only():
    model = SwinTransformer(**{**SMALL, "img_size": 32})  # stages 8x8, 4x4 with window 4
    last = model.layers[1].blocks[1].attn
    assert last.window_size == (4, 4) and last.shift_size == (0, 0)
    small = SwinTransformer(**{**SMALL, "img_size": 16})  # stage 1 is 2x2 < window 4: window 2, no shift
    assert small.layers[1].blocks[1].attn.window_size == (2, 2)
    assert small.layers[1].blocks[1].attn.relative_position_bias_table.shape == (9, 4)
    tv = SwinTransformer(**{**SMALL, "img_size": 16, "pad_mode": "torchvision"})
    assert tv.layers[1].blocks[1].attn.window_size == (4, 4) and tv.layers[1].blocks[1].attn.shift_size == (2, 2)


def test_absolute_position_embedding_option():
    model = SwinTransformer(**{**SMALL, "ape": True, "strict_img_size": False}).eval()
    assert model.absolute_pos_embed.shape == (1, 256, 16)
    assert "absolute_pos_embed" in model.no_weight_decay()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 48, 80)).shape == (1, 7)  # resampled to a 12x20 grid


def test_v2_structure_and_res_post_norm_init():
    model = SwinTransformerV2(**SMALL)
    blk = model.layers[0].blocks[0]
    assert blk.style == "res_post" and torch.all(blk.norm1.weight == 0)
    assert model.layers[1].downsample.norm.normalized_shape == (32,)  # norm after the reduction (2C)
    assert SwinTransformer(**SMALL).layers[1].downsample.norm.normalized_shape == (64,)  # v1: norm(4C) first
    keys = set(model.state_dict())
    assert "layers.1.downsample.reduction.weight" in keys and "layers.0.downsample.reduction.weight" not in keys
    assert "layers.0.blocks.0.attn.cpb_mlp.2.weight" in keys and "head.fc.weight" in keys
    assert isinstance(model.cfg, SwinTransformerV2Config) and model.cfg.attn_layer == "cosine_window"


def test_config_json_round_trip_and_grad_checkpointing():
    model = SwinTransformerV2(**{**SMALL, "pretrained_window_sizes": (8, 8)})
    cfg = SwinTransformerV2Config.from_dict(model.cfg.to_dict())
    assert cfg == model.cfg
    assert isinstance(SwinTransformerConfig.from_dict({"depths": [1], "num_heads": [3]}).depths, tuple)
    twin = SwinTransformerV2(cfg)
    twin.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 64, 64)
    model.train()
    twin.train()
    twin.set_grad_checkpointing(True)
    torch.testing.assert_close(twin(x), model(x))
    twin(x).sum().backward()
    assert twin.patch_embed.proj.weight.grad is not None


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        SwinTransformer(**{**SMALL, "num_heads": (3, 4)})
    with pytest.raises(ValueError, match="equally long"):
        SwinTransformer(**{**SMALL, "num_heads": (2,)})
    with pytest.raises(ValueError, match="pad_mode"):
        SwinTransformer(**{**SMALL, "pad_mode": "zeros"})


def test_any_spatial_mechanism_and_its_own_keywords():
    from vit_attention.attention import get_attention_spec, list_attention

    spatial = [n for n in list_attention() if get_attention_spec(n).layout == "spatial"]
    for name in spatial:
        model = SwinTransformer(**{**SMALL, "attn_layer": name}).eval()
        assert type(model.layers[0].blocks[0].attn) is get_attention_spec(name).cls
        with torch.no_grad():
            assert model(torch.randn(1, 3, 64, 64)).shape[0] == 1
    v1_cosine = SwinTransformer(**{**SMALL, "attn_layer": "cosine_window", "attn_kwargs": dict(cpb_hidden=8)})
    assert v1_cosine.layers[0].blocks[0].attn.cpb_mlp[0].out_features == 8
    assert v1_cosine.layers[0].blocks[0].style == "pre"


def test_inference_fuses_the_residuals_into_proj_and_fc2(monkeypatch):
    from vit_attention.attention.window import WindowAttention
    from vit_attention.layers import Mlp

    seen: list[str] = []
    for cls, tag in ((WindowAttention, "attn"), (Mlp, "mlp")):
        orig = cls.forward

        def spy(self, x, *args, _orig=orig, _tag=tag, **kw):
            residual = kw.get("residual", getattr(args[0] if args else None, "residual", None))  # Mlp's / the call's
            seen.append(f"{_tag}:{'residual' if residual is not None else 'plain'}")
            return _orig(self, x, *args, **kw)

        monkeypatch.setattr(cls, "forward", spy)
    model = SwinTransformer(**SMALL).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    assert seen and set(seen) == {"attn:residual", "mlp:residual"}  # every block, both branches
    seen.clear()
    model.train()(torch.randn(1, 3, 64, 64))
    assert set(seen) == {"attn:plain", "mlp:plain"}  # training: drop path / LayerScale need the branch alone
