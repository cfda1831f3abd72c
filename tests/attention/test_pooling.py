"""MViTv2 pooling attention (attention/pooling.py) against an oracle written here after timm 1.0.31's
``MultiScaleAttention`` / ``cal_rel_pos_type`` (its own index arithmetic, per-head loops, no library helper), the
table resize rule at other grids, the transition variant (strided queries, wider heads), FLOPs and refusals. Parity
of whole models with timm runs through the family fixtures (tests/models/test_mvitv2.py)."""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention
from vit_attention.analysis import record_attention
from vit_attention.analysis.flops import measure_flops
from vit_attention.attention import AttentionCall
from vit_attention.attention.pooling import PoolingAttention, PoolingAttentionTransition, pooled_size, rel_pos_length
from vit_attention.functional.rel_pos import resize_rel_pos


def _pool(m, t: torch.Tensor, which: str, grid: tuple[int, int], P: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """timm's reshape_pre_pool -> conv -> reshape_post_pool -> norm, on [B, nh, N, hd]."""
    B, nh, _, hd = t.shape
    cls, g = t[:, :, :P], t[:, :, P:]
    g = g.reshape(-1, grid[0], grid[1], hd).permute(0, 3, 1, 2)
    g = getattr(m, f"pool_{which}")(g)
    size = (g.shape[2], g.shape[3])
    g = g.reshape(-1, nh, hd, size[0] * size[1]).transpose(2, 3)
    return getattr(m, f"norm_{which}")(torch.cat([cls, g], dim=2)), size


def _oracle(m, x: torch.Tensor, grid: tuple[int, int], P: int = 0, residual_cls: bool = True) -> torch.Tensor:
    """timm's MultiScaleAttention.forward with the tables indexed as cal_rel_pos_type does (no resize: the module is
    run at the grid it was built for)."""
    B, N, _ = x.shape
    nh = m.num_heads
    q, k, v = (x @ m.qkv.weight.T + m.qkv.bias).reshape(B, N, 3, nh, -1).permute(2, 0, 3, 1, 4)
    q, qs = _pool(m, q, "q", grid, P)
    k, ks = _pool(m, k, "k", grid, P)
    v, _ = _pool(m, v, "v", grid, P)
    attn = (q * m.head_dim ** -0.5) @ k.transpose(-2, -1)
    (qh, qw), (kh, kw) = qs, ks
    rows = []
    for qn, kn, table in ((qh, kh, m.rel_pos_h), (qw, kw, m.rel_pos_w)):
        qr, kr = max(kn / qn, 1.0), max(qn / kn, 1.0)
        d = torch.arange(qn)[:, None] * qr - torch.arange(kn)[None, :] * kr + (kn - 1) * kr
        rows.append(table[d.long()])  # [qn, kn, hd]
    r_q = q[:, :, P:].reshape(B, nh, qh, qw, -1)
    rel_h = torch.einsum("byhwc,hkc->byhwk", r_q, rows[0])
    rel_w = torch.einsum("byhwc,wkc->byhwk", r_q, rows[1])
    sp = attn[:, :, P:, P:].view(B, nh, qh, qw, kh, kw) + rel_h[..., None] + rel_w[..., None, :]
    attn = attn.clone()
    attn[:, :, P:, P:] = sp.reshape(B, nh, qh * qw, kh * kw)
    out = attn.softmax(-1) @ v
    if residual_cls:
        out = out + q
    else:
        out[:, :, P:] = out[:, :, P:] + q[:, :, P:]
    out = out.transpose(1, 2).reshape(B, out.shape[2], -1)
    return out @ m.proj.weight.T + m.proj.bias


def _perturbed(m: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m.eval()


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert (a - b).abs().max() <= 1e-5 * b.abs().max(), (a - b).abs().max()


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "auto"])
@pytest.mark.parametrize("grid,stride_kv,P", [((8, 6), 2, 0), ((8, 8), 4, 0), ((6, 4), 2, 1), ((5, 7), 1, 1)])
def test_equals_timm_oracle(backend, grid, stride_kv, P):
    m = _perturbed(PoolingAttention(32, 4, stride_kv=stride_kv, input_size=grid))
    m.attention_backend = backend
    x = torch.randn(2, P + grid[0] * grid[1], 32)
    with torch.no_grad():
        out = m(x, AttentionCall(grid, num_prefix_tokens=P))
        _close(out, _oracle(m, x, grid, P))
    assert out.shape == x.shape


def test_class_row_left_out_of_the_residual_pooling_as_the_original():
    m = _perturbed(PoolingAttention(16, 2, stride_kv=2, input_size=4, residual_cls=False))
    x = torch.randn(2, 17, 16)
    with torch.no_grad():
        out = m(x, AttentionCall((4, 4), num_prefix_tokens=1))
        _close(out, _oracle(m, x, (4, 4), 1, residual_cls=False))
        timm_rule = _oracle(m, x, (4, 4), 1, residual_cls=True)
    assert torch.allclose(out[:, 1:], timm_rule[:, 1:], atol=1e-6) and not torch.allclose(out[:, :1], timm_rule[:, :1])


@pytest.mark.parametrize("P", [0, 1])
def test_transition_strides_queries_and_widens(P):
    m = _perturbed(PoolingAttentionTransition(16, 32, 2, stride_q=2, stride_kv=1, input_size=(8, 6)))
    x = torch.randn(2, P + 48, 16)
    with torch.no_grad():
        out = m(x, AttentionCall((8, 6), num_prefix_tokens=P))
        _close(out, _oracle(m, x, (8, 6), P))
    assert out.shape == (2, P + 12, 32) and m.q_grid((8, 6)) == (4, 3) and m.kv_grid((8, 6)) == (8, 6)
    assert m.rel_pos_h.shape == (rel_pos_length(8, 2, 1), 16) == (15, 16) and m.rel_pos_w.shape == (11, 16)


