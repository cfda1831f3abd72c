import pytest
import torch

from vit_attention.functional import resample_abs_pos_embed, sincos_2d_pos_embed


def test_sincos_layout():
    pe = sincos_2d_pos_embed(16, (3, 5))
    assert pe.shape == (15, 16)
    # token (y=0, x=0): sin parts 0, cos parts 1
    torch.testing.assert_close(pe[0], torch.tensor([0.0] * 4 + [1.0] * 4 + [0.0] * 4 + [1.0] * 4))
    # the x quarter of token (y=0, x=1) is sin(1 * omega)
    omega = 1 / 10000 ** (torch.arange(4) / 4)
    torch.testing.assert_close(pe[1, 8:12], torch.sin(omega))
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d_pos_embed(10, (2, 2))


def test_resample_keeps_prefix_and_identity():
    pos = torch.randn(1, 1 + 16, 8)
    assert resample_abs_pos_embed(pos, (4, 4)) is pos
    out = resample_abs_pos_embed(pos, (6, 2))
    assert out.shape == (1, 1 + 12, 8)
    torch.testing.assert_close(out[:, :1], pos[:, :1])
    # a constant grid stays constant under interpolation
    const = torch.ones(1, 16, 8)
    torch.testing.assert_close(resample_abs_pos_embed(const, (7, 7), num_prefix_tokens=0), torch.ones(1, 49, 8))


def test_resample_errors():
    with pytest.raises(ValueError, match="square grid"):
        resample_abs_pos_embed(torch.randn(1, 1 + 15, 8), (4, 4))
    with pytest.raises(ValueError, match="old_size"):
        resample_abs_pos_embed(torch.randn(1, 16, 8), (4, 4), (3, 3), num_prefix_tokens=0)


# ---------------------------------------------------------------- resize rules (timm 1.0.31, DINOv2, HF)
def _original_dinov2(pos: torch.Tensor, h0: int, w0: int) -> torch.Tensor:
    """The original plain DINOv2 ``interpolate_pos_encoding`` call (``interpolate_offset=0.1``,
    ``interpolate_antialias=False``), written out independently: ``[1, 1 + M*M, C] -> [1, 1 + h0*w0, C]``."""
    N = pos.shape[1] - 1
    M = int(N ** 0.5)
    dim = pos.shape[-1]
    sx, sy = float(h0 + 0.1) / M, float(w0 + 0.1) / M  # the original's (swapped) names: x is the row axis
    patch = torch.nn.functional.interpolate(pos[:, 1:].float().reshape(1, M, M, dim).permute(0, 3, 1, 2),
                                            scale_factor=(sx, sy), mode="bicubic", antialias=False)
    assert tuple(patch.shape[-2:]) == (h0, w0)
    return torch.cat([pos[:, :1], patch.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


def _hf_size(pos: torch.Tensor, h0: int, w0: int, antialias: bool) -> torch.Tensor:
    """HF ``Dinov2Embeddings`` (no antialias) / ``Dinov2WithRegistersEmbeddings`` (antialias): ``size=``."""
    M, dim = int((pos.shape[1] - 1) ** 0.5), pos.shape[-1]
    patch = torch.nn.functional.interpolate(pos[:, 1:].reshape(1, M, M, dim).permute(0, 3, 1, 2), size=(h0, w0),
                                            mode="bicubic", align_corners=False, antialias=antialias)
    return torch.cat([pos[:, :1], patch.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


SIZES = [(16, 16), (32, 32), (46, 46), (16, 24), (40, 60)]


@pytest.mark.parametrize("size", SIZES)
def test_rules_match_their_sources_and_differ(size):
    """37^2 N(0, 1) table: "dinov2" == the original plain call exactly, "bicubic" == HF Dinov2Model, "timm" ==
    HF-reg; the offset rule is far from timm's (MODERN: 0.7-3.1) and from HF's (0.6-1.5)."""
    pos = torch.randn(1, 1 + 37 * 37, 64, generator=torch.Generator().manual_seed(0))
    dino = resample_abs_pos_embed(pos, size, rule="dinov2")
    torch.testing.assert_close(dino, _original_dinov2(pos, *size), rtol=0, atol=0)
    plain = resample_abs_pos_embed(pos, size, rule="bicubic")
    torch.testing.assert_close(plain, _hf_size(pos, *size, antialias=False), rtol=0, atol=0)
    timm = resample_abs_pos_embed(pos, size)
    torch.testing.assert_close(timm, _hf_size(pos, *size, antialias=True), rtol=0, atol=0)
    assert (dino - timm).abs().max() > 0.7  # measured 0.74 (40x60) .. 3.06 (16x24)
    assert (dino - plain).abs().max() > 0.6  # measured 0.60 (40x60) .. 1.45 (16x16)
    assert (plain - timm).abs().max() > 0.3  # antialias: a = -0.5 vs -0.75 even when upsampling


def test_rule_dinov2_non_square_source_and_identity():
    pos = torch.randn(1, 2 + 4 * 6, 8, generator=torch.Generator().manual_seed(1))
    for rule in ("timm", "dinov2", "bicubic"):
        assert resample_abs_pos_embed(pos, (4, 6), (4, 6), num_prefix_tokens=2, rule=rule) is pos
    out = resample_abs_pos_embed(pos, (7, 9), (4, 6), num_prefix_tokens=2, rule="dinov2")
    grid = pos[:, 2:].reshape(1, 4, 6, 8).permute(0, 3, 1, 2)
    ref = torch.nn.functional.interpolate(grid, scale_factor=(7.1 / 4, 9.1 / 6), mode="bicubic", antialias=False)
    torch.testing.assert_close(out[:, 2:], ref.permute(0, 2, 3, 1).reshape(1, 63, 8), rtol=0, atol=0)
    torch.testing.assert_close(out[:, :2], pos[:, :2])
    with pytest.raises(ValueError, match="rule"):
        resample_abs_pos_embed(pos, (7, 9), (4, 6), num_prefix_tokens=2, rule="hf")  # type: ignore[arg-type]


def test_rule_dinov2_half_precision_resizes_in_float32():
    pos = torch.randn(1, 1 + 16, 8, generator=torch.Generator().manual_seed(2))
    out = resample_abs_pos_embed(pos.bfloat16(), (6, 6), rule="dinov2")
    assert out.dtype == torch.bfloat16
    ref = resample_abs_pos_embed(pos.bfloat16().float(), (6, 6), rule="dinov2").bfloat16()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
