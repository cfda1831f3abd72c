"""Token merging (ToMe, Bolya et al., ICLR 2023): bipartite soft matching, merge and unmerge as plain functions.

Between a block's attention and its MLP, the ``r`` most similar pairs of tokens are merged:

1. the tokens after the ``P`` prefix tokens (class, distillation, registers: never merged, never
   matched) alternate into set A (even positions) and set B (odd positions);
2. each token of A finds its most similar token of B by the cosine of their ``metric`` rows (ToMe
   uses the attention keys averaged over heads);
3. the ``r`` tokens of A with the highest similarity merge into their match (``r`` is capped at half
   the mergeable tokens); the rest of A stays.

The result is ``[prefix, the unmerged A in their original order, B]``: ``T - r`` tokens. A merged
token is the size-weighted mean of its sources (:func:`merge_wavg`; ``size`` counts the original
patches a token covers), and attention can stay proportional to size by adding ``log(size)`` to the
logits (:func:`size_bias`, handed to the attention core as ``bias``).

:class:`MergePlan` holds one matching's indices. :meth:`MergePlan.merge` applies it to any per-token
tensor (features, sizes, RoPE coordinates); :meth:`MergePlan.positions` says where each token went,
which composes over blocks into a map from every original token to the token that covers it
(:func:`follow`), so dense outputs and attention maps can be placed back in image space
(:func:`unmerge`).

Shapes: ``metric [B, T, C']``, per-token tensors ``[B, T, ...]``, sizes ``[B, T, 1]``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["MergePlan", "bipartite_soft_matching", "merge_wavg", "size_bias", "follow", "unmerge",
           "merge_schedule", "TokenMergeState", "matching_costs", "recording_merges", "expand_weights"]

# multiply-adds of the similarity products, collected while a matching_costs() block is open (FLOP counting)
_COSTS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("vit_attention_tome_costs", default=None)


_RECORD: contextvars.ContextVar[list[Tensor] | None] = contextvars.ContextVar("vit_attention_tome_record",
                                                                             default=None)


@contextlib.contextmanager
def _collecting(var: contextvars.ContextVar[list[Any] | None]) -> Iterator[list[Any]]:
    """Open a fresh list in ``var`` for this thread inside the block; yields it."""
    items: list[Any] = []
    token = var.set(items)
    try:
        yield items
    finally:
        var.reset(token)


def recording_merges() -> contextlib.AbstractContextManager[list[Tensor]]:
    """Inside the block, every :meth:`TokenMergeState.merge` of this thread appends a copy of the token map after
    it, ``[B, T0]`` (the merged token covering each original token; the identity where nothing merged yet)."""
    return _collecting(_RECORD)


def matching_costs() -> contextlib.AbstractContextManager[list[int]]:
    """Inside the block, every :func:`bipartite_soft_matching` of this thread appends the multiply-adds of its
    similarity product (``B·nA·nB·C'``) to the yielded list (``vit_attention.analysis.flops`` counts them)."""
    return _collecting(_COSTS)


@dataclass(frozen=True)
class MergePlan:
    """One bipartite soft matching over ``num_tokens`` tokens, the first ``num_prefix`` of them protected.

    Indices are into the mergeable part (after the prefix) of sets A (even positions) and B (odd):
    ``src [B, r]`` the merged tokens of A, ``dst [B, r]`` the tokens of B they merge into,
    ``keep [B, nA - r]`` the tokens of A that stay (ascending).
    """

    num_tokens: int
    num_prefix: int
    src: Tensor
    dst: Tensor
    keep: Tensor

    @property
    def r(self) -> int:
        """Tokens removed by this plan."""
        return int(self.src.shape[1])

    @property
    def num_out(self) -> int:
        """Tokens after the merge, ``num_tokens - r``."""
        return self.num_tokens - self.r

    def merge(self, x: Tensor, reduce: str = "sum") -> Tensor:
        """Apply the plan to a per-token tensor ``[B, T, *f]`` -> ``[B, T - r, *f]``.

        ``reduce``: how a token of B combines with the tokens merged into it (``"sum"``, ``"mean"``,
        ``"amax"``, ... as ``Tensor.scatter_reduce``; size-weighted means: :func:`merge_wavg`).
        """
        if x.shape[1] != self.num_tokens:
            raise ValueError(f"x has {x.shape[1]} tokens, the plan was made for {self.num_tokens}")
        if self.r == 0:
            return x
        P = self.num_prefix
        feat = x.shape[2:]
        a, b = x[:, P::2], x[:, P + 1::2]  # [B, nA, *f], [B, nB, *f]

        def rows(idx: Tensor) -> Tensor:
            return idx.view(*idx.shape, *([1] * len(feat))).expand(*idx.shape, *feat)

        kept = a.gather(1, rows(self.keep))  # [B, nA - r, *f]
        moved = a.gather(1, rows(self.src))  # [B, r, *f]
        b = b.scatter_reduce(1, rows(self.dst), moved, reduce=reduce)  # [B, nB, *f]
        return torch.cat([x[:, :P], kept, b], dim=1)  # [B, T - r, *f]

    def positions(self) -> Tensor:
        """Where each of the ``T`` tokens went: ``[B, T]`` int64 indices into the ``T - r`` merged tokens."""
        B = self.src.shape[0]
        P, T = self.num_prefix, self.num_tokens
        device = self.src.device
        if self.r == 0:  # merge() returns its input as it is
            return torch.arange(T, device=device).expand(B, -1)
        n_keep = self.keep.shape[1]
        nB = (T - P) // 2
        pos = torch.empty(B, T, dtype=torch.long, device=device)
        pos[:, :P] = torch.arange(P, device=device)
        a_pos = torch.empty(B, self.keep.shape[1] + self.r, dtype=torch.long, device=device)  # [B, nA]
        a_pos.scatter_(1, self.keep, torch.arange(P, P + n_keep, device=device).expand(B, -1))
        a_pos.scatter_(1, self.src, P + n_keep + self.dst)
        pos[:, P::2] = a_pos
        pos[:, P + 1::2] = torch.arange(P + n_keep, P + n_keep + nB, device=device).expand(B, -1)
        return pos


def bipartite_soft_matching(metric: Tensor, r: int, *, num_prefix: int = 0) -> MergePlan:
    """The ToMe matching of ``metric [B, T, C']`` removing up to ``r`` tokens, prefix tokens protected.

    ``r`` is capped at ``(T - num_prefix) // 2`` (at most half the mergeable tokens go). The metric
    is compared by cosine; ties break by the lower index (``torch.sort`` is stable here).
    """
    if metric.dim() != 3:
        raise ValueError(f"metric must be [B, T, C], got {tuple(metric.shape)}")
    B, T, _ = metric.shape
    P = int(num_prefix)
    if not 0 <= P <= T:
        raise ValueError(f"num_prefix={num_prefix} must be in 0..{T} for {T} tokens")
    if not isinstance(r, int) or isinstance(r, bool) or r < 0:
        raise ValueError(f"r must be an int >= 0, got {r!r}")
    r = min(r, (T - P) // 2)
    nA = (T - P + 1) // 2
    device = metric.device
    if r == 0:
        empty = torch.zeros(B, 0, dtype=torch.long, device=device)
        return MergePlan(T, P, empty, empty, torch.arange(nA, device=device).expand(B, -1))
    with torch.no_grad():  # the matching is a discrete choice: no gradient flows through it
        m = metric[:, P:].float()
        m = m / m.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        scores = m[:, ::2] @ m[:, 1::2].transpose(1, 2)  # [B, nA, nB] cosine similarities
        if not torch.compiler.is_compiling():  # dynamo cannot read a context variable (and nobody counts there)
            costs = _COSTS.get()
            if costs is not None:
                costs.append(B * scores.shape[1] * scores.shape[2] * m.shape[-1])
        best, match = scores.max(dim=-1)  # [B, nA]
        order = torch.sort(best, dim=-1, descending=True, stable=True).indices  # [B, nA]
        src = order[:, :r]  # [B, r]
        keep = order[:, r:].sort(dim=-1).values  # [B, nA - r], original order
        dst = match.gather(1, src)  # [B, r]
    return MergePlan(T, P, src, dst, keep)


def merge_wavg(plan: MergePlan, x: Tensor, size: Tensor) -> tuple[Tensor, Tensor]:
    """Size-weighted merge: ``x [B, T, C]`` and ``size [B, T, 1]`` -> ``([B, T - r, C], [B, T - r, 1])``.

    A merged token is ``Σ s_i x_i / Σ s_i`` over its sources and its size ``Σ s_i``.
    """
    if plan.r == 0:
        return x, size
    total = plan.merge(size.to(x.dtype), "sum")  # [B, T - r, 1]
    out = plan.merge(x * size.to(x.dtype), "sum") / total  # [B, T - r, C]
    return out, total.to(size.dtype)


def size_bias(size: Tensor) -> Tensor:
    """Proportional attention's additive logit term: ``log(size)`` of each key, ``[B, T, 1] -> [B, 1, 1, T]``."""
    return size.squeeze(-1).log()[:, None, None, :]


def follow(token_map: Tensor | None, plan: MergePlan) -> Tensor:
    """Compose: for each original token ``[B, T0]``, the index of the token covering it after ``plan``.

    ``token_map`` None = identity over ``plan.num_tokens`` tokens (the first merge).
    """
    pos = plan.positions()  # [B, T]
    return pos if token_map is None else pos.gather(1, token_map)


def unmerge(x: Tensor, token_map: Tensor) -> Tensor:
    """Dense output back on the original tokens: ``x [B, T', *f]``, ``token_map [B, T0]`` -> ``[B, T0, *f]``
    (each original token takes the value of the merged token that covers it)."""
    idx = token_map.view(*token_map.shape, *([1] * (x.dim() - 2))).expand(*token_map.shape, *x.shape[2:])
    return x.gather(1, idx)


def expand_weights(weights: Tensor, token_map: Tensor, size: Tensor) -> Tensor:
    """Attention weights among merged tokens placed on the original ones: ``[B, nh, T, T]`` -> ``[B, nh, T0, T0]``.

    Original query ``i`` takes the row of the token covering it (``token_map [B, T0]``); a merged key's
    weight is shared evenly by the ``size [B, T, 1]`` patches it covers, so each row still sums to 1.
    """
    B, nh, T, _ = weights.shape
    T0 = token_map.shape[1]
    idx = token_map.to(weights.device)
    rows = weights.gather(2, idx[:, None, :, None].expand(B, nh, T0, T))  # [B, nh, T0, T]
    per_patch = rows / size.to(weights.device, weights.dtype).view(B, 1, 1, T)  # each key's weight per patch
    return per_patch.gather(3, idx[:, None, None, :].expand(B, nh, T0, T0))  # [B, nh, T0, T0]


_FORMS = ("an int >= 0 (the same in every block), (r, inflection) (a ramp: an int r >= 0 and a number "
          "-1 <= inflection <= 1) or a list of ints >= 0 (one per block)")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def merge_schedule(r: int | tuple[int, float] | list[int], num_blocks: int) -> list[int]:
    """Tokens to merge in each of ``num_blocks`` blocks, as the ToMe reference's ``parse_r``
    (facebookresearch/ToMe ``tome/utils.py``) reads ``r``:

    * an int ``r >= 0``: ``r`` in every block;
    * a tuple ``(r, inflection)``: a linear ramp from ``int(r·(1 - inflection))`` in the first block to
      ``2r`` minus that in the last, each block's value truncated to an int (``inflection`` -1 =
      decreasing to 0, the paper's "decreasing schedule"; 0 = constant ``r``; 1 = increasing from 0;
      any value between). Before truncation the ramp averages ``r``, so its total is at most
      ``num_blocks·r`` (less by the truncation: ``(8, -1.0)`` over 12 blocks merges 91 tokens, not 96);
    * a list of ints ``>= 0``: one per block (its length must be ``num_blocks``).

    Anything else (a float such as 2.5, a negative value, a bool, a tuple of another length) raises
    ``ValueError`` naming ``r`` and these forms. The cap of half the tokens is applied per block when merging.
    """
    if _is_int(r):
        if r < 0:  # type: ignore[operator]
            raise ValueError(f"r must be >= 0, got {r}; r is {_FORMS}")
        return [int(r)] * num_blocks  # type: ignore[call-overload]
    if isinstance(r, tuple):
        ok = len(r) == 2 and _is_int(r[0]) and r[0] >= 0 and isinstance(r[1], (int, float)) \
            and not isinstance(r[1], bool) and -1.0 <= r[1] <= 1.0
        if not ok:
            raise ValueError(f"a tuple r is (r, inflection), an int r >= 0 and -1 <= inflection <= 1, got {r!r} "
                             f"(a per-block schedule is a list); r is {_FORMS}")
        base, inflect = int(r[0]), float(r[1])
        lo = int(base * (1.0 - inflect))
        hi = 2 * base - lo
        step = (hi - lo) / max(num_blocks - 1, 1)
        return [int(lo + step * i) for i in range(num_blocks)]
    if isinstance(r, list):
        if len(r) != num_blocks or not all(_is_int(v) and v >= 0 for v in r):
            raise ValueError(f"a per-block r must list {num_blocks} ints >= 0 (one per block), got {r!r}")
        return [int(v) for v in r]
    raise ValueError(f"r must be {_FORMS}; got {r!r}")


class TokenMergeState:
    """What token merging carries through one forward of a token model, block to block.

    Made by the model from the blocks' input ``x [B, T0, C]`` (``num_prefix`` protected tokens, then
    the grid) and the per-block ``schedule`` (:func:`merge_schedule`); each block's attention reads
    :meth:`attention_bias` (``log(size)`` with ``prop_attn``) and sets :attr:`metric` (its keys
    averaged over heads, ``[B, T, hd]``), then the block calls :meth:`merge` between its attention
    and MLP. ``grid`` ``(H, W)``: with it, :attr:`coords` holds each token's ``(y, x)`` grid position
    (float, ``[B, T - P, 2]``; size-weighted means once merged), which RoPE mechanisms rotate by.

    Attributes: ``size [B, T, 1]`` (patches each token covers), ``token_map [B, T0]`` (the token
    covering each original one; None before the first merge), ``metric``, ``coords``, ``removed``
    (tokens merged away so far, per block).
    """

    def __init__(self, x: Tensor, num_prefix: int, schedule: Sequence[int], *, prop_attn: bool = True,
                 grid: tuple[int, int] | None = None) -> None:
        B, T = x.shape[0], x.shape[1]
        self.num_prefix, self.num_tokens = int(num_prefix), T
        self.schedule, self.block = list(schedule), 0
        self.prop_attn = bool(prop_attn)
        self.size = torch.ones(B, T, 1, device=x.device, dtype=torch.float32)
        self.token_map: Tensor | None = None
        self.metric: Tensor | None = None
        self.removed: list[int] = []
        self.coords: Tensor | None = None
        if grid is not None:
            H, W = int(grid[0]), int(grid[1])
            if H * W != T - self.num_prefix:
                raise ValueError(f"grid {grid} holds {H * W} tokens, x has {T - self.num_prefix} after the prefix")
            yy, xx = torch.meshgrid(torch.arange(H, device=x.device), torch.arange(W, device=x.device),
                                    indexing="ij")
            self.coords = torch.stack([yy, xx], dim=-1).reshape(1, H * W, 2).float().expand(B, -1, -1)

    def attention_bias(self) -> Tensor | None:
        """``log(size)`` of each key ``[B, 1, 1, T]`` (proportional attention), or None without ``prop_attn``."""
        return size_bias(self.size) if self.prop_attn else None

    def read_keys(self, k: Tensor) -> Tensor | None:
        """A block's attention's part: keep its keys ``k [B, nh, T, hd]`` averaged over heads as the merge
        :attr:`metric` (``[B, T, hd]``, ToMe's similarity) and return :meth:`attention_bias` (``[B, 1, 1, T]`` or
        None), which the attention adds to its logits."""
        self.metric = k.mean(dim=1)  # [B, T, hd]
        return self.attention_bias()

    def merge(self, x: Tensor) -> Tensor:
        """Merge this block's share of ``x [B, T, C]`` by the :attr:`metric` its attention set: ``[B, T - r, C]``."""
        r = self.schedule[self.block] if self.block < len(self.schedule) else 0
        self.block += 1
        if self.metric is None:
            raise RuntimeError("TokenMergeState.merge: the block's attention set no metric (its mechanism does not "
                               "support token merging)")
        plan = bipartite_soft_matching(self.metric, r, num_prefix=self.num_prefix)
        self.metric = None
        self.removed.append(plan.r)
        x = self._apply(plan, x)
        if not torch.compiler.is_compiling():  # dynamo cannot read a context variable
            record = _RECORD.get()
            if record is not None:
                B = x.shape[0]
                record.append(torch.arange(self.num_tokens, device=x.device).expand(B, -1).clone()
                              if self.token_map is None else self.token_map.clone())
        return x

    def _apply(self, plan: MergePlan, x: Tensor) -> Tensor:
        """``x`` merged by ``plan``; sizes, coordinates and the token map follow."""
        if plan.r == 0:
            return x
        size = self.size
        x, self.size = merge_wavg(plan, x, size)
        if self.coords is not None:
            P = self.num_prefix
            padded = torch.cat([self.coords.new_zeros(x.shape[0], P, 2), self.coords], dim=1)  # [B, T, 2]
            self.coords = merge_wavg(plan, padded, size)[0][:, P:]  # [B, T - r - P, 2]
        self.token_map = follow(self.token_map, plan)
        return x

    def observer_info(self) -> dict[str, Tensor]:
        """What an attention observer needs to place this block's weights on the original tokens
        (:func:`expand_weights`): ``token_map`` and ``token_size``; empty before the first merge."""
        if self.token_map is None:
            return {}
        return {"token_map": self.token_map, "token_size": self.size}

    def unmerge(self, x: Tensor) -> Tensor:
        """Tokens ``[B, T, ...]`` back on the original ``T0`` tokens (each takes its covering token's value)."""
        return x if self.token_map is None else unmerge(x, self.token_map)
