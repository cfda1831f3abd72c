"""Token merging's functions: matching, size-weighted merge, positions / unmerge, schedules."""

from __future__ import annotations

import pytest
import torch

from vit_attention.functional.tome import (
    bipartite_soft_matching,
    follow,
    merge_schedule,
    merge_wavg,
    size_bias,
    unmerge,
)


def _brute_force(metric: torch.Tensor, r: int, P: int) -> list[tuple[int, int]]:
    """(source, destination) token indices of the ToMe rule, written per token with Python loops."""
    m = metric[0, P:]
    m = m / m.norm(dim=-1, keepdim=True)
    A, Bs = list(range(0, len(m), 2)), list(range(1, len(m), 2))
    best = []
    for a in A:
        sims = [float(m[a] @ m[b]) for b in Bs]
        j = max(range(len(Bs)), key=lambda i: (sims[i], -i))
        best.append((sims[j], a, Bs[j]))
    best.sort(key=lambda t: -t[0])
    return sorted((P + a, P + b) for _, a, b in best[:r])


@pytest.mark.parametrize(("T", "P", "r"), [(9, 0, 2), (17, 1, 5), (20, 5, 7), (12, 2, 50)])
def test_matching_follows_the_rule_and_protects_the_prefix(T: int, P: int, r: int) -> None:
    metric = torch.randn(1, T, 6, generator=torch.Generator().manual_seed(T))
    plan = bipartite_soft_matching(metric, r, num_prefix=P)
    assert plan.r == min(r, (T - P) // 2) and plan.num_out == T - plan.r
    pairs = sorted((P + 2 * int(s), P + 2 * int(d) + 1) for s, d in zip(plan.src[0], plan.dst[0]))
    assert pairs == _brute_force(metric, plan.r, P)
    pos = plan.positions()[0]
    assert pos[:P].tolist() == list(range(P))  # prefix tokens stay where they are, alone
    assert all(int((pos == i).sum()) == 1 for i in range(P))


def test_merge_wavg_sizes_and_positions_agree() -> None:
    torch.manual_seed(0)
    B, T, P = 3, 15, 2
    x = torch.randn(B, T, 4)
    size = torch.ones(B, T, 1)
    plan = bipartite_soft_matching(torch.randn(B, T, 8), 4, num_prefix=P)
    merged, new_size = merge_wavg(plan, x, size)
    assert merged.shape == (B, T - 4, 4) and new_size.shape == (B, T - 4, 1)
    assert torch.equal(new_size.sum(1), size.sum(1))  # every original patch is counted once
    pos = plan.positions()
    # each merged token is the mean of the tokens whose position points at it
    for b in range(B):
        for j in range(T - 4):
            members = (pos[b] == j).nonzero().flatten()
            assert int(new_size[b, j]) == len(members)
            torch.testing.assert_close(merged[b, j], x[b, members].mean(0))
    assert torch.equal(merged[:, :P], x[:, :P])


def test_merges_compose_and_unmerge_places_tokens() -> None:
    torch.manual_seed(1)
    B, T, P = 2, 21, 1
    x = torch.randn(B, T, 3)
    size = torch.ones(B, T, 1)
    token_map = None
    cur, cur_size = x, size
    for r in (5, 4, 3):
        plan = bipartite_soft_matching(torch.randn(B, cur.shape[1], 8), r, num_prefix=P)
        cur, cur_size = merge_wavg(plan, cur, cur_size)
        token_map = follow(token_map, plan)
    assert token_map.shape == (B, T) and cur.shape[1] == T - 12
    back = unmerge(cur, token_map)  # [B, T, 3]
    for b in range(B):  # the token covering each original token is the mean of all it covers
        for j in range(cur.shape[1]):
            members = (token_map[b] == j).nonzero().flatten()
            assert int(cur_size[b, j]) == len(members)
            torch.testing.assert_close(back[b, members], x[b, members].mean(0).expand(len(members), -1))
    assert torch.equal(token_map[:, 0], torch.zeros(B, dtype=torch.long))


def test_r_zero_is_the_identity_and_bias_is_log_size() -> None:
    x = torch.randn(2, 7, 3)
    plan = bipartite_soft_matching(x, 0, num_prefix=1)
    assert plan.r == 0 and plan.merge(x) is x
    assert torch.equal(plan.positions(), torch.arange(7).expand(2, -1))
    torch.testing.assert_close(size_bias(torch.tensor([[[1.0], [4.0]]])), torch.log(torch.tensor([1.0, 4.0])).view(
        1, 1, 1, 2))


def test_schedules() -> None:
    assert merge_schedule(8, 3) == [8, 8, 8]
    assert merge_schedule([1, 2, 3], 3) == [1, 2, 3]
    ramp = merge_schedule((16, -1.0), 12)
    assert ramp[0] == 32 and ramp[-1] == 0 and ramp[1] == 29
    assert merge_schedule((4, 0.0), 5) == [4] * 5
    # ToMe's parse_r: any pair is (r, inflection), an int inflection too; a per-block schedule is a list
    assert merge_schedule((2, 1), 3) == merge_schedule((2, 1.0), 3) == [0, 2, 4]
    assert merge_schedule((4, 0), 5) == [4] * 5
    # the ramp averages r before truncation: its total is at most num_blocks·r, here below it
    assert sum(merge_schedule((8, -1.0), 12)) == 91
    for (r, inflect), n in (((8, -1.0), 12), ((5, 0.3), 7), ((3, 1.0), 4), ((7, -0.5), 12)):
        assert sum(merge_schedule((r, inflect), n)) <= n * r
    for bad in (-1, True, 2.5, [1, 2], (4, 2.0), (1.5, 0.0), (2, 1, 0), (2,), [1, -1, 0], [1, 2.0, 0], "3", None):
        with pytest.raises(ValueError, match=r"\br\b"):
            merge_schedule(bad, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"r must be an int >= 0 .*\(r, inflection\).*list of ints"):
        merge_schedule(2.5, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="r must be an int >= 0"):
        bipartite_soft_matching(torch.randn(1, 4, 2), -1)
