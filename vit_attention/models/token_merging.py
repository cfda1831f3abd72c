"""Token merging (ToMe, Bolya et al. 2023) for the token models: :class:`TokenMergingMixin`.

A family whose ``blocks`` are token :class:`~vit_attention.layers.Block` s (ViT and its relatives, CaiT) puts
the mixin before its base: ``model.set_token_merging(r)`` checks the blocks can merge and records the per-block
schedule; the family's block loop calls :meth:`TokenMergingMixin._run_blocks_merging` while it is set. The
merging itself (bipartite matching, sizes, unmerging back to image space) is
:mod:`vit_attention.functional.tome`'s; every other family refuses by name
(:meth:`~vit_attention.models.backbone.Backbone.set_token_merging`).
"""

from __future__ import annotations

from torch import Tensor, nn

from ..functional.tome import TokenMergeState, merge_schedule
from ..layers.block import Block

__all__ = ["TokenMergingMixin"]


class TokenMergingMixin:
    """Token merging (ToMe) for a model whose ``blocks`` are token :class:`~vit_attention.layers.Block` s.

    The model calls :meth:`_run_blocks_merging` from its block loop while :attr:`token_merging` is set;
    :meth:`_merging_obstacle` names a part of the model that needs the token grid (then merging is refused).
    """

    blocks: nn.Sequential
    num_prefix_tokens: int
    token_merging: tuple[list[int], bool] | None = None  # (per-block r, prop_attn) set by set_token_merging

    def _merging_obstacle(self) -> str | None:
        """Why this model's tokens cannot merge although its blocks could (None: nothing stands in the way)."""
        return None

    def set_token_merging(self, r: int | tuple[int, float] | list[int], *, prop_attn: bool = True) -> None:
        """Token merging (ToMe, Bolya et al. 2023) in every block of ``blocks``, at inference and in training.

        ``r``: tokens merged per block (an int; ``0`` = off), a per-block list of ints, or the tuple ``(r,
        inflection)``, ToMe's ramp (:func:`~vit_attention.functional.tome.merge_schedule`; anything else, such as
        2.5, raises ``ValueError`` naming ``r``); each block merges at most half its mergeable tokens. The setting
        is recorded by ``save_weights`` and restored by ``load_model``. ``prop_attn``: attention proportional to
        token size (``+ log(size)`` on the logits). Prefix tokens (class, distillation, registers) are never merged;
        LayerScale, QK-norm and the fused kernel are kept; RoPE turns each merged token by its size-weighted grid
        position. Outputs stay in image space: the tokens leaving the blocks and every tapped intermediate give each
        original token the value of the merged token that covers it, so pooling (``avg`` then size-weighted), heads
        and feature maps work unchanged. A block that cannot merge (a position layer, a mechanism whose
        ``accepts`` lacks ``"tome"``) or :meth:`_merging_obstacle` makes this raise ``ValueError`` naming it, and
        nothing changes. Gradient checkpointing is not applied while merging (the blocks change the token count).
        """
        if isinstance(r, int) and not isinstance(r, bool) and r == 0:
            self.token_merging = None
            return
        schedule = merge_schedule(r, len(self.blocks))
        obstacle = self._merging_obstacle()
        if obstacle:
            raise ValueError(f"token merging: {obstacle}")
        for i, blk in enumerate(self.blocks):
            attn = getattr(blk, "attn", None)
            if not isinstance(blk, Block) or "tome" not in getattr(attn, "accepts", ()):
                name = getattr(attn, "attention_name", type(attn).__name__)
                note = getattr(attn, "merging_note", "")
                raise ValueError(f"token merging: block {i}'s attention ({name!r}) does not support it"
                                 + (f": {note}" if note else ""))
            if blk.pos is not None or blk.pos2 is not None:
                raise ValueError(f"token merging: block {i} has a position layer, which needs the token grid")
        self.token_merging = (schedule, bool(prop_attn))

    def _run_blocks_merging(self, x: Tensor, feat_size: tuple[int, int], indices: set[int] | None, *,
                            rope_grid: bool = False, num_prefix: int | None = None, stop: bool = False,
                            ) -> tuple[Tensor, list[Tensor]]:
        """``x [B, P + N, C]`` through ``blocks`` merging as they go: ``-> (tokens, [outputs of blocks indices])``,
        both back on the ``P + N`` original tokens. ``rope_grid``: carry grid positions for RoPE;
        ``num_prefix``: ``P`` of the blocks' input (default ``num_prefix_tokens``); ``stop``: no block after
        the last of ``indices`` runs."""
        assert self.token_merging is not None
        schedule, prop_attn = self.token_merging
        P = self.num_prefix_tokens if num_prefix is None else num_prefix
        state = TokenMergeState(x, P, schedule, prop_attn=prop_attn, grid=feat_size if rope_grid else None)
        saved: list[Tensor] = []
        last = max(indices) if stop and indices else None
        for i, blk in enumerate(self.blocks):
            x = blk(x, feat_size, P, tome=state)  # [B, T_i, C]
            if indices and i in indices:
                saved.append(state.unmerge(x))  # [B, P + N, C]
            if i == last:
                break
        return state.unmerge(x), saved
