"""Token merging (ToMe) on the token models: r=0 changes nothing, prefix tokens are never merged, the schedule
is followed, outputs stay in image space, and the families where merging has no meaning refuse by name."""

from __future__ import annotations

import re
from unittest import mock

import pytest
import torch
from model_outputs import build, first_preset_per_family, small_overrides

from vit_attention import create_model
from vit_attention.functional import tome as tome_fn
from vit_attention.models.token_merging import TokenMergingMixin

FAMILIES = first_preset_per_family()


def _refusal(name: str) -> str | None:
    """Why the family's representative refuses token merging, read from the model (None: it merges): a family
    without the mixin names its ``token_merging_note``, a token model its ``_merging_obstacle()``."""
    with torch.device("meta"):
        model = create_model(name, **small_overrides(name))
    if not isinstance(model, TokenMergingMixin):
        return model.token_merging_note
    return model._merging_obstacle()


REFUSALS = {n: _refusal(n) for n in FAMILIES.values()}
MERGING = sorted(n for n, why in REFUSALS.items() if why is None)
# code paths beyond each family's first preset: registers, two prefix tokens, RoPE-Mixed, post-norm, parallel,
# MAP pooling, QK-norm
EXTRA = ["vit_base_patch14_reg4_dinov2", "deit_tiny_distilled_patch16_224", "vit_base_patch16_rope_mixed_224",
         "vit_base_patch16_224_postnorm", "vit_small_parallel_qknorm_patch16_224", "vit_base_patch16_siglip_224"]
REFUSING = sorted(n for n, why in REFUSALS.items() if why is not None)


