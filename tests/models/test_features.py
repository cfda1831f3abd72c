"""Feature extraction: ``create_model(name, features_only=True, out_indices=...)`` (models/features.py)."""

from __future__ import annotations

import pytest
import torch
from model_outputs import distinct_reduced_presets, small_overrides

from vit_attention import create_model
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.features import FeatureInfo, FeaturesMixin, features_class, resolve_out_indices

HEAD_PREFIXES = ("head.", "head_dist.", "fc_norm.", "pre_logits.", "attn_pool.")


def _input(model: torch.nn.Module, batch: int = 2) -> torch.Tensor:
    size = model.cfg.img_size
    h, w = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, model.cfg.in_chans, h, w, generator=torch.Generator().manual_seed(0))


@pytest.mark.registry
@pytest.mark.parametrize("name", distinct_reduced_presets())
def test_every_model_channels_and_strides(name: str) -> None:
    """Default out_indices: each map's channels and stride are what feature_info says (every distinct reduced
    model of tests/model_outputs.py: each family and each code path its presets select)."""
    model = create_model(name, features_only=True, **small_overrides(name)).eval()
    info = model.feature_info
    assert isinstance(info, FeatureInfo) and len(info) > 0
    x = _input(model)
    with torch.no_grad():
        maps = model(x)
    assert isinstance(maps, list) and len(maps) == len(info)
    assert [m.shape[1] for m in maps] == info.channels()
    assert [x.shape[-1] // m.shape[-1] for m in maps] == info.reduction()
    assert [x.shape[-2] // m.shape[-2] for m in maps] == info.reduction()
    assert all(x.shape[-1] % m.shape[-1] == 0 and m.shape[0] == 2 for m in maps)
    assert len(info.module_name()) == len(info)
    assert not [k for k in model.state_dict() if k.startswith(HEAD_PREFIXES)]


def test_default_out_indices_follow_timm() -> None:
    """ViT: the last 3 blocks (timm's out_indices=3); hierarchical: every stage."""
    vit = create_model("vit_digits_patch2_8", features_only=True)  # 4 blocks
    assert vit.feature_info.out_indices == (1, 2, 3)
    assert vit.feature_info.module_name() == ["blocks.1", "blocks.2", "blocks.3"]
    name = "swin_tiny_patch4_window7_224"
    swin = create_model(name, features_only=True, **small_overrides(name))
    assert swin.feature_info.out_indices == (0, 1, 2, 3)
    assert swin.feature_info.reduction() == [4, 8, 16, 32]
    assert swin.feature_info.module_name() == ["layers.0", "layers.1", "layers.2", "layers.3"]


def test_out_indices_negative_int_and_order() -> None:
    name = "swin_tiny_patch4_window7_224"
    over = small_overrides(name)
    model = create_model(name, features_only=True, out_indices=(-1, 1), **over).eval()
    assert model.feature_info.channels() == [128, 32]
    assert model.feature_info.reduction() == [32, 8]
    with torch.no_grad():
        maps = model(_input(model))
    assert [m.shape[1] for m in maps] == [128, 32]
    last2 = create_model(name, features_only=True, out_indices=2, **over)
    assert last2.feature_info.out_indices == (2, 3)
    assert resolve_out_indices((0, -1, 0), 4) == (0, 3, 0)


@pytest.mark.parametrize("bad", [(4,), (-5,), 0, 5, ()])
def test_out_of_range_out_indices_raise(bad: object) -> None:
    name = "swin_tiny_patch4_window7_224"
    with pytest.raises(ValueError, match="out_indices"):
        create_model(name, features_only=True, out_indices=bad, **small_overrides(name))


def test_options_need_features_only() -> None:
    with pytest.raises(ValueError, match="features_only"):
        create_model("vit_digits_patch2_8", out_indices=(0,))


@pytest.mark.registry
@pytest.mark.parametrize("name", ["deit_tiny_distilled_patch16_224", "swinv2_tiny_window8_256"])
def test_maps_equal_the_full_models_intermediates(name: str) -> None:
    """A full model's state dict (head included) loads strictly; maps are its forward_intermediates. Without
    pruning the features model keeps every backbone key; with it (the default), what it lacks is ``pruned_keys``."""
    over = small_overrides(name)
    full = create_model(name, **over).eval()
    kept = create_model(name, features_only=True, out_indices=(-1, 0), feature_prune=False, **over)
    backbone = {k for k in full.state_dict() if not k.startswith(HEAD_PREFIXES)}
    assert set(kept.state_dict()) == backbone and not kept.pruned_keys
    feats = create_model(name, features_only=True, out_indices=(-1, 0), **over).eval()
    assert set(feats.state_dict()) == backbone - feats.pruned_keys and feats.pruned_keys <= set(full.state_dict())
    feats.load_state_dict(full.state_dict())  # strict: head keys ignored, nothing missing
    x = _input(full)
    with torch.no_grad():
        ref = full.forward_intermediates(x, intermediates_only=True)
        maps = feats(x)
    torch.testing.assert_close(maps[0], ref[-1])
    torch.testing.assert_close(maps[1], ref[0])
    with pytest.raises(RuntimeError, match="Missing"):
        feats.load_state_dict({k: v for k, v in full.state_dict().items() if not k.startswith("patch_embed")})


def test_vit_drops_prefix_tokens_and_nlc() -> None:
    name = "deit_tiny_distilled_patch16_224"  # class + distillation tokens
    over = small_overrides(name)
    model = create_model(name, features_only=True, output_fmt="NLC", out_indices=(-1,), **over).eval()
    x = _input(model)
    with torch.no_grad():
        (tokens,) = model(x)
    n = (x.shape[-2] // 16) * (x.shape[-1] // 16)
    assert tokens.shape == (2, n, 32)


def test_swin_nhwc() -> None:
    name = "swin_tiny_patch4_window7_224"
    model = create_model(name, features_only=True, output_fmt="NHWC", **small_overrides(name)).eval()
    x = _input(model)
    with torch.no_grad():
        maps = model(x)
    assert [m.shape[-1] for m in maps] == model.feature_info.channels()
    assert [x.shape[-2] // m.shape[1] for m in maps] == model.feature_info.reduction()


def test_pretrained_path(tmp_path) -> None:
    """``pretrained=`` a full model's checkpoint: weights load first, then the head goes."""
    name = "vit_digits_patch2_8"
    full = create_model(name).eval()
    path = tmp_path / "full.pth"
    torch.save(full.state_dict(), path)
    feats = create_model(name, pretrained=path, features_only=True, out_indices=(-1,)).eval()
    x = _input(full)
    with torch.no_grad():
        ref = full.forward_intermediates(x, indices=(-1,), intermediates_only=True)
        torch.testing.assert_close(feats(x), ref)


def test_a_features_model_is_built_as_its_features_class_and_cannot_be_one_twice() -> None:
    """``create_model(features_only=True)`` constructs the features class (a subclass of the family's): the model
    is an instance of the family's class; a features class of a features class is refused."""
    plain = create_model("vit_digits_patch2_8")
    model = create_model("vit_digits_patch2_8", features_only=True, out_indices=1)
    assert isinstance(model, type(plain)) and type(model) is features_class(type(plain))
    assert isinstance(model, FeaturesMixin) and model.out_indices == (3,)
    with pytest.raises(TypeError, match="already"):
        features_class(type(model))


@pytest.mark.compile
@pytest.mark.registry
@pytest.mark.parametrize("name", ["deit_tiny_distilled_patch16_224", "swin_tiny_patch4_window7_224"])
def test_onnx_export_one_output_per_map(name: str, tmp_path) -> None:
    import onnx  # the test set-up installs the onnx extra: a missing package must fail, not skip

    from vit_attention.export import INPUT_NAME, output_names, to_onnx, verify_onnx

    model = create_model(name, features_only=True, out_indices=(-1, 0), **small_overrides(name)).eval()
    path = to_onnx(model, tmp_path / "features.onnx")
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == [INPUT_NAME]
    assert [o.name for o in graph.output] == output_names(model) == ["feature_0", "feature_1"]
    errors = verify_onnx(model, path, batch_sizes=(1, 3))
    assert max(errors.values()) < 1e-4


def test_deepcopy_and_pickle_keep_the_features_model() -> None:
    import copy
    import io

    name = "swin_digits_patch2_window2_8"
    model = create_model(name, features_only=True, out_indices=(-1, 0)).eval()
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    x = _input(model)
    for other in (copy.deepcopy(model), torch.load(buf, weights_only=False)):
        assert type(other) is type(model) and other.feature_info.out_indices == (1, 0)
        with torch.no_grad():
            for a, b in zip(model(x), other(x), strict=True):
                torch.testing.assert_close(a, b)
        other.load_state_dict(create_model(name).state_dict())  # the load hook came along


@pytest.mark.registry
@pytest.mark.parametrize(("name", "fmt"), [("vit_digits_patch2_8", "NHWC"), ("swin_digits_patch2_window2_8", "NLC"),
                                           ("vit_digits_patch2_8", "nchw")])
def test_unsupported_output_fmt_raises_when_built(name: str, fmt: str) -> None:
    with pytest.raises(ValueError, match="output_fmt"):
        create_model(name, features_only=True, output_fmt=fmt)


def test_load_weights_into_a_features_model_ignores_the_head_strictly(tmp_path) -> None:
    """A full checkpoint loads into an existing features model with strict=True; a missing backbone key still fails."""
    from vit_attention.weights import load_weights
    from vit_attention.weights.load import CheckpointMismatchError

    name = "vit_digits_patch2_8"
    full = create_model(name).eval()
    feats = create_model(name, features_only=True, out_indices=(-1,)).eval()
    report = load_weights(feats, full.state_dict())
    assert report.ok
    x = _input(full)
    with torch.no_grad():
        torch.testing.assert_close(feats(x), full.forward_intermediates(x, indices=(-1,), intermediates_only=True))
    partial = {k: v for k, v in full.state_dict().items() if not k.startswith("blocks.0.")}
    with pytest.raises(CheckpointMismatchError, match="blocks.0"):
        load_weights(feats, partial)


def _one_preset_per_family() -> list[str]:

    first: dict[str, str] = {}
    for name in list_models():
        first.setdefault(get_model_entry(name).family, name)
    return sorted(first.values())


@pytest.mark.registry
@pytest.mark.parametrize("name", _one_preset_per_family())
def test_saved_features_model_loads_back_by_both_routes(name: str, tmp_path) -> None:
    """``save_weights`` of a features model: ``load_model`` and ``create_model(features_only=True, pretrained=)``
    both give it back (its out_indices, output_fmt and norm; the same maps, bit for bit); a plain model's file
    loads into a features model too (its head ignored), and into a plain model the features file does not."""
    from model_outputs import build

    from vit_attention import load_model, save_weights
    from vit_attention.weights import CheckpointMismatchError, read_checkpoint

    over = small_overrides(name)
    full, x = build(name, over)
    plain_path = save_weights(full, tmp_path / "plain.safetensors")
    entry = get_model_entry(name)
    plain = entry.build(full.cfg, features={"out_indices": (-1, 0)}).eval()
    feats = entry.build(full.cfg, features={"out_indices": (-1, 0), "norm": True}).eval()
    for model in (plain, feats):  # the full model's weights (its head ignored)
        model.load_state_dict(full.state_dict())
    path = save_weights(feats, tmp_path / "features.safetensors")
    state, _ = read_checkpoint(path)
    assert state.keys() == feats.state_dict().keys() and not [k for k in state if k.startswith(HEAD_PREFIXES)]
    with torch.no_grad():
        ref, ref_plain = feats(x), plain(x)
        for loaded in (load_model(path), create_model(name, features_only=True, pretrained=path, **over).eval()):
            assert isinstance(loaded, FeaturesMixin) and loaded.feature_norm and loaded.out_indices == feats.out_indices
            assert loaded.output_fmt == "NCHW" and loaded.feature_info.channels() == feats.feature_info.channels()
            maps = loaded(x)
            assert len(maps) == 2 and all(torch.equal(a, b) for a, b in zip(maps, ref, strict=True))
        from_plain = create_model(name, features_only=True, pretrained=plain_path, out_indices=(-1, 0), **over).eval()
        assert all(torch.equal(a, b) for a, b in zip(from_plain(x), ref_plain, strict=True))
    with pytest.raises(CheckpointMismatchError, match="features_only=True"):
        create_model(name, pretrained=path, **over)


@pytest.mark.registry
@pytest.mark.parametrize("name", distinct_reduced_presets())
def test_pruned_features_model_keeps_only_what_its_maps_need(name: str) -> None:
    """``out_indices=(0,)`` (the first level): the layers after it and the final norm are gone (fewer parameters
    whenever the model has more than one level), a full checkpoint still loads strictly, the map equals the full
    model's, and every parameter left gets a gradient from it (DDP needs no ``find_unused_parameters``)."""
    over = small_overrides(name)
    full = create_model(name, **over).eval()
    feats = create_model(name, features_only=True, out_indices=(0,), **over)
    feats.load_state_dict(full.state_dict())  # strict: the pruned layers' keys are ignored like the head's
    x = _input(full)
    with torch.no_grad():
        ref = full.forward_intermediates(x, indices=(0,), intermediates_only=True)[0]
        torch.testing.assert_close(feats.eval()(x)[0], ref)
    if len(full.feature_info) > 1:
        assert feats.pruned_keys and sum(p.numel() for p in feats.parameters()) < sum(
            p.numel() for p in full.parameters())
    feats.train()
    feats(x)[0].float().square().mean().backward()
    unused = [n for n, p in feats.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, f"parameters without a gradient: {unused[:6]}"


def test_feature_prune_is_recorded_and_needs_features_only(tmp_path) -> None:
    """A pruned features model's file says so and loads back pruned; a full file loads into it; the option
    outside ``features_only`` raises, naming it."""
    from vit_attention import load_model, save_weights
    from vit_attention.weights.load import CheckpointMismatchError

    name = "vit_digits_patch2_8"
    feats = create_model(name, features_only=True, out_indices=(1,))
    assert len(feats.blocks) == 2 and feats.feature_prune
    path = save_weights(feats, tmp_path / "pruned.safetensors")
    back = load_model(path)
    assert back.feature_prune and len(back.blocks) == 2 and back.pruned_keys == feats.pruned_keys
    with pytest.raises(CheckpointMismatchError, match="blocks.2"):  # deeper levels are not in the file
        create_model(name, features_only=True, pretrained=path, out_indices=(1, 3))
    with pytest.raises(ValueError, match="feature_prune"):
        create_model(name, feature_prune=False)


@pytest.mark.parametrize("out_indices", [(1, 3), (4,), (0, 2, 4)])
def test_vitdet_features_keep_only_the_pyramid_branches_they_read(out_indices: tuple[int, ...]) -> None:
    """ViTDet's pyramid levels are parallel branches of the last block: a features model keeps the ones its
    levels read (p6 reads p5's), so every parameter gets a gradient; the maps equal the full model's."""
    name = "vitdet_base_patch16_1024"
    over = small_overrides(name)
    full = create_model(name, **over).eval()
    feats = create_model(name, features_only=True, out_indices=out_indices, **over)
    feats.load_state_dict(full.state_dict())
    levels = full.pyramid_levels
    kept = {f"simfp_{levels[i][1:]}" for i in out_indices if levels[i] != "p6"} | (
        {"simfp_5"} if "p6" in [levels[i] for i in out_indices] else set())
    assert {n for n, m in feats.named_children() if n.startswith("simfp_") and m is not None} == kept
    x = _input(full)
    with torch.no_grad():
        want = full.forward_intermediates(x, list(out_indices), intermediates_only=True)
        for got, ref in zip(feats.eval()(x), want, strict=True):
            torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert set(feats.output_shape()) == {levels[i] for i in out_indices} | ({"p5"} if "simfp_5" in kept else set())
    feats.train()
    sum(m.square().mean() for m in feats(x)).backward()
    assert not [n for n, p in feats.named_parameters() if p.grad is None]
    with pytest.raises(ValueError, match="removed by prune_intermediate_layers"):
        feats.pyramid_from_map(torch.zeros(1, 2, 2, feats.embed_dim), ["p2", "p3"])
