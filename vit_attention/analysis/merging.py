"""Which patches token merging (ToMe) put together: per block, the merged token covering each patch.

``merge_groups(model, images)`` runs a model with :meth:`set_token_merging` on and returns, after
each block, an ``[B, h, w]`` map of group ids (patches with the same id are one token there);
:func:`vit_attention.analysis.render.save_merge_groups` draws them over the image.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..functional.tome import recording_merges

__all__ = ["merge_groups"]


@torch.no_grad()
def merge_groups(model: nn.Module, images: Tensor, *, blocks: Sequence[int] | None = None) -> list[Tensor]:
    """Group maps of a merging model on ``images [B, Cin, H, W]``: one ``[B, h, w]`` int64 tensor per block (or per
    ``blocks`` entry; negative indices count from the end), ids shared by the patches one token covers.

    The model must have token merging set (:meth:`set_token_merging`); its grid is ``model.feat_size``.
    """
    if getattr(model, "token_merging", None) is None:
        raise ValueError("merge_groups needs a model with token merging on: call model.set_token_merging(r) first")
    with recording_merges() as maps:
        model.forward_features(images)
    h, w = model.feat_size(tuple(images.shape[-2:]))
    P = model.num_prefix_tokens
    grids = [m[:, P:].reshape(m.shape[0], h, w) for m in maps]  # [B, h, w] each
    if blocks is None:
        return grids
    return [grids[i] for i in blocks]
