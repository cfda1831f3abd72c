"""Attention mechanisms: one file per idea, each a thin nn.Module over ``functional``.

Importing this package registers every mechanism; see :func:`list_attention`.
"""

from .class_attn import ClassAttention
from .cosine_window import CosineWindowAttention  # noqa: F401
from .mha import MultiHeadAttention
from .mhsa import MultiHeadSelfAttention
from .registry import AttentionSpec, create_attention, get_attention_spec, list_attention, register_attention
from .talking_heads import TalkingHeadsAttention
from .window import WindowAttention  # noqa: F401

__all__ = [
    "AttentionSpec",
    "ClassAttention",
    "MultiHeadAttention",
    "MultiHeadSelfAttention",
    "TalkingHeadsAttention",
    "create_attention",
    "get_attention_spec",
    "list_attention",
    "register_attention",
]
