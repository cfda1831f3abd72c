"""NAT / DiNAT: published GMACs (the paper's count), any input size, the original SHI-Labs checkpoint layout
against a dense-oracle forward, and the DiNAT dilation schedule."""

from __future__ import annotations

import math

import pytest
import torch
from fixture_utils import add_noise

from vit_attention import create_model
from vit_attention.analysis.flops import flops
from vit_attention.analysis.published import matches_published
from vit_attention.attention.neighborhood import NeighborhoodAttention
from vit_attention.models import get_model_entry, list_models
from vit_attention.weights import load_weights

NAMES = list_models("nat_*") + list_models("dinat_*")


def test_all_presets_registered() -> None:
    assert set(NAMES) == {"nat_mini", "nat_tiny", "nat_small", "nat_base", "dinat_mini", "dinat_tiny", "dinat_small",
                          "dinat_base", "dinat_large"}


@pytest.mark.registry
@pytest.mark.parametrize("name", NAMES)
def test_published_gmacs_with_exact_neighbourhoods(name: str) -> None:
    """With ``tile_size=1`` each query computes exactly its K² logits: the papers' count (meta device)."""
    published = get_model_entry(name).meta["published_gmacs_tile1"]
    with torch.device("meta"):
        model = create_model(name, attn_kwargs={"tile_size": 1})
    assert matches_published(flops(model, (1, 3, 224, 224)).gmacs, published)


def test_dinat_schedule_and_nat_layer_scale() -> None:
    with torch.device("meta"):
        dinat = create_model("dinat_tiny")
        nat_small = create_model("nat_small")
    dil = [[blk.attn.dilation[0] for blk in level.blocks] for level in dinat.levels]
    assert dil[0] == [1, 8, 1] and dil[1] == [1, 4, 1, 4] and dil[2][:4] == [1, 2, 1, 2] and set(dil[3]) == {1}
    assert nat_small.levels[0].blocks[0].ls1.gamma.shape == (96,)
    assert dinat.feature_info[-1] == dict(num_chs=512, reduction=32, module="levels.3")


@pytest.mark.parametrize("size", [(64, 64), (72, 40)])
def test_any_input_size(size: tuple[int, int]) -> None:
    """Small and odd sizes: levels below K·d are padded inside the mechanism."""
    torch.manual_seed(0)
    m = create_model("dinat_mini", num_classes=5, embed_dim=16, depths=(1, 2, 1, 1), num_heads=(1, 2, 2, 4),
                     dilations=((1,), (1, 4), (2,), (1,))).eval()
    with torch.no_grad():
        out = m(torch.randn(2, 3, *size))
        final, maps = m.forward_intermediates(torch.randn(1, 3, *size))
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    assert [t.shape[1] for t in maps] == [16, 32, 64, 128]
    assert maps[0].shape[-2:] == (math.ceil(size[0] / 4), math.ceil(size[1] / 4))


def _dense_attend(self: NeighborhoodAttention, qkv: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
    """An independent oracle for :meth:`NeighborhoodAttention.attend`: the whole map, the NATTEN window as mask."""
    B, H, W, C3 = qkv.shape
    C, nh = C3 // 3, self.num_heads
    (K, _), (d, _) = self.kernel_size, self.dilation

    def window(p: int, length: int) -> list[int]:
        g, s = p % d, p // d
        start = min(max(s - K // 2, 0), math.ceil((length - g) / d) - K)
        return [g + d * u for u in range(start, start + K)]

    q, k, v = qkv.reshape(B, H * W, 3, nh, C // nh).permute(2, 0, 3, 1, 4)
    logits = (q * self.scale) @ k.transpose(-1, -2)  # [B, nh, N, N]
    bias = torch.full((nh, H * W, H * W), float("-inf"))
    for i in range(H):
        for j in range(W):
            for r in window(i, H):
                for c in window(j, W):
                    bias[:, i * W + j, r * W + c] = self.rpb[:, (r - i) // d + K - 1, (c - j) // d + K - 1]
    return ((logits + bias).softmax(-1) @ v).transpose(1, 2).reshape(B, H, W, C)


def test_original_layout_loads_and_matches_the_oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state dict in the SHI-Labs layout (downsamplers at the end of levels, gamma1/gamma2, head) loads through
    load_weights; the model then equals the same weights run with dense masked attention."""
    torch.manual_seed(0)
    over = dict(num_classes=7, embed_dim=16, depths=(2, 1, 2, 1), num_heads=(2, 2, 4, 4), kernel_size=3,
                layer_scale=0.5, dilations=((1, 2), (1,), (2, 1), (1,)))
    src = create_model("dinat_small", **over).eval()
    add_noise(src, 0.1)
    original = {}
    for k, v in src.state_dict().items():  # ours -> the original's names (the inverse of the converter)
        parts = k.split(".")
        if parts[0] == "levels" and parts[2] == "downsample":
            k = ".".join(["levels", str(int(parts[1]) - 1), *parts[2:]])
        k = k.replace(".ls1.gamma", ".gamma1").replace(".ls2.gamma", ".gamma2").replace("head.fc.", "head.")
        original[k] = v.clone()
    assert "levels.0.downsample.reduction.weight" in original and "levels.0.blocks.0.gamma1" in original
    dst = create_model("dinat_small", **over).eval()
    report = load_weights(dst, original)
    assert report.ok, report
    x = torch.randn(2, 3, 48, 40)
    with torch.no_grad():
        out = dst(x)
        monkeypatch.setattr(NeighborhoodAttention, "attend", _dense_attend)
        ref = src(x)
    err = (out - ref).abs().max() / ref.abs().max()
    assert err <= 1e-5, err
