"""merge_groups: the patches each merged token covers, per block; save_merge_groups draws them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vit_attention as va
from vit_attention.analysis.merging import merge_groups
from vit_attention.analysis.render import save_merge_groups


def test_groups_follow_the_schedule_and_draw(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = va.create_model("vit_tiny_patch16_224", img_size=64, depth=4, num_classes=3).eval()
    with pytest.raises(ValueError, match="set_token_merging"):
        merge_groups(model, torch.randn(1, 3, 64, 64))
    model.set_token_merging(3)
    groups = merge_groups(model, torch.randn(2, 3, 64, 64))
    assert [tuple(g.shape) for g in groups] == [(2, 4, 4)] * 4
    for g, kept in zip(groups, (13, 10, 7, 4)):
        assert all(int(g[b].unique().numel()) == kept for b in range(2))  # 16 patches, 3 fewer tokens per block
    last = merge_groups(model, torch.randn(1, 3, 64, 64), blocks=[-1])
    assert len(last) == 1 and int(last[0].unique().numel()) == 4
    out = save_merge_groups([torch.rand(3, 64, 64)], [[g[0] for g in groups]], [f"b{i}" for i in range(4)],
                            tmp_path / "m.png")
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="one list of group maps per image"):
        save_merge_groups([torch.rand(3, 8, 8)], [], [], tmp_path / "x.png")
