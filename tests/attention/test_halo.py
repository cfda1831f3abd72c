"""Halo attention (HaloNet): an independent dense oracle, timm ``HaloAttn`` fixtures, argument checks.

The oracle is global attention over every key of the halo-padded map with the block / halo
neighbourhood as a boolean mask and the relative logits gathered by the formula
``q · R_h[ky - qy + win - 1] + q · R_w[kx - qx + win - 1]`` (window and block coordinates), built
from index arithmetic on the whole map: no unfold, no blocks. Tolerance:
max |ours - ref| <= 1e-5 * max |ref|.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from fixture_utils import assert_parity, load_fixture

from vit_attention.analysis import record_attention
from vit_attention.attention import AttentionCall
from vit_attention.attention.halo import HaloAttention
from vit_attention.functional import switched
from vit_attention.functional.halo import halo_attention, halo_key_index, halo_rel_index


def _oracle(attn: HaloAttention, x: torch.Tensor) -> torch.Tensor:
    """Dense masked attention ``[B, H, W, C] -> [B, ceil(H/s), ceil(W/s), dim_out]`` for ``attn``'s settings."""
    B, H, W, C = x.shape
    b, h, win, nh = attn.block_size, attn.halo_size, attn.win_size, attn.num_heads
    s = attn.block_stride
    Hp, Wp = math.ceil(H / b) * b, math.ceil(W / b) * b
    dqk, dv = attn.dim_head_qk, attn.dim_head_v
    wq, wkv = attn.q.weight.flatten(1), attn.kv.weight.flatten(1)
    bq_, bkv = attn.q.bias, attn.kv.bias
    q = F.linear(x, wq, bq_)[:, ::s, ::s]  # [B, ceil(H/s), ceil(W/s), nh·dqk]
    kv = F.linear(x, wkv, bkv)  # [B, H, W, nh·(dqk+dv)]
    # zeros bottom / right to block multiples, then the halo on every side: key grid (Hp + 2h) x (Wp + 2h)
    kv = F.pad(kv, (0, 0, h, h + Wp - W, h, h + Hp - H))
    Hk, Wk = Hp + 2 * h, Wp + 2 * h
    kv = kv.reshape(B, Hk * Wk, nh, dqk + dv).transpose(1, 2)  # [B, nh, Nk, dqk+dv]
    k, v = kv[..., :dqk], kv[..., dqk:]
    Hq, Wq = q.shape[1:3]
    q = q.reshape(B, Hq * Wq, nh, dqk).transpose(1, 2)  # [B, nh, Nq, dqk]
    bq = b // s
    qi, qj = torch.meshgrid(torch.arange(Hq), torch.arange(Wq), indexing="ij")
    qi, qj = qi.reshape(-1, 1), qj.reshape(-1, 1)  # [Nq, 1] query-grid coordinates
    ki, kj = torch.meshgrid(torch.arange(Hk), torch.arange(Wk), indexing="ij")
    ki, kj = ki.reshape(1, -1), kj.reshape(1, -1)  # [1, Nk] padded-map coordinates
    by, bx = qi // bq, qj // bq  # the query's block
    ky, kx = ki - by * b, kj - bx * b  # key offset inside the block's window (padded map origin)
    inside = (ky >= 0) & (ky < win) & (kx >= 0) & (kx < win)  # [Nq, Nk]
    if attn.pad_mask:
        inside &= (ki >= h) & (ki < h + H) & (kj >= h) & (kj < h + W)
    rh = torch.where(inside, ky - qi % bq + win - 1, 0)
    rw = torch.where(inside, kx - qj % bq + win - 1, 0)
    lh = q @ attn.pos_embed.height_rel.T  # [B, nh, Nq, 2·win-1]
    lw = q @ attn.pos_embed.width_rel.T
    rel = lh.gather(-1, rh.expand(B, nh, -1, -1)) + lw.gather(-1, rw.expand(B, nh, -1, -1))  # [B, nh, Nq, Nk]
    logits = q @ k.transpose(-1, -2)
    logits = (logits + rel) * attn.scale if attn.scale_pos_embed else logits * attn.scale + rel
    out = logits.masked_fill(~inside, float("-inf")).softmax(-1) @ v  # [B, nh, Nq, dv]
    out = out.transpose(1, 2).reshape(B, Hq, Wq, nh * dv)
    if not isinstance(attn.pool, torch.nn.Identity):
        out = F.avg_pool2d(out.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)
    return out


