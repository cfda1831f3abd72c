"""``longformer2d`` (ViL) against a dense oracle: global attention with a boolean mask built here from
the rule (3x3 chunks of w x w around the query's chunk + all globals; globals see everything), and
the relative-position bias gathered from coordinates, independently of the module's chunk plan."""

from __future__ import annotations

import random

import pytest
import torch

from vit_attention import create_attention
from vit_attention.analysis import record_attention
from vit_attention.attention import AttentionCall
from vit_attention.functional import switched
from vit_attention.functional.longformer2d import longformer2d_plan


def _allowed(H: int, W: int, G: int, w: int) -> torch.Tensor:
    """``[N, N]`` bool: may query i attend to key j (tokens ``[G globals; H·W map]``)."""
    N = G + H * W
    ok = torch.zeros(N, N, dtype=torch.bool)
    ok[:G, :] = True  # global queries: everything
    ok[:, :G] = True  # every query: the globals
    for p in range(H * W):
        r, c = divmod(p, W)
        for p2 in range(H * W):
            r2, c2 = divmod(p2, W)
            ok[G + p, G + p2] = abs(r2 // w - r // w) <= 1 and abs(c2 // w - c // w) <= 1
    return ok


def _rpe(attn, H: int, W: int, G: int) -> torch.Tensor:
    """``[nh, N, N]`` relative-position bias from coordinates (the original's definitions)."""
    w, nh = attn.window_size, attn.num_heads
    N = G + H * W
    bias = torch.zeros(nh, N, N)
    table = attn.local_relative_position_bias_table  # [(4w-1)², nh]
    if G:
        bias[:, :G, :G] = attn.g2g_relative_position_bias
        bias[:, :G, G:] = attn.g2l_relative_position_bias[0][:, :, None]
        bias[:, G:, :G] = attn.g2l_relative_position_bias[1][:, None, :]
    for p in range(H * W):
        r, c = divmod(p, W)
        r0, c0 = (r // w) * w, (c // w) * w  # the query's chunk origin
        for p2 in range(H * W):
            r2, c2 = divmod(p2, W)
            dy, dx = (r - r0) - (r2 - r0) + 2 * w - 1, (c - c0) - (c2 - c0) + 2 * w - 1
            if 0 <= dy < 4 * w - 1 and 0 <= dx < 4 * w - 1:
                bias[:, G + p, G + p2] = table[dy * (4 * w - 1) + dx]
    return bias


def _oracle(attn, x: torch.Tensor, H: int, W: int, G: int) -> torch.Tensor:
    B, N, C = x.shape
    nh = attn.num_heads
    hd = C // nh
    split = lambda t: t.view(B, -1, nh, hd).transpose(1, 2)  # noqa: E731
    q = torch.cat([attn.query_global(x[:, :G]), attn.query(x[:, G:])], dim=1)
    k_loc, v_loc = attn.kv(x).chunk(2, dim=-1)
    k_glo, v_glo = attn.kv_global(x).chunk(2, dim=-1)
    logits_loc = split(q) @ split(k_loc).transpose(-1, -2) * hd ** -0.5  # [B, nh, N, N]
    logits_glo = split(q) @ split(k_glo).transpose(-1, -2) * hd ** -0.5
    if attn.rel_pos_bias:
        rpe = _rpe(attn, H, W, G)
        logits_loc, logits_glo = logits_loc + rpe, logits_glo + rpe
    ok = _allowed(H, W, G, attn.window_size)
    a_loc = logits_loc.masked_fill(~ok, float("-inf")).softmax(-1)
    a_glo = logits_glo.masked_fill(~ok, float("-inf")).softmax(-1)
    o_loc = (a_loc @ split(v_loc)).transpose(1, 2).reshape(B, N, C)
    o_glo = (a_glo @ split(v_glo)).transpose(1, 2).reshape(B, N, C)
    return torch.cat([attn.proj_global(o_glo[:, :G]), attn.proj(o_loc[:, G:])], dim=1)


CASES = [(7, 8, 1, 3), (5, 5, 0, 2), (9, 4, 2, 4), (3, 11, 1, 5), (6, 6, 1, 2), (2, 2, 3, 7)]


@pytest.mark.parametrize(("H", "W", "G", "w"), CASES)
@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("rpe", [False, True])
def test_equals_dense_masked_oracle(H, W, G, w, share, rpe):
    torch.manual_seed(H * 100 + W * 10 + G)
    attn = create_attention("longformer2d", 24, 3, window_size=w, share_weights=share, rel_pos_bias=rpe,
                            num_global_tokens=G).eval()
    x = torch.randn(2, G + H * W, 24)
    with torch.no_grad():
        ref = _oracle(attn, x, H, W, G)
        out = attn(x, AttentionCall(feat_size=(H, W), num_prefix_tokens=G))
        with switched(attn, fused_attention=False):
            explicit = attn(x, AttentionCall(feat_size=(H, W), num_prefix_tokens=G))
    tol = 1e-5 * float(ref.abs().max())
    torch.testing.assert_close(out, ref, atol=tol, rtol=0)
    torch.testing.assert_close(explicit, ref, atol=tol, rtol=0)


def test_random_sizes_against_oracle():
    rng = random.Random(0)
    for _ in range(6):
        H, W, G, w = rng.randint(1, 10), rng.randint(1, 10), rng.randint(0, 2), rng.randint(1, 4)
        attn = create_attention("longformer2d", 16, 2, window_size=w).eval()
        x = torch.randn(1, G + H * W, 16)
        with torch.no_grad():
            ref = _oracle(attn, x, H, W, G)
            out = attn(x, AttentionCall(feat_size=(H, W), num_prefix_tokens=G))
        torch.testing.assert_close(out, ref, atol=1e-5 * float(ref.abs().max()), rtol=0, msg=str((H, W, G, w)))


def test_gradient_reaches_only_the_3x3_chunks_and_globals():
    attn = create_attention("longformer2d", 16, 2, window_size=2).eval()
    H, W, G = 8, 7, 1
    x = torch.randn(1, G + H * W, 16, requires_grad=True)
    out = attn(x, AttentionCall(feat_size=(H, W), num_prefix_tokens=G))
    ok = _allowed(H, W, G, 2)
    for i in (0, 1, G + 0, G + 3 * W + 3, G + H * W - 1):
        x.grad = None
        out[0, i].sum().backward(retain_graph=True)
        assert torch.equal(x.grad[0].abs().sum(-1) > 0, ok[i]), i


def test_plan_masks_out_of_image_keys_and_pads_queries():
    plan = longformer2d_plan(5, 4, 3)  # 2x2 chunks, padded to 6x6
    assert plan.chunks == (2, 2) and plan.query_index.shape == (4, 9) and plan.key_index.shape == (4, 81)
    assert int((plan.query_index >= 0).sum()) == 20  # every map position once
    assert torch.equal(plan.query_index.reshape(-1)[plan.slot_of], torch.arange(20))
    assert int(plan.valid[0].sum()) == 20  # chunk (0, 0) sees the whole 5x4 map


def test_state_dict_keys_follow_the_original():
    shared = create_attention("longformer2d", 16, 2, window_size=2)
    keys = set(shared.state_dict())
    assert {"query.weight", "kv.weight", "proj.weight"} <= keys and not any("_global" in k for k in keys)
    assert shared.query_global is shared.query and shared.proj_global is shared.proj  # sharew: the same modules
    separate = create_attention("longformer2d", 16, 2, window_size=2, share_weights=False)
    assert {"query_global.weight", "kv_global.bias", "proj_global.weight"} <= set(separate.state_dict())
    rpe = create_attention("longformer2d", 16, 2, window_size=2, rel_pos_bias=True, num_global_tokens=1)
    assert rpe.local_relative_position_bias_table.shape == (49, 2)
    assert rpe.g2l_relative_position_bias.shape == (2, 2, 1) and rpe.g2g_relative_position_bias.shape == (2, 1, 1)


def test_bad_inputs_name_the_argument():
    attn = create_attention("longformer2d", 16, 2, window_size=2)
    with pytest.raises(ValueError, match="feat_size"):
        attn(torch.randn(1, 10, 16), AttentionCall(feat_size=(3, 3), num_prefix_tokens=0))
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        attn(torch.randn(1, 10, 16), AttentionCall(num_prefix_tokens=10))
    with pytest.raises(ValueError, match="window_size"):
        create_attention("longformer2d", 16, 2, window_size=0)
    rpe = create_attention("longformer2d", 16, 2, window_size=2, rel_pos_bias=True, num_global_tokens=1)
    with pytest.raises(ValueError, match="num_global_tokens"):
        rpe(torch.randn(1, 11, 16), AttentionCall(feat_size=(3, 3), num_prefix_tokens=2))


def test_records_land_on_the_map_and_globals():
    attn = create_attention("longformer2d", 16, 2, window_size=2).eval()
    x = torch.randn(1, 1 + 5 * 6, 16)
    with record_attention(attn) as rec, torch.no_grad():
        attn(x, AttentionCall(feat_size=(5, 6), num_prefix_tokens=1))
    local, glob = rec.records
    assert local.grid == (5, 6) and local.layout.groups == 9  # 3x3 chunks
    m = local.query_map((0, 0))[0]
    assert 0 < float(m.sum()) < 1 and bool((m[:4, :4] > 0).all())  # the rest of its row sits on the global
    assert bool((m[4:] == 0).all()) and bool((m[:, 4:] == 0).all())  # chunks beyond the 3x3 block: nothing
    g = glob.query_map("cls")[0]
    assert g.shape == (5, 6) and bool((g > 0).all())
