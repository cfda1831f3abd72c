"""The parallel-scaling block (ViT-22B, Dehghani et al. 2023, arXiv 2302.05442) as timm 1.0.31 builds it.

``x + drop_path(ls(attn(norm1(x)) + mlp(norm1(x))))``: one norm feeds both branches, their sum has one
LayerScale and one output bias. timm's ``ParallelScalingBlock`` / ``DiffParallelScalingBlock``
(``timm/models/vision_transformer.py``) fuse the MLP's ``fc1`` and the attention's ``qkv`` into one
``in_proj`` (rows ``[fc1 | q | k | v]``) and the attention's ``proj`` and the MLP's ``fc2`` into one
``out_proj`` (columns ``[attn | mlp]``, with ``fuse_out_proj``); here they are the attention mechanism's
own ``qkv`` / ``proj`` (without its bias) and the MLP's ``fc1`` / ``fc2`` (whose bias is the output bias), so
any registered mechanism is the attention, with the same parameters as timm's fused layout
(:mod:`vit_attention.weights.parallel_scaling` converts those checkpoints).

State-dict keys: ``norm1``, ``attn.*``, ``mlp.fc1``, ``mlp.fc2``, ``ls.gamma``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from ..attention import get_attention_spec
from ..attention.base import AttentionCall
from ..functional.tome import TokenMergeState
from .block import Block
from .drop_path import DropPath
from .layer_scale import LayerScale
from .layout_adapter import apply_attention

__all__ = ["ParallelScalingBlock"]


class ParallelScalingBlock(Block):
    """Parallel attention and MLP with one LayerScale and one output bias, ``[B, N, C] -> [B, N, C]``.

    The arguments are :class:`~vit_attention.layers.block.Block`'s (its ``"parallel"`` style), except:
    ``init_values`` / ``drop_path`` apply once, to the sum of the branches; the output bias is the MLP's
    ``fc2`` bias (timm's ``out_proj.bias``), so the mechanism is built without its ``proj`` bias where it takes
    ``proj_bias``, and ``proj_bias`` must equal ``mlp_bias`` (the MLP's ``fc1`` bias is timm's part of
    ``in_proj.bias``, or its ``mlp_bias`` when there is no qkv bias). No position layers, no class-attention
    ``context``.
    """

    def __init__(self, dim: int, num_heads: int, *, proj_bias: bool = True, mlp_bias: bool = True,
                 drop_path: float = 0.0, init_values: float | None = None, attn_layer: str = "mhsa",
                 attn_kwargs: Mapping[str, Any] | None = None,
                 pos_layer: Callable[[int], nn.Module] | None = None,
                 pos_mlp_layer: Callable[[int], nn.Module] | None = None, **kwargs: Any) -> None:
        if proj_bias != mlp_bias:
            raise ValueError(f"a parallel-scaling block has one output bias (the MLP's fc2, timm's out_proj.bias): "
                             f"proj_bias and mlp_bias must agree, got proj_bias={proj_bias}, mlp_bias={mlp_bias}")
        if pos_layer is not None or pos_mlp_layer is not None:
            raise ValueError("a parallel-scaling block takes no pos_layer / pos_mlp_layer")
        if kwargs.pop("style", "parallel") != "parallel":
            raise ValueError("a parallel-scaling block has the 'parallel' style only")
        spec = get_attention_spec(attn_layer)
        own_bias = not ("proj_bias" in spec.init_kwargs or spec.init_accepts_any)  # kept where it cannot be left out
        super().__init__(dim, num_heads, style="parallel", proj_bias=own_bias, mlp_bias=mlp_bias,
                         attn_layer=attn_layer, attn_kwargs=attn_kwargs, **kwargs)
        del self.ls1, self.ls2, self.drop_path1, self.drop_path2, self.norm2  # one of each, over the sum
        self.ls = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, feat_size: tuple[int, int] | None = None, num_prefix_tokens: int = 0, *,
                context: Tensor | None = None, mask: Tensor | None = None, rope_coords: Tensor | None = None,
                rope_valid: Tensor | None = None, tome: TokenMergeState | None = None) -> Tensor:
        """``[B, P + H·W, C]`` (grid ``feat_size``, ``P`` prefix tokens) -> same shape; ``mask`` / ``rope_coords`` /
        ``rope_valid`` reach the mechanism as in :meth:`Block.forward`; ``tome``: token merging after the block
        (both branches read one norm), ``[B, T, C] -> [B, T - r, C]``."""
        if context is not None:
            raise ValueError("context (the class-attention flow) needs a pre-norm Block, not a parallel-scaling one")
        if tome is not None:
            if mask is not None or rope_coords is not None or rope_valid is not None:
                raise ValueError("token merging takes no mask / rope_coords / rope_valid (packed NaFlex batches)")
            call = AttentionCall(feat_size, num_prefix_tokens, tome=tome)
        else:
            call = AttentionCall(feat_size, num_prefix_tokens, mask=mask, rope_coords=rope_coords,
                                 rope_valid=rope_valid)
        y = self.norm1(x)  # [B, N, C], both branches
        x = x + self.drop_path(self.ls(apply_attention(self.attn, y, call) + self.mlp(y)))  # [B, N, C]
        return x if tome is None else tome.merge(x)

    def extra_repr(self) -> str:
        return "style='parallel_scaling'"