def _model(name: str, depth: int | None = None) -> tuple[torch.nn.Module, torch.Tensor]:
    over = small_overrides(name)
    if depth is not None:
        over["depth"] = depth
    model, x = build(name, over)
    return model, x


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(set(MERGING + EXTRA)))
def test_r_zero_schedule_changes_nothing(name: str) -> None:
    """The merging path with nothing merged (a schedule of zeros: sizes, log-size bias, metric, RoPE at carried
    positions all run) equals the model without merging, LayerScale, registers and RoPE included."""
    model, x = _model(name)
    with torch.no_grad():
        ref = model.forward_features(x)
        model.set_token_merging([0] * len(model.blocks))
        out = model.forward_features(x)
        model.set_token_merging(0)
        off = model.forward_features(x)
    assert model.token_merging is None and torch.equal(off, ref)
    assert (out - ref).abs().max().item() <= 1e-6


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(set(MERGING + EXTRA)))
def test_merging_follows_the_schedule_and_never_merges_prefix_tokens(name: str) -> None:
    model, x = _model(name, depth=3)
    P = model.num_prefix_tokens
    states: list[tome_fn.TokenMergeState] = []
    real = tome_fn.TokenMergeState.__init__

    def spy(self: tome_fn.TokenMergeState, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        states.append(self)

    model.set_token_merging(3)
    with torch.no_grad(), mock.patch.object(tome_fn.TokenMergeState, "__init__", spy):
        out = model.forward_features(x)
        logits = model.forward_head(out)
    (state,) = states
    assert out.shape[:2] == (x.shape[0], P + state.num_tokens - state.num_prefix) and logits.shape[0] == x.shape[0]
    P = state.num_prefix  # the blocks' prefix tokens (CaiT adds its class token after them)
    N = state.num_tokens - P
    expected, left = [], N
    for _ in range(3):
        expected.append(min(3, left // 2))
        left -= expected[-1]
    assert state.removed == expected
    tm = state.token_map
    assert tm is not None and torch.equal(tm[:, :P], torch.arange(P).expand(x.shape[0], -1))
    assert bool((tm[:, P:] >= P).all())  # no grid token ever lands on a prefix token
    assert torch.equal(state.size[:, :P], torch.ones(x.shape[0], P, 1))
    assert int(state.size.sum(1).min()) == P + N  # every patch still counted once
    # image space: tokens covered by the same merged token are equal, the others are not forced to be
    same = tm[0, P:, None] == tm[0, None, P:]
    grid = out[0, out.shape[1] - N:]
    assert torch.allclose(grid[same.nonzero()[:, 0]], grid[same.nonzero()[:, 1]])


def test_merging_speeds_up_by_dropping_tokens_and_trains() -> None:
    name = FAMILIES["vit"]
    model, x = _model(name, depth=2)
    model.train()
    model.set_token_merging(4)
    model(x).sum().backward()  # gradients flow through the merges
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad and "head" not in n)
    inter = model.eval().forward_intermediates(x, [0, 1], output_fmt="NCHW", intermediates_only=True)
    assert [tuple(t.shape[-2:]) for t in inter] == [model.feat_size(tuple(x.shape[-2:]))] * 2


@pytest.mark.registry
@pytest.mark.parametrize("name", REFUSING)
def test_families_without_token_blocks_refuse_by_name(name: str) -> None:
    with torch.device("meta"):
        model = create_model(name, **small_overrides(name))
    model.set_token_merging(0)  # off is always fine
    with pytest.raises(ValueError, match=f"token merging.*{re.escape(REFUSALS[name])}"):
        model.set_token_merging(2)
    assert getattr(model, "token_merging", None) is None


@pytest.mark.registry
@pytest.mark.parametrize("name", sorted(set(MERGING + EXTRA)))
def test_save_weights_and_load_model_keep_token_merging(name: str, tmp_path) -> None:
    """load_model gives back the merged model bit for bit: the schedule and prop_attn travel in the file."""
    from vit_attention import load_model, save_weights

    model, x = _model(name)
    for r, prop_attn in ((3, True), ((4, -1.0), False)):
        model.set_token_merging(r, prop_attn=prop_attn)
        loaded = load_model(save_weights(model, tmp_path / "m.safetensors"))
        assert loaded.token_merging == model.token_merging
        with torch.no_grad():
            assert torch.equal(loaded(x), model(x))
    model.set_token_merging(0)  # off is recorded as off
    assert load_model(save_weights(model, tmp_path / "off.safetensors")).token_merging is None


def test_bad_schedules_are_refused() -> None:
    model, _ = _model(FAMILIES["vit"], depth=2)
    with pytest.raises(ValueError, match="r must be an int >= 0"):
        model.set_token_merging(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per-block r must list 2 ints"):
        model.set_token_merging([1, 2, 3])
    with pytest.raises(ValueError, match="r must be >= 0"):
        model.set_token_merging(-1)
    assert model.token_merging is None


@pytest.mark.registry
@pytest.mark.parametrize("name", ["vit_base_patch16_224", "vit_base_patch14_reg4_dinov2", "eva02_base_patch14_224"])
def test_flops_with_merging_equal_the_measured(name: str) -> None:
    """Analytic FLOPs of a merged model (its blocks on fewer tokens, plus the matching products) equal what
    torch's FlopCounterMode measures, at the preset's full size (meta device). RoPE's rotations are elementwise
    products the analytic count includes (``4·T·C`` per block) and FlopCounterMode does not: the difference
    is exactly those, at each block's merged token count."""
    from vit_attention.analysis import flops, measure_flops

    with torch.device("meta"):
        model = create_model(name)
    size = model.cfg.img_size if isinstance(model.cfg.img_size, int) else model.cfg.img_size[0]
    B, P = 2, model.num_prefix_tokens
    shape = (B, 3, size, size)
    full = flops(model, shape).total
    N = model.patch_embed.num_patches
    r = max(8, N // (2 * len(model.blocks)))  # about half the tokens gone by the last block
    model.set_token_merging(r)
    report = flops(model, shape)
    rope, T = 0, P + N
    for blk in model.blocks:
        if blk.attn.rope is not None:
            rope += B * blk.attn.rope.flops(T)
        T -= min(r, (T - P) // 2)
    assert report.total - measure_flops(model, shape)[0] == rope
    assert report.modules["token merging"] > 0 and report.total < 0.8 * full
