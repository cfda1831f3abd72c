"""timm's ``forward_intermediates(..., stop_early=)`` on every family and ``pool_include_prefix`` on the ViT-like ones
(timm 1.0 ``VisionTransformer``: ``stop_early`` runs no block after the last chosen index; ``pool_include_prefix``
pools the class / register tokens too in ``avg`` / ``map``)."""

from __future__ import annotations

import pytest
import torch
from model_outputs import first_preset_per_family, small_overrides

from vit_attention import create_model, load_model, save_weights

FAMILIES = sorted(first_preset_per_family().values())


def _model(name: str, **over: object) -> tuple[torch.nn.Module, torch.Tensor]:
    model = create_model(name, **{**small_overrides(name), **over}).eval()
    size = model.cfg.img_size if isinstance(model.cfg.img_size, (tuple, list)) else (model.cfg.img_size,) * 2
    return model, torch.randn(2, model.cfg.in_chans, *size)


def _calls(model: torch.nn.Module, fn):  # type: ignore[no-untyped-def]
    """``(number of module forwards, fn())``."""
    n = [0]
    hooks = [m.register_forward_hook(lambda *a: n.__setitem__(0, n[0] + 1)) for m in model.modules()]
    try:
        with torch.no_grad():
            out = fn()
    finally:
        for h in hooks:
            h.remove()
    return n[0], out


@pytest.mark.registry
@pytest.mark.parametrize("name", FAMILIES)
def test_stop_early_runs_nothing_after_the_first_index_and_keeps_the_intermediates(name: str) -> None:
    model, x = _model(name)
    full_calls, (_, full) = _calls(model, lambda: model.forward_intermediates(x, indices=[0]))
    calls, (final, outs) = _calls(model, lambda: model.forward_intermediates(x, indices=[0], stop_early=True))
    assert len(outs) == len(full) == 1
    torch.testing.assert_close(outs[0], full[0], rtol=0, atol=0)
    with torch.no_grad():
        only = model.forward_intermediates(x, indices=[0], stop_early=True, intermediates_only=True)
    torch.testing.assert_close(only[0], full[0])  # no hooks now: the blocks' fused inference path
    if getattr(model, "pyramid_levels", None):  # ViTDet's levels all read the last block's map
        assert calls == full_calls
    else:
        assert calls < full_calls and final.shape[0] == x.shape[0]


def test_stop_early_final_is_the_last_chosen_block_through_the_norm_as_timm() -> None:
    model, x = _model("deit3_base_patch16_224", depth=3)
    with torch.no_grad():
        final, _ = model.forward_intermediates(x, indices=[1], stop_early=True)
        ((grid, prefix),) = model.forward_intermediates(x, indices=[1], norm=True, output_fmt="NLC",
                                                        return_prefix_tokens=True, intermediates_only=True)
        full, _ = model.forward_intermediates(x, indices=[1])
    torch.testing.assert_close(final, torch.cat([prefix, grid], dim=1))
    assert not torch.allclose(final, full)  # block 2 did not run


def test_stop_early_of_a_staged_model_before_its_last_stage_is_that_stages_map() -> None:
    model, x = _model("swin_base_patch4_window12_384")
    with torch.no_grad():
        final, (first,) = model.forward_intermediates(x, indices=[0], stop_early=True, output_fmt="NHWC")
        last, _ = model.forward_intermediates(x, indices=[-1], stop_early=True)
    torch.testing.assert_close(final, first)  # no final norm: it belongs to the last stage's width
    torch.testing.assert_close(last, model.forward_features(x))  # the last stage: as forward_features


@pytest.mark.parametrize("pool", ["avg", "map"])
def test_pool_include_prefix_pools_the_prefix_tokens_too(pool: str) -> None:
    base, x = _model("deit3_base_patch16_224", global_pool=pool, reg_tokens=2)
    model = create_model("deit3_base_patch16_224", **small_overrides("deit3_base_patch16_224"), global_pool=pool,
                         reg_tokens=2, pool_include_prefix=True).eval()
    model.load_state_dict(base.state_dict())
    with torch.no_grad():
        feats = model.forward_features(x)  # [B, 3 + N, C]
        pooled = model.pool(feats)
        ref = feats.mean(dim=1) if pool == "avg" else model.attn_pool(feats)
        torch.testing.assert_close(pooled, ref)
        assert not torch.allclose(pooled, base.pool(feats))  # the default leaves the 3 prefix tokens out
        assert not torch.allclose(model(x), base(x))


def test_pool_include_prefix_is_a_saved_config_option(tmp_path) -> None:
    model, x = _model("vit_base_patch16_clip_224", global_pool="avg", pool_include_prefix=True)
    save_weights(model, tmp_path / "m.safetensors")
    again = load_model(tmp_path / "m.safetensors")
    assert again.cfg.pool_include_prefix is True
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x))
    with pytest.raises(TypeError, match="pool_include_prefix must be a bool"):
        create_model("deit3_base_patch16_224", pool_include_prefix="yes")


@pytest.mark.parametrize("pool", ["avg", "map"])
def test_naflexvit_packed_pooling_includes_the_prefix_tokens_as_the_tensor_path(pool: str) -> None:
    model, x = _model("naflexvit_base_patch16_gap", global_pool=pool, pool_include_prefix=True)
    with torch.no_grad():
        torch.testing.assert_close(model(list(x)), model(x), atol=1e-5, rtol=1e-5)
