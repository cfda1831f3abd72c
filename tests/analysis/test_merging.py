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


def test_attention_maps_of_a_merged_model_stay_in_image_space() -> None:
    """Recorded weights among merged tokens come back on the original tokens: one row per patch, a merged key's
    weight shared by its patches (rows sum to 1), patches of one token with the same row; nothing merged: the
    unmerged maps."""
    from vit_attention.analysis import record_attention

    torch.manual_seed(0)
    model = va.create_model("vit_tiny_patch16_224", img_size=64, depth=3, num_classes=3).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad(), record_attention(model) as plain:
        model(x)
    model.set_token_merging([0, 0, 0])
    with torch.no_grad(), record_attention(model) as zeros:
        model(x)
    for a, b in zip(plain.records, zeros.records):
        torch.testing.assert_close(a.weights, b.weights, rtol=1e-5, atol=1e-6)
    model.set_token_merging(4)
    with torch.no_grad(), record_attention(model) as rec:
        model(x)
    groups = merge_groups(model, x)
    assert [tuple(r.weights.shape) for r in rec.records] == [(2, 3, 17, 17)] * 3  # 1 + 16 tokens, every block
    last = rec.records[-1].weights  # block 2 ran on 17 - 4 - 4 = 9 tokens
    torch.testing.assert_close(last.sum(-1), torch.ones(2, 3, 17))
    g = groups[1][0].flatten()  # after block 1: the grouping block 2 attended over
    same = (g[:, None] == g[None]).nonzero()
    torch.testing.assert_close(last[0, :, 1 + same[:, 0]], last[0, :, 1 + same[:, 1]])
    assert rec.image_map(layer=-1).shape == (2, 4, 4)


def test_attn_cli_with_token_merging(tmp_path: Path) -> None:
    from PIL import Image

    from vit_attention.cli import main

    model = va.create_model("vit_digits_patch2_8", num_classes=10, in_chans=1, depth=2).eval()
    va.save_weights(model, tmp_path / "run" / "model.safetensors",
                    metadata={"classes": [str(i) for i in range(10)], "mean": [0.3], "std": [0.2], "data": "digits",
                              "crop_pct": 1.0, "val_fraction": 0.25, "split_seed": 0})
    Image.new("L", (8, 8), 128).save(tmp_path / "d.png")
    assert main(["attn", str(tmp_path / "run"), str(tmp_path / "d.png"), "--tome", "3", "--output",
                 str(tmp_path / "maps")]) == 0
    assert list((tmp_path / "maps").glob("*.png"))
