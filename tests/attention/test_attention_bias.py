"""LeViT's attention (``attention_bias``): the |offset| index, the math against timm 1.0.31's ``Attention`` and
``AttentionDownsample`` written out (``timm/models/levit.py``, linear mode), the table on other grids, prefix
tokens, BatchNorm folding and the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_attention
from vit_attention.attention import AttentionCall
from vit_attention.attention.attention_bias import AttentionBiasShrink, LinearNorm
from vit_attention.attention.transfer import get_projections
from vit_attention.functional.attention_bias import attention_bias_index, resize_attention_bias_table


def _offsets(H: int, W: int, stride: int = 1) -> torch.Tensor:
    """timm's index from coordinates, one pair at a time: ``|s·yq - yk|·W + |s·xq - xk|``."""
    queries = [(y, x) for y in range(0, H, stride) for x in range(0, W, stride)]
    keys = [(y, x) for y in range(H) for x in range(W)]
    return torch.tensor([[abs(qy - ky) * W + abs(qx - kx) for ky, kx in keys] for qy, qx in queries])


@pytest.mark.parametrize(("grid", "stride"), [((3, 5), 1), ((4, 4), 1), ((7, 7), 2), ((5, 8), 2), ((3, 3), 3)])
def test_index_is_the_absolute_offset_on_the_key_grid(grid: tuple[int, int], stride: int) -> None:
    idx = attention_bias_index(grid, stride)
    assert torch.equal(idx, _offsets(*grid, stride))
    assert idx.shape == (-(-grid[0] // stride) * -(-grid[1] // stride), grid[0] * grid[1])
    assert idx.max() < grid[0] * grid[1]  # the table has H·W entries, one per (|dy|, |dx|)


def _randomise(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter and BatchNorm statistic random (a zero table or identity norm would hide a wrong index)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return module.eval()


def _linear_norm(layer: LinearNorm, x: torch.Tensor) -> torch.Tensor:
    bn = layer.bn
    y = x @ layer.linear.weight.T
    return (y - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias


def _reference(attn: torch.nn.Module, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """timm's ``Attention.forward`` (linear mode) written out: per-head interleaved [q | k | v], its index."""
    B, N, _ = x.shape
    nh, kd, vd = attn.num_heads, attn.key_dim, attn.val_dim
    q, k, v = _linear_norm(attn.qkv, x).view(B, N, nh, -1).split([kd, kd, vd], dim=3)
    q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
    a = (q @ k * kd ** -0.5 + attn.attention_biases[:, _offsets(H, W)]).softmax(-1)
    out = F.hardswish((a @ v).transpose(1, 2).reshape(B, N, nh * vd))
    return _linear_norm(attn.proj.ln, out)


@pytest.mark.compile
@pytest.mark.parametrize("backend", ["explicit", "sdpa", "flex"])
def test_forward_equals_timm_attention_written_out(backend: str) -> None:
    attn = _randomise(create_attention("attention_bias", 24, 3, key_dim=8, attn_ratio=2, resolution=(3, 4)))
    attn.attention_backend = backend
    x = torch.randn(2, 12, 24)
    with torch.no_grad():
        out = attn(x, AttentionCall((3, 4)))
        torch.testing.assert_close(out, _reference(attn, x, 3, 4), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(attn(x), out, atol=0, rtol=0)  # the grid defaults to the table's
        attn.attention_biases.zero_()
        assert not torch.allclose(out, attn(x, AttentionCall((3, 4))), atol=1e-3)  # the table matters


def test_heads_are_key_dim_wide_whatever_the_width() -> None:
    """LeViT-192's second stage: 288 channels, 5 heads of 32 (288 is no multiple of 5)."""
    attn = create_attention("attention_bias", 288, 5, key_dim=32, resolution=2)
    assert attn.qkv.linear.weight.shape == (5 * (32 + 32 + 64), 288) and attn.proj.ln.linear.weight.shape == (288, 320)
    assert attn(torch.randn(1, 4, 288)).shape == (1, 4, 288)
    with pytest.raises(ValueError, match="divisible by num_heads"):  # without key_dim the width is split
        create_attention("attention_bias", 288, 5)


def _shrink_reference(m: AttentionBiasShrink, x: torch.Tensor) -> torch.Tensor:
    """timm's ``AttentionDownsample.forward`` (linear mode) written out on the map's tokens."""
    B, H, W, C = x.shape
    nh, kd, vd, s = m.num_heads, m.key_dim, m.val_dim, m.stride
    t = x.reshape(B, H * W, C)
    k, v = _linear_norm(m.kv, t).view(B, H * W, nh, -1).split([kd, vd], dim=3)
    k, v = k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
    q = _linear_norm(m.q.ln, x[:, ::s, ::s].reshape(B, -1, C)).view(B, -1, nh, kd).permute(0, 2, 1, 3)
    a = (q @ k * kd ** -0.5 + m.attention_biases[:, _offsets(H, W, s)]).softmax(-1)
    out = F.hardswish((a @ v).transpose(1, 2).reshape(B, -1, nh * vd))
    return _linear_norm(m.proj.ln, out).reshape(B, -(-H // s), -(-W // s), -1)


@pytest.mark.parametrize("grid", [(7, 7), (5, 8)])
def test_shrink_attention_equals_timm_attention_downsample_written_out(grid: tuple[int, int]) -> None:
    m = _randomise(AttentionBiasShrink(16, 24, key_dim=4, num_heads=4, attn_ratio=4, resolution=grid))
    x = torch.randn(2, *grid, 16)
    with torch.no_grad():
        out = m(x)
        assert out.shape == (2, -(-grid[0] // 2), -(-grid[1] // 2), 24)
        torch.testing.assert_close(out, _shrink_reference(m, x), atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match=r"channels-last map \[B, H, W, 16\]"):
            m(x.reshape(2, -1, 16))


def test_another_grid_reads_the_table_resampled_as_set_window_size_does() -> None:
    attn = _randomise(create_attention("attention_bias", 16, 2, key_dim=8, resolution=4))
    table = attn.attention_biases.detach().clone()
    x = torch.randn(1, 36, 16)
    with torch.no_grad():
        out = attn(x, AttentionCall((6, 6)))
        attn.set_window_size(6)
    assert attn.attention_biases.shape == (2, 36) and attn.resolution == (6, 6)
    # timm 1.0.31 resize_rel_pos_bias_table_levit: [L, nh] -> bicubic antialiased image of (|dy|, |dx|)
    want = F.interpolate(table.T.permute(1, 0).view(1, 2, 4, 4), size=(6, 6), mode="bicubic", antialias=True)
    torch.testing.assert_close(attn.attention_biases.detach(), want.view(2, 36))
    with torch.no_grad():
        torch.testing.assert_close(attn(x), out, atol=0, rtol=0)
        torch.testing.assert_close(out, _reference(attn, x, 6, 6), atol=1e-5, rtol=1e-5)
    assert resize_attention_bias_table(table, (4, 4), (4, 4)) is table
    assert resize_attention_bias_table(table, (4, 4), (3, 5)).shape == (2, 15)
    with pytest.raises(ValueError, match=r"shape \[nh, 16\]"):
        resize_attention_bias_table(table[:, :-1], (4, 4), (6, 6))
    with pytest.raises(ValueError, match="shift_size must be 0"):
        attn.set_window_size(6, 1)


def test_prefix_tokens_get_no_bias() -> None:
    attn = _randomise(create_attention("attention_bias", 16, 2, key_dim=8, resolution=(2, 3)))
    x = torch.randn(2, 7, 16)
    bias = attn.position_bias((2, 3), 1)
    assert bias.shape == (1, 2, 7, 7) and not bias[0, :, 0].any() and not bias[0, :, :, 0].any()
    torch.testing.assert_close(bias[0, :, 1:, 1:], attn.attention_biases[:, _offsets(2, 3)])
    with torch.no_grad():
        out = attn(x, AttentionCall((2, 3), 1))
        grid_only = attn(x[:, 1:], AttentionCall((2, 3)))
    assert out.shape == x.shape and not torch.allclose(out[:, 1:], grid_only, atol=1e-4)  # the class token is a key


def test_fused_batch_norms_give_the_same_outputs_and_cost_less() -> None:
    attn = _randomise(create_attention("attention_bias", 24, 3, key_dim=8, resolution=(3, 4)))
    x = torch.randn(2, 12, 24)
    with torch.no_grad():
        want = attn(x)
        before = attn.flops((2, 12, 24))
        for m in attn.modules():
            if isinstance(m, LinearNorm):
                m.fuse()
        got = attn(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert attn.qkv.fused and isinstance(attn.qkv.bn, torch.nn.Identity) and attn.qkv.linear.bias is not None
    assert before - attn.flops((2, 12, 24)) == 2 * 5 * 12 * (3 * 32 + 24)  # the BatchNorms' elements, 5 each
    assert "qkv.bn.weight" not in attn.state_dict() and "qkv.linear.bias" in attn.state_dict()


def test_transfer_slots_pick_each_heads_rows() -> None:
    """q / k: the first / second ``kd`` rows of each head's ``2kd + vd``; v only when ``vd == kd``."""
    attn = _randomise(create_attention("attention_bias", 16, 2, key_dim=4, attn_ratio=2, resolution=2))
    rows = attn.qkv.linear.weight.detach().view(2, 16, 16)  # per head: q 4, k 4, v 8
    proj = get_projections(attn)
    assert set(proj.weight) == {"q", "k", "o"}
    torch.testing.assert_close(proj.weight["q"], rows[:, :4].reshape(8, 16), rtol=0, atol=0)
    torch.testing.assert_close(proj.weight["k"], rows[:, 4:8].reshape(8, 16), rtol=0, atol=0)
    same = create_attention("attention_bias", 16, 2, key_dim=4, attn_ratio=1, resolution=2)
    assert set(get_projections(same).weight) == {"q", "k", "v", "o"}
    notes = same.transfer_init()
    assert any("attention_biases" in n for n in notes) and not same.attention_biases.any()
    with torch.no_grad():  # the BatchNorms pass their input through at inference
        y = torch.randn(5, 24)  # 2 heads of q, k, v 4 wide each
        torch.testing.assert_close(same.eval().qkv.bn(y), y, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(key_dim=0), "key_dim must be an int >= 1"),
    (dict(key_dim=8, attn_ratio=0), "attn_ratio must be a number > 0"),
    (dict(key_dim=8, resolution=0), "resolution must be positive"),
    (dict(key_dim=8, resolution=(2, 3, 4)), "resolution must be an int or a pair"),
    (dict(key_dim=8, act_layer="swish"), "act_layer must be one of 'hard_swish'"),
    (dict(key_dim=8, qkv_bias="yes"), "qkv_bias must be a bool"),
])
def test_bad_arguments_are_refused_by_name(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        create_attention("attention_bias", 16, 2, **kwargs)


def test_a_grid_that_does_not_hold_the_tokens_is_refused() -> None:
    attn = create_attention("attention_bias", 16, 2, resolution=(3, 4))
    with pytest.raises(ValueError, match="not a square map: pass feat_size"):
        attn(torch.randn(1, 10, 16))
    with pytest.raises(ValueError, match=r"feat_size \(3, 3\) holds 9 tokens"):
        attn(torch.randn(1, 12, 16), AttentionCall((3, 3)))


def test_inference_keeps_the_folds_and_the_bias_only_while_the_tensors_are_unchanged() -> None:
    import copy

    from vit_attention.functional.fast_paths import use_fast_paths

    attn = _randomise(create_attention("attention_bias", 24, 3, key_dim=8, resolution=(3, 4)))
    shrink = _randomise(AttentionBiasShrink(24, 32, 8, 3, resolution=(3, 4)), seed=1)
    x, m = torch.randn(2, 12, 24), torch.randn(2, 3, 4, 24)
    with torch.no_grad():
        attn(x), shrink(m)
        a, b = attn.position_bias((3, 4)), attn.position_bias((3, 4))
        assert a.data_ptr() == b.data_ptr()  # the gathered bias is kept
        weight = attn.qkv._folded.value[0]
        attn(x)
        assert attn.qkv._folded.value[0] is weight  # and so are the folded weights
        for module in (attn, shrink):  # every kind of change a cached value must follow
            module.attention_biases.add_(0.5)
            for ln in module.modules():
                if isinstance(ln, LinearNorm):
                    ln.bn.running_var.mul_(1.5)
                    ln.linear.weight.mul_(0.9)
        got = attn(x), shrink(m)
        with use_fast_paths(False):  # nothing cached: every value computed from the tensors as they are
            want = copy.deepcopy(attn)(x), copy.deepcopy(shrink)(m)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    with torch.enable_grad():  # autograd through the table: computed on each call
        a, b = attn.position_bias((3, 4)), attn.position_bias((3, 4))
        assert a.data_ptr() != b.data_ptr() and a.requires_grad