ORACLE_CASES = [
    # (kwargs, (H, W))
    (dict(block_size=4, halo_size=1), (8, 12)),
    (dict(block_size=4, halo_size=2, pad_mask=True), (8, 12)),
    (dict(block_size=4, halo_size=1), (7, 10)),  # not block multiples: zero padding bottom / right
    (dict(block_size=4, halo_size=1, pad_mask=True), (7, 10)),
    (dict(block_size=4, halo_size=1, stride=2), (8, 12)),  # strided queries: 2x2 query blocks
    (dict(block_size=4, halo_size=2, stride=2, pad_mask=True), (9, 5)),
    (dict(block_size=3, halo_size=1, stride=2), (9, 6)),  # odd block: average pool after
    (dict(block_size=2, halo_size=0), (4, 6)),  # no halo: plain block-local attention
    (dict(block_size=4, halo_size=3, qk_ratio=0.5, dim_out=48, scale_pos_embed=True, qkv_bias=True), (8, 8)),
    (dict(block_size=4, halo_size=1, dim_head=6), (4, 4)),
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("kwargs,size", ORACLE_CASES, ids=[str(i) for i in range(len(ORACLE_CASES))])
def test_equals_the_dense_masked_oracle(kwargs, size, fused):
    torch.manual_seed(0)
    attn = HaloAttention(32, 4, **kwargs).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))  # biases non-zero, tables far from their small init
        x = torch.randn(2, *size, 32)
        with switched(attn, fused_attention=fused):
            out = attn(x)
        ref = _oracle(attn, x)
    assert out.shape == ref.shape
    assert_parity(out, ref)


@pytest.mark.parity
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("name", ["timm_halo_attn", "timm_halo_attn_s2", "timm_halo_attn_pool"])
def test_timm_halo_attn_fixture(name, fused):
    state, t, cfg = load_fixture(name)
    kwargs = {k: v for k, v in cfg.items() if k not in ("dim", "num_heads")}
    attn = HaloAttention(cfg["dim"], cfg["num_heads"], **kwargs).eval()
    attn.load_state_dict(state)  # timm's keys: q, kv, pos_embed.height_rel, pos_embed.width_rel
    with torch.no_grad(), switched(attn, fused_attention=fused):
        out = attn(t["input"].permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    assert out.shape == t["output"].shape
    assert_parity(out, t["output"])


def test_unmasked_padding_attends_to_the_zero_keys_and_pad_mask_does_not():
    """timm's default: border queries give weight to the zero halo keys (their value is 0, so the output shrinks);
    pad_mask renormalises over the image keys only."""
    torch.manual_seed(0)
    attn = HaloAttention(8, 2, block_size=2, halo_size=1).eval()
    masked = HaloAttention(8, 2, block_size=2, halo_size=1, pad_mask=True).eval()
    masked.load_state_dict(attn.state_dict())
    x = torch.randn(1, 4, 4, 8)
    with torch.no_grad(), record_attention(attn) as rec:
        attn(x)
    with torch.no_grad(), record_attention(masked) as rec_m:
        masked(x)
    corner = rec.records[0].query_map((0, 0))  # [B, H, W]: mass on image keys
    corner_m = rec_m.records[0].query_map((0, 0))
    assert float(corner.sum()) < 0.999  # part of the row went to padded keys
    torch.testing.assert_close(corner_m.sum(), torch.tensor(1.0), atol=1e-5, rtol=0)


def test_index_plans():
    ki = halo_key_index(4, 8, 4, 1)  # 1 x 2 blocks of a 4x8 map, windows 6x6 of the 6x10 padded map
    assert ki.shape == (2, 36)
    assert ki[0, 0] == 0 and ki[1, 0] == 4 and ki[0, -1] == 5 * 10 + 5
    rel = halo_rel_index(2, 4)  # query offsets 0..1, window offsets 0..3
    assert rel.tolist() == [[3, 4, 5, 6], [2, 3, 4, 5]]


def test_rel_bias_gradients_reach_the_tables():
    attn = HaloAttention(16, 2, block_size=2, halo_size=1)
    attn(torch.randn(1, 4, 4, 16)).sum().backward()
    for p in (attn.pos_embed.height_rel, attn.pos_embed.width_rel, attn.q.weight, attn.kv.weight):
        assert p.grad is not None and bool(p.grad.abs().sum() > 0)


def test_flops_count_the_padded_blocks():
    attn = HaloAttention(16, 2, block_size=4, halo_size=1)
    B, H, W, C = 1, 5, 8, 16  # padded to 8x8: 4 blocks of 16 queries, windows of 36 keys
    expected = H * W * C * 16 + H * W * C * 32 + 64 * 36 * 32 + 2 * 64 * 6 * 16
    assert attn.flops((B, H, W, C)) == expected


@pytest.mark.parametrize("kwargs,match", [
    (dict(stride=3), "stride must be 1 or 2"),
    (dict(block_size=0), "block_size must be a positive int"),
    (dict(halo_size=-1), "halo_size"),
    (dict(dim_out=30), "dim_out=30 must be divisible by num_heads=4"),
    (dict(attn_drop=1.0), "attn_drop"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HaloAttention(32, 4, **kwargs)


def test_bad_inputs_raise():
    attn = HaloAttention(32, 4, block_size=4, halo_size=1)
    with pytest.raises(ValueError, match="channels-last map"):
        attn(torch.randn(2, 32, 8, 8)[:, :, :, :4])
    with pytest.raises(ValueError, match="feat_size"):
        attn(torch.randn(1, 8, 8, 32), AttentionCall(feat_size=(4, 16)))
    with pytest.raises(ValueError, match="multiple of block_size"):
        halo_attention(torch.randn(1, 6, 6, 8), torch.randn(1, 6, 6, 16), 2, 4, 1)
    with pytest.raises(ValueError, match="both or neither"):
        halo_attention(torch.randn(1, 8, 8, 8), torch.randn(1, 8, 8, 16), 2, 4, 1, height_rel=torch.zeros(11, 4))
