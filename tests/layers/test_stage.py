"""The stage scaffold shared by hierarchical families: Stage, drop-path schedule, checkpointing, intermediates."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from vit_attention.layers import (
    Block,
    ClassifierHead,
    PatchMerging,
    Stage,
    Tokens,
    as_map,
    drop_path_schedule,
    resolve_indices,
    run_blocks,
    run_blocks_with_taps,
    run_stages,
    stage_feature_info,
)
from vit_attention.layers.stage import staged_intermediates


def test_drop_path_schedule_is_linear_over_all_blocks() -> None:
    rates = drop_path_schedule(0.3, (2, 0, 2))
    assert [len(r) for r in rates] == [2, 0, 2]
    assert sum(rates, []) == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert drop_path_schedule(0.5, (1,)) == [[0.0]]


def test_feature_info_and_indices() -> None:
    info = stage_feature_info((16, 32), (4, 8), "layers")
    assert info == [dict(num_chs=16, reduction=4, module="layers.0"), dict(num_chs=32, reduction=8, module="layers.1")]
    assert resolve_indices(None, 3) == [0, 1, 2] and resolve_indices(1, 3) == [2] and resolve_indices([-1], 3) == [2]
    with pytest.raises(ValueError, match="stage indices"):
        resolve_indices([3], 3, "stage")


def _stage(norm: nn.Module | None = None) -> Stage:
    blocks = [Block(32, 2, attn_layer="window", attn_kwargs=dict(window_size=2, shift_size=s)) for s in (0, 1)]
    return Stage(blocks, PatchMerging(16, 32), norm)


def test_stage_downsamples_then_runs_blocks_then_norm() -> None:
    torch.manual_seed(0)
    stage = _stage(nn.LayerNorm(32)).eval()
    x = torch.randn(2, 5, 6, 16)  # odd side: PatchMerging pads
    with torch.no_grad():
        y = stage(x)
        ref = stage.norm(stage.blocks[1](stage.blocks[0](stage.downsample(x))))
    assert y.shape == (2, 3, 3, 32)
    torch.testing.assert_close(y, ref)
    keys = set(stage.state_dict())
    assert {"downsample.reduction.weight", "blocks.1.attn.qkv.weight", "norm.weight"} <= keys
    assert not any(k.startswith("norm.") for k in _stage().state_dict())  # no norm: no keys


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    torch.manual_seed(0)
    stage = _stage()
    x = torch.randn(2, 4, 4, 16)
    grads = []
    for ckpt in (False, True):
        stage.grad_checkpointing = ckpt
        stage.zero_grad()
        stage(x).square().sum().backward()
        grads.append([p.grad.clone() for p in stage.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    lin = nn.Linear(3, 3)
    torch.testing.assert_close(run_blocks([lin, lin], torch.ones(1, 3), checkpoint=True), lin(lin(torch.ones(1, 3))))


def test_staged_intermediates_gives_each_stage_map_and_the_final_normalised_map() -> None:
    """Two stages of the scaffold, the least a hierarchical family writes: stage maps, final norm, checkpointing."""
    torch.manual_seed(0)
    stem = nn.Conv2d(3, 16, 4, stride=4)
    stages = nn.Sequential(Stage([Block(16, 2)]), _stage()).eval()
    norm = nn.LayerNorm(32)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        embedded = stem(x).permute(0, 2, 3, 1)  # [B, H/4, W/4, 16]
        final, maps = staged_intermediates(stages, embedded, None, norm)
        only = staged_intermediates(stages, embedded, [-1], norm, output_fmt="NHWC", intermediates_only=True)
        torch.testing.assert_close(final, norm(stages(embedded)))
    assert [tuple(m.shape) for m in maps] == [(2, 16, 8, 8), (2, 32, 4, 4)]
    assert final.shape == (2, 4, 4, 32) and ClassifierHead(32, 5)(final).shape == (2, 5)
    torch.testing.assert_close(only[0], maps[1].permute(0, 2, 3, 1))
    with pytest.raises(ValueError, match="output_fmt"):
        staged_intermediates(stages, embedded, None, norm, output_fmt="NLC")
    assert stage_feature_info((16, 32), (4, 8))[1] == dict(num_chs=32, reduction=8, module="stages.1")


class _ClassTokenEmbed(nn.Module):
    """A token embedding: linear patch map -> Tokens with one class token in front."""

    def __init__(self, cin: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(cin, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))

    def forward(self, x: Tensor) -> Tokens:
        x = self.proj(x)  # [B, H, W, C]
        B, H, W, C = x.shape
        return Tokens(torch.cat([self.cls_token.expand(B, -1, -1), x.reshape(B, H * W, C)], 1), (H, W), 1)


def test_stage_after_a_token_embedding_runs_blocks_on_tokens_and_gives_tokens() -> None:
    torch.manual_seed(0)
    blocks = [Block(32, 2, attn_layer="mhsa") for _ in range(2)]
    stage = Stage(blocks, _ClassTokenEmbed(16, 32), nn.LayerNorm(32)).eval()
    x = torch.randn(3, 4, 5, 16)
    with torch.no_grad():
        out = stage(x)
        t = stage.downsample(x)
        ref = stage.norm(blocks[1](blocks[0](t.x, (4, 5), 1), (4, 5), 1))
        # the previous stage's Tokens are taken as their map (prefix dropped)
        again = stage(Tokens(torch.cat([torch.zeros(3, 2, 16), x.reshape(3, 20, 16)], 1), (4, 5), 2))
    assert isinstance(out, Tokens) and out.feat_size == (4, 5) and out.num_prefix_tokens == 1
    assert out.x.shape == (3, 21, 32)
    torch.testing.assert_close(out.x, ref)
    torch.testing.assert_close(again.x, out.x)
    torch.testing.assert_close(out.to_map(), out.x[:, 1:].reshape(3, 4, 5, 32))
    assert as_map(out).shape == (3, 4, 5, 32) and as_map(x) is x
    assert out.to_map().shape[0] == 3 and stage(x[:0]).to_map().shape == (0, 4, 5, 32)  # B = 0 keeps its shape


def test_token_stage_chunks_at_cpu_inference_and_never_in_training() -> None:
    from vit_attention.functional.chunking import CHUNK_ELEMENTS

    torch.manual_seed(0)
    stage = Stage([Block(32, 2, attn_layer="mhsa")], _ClassTokenEmbed(16, 32)).eval()
    x = torch.randn(4, 3, 3, 16)
    calls: list[int] = []
    stage.blocks[0].register_forward_pre_hook(lambda m, a: calls.append(a[0].shape[0]))
    with torch.no_grad():
        whole = stage(x).x
        stage.blocks[0]._forward_pre_hooks.clear()  # hooks keep the batch whole: count through a wrapper instead
        seen: list[int] = []
        run = stage._run
        stage._run = lambda t, *a: (seen.append(t.shape[0]), run(t, *a))[1]  # type: ignore[method-assign]
        with CHUNK_ELEMENTS.override(10 * 32):  # one image's tokens (10 x 32) per chunk
            chunked = stage(x).x
            stage.train()
            trained = stage(x).x
    assert calls == [4] and seen == [1, 1, 1, 1, 4]
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(trained, whole, atol=1e-5, rtol=1e-5)


def test_run_blocks_with_taps_keeps_chosen_outputs_and_runs_layers_after_blocks() -> None:
    lins = [nn.Linear(3, 3) for _ in range(4)]
    x = torch.randn(2, 3)
    double = {1: lambda t: 2 * t}
    y, saved = run_blocks_with_taps(lins, x, taps={0, 1, 3}, after=double)
    ref0 = lins[0](x)
    ref1 = 2 * lins[1](ref0)  # the layer after block 1 runs before the tap
    ref3 = lins[3](lins[2](ref1))
    torch.testing.assert_close(saved[0], ref0)
    torch.testing.assert_close(saved[1], ref1)
    torch.testing.assert_close(saved[2], ref3)
    torch.testing.assert_close(y, ref3)
    y2, none = run_blocks_with_taps(lins, x)
    assert none == [] and torch.equal(y2, run_blocks(lins, x))
    y3, none = run_blocks_with_taps(lins, x, after=double)
    assert none == [] and torch.allclose(y3, ref3)


def test_run_stages_taps_maps_and_normalises_the_last() -> None:
    torch.manual_seed(0)
    stages = nn.Sequential(Stage([Block(16, 2)]), Stage([Block(32, 2, attn_layer="mhsa")], _ClassTokenEmbed(16, 32)))
    norm = nn.LayerNorm(32)
    x = torch.randn(2, 4, 4, 16)
    with torch.no_grad():
        out, maps = run_stages(stages, x, {0, 1}, last_norm=norm, output_fmt="NHWC")
        ref0 = stages[0](x)
    assert isinstance(out, Tokens)
    torch.testing.assert_close(maps[0], ref0)
    torch.testing.assert_close(maps[1], norm(out.to_map()))
    with pytest.raises(ValueError, match="output_fmt"):
        run_stages(stages, x, output_fmt="NLC")
