"""The stage scaffold shared by hierarchical families: Stage, drop-path schedule, checkpointing, intermediates."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from vit_attention.layers import (
    Block,
    ClassifierHead,
    HierarchicalMixin,
    PatchMerging,
    Stage,
    drop_path_schedule,
    resolve_indices,
    run_blocks,
    stage_feature_info,
)


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


class _Toy(HierarchicalMixin, nn.Module):
    """Two stages of the scaffold: the least a new hierarchical family writes."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 4, stride=4)
        self.stages = nn.Sequential(Stage([Block(16, 2)]), _stage())
        self.norm = nn.LayerNorm(32)
        self.head = ClassifierHead(32, 5)
        self.feature_info = stage_feature_info((16, 32), (4, 8))

    def _embed(self, x: Tensor) -> Tensor:
        return self.stem(x).permute(0, 2, 3, 1)  # [B, H/4, W/4, 16]


def test_hierarchical_mixin_intermediates_and_checkpointing() -> None:
    model = _Toy().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        only = model.forward_intermediates(x, indices=[-1], output_fmt="NHWC", intermediates_only=True)
    assert [tuple(m.shape) for m in maps] == [(2, 16, 8, 8), (2, 32, 4, 4)]
    assert final.shape == (2, 4, 4, 32) and model.head(final).shape == (2, 5)
    torch.testing.assert_close(only[0], maps[1].permute(0, 2, 3, 1))
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NLC")
    model.set_grad_checkpointing()
    assert all(s.grad_checkpointing for s in model.stages)
