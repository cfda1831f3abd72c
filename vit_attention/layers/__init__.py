"""Reusable building blocks: patch embedding, MLP, drop path, layer scale, position layers, the block,
the stage scaffolding, downsampling and heads."""

from .block import BLOCK_STYLES, Block, accepted_kwargs
from .downsample import PatchMerging
from .drop_path import DropPath, drop_path
from .head import AttentionPoolHead, ClassifierHead
from .layer_scale import LayerScale
from .layout_adapter import apply_attention
from .mlp import GluMlp, Mlp, SwiGLU
from .patch_embed import ConvStemPatchEmbed, PatchEmbed
from .plug import Plug, plug
from .pos_embed import PosConv
from .stage import (
    Stage,
    Tokens,
    as_map,
    drop_path_schedule,
    resolve_indices,
    run_blocks,
    run_blocks_with_taps,
    run_stages,
    stage_feature_info,
)

__all__ = [
    "BLOCK_STYLES",
    "AttentionPoolHead",
    "Block",
    "ClassifierHead",
    "ConvStemPatchEmbed",
    "DropPath",
    "LayerScale",
    "GluMlp",
    "Mlp",
    "SwiGLU",
    "PatchEmbed",
    "PatchMerging",
    "Plug",
    "PosConv",
    "Stage",
    "Tokens",
    "accepted_kwargs",
    "apply_attention",
    "as_map",
    "drop_path",
    "drop_path_schedule",
    "plug",
    "resolve_indices",
    "run_blocks",
    "run_blocks_with_taps",
    "run_stages",
    "stage_feature_info",
]
