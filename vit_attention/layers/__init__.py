"""Reusable building blocks: patch embedding, MLP, drop path, layer scale, position embeddings, blocks."""

from .block import Block, ParallelBlock, PostNormBlock, apply_token_attention
from .drop_path import DropPath, drop_path
from .layer_scale import LayerScale
from .mlp import Mlp
from .patch_embed import ConvStemPatchEmbed, PatchEmbed, to_2tuple
from .plug import Plug, plug
from .pos_embed import LearnedPosEmbed, SinCosPosEmbed2d, resample_abs_pos_embed, sincos_2d_pos_embed

__all__ = [
    "Block",
    "ConvStemPatchEmbed",
    "DropPath",
    "LayerScale",
    "LearnedPosEmbed",
    "Mlp",
    "ParallelBlock",
    "PatchEmbed",
    "Plug",
    "PostNormBlock",
    "SinCosPosEmbed2d",
    "apply_token_attention",
    "drop_path",
    "plug",
    "resample_abs_pos_embed",
    "sincos_2d_pos_embed",
    "to_2tuple",
]
