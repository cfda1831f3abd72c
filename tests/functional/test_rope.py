"""2-D RoPE (functional/rope.py, attention/rope.py RotaryEmbedding): parity with timm (committed fixture,
tests/fixtures/make_fixtures_rope.py) and HF DINOv3 (live), and the properties RoPE promises."""

import math

import pytest
import torch
from fixture_utils import FIXTURES
from safetensors.torch import load_file

from vit_attention.attention.rope import RotaryEmbedding
from vit_attention.functional.rope import (
    apply_rope,
    axial_rope_angles,
    axial_rope_tables,
    mixed_rope_angles,
    rope_coords,
    rope_cos_sin,
    rotate_pairs,
)

HD, NH, P_MAX = 16, 2, 5
GRIDS = [(3, 5), (5, 3), (7, 4)]
CONVENTIONS = {  # our RotaryEmbedding keywords per fixture convention, and its prefix rows
    "eva": (dict(convention="eva", ref_feat_shape=(16, 16)), 1),
    "naver": (dict(convention="naver"), 1),
    "dinov3": (dict(convention="dinov3"), 5),
}


@pytest.fixture(scope="module")
def timm_rope() -> dict:
    return load_file(str(FIXTURES / "timm_rope.safetensors"))


# ------------------------------------------------------------------ parity: timm (fixture)
@pytest.mark.parity
@pytest.mark.parametrize("conv", sorted(CONVENTIONS))
@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0]}x{g[1]}")
def test_axial_tables_and_rotation_equal_timm(timm_rope, conv, grid):
    """Bit-for-bit: the same float32 operations in the same order as timm's RotaryEmbeddingCat / DinoV3."""
    kw, npt = CONVENTIONS[conv]
    tag = f"{grid[0]}x{grid[1]}"
    rope = RotaryEmbedding(HD, NH, "axial", **kw)
    cos, sin = rope.tables(grid)
    assert cos.shape == (grid[0] * grid[1], HD) and cos.dtype == torch.float32
    torch.testing.assert_close(cos, timm_rope[f"{conv}.{tag}.cos"], rtol=0, atol=0)
    torch.testing.assert_close(sin, timm_rope[f"{conv}.{tag}.sin"], rtol=0, atol=0)
    q = timm_rope[f"q.{tag}"][:, :, P_MAX - npt:]
    rq, rk = rope(q, q.flip(0), grid, npt)
    ref = timm_rope[f"{conv}.{tag}.out"]
    torch.testing.assert_close(rq, ref, rtol=0, atol=0)
    torch.testing.assert_close(rk, ref.flip(0), rtol=0, atol=0)