def test_table_lengths_follow_timm_floor_rule_and_ceil_grids():
    assert [rel_pos_length(56, 1, 4), rel_pos_length(56, 2, 2), rel_pos_length(28, 2, 1), rel_pos_length(7, 1, 1)] \
        == [111, 55, 55, 13]
    assert [pooled_size(7, 2), pooled_size(56, 4), pooled_size(13, 4), pooled_size(5, 1)] == [4, 14, 4, 5]


def test_another_grid_reads_the_tables_resized_linearly():
    """A module built for 8x8 run at 6x6 equals the oracle on tables resized linearly to 6x6's lengths (the
    torchvision / timm checkpoint-filter rule), not timm's off-centre read; set_input_size makes it permanent."""
    m = _perturbed(PoolingAttention(16, 2, stride_kv=2, input_size=8))
    x = torch.randn(2, 36, 16)
    with torch.no_grad():
        out = m(x, AttentionCall((6, 6)))
        ref_mod = PoolingAttention(16, 2, stride_kv=2, input_size=6).eval()
        state = dict(m.state_dict())
        state["rel_pos_h"] = resize_rel_pos(m.rel_pos_h, 11)
        state["rel_pos_w"] = resize_rel_pos(m.rel_pos_w, 11)
        ref_mod.load_state_dict(state)
        _close(out, _oracle(ref_mod, x, (6, 6)))
        offcentre = m.rel_pos_h[:11].clone()
        assert not torch.allclose(state["rel_pos_h"], offcentre)
        m.set_input_size(6)
        assert m.rel_pos_h.shape == (11, 8) and m.input_size == (6, 6)
        _close(m(x, AttentionCall((6, 6))), out)


class _Called(torch.nn.Module):
    """``m(x, call)`` as a one-argument module (what measure_flops runs)."""

    def __init__(self, m: torch.nn.Module, call: AttentionCall) -> None:
        super().__init__()
        self.m, self.call = m, call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x, self.call)


@pytest.mark.parametrize("P", [0, 1])
def test_analytic_flops_equal_measured(P):
    for m, grid in ((PoolingAttention(96, 1, stride_kv=4, input_size=56), (56, 56)),
                    (PoolingAttentionTransition(96, 192, 2, stride_q=2, stride_kv=2, input_size=(14, 10)), (14, 10))):
        shape = (2, P + grid[0] * grid[1], 96)

        measured, _ = measure_flops(_Called(m, AttentionCall(grid, num_prefix_tokens=P)), shape)
        assert m.flops(shape, feat_size=grid) == measured


def test_residual_is_added_and_transfer_init_makes_pooling_the_identity():
    m = _perturbed(PoolingAttention(16, 2, stride_kv=1, input_size=4))
    x, r = torch.randn(2, 16, 16), torch.randn(2, 16, 16)
    with torch.no_grad():
        _close(m(x, AttentionCall((4, 4), residual=r)), m(x, AttentionCall((4, 4))) + r)
        notes = m.transfer_init()
        t = torch.randn(2, 2, 16, 8)
        pooled = m.pool_k(t.reshape(4, 4, 4, 8).permute(0, 3, 1, 2)).permute(0, 2, 3, 1).reshape(2, 2, 16, 8)
    assert torch.equal(pooled, t) and not m.rel_pos_h.any() and any("norm_q" in n for n in notes)


def test_refusals_name_the_argument():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_attention("pooling", 30, 4)
    with pytest.raises(ValueError, match="stride_kv"):
        PoolingAttention(16, 2, stride_kv=0)
    with pytest.raises(ValueError, match="input_size"):
        PoolingAttention(16, 2, input_size=(4, -1))
    with pytest.raises(TypeError, match="residual_cls"):
        PoolingAttention(16, 2, residual_cls=1)  # type: ignore[arg-type]
    m = PoolingAttention(16, 2, input_size=4)
    with pytest.raises(ValueError, match="feat_size"):
        m(torch.randn(1, 15, 16), AttentionCall((4, 4)))
    with pytest.raises(ValueError, match="takes no mask"):
        m(torch.randn(1, 16, 16), AttentionCall((4, 4), mask=torch.ones(1, 1, 16, 16, dtype=torch.bool)))
    assert "pooled by convolutions" in m.merging_note
    with pytest.raises(ValueError, match="tokens"):
        m(torch.randn(1, 4, 4, 16))


@pytest.mark.parametrize("stride_q,stride_kv", [(1, 2), (2, 1)])
def test_recorded_maps_sit_on_the_query_grid_and_keep_their_weight(stride_q, stride_kv):
    """Keys coarser (strided k / v) or finer (a stage-opening block: strided queries, unstrided keys) than the
    queries: each query's map lies on its own grid and still sums to one."""
    m = _perturbed(PoolingAttentionTransition(16, 16, 2, stride_q=stride_q, stride_kv=stride_kv, input_size=8))
    with record_attention(m) as rec, torch.no_grad():
        m(torch.randn(2, 64, 16), AttentionCall((8, 8)))
    (r,) = rec.records
    qg = m.q_grid((8, 8))
    assert r.grid == qg and r.weights.shape == (2, 2, qg[0] * qg[1], m.kv_grid((8, 8))[0] * m.kv_grid((8, 8))[1])
    qmap = r.query_map((1, 1))
    assert qmap.shape[-2:] == qg
    torch.testing.assert_close(qmap.sum(dim=(-2, -1)), torch.ones(qmap.shape[:-2]))