@pytest.mark.parity
@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0]}x{g[1]}")
def test_mixed_tables_and_rotation_equal_timm(timm_rope, grid):
    """RoPE-Mixed: timm's (2, depth, nh, hd/2) freqs; block b uses freqs[:, b] (our per-block module)."""
    tag = f"{grid[0]}x{grid[1]}"
    freqs = timm_rope["mixed.freqs"]
    assert freqs.shape == (2, 2, NH, HD // 2)
    for b in range(freqs.shape[1]):
        rope = RotaryEmbedding(HD, NH, "mixed")
        with torch.no_grad():
            rope.freqs.copy_(freqs[:, b])
        cos, sin = rope.tables(grid)
        assert cos.shape == (NH, grid[0] * grid[1], HD)
        torch.testing.assert_close(cos, timm_rope[f"mixed.{tag}.cos"][b], rtol=0, atol=0)
        torch.testing.assert_close(sin, timm_rope[f"mixed.{tag}.sin"][b], rtol=0, atol=0)
        q = timm_rope[f"q.{tag}"][:, :, P_MAX - 1:]
        rq, _ = rope(q, q, grid, 1)
        torch.testing.assert_close(rq, timm_rope[f"mixed.{tag}.out{b}"], rtol=0, atol=0)


@pytest.mark.parity
def test_the_conventions_differ(timm_rope):
    """Each convention's rule matters: swapping any of them breaks parity (the fixture is not degenerate)."""
    ref = timm_rope["naver.3x5.cos"]
    yx = RotaryEmbedding(HD, NH, convention="naver", axes="yx").tables((3, 5))[0]  # 'ij' instead of 'xy'
    assert (yx - ref).abs().max() > 0.1
    half = RotaryEmbedding(HD, NH, convention="naver", layout="half").tables((3, 5))[0]
    assert (half - ref).abs().max() > 0.1
    eva = timm_rope["eva.3x5.cos"]
    no_ref = RotaryEmbedding(HD, NH, convention="eva", coords="index").tables((3, 5))[0]
    assert (no_ref - eva).abs().max() > 0.1
    # EVA's ref grid: on the 16x16 pretraining grid the coordinates are the plain indices
    torch.testing.assert_close(rope_coords((16, 16), "ref", ref_feat_shape=(16, 16)), rope_coords((16, 16)))


# ------------------------------------------------------------------ parity: HF DINOv3 (live)
def _hf_rope(H: int, W: int, patch: int = 4):
    from transformers import DINOv3ViTConfig
    from transformers.models.dinov3_vit.modeling_dinov3_vit import (
        DINOv3ViTRopePositionEmbedding,
        apply_rotary_pos_emb,
    )

    cfg = DINOv3ViTConfig(hidden_size=HD * NH, num_attention_heads=NH, patch_size=patch, image_size=16,
                          rope_theta=100.0)
    return DINOv3ViTRopePositionEmbedding(cfg).eval(), apply_rotary_pos_emb


@pytest.mark.parity
@pytest.mark.parametrize("grid", [(3, 5), (4, 4), (6, 2)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_dinov3_equals_hf(grid):
    """HF DINOv3ViTRopePositionEmbedding (eval mode: train mode randomises the coordinates) and its
    apply_rotary_pos_emb, prefix = cls + 4 registers inferred from the table length."""
    H, W = grid
    hf, hf_apply = _hf_rope(H, W)
    pixels = torch.randn(1, 3, 4 * H, 4 * W)
    with torch.no_grad():
        hf_cos, hf_sin = hf(pixels)
    rope = RotaryEmbedding(HD, NH, "axial", convention="dinov3")
    cos, sin = rope.tables(grid)
    # HF multiplies by 1 / period, timm and the original divide by the period: float32 rounding apart
    torch.testing.assert_close(cos, hf_cos, rtol=0, atol=2e-6)
    torch.testing.assert_close(sin, hf_sin, rtol=0, atol=2e-6)
    q, k = torch.randn(2, 2, NH, 5 + H * W, HD).unbind(0)
    hq, hk = hf_apply(q, k, hf_cos, hf_sin)
    oq, ok = rope(q, k, grid, 5)
    torch.testing.assert_close(oq, hq, rtol=0, atol=1e-5 * hq.abs().max().item())
    torch.testing.assert_close(ok, hk, rtol=0, atol=1e-5 * hk.abs().max().item())
    assert torch.equal(oq[:, :, :5], q[:, :, :5])


@pytest.mark.parity
def test_hf_train_mode_randomises_what_eval_mode_fixes():
    """Why the parity tests use eval mode: HF's default pos_embed_rescale=2 jitters the coordinates in train."""
    hf, _ = _hf_rope(3, 5)
    pixels = torch.randn(1, 3, 12, 20)
    torch.manual_seed(0)
    a = hf.train()(pixels)[0]
    b = hf.train()(pixels)[0]
    assert not torch.equal(a, b)
    torch.testing.assert_close(hf.eval()(pixels)[0], hf(pixels)[0], rtol=0, atol=0)


# ------------------------------------------------------------------ the formulas, written out
def test_coordinates():
    c = rope_coords((2, 3))
    assert c.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]  # row-major, (y, x)
    cen = rope_coords((2, 4), "centered")
    torch.testing.assert_close(cen[:4, 1], torch.tensor([-0.75, -0.25, 0.25, 0.75]))
    torch.testing.assert_close(cen[::4, 0], torch.tensor([-0.5, 0.5]))
    ref = rope_coords((4, 8), "ref", ref_feat_shape=(16, 16))
    torch.testing.assert_close(ref[:8, 1], torch.arange(8.0) * 2)  # 8 columns stretched over 16
    torch.testing.assert_close(ref[::8, 0], torch.arange(4.0) * 4)
    with pytest.raises(ValueError, match="ref_feat_shape"):
        rope_coords((2, 2), "ref")
    with pytest.raises(ValueError, match="coords must be one of"):
        rope_coords((2, 2), "pixel")
    with pytest.raises(ValueError, match="positive"):
        rope_coords((0, 2))


def test_axial_angles_formula():
    c = torch.tensor([[2.0, 3.0]])  # y = 2, x = 3
    nb = HD // 4
    f = torch.tensor([100.0 ** (-i / nb) for i in range(nb)])
    torch.testing.assert_close(axial_rope_angles(c, HD, theta=100.0), torch.cat([2 * f, 3 * f])[None])
    torch.testing.assert_close(axial_rope_angles(c, HD, theta=100.0, axes="xy"), torch.cat([3 * f, 2 * f])[None])
    torch.testing.assert_close(axial_rope_angles(c, HD, theta=100.0, scale=2 * math.pi),
                               2 * math.pi * torch.cat([2 * f, 3 * f])[None])
    with pytest.raises(ValueError, match="divisible by 4"):
        axial_rope_angles(c, 10)
    with pytest.raises(ValueError, match="axes"):
        axial_rope_angles(c, HD, axes="zy")


def test_mixed_angles_formula():
    freqs = torch.randn(2, 3, 4)  # rows x then y
    c = torch.tensor([[2.0, 5.0]])  # y = 2, x = 5
    torch.testing.assert_close(mixed_rope_angles(c, freqs), (5 * freqs[0] + 2 * freqs[1])[:, None, :])
    with pytest.raises(ValueError, match="freqs"):
        mixed_rope_angles(c, torch.randn(3, 4))


def test_layouts_rotate_the_right_pairs():
    t = torch.arange(8.0)
    assert rotate_pairs(t, "interleaved").tolist() == [-1, 0, -3, 2, -5, 4, -7, 6]
    assert rotate_pairs(t, "half").tolist() == [-4, -5, -6, -7, 0, 1, 2, 3]
    a = torch.tensor([0.1, 0.2])
    cos_i, sin_i = rope_cos_sin(a, "interleaved")
    torch.testing.assert_close(cos_i, torch.tensor([0.1, 0.1, 0.2, 0.2]).cos())
    cos_h, sin_h = rope_cos_sin(a, "half")
    torch.testing.assert_close(sin_h, torch.tensor([0.1, 0.2, 0.1, 0.2]).sin())
    with pytest.raises(ValueError, match="layout"):
        rope_cos_sin(a, "complex")


# ------------------------------------------------------------------ properties
@pytest.mark.parametrize("kind,kw", [("axial", dict(convention="dinov3")), ("axial", dict(convention="naver")),
                                     ("axial", dict(convention="eva", ref_feat_shape=(4, 4))), ("mixed", {})])
def test_prefix_untouched_and_norms_kept(kind, kw):
    torch.manual_seed(0)
    rope = RotaryEmbedding(HD, NH, kind, **kw)
    q, k = torch.randn(2, 3, NH, 3 + 12, HD).unbind(0)
    rq, rk = rope(q, k, (3, 4), 3)
    assert torch.equal(rq[:, :, :3], q[:, :, :3]) and torch.equal(rk[:, :, :3], k[:, :, :3])
    assert (rq[:, :, 3:] - q[:, :, 3:]).abs().max() > 0.1  # the grid rows do turn
    # a rotation of each channel pair: every pair keeps its length
    layout = rope.layout
    pairs = (lambda t: t.unflatten(-1, (-1, 2))) if layout == "interleaved" else \
        (lambda t: torch.stack(t.chunk(2, -1), -1))
    torch.testing.assert_close(pairs(rq).norm(dim=-1), pairs(q).norm(dim=-1))


@pytest.mark.parametrize("kind,kw", [("axial", dict(convention="naver")), ("axial", dict(convention="dinov3",
                                                                                           coords="index")),
                                     ("mixed", {})])
def test_scores_depend_on_the_position_difference_only(kind, kw):
    """q at (y, x) and k at (y', x'): q·k after RoPE is a function of (y - y', x - x') for index coordinates."""
    torch.manual_seed(0)
    H, W = 6, 7
    rope = RotaryEmbedding(HD, NH, kind, **kw)
    q0, k0 = torch.randn(2, NH, HD).unbind(0)
    q = q0[None, :, None].expand(1, NH, H * W, HD).contiguous()
    k = k0[None, :, None].expand(1, NH, H * W, HD).contiguous()
    rq, rk = rope(q, k, (H, W))
    s = torch.einsum("bhnd,bhmd->bhnm", rq, rk)[0]  # [nh, N, N]
    idx = lambda y, x: y * W + x  # noqa: E731
    for (y1, x1), (y2, x2), (dy, dx) in [((0, 0), (2, 3), (3, 1)), ((4, 6), (1, 2), (-1, -2)),
                                         ((2, 2), (2, 2), (3, 4))]:
        torch.testing.assert_close(s[:, idx(y1, x1), idx(y2, x2)], s[:, idx(y1 + dy, x1 + dx), idx(y2 + dy, x2 + dx)],
                                   rtol=1e-5, atol=1e-5)
    assert (s[:, idx(0, 0), idx(0, 1)] - s[:, idx(0, 0), idx(1, 0)]).abs().max() > 1e-3  # y and x differ


@pytest.mark.parametrize("grid", [(1, 7), (9, 2), (13, 11), (1, 1)])
def test_any_grid_and_aspect(grid):
    for rope in (RotaryEmbedding(HD, NH, convention="dinov3"), RotaryEmbedding(HD, NH, convention="naver"),
                 RotaryEmbedding(HD, NH, convention="eva", ref_feat_shape=(16, 16)), RotaryEmbedding(HD, NH, "mixed")):
        q = torch.randn(2, NH, 1 + grid[0] * grid[1], HD)
        rq, _ = rope(q, q, grid, 1)
        assert rq.shape == q.shape and torch.isfinite(rq).all()
    with pytest.raises(ValueError, match="feat_size"):
        RotaryEmbedding(HD, NH)(q, q, (grid[0] + 1, grid[1]), 1)


def test_square_grid_without_feat_size():
    rope = RotaryEmbedding(HD, NH)
    q = torch.randn(1, NH, 2 + 16, HD)
    torch.testing.assert_close(rope(q, q, None, 2)[0], rope(q, q, (4, 4), 2)[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="not a square"):
        rope(q, q, None, 1)


def test_apply_rope_checks_table_shapes():
    cos, sin = axial_rope_tables((2, 3), HD)
    with pytest.raises(ValueError, match="do not fit"):
        apply_rope(torch.randn(1, NH, 7, HD), cos, sin, num_prefix_tokens=0)


def test_tables_are_cached_and_current():
    a = axial_rope_tables((3, 5), HD, theta=100.0)
    assert axial_rope_tables((3, 5), HD, theta=100.0)[0] is a[0]
    assert not torch.equal(axial_rope_tables((3, 5), HD, theta=10.0)[0], a[0])


@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_meta_device(kind):
    with torch.device("meta"):
        rope = RotaryEmbedding(HD, NH, kind)
        q = torch.empty(2, NH, 1 + 15, HD)
    rq, rk = rope(q, q, (3, 5), 1)
    assert rq.is_meta and rq.shape == q.shape
    cos, _ = rope.tables((3, 5), torch.device("meta"))
    assert cos.is_meta and cos.shape[-2:] == (15, HD)


@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_bf16_rotates_in_float32_and_casts_once(kind):
    """Tables stay float32; a bf16 q is rotated in float32 and rounded once (timm / the originals)."""
    torch.manual_seed(0)
    rope = RotaryEmbedding(HD, NH, kind)
    q = torch.randn(2, NH, 1 + 15, HD).bfloat16()
    rq, _ = rope(q, q, (3, 5), 1)
    assert rq.dtype == torch.bfloat16
    ref, _ = rope(q.float(), q.float(), (3, 5), 1)
    torch.testing.assert_close(rq, ref.bfloat16(), rtol=0, atol=0)
    if kind == "mixed":  # a bf16 module still computes its angles in float32
        rope16 = RotaryEmbedding(HD, NH, kind).bfloat16()
        assert rope16.tables((3, 5))[0].dtype == torch.float32


def test_gradients_reach_the_mixed_frequencies():
    torch.manual_seed(0)
    rope = RotaryEmbedding(HD, NH, "mixed")
    q, k = torch.randn(2, 1, NH, 1 + 12, HD).unbind(0)
    target = torch.randn(1, NH, 13, 13)

    def loss() -> torch.Tensor:
        rq, rk = rope(q, k, (3, 4), 1)
        return ((rq @ rk.transpose(-1, -2)) - target).pow(2).mean()

    before = loss()
    before.backward()
    g = rope.freqs.grad
    assert g is not None and g.shape == (2, NH, HD // 2) and torch.isfinite(g).all() and g.abs().max() > 0
    # the analytic gradient agrees with a finite difference along it
    eps = 1e-3
    with torch.no_grad():
        base = rope.freqs.detach().clone()
        rope.freqs.copy_(base + eps * g / g.norm())
        up = loss()
        rope.freqs.copy_(base - eps * g / g.norm())
        down = loss()
        rope.freqs.copy_(base)
    torch.testing.assert_close((up - down) / (2 * eps), g.norm(), rtol=2e-2, atol=1e-6)
    assert not any(p.requires_grad for p in RotaryEmbedding(HD, NH).parameters())  # axial: nothing to learn
