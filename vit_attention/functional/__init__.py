"""Pure functions: no parameters, no nn.Module. The bottom layer of the package."""

from .attention import fused_attention_enabled, scaled_dot_product_attention, set_fused_attention
from .heads import merge_heads, split_heads, split_packed, split_qkv
from .layout import AttentionLayout, token_layout, window_layout
from .observers import attention_context, attention_observed, register_attention_hook
from .patch_embed import resample_patch_embed
from .pos_embed import resample_abs_pos_embed, sincos_2d_pos_embed
from .runtime import Switch, set_switches, switched, switches
from .sizes import make_divisible
from .window import pad_to_window, shift_window_mask, window_partition, window_reverse  # noqa: F401
from .window_attention import window_attention

__all__ = [
    "AttentionLayout",
    "attention_context",
    "attention_observed",
    "fused_attention_enabled",
    "make_divisible",
    "merge_heads",
    "register_attention_hook",
    "resample_abs_pos_embed",
    "resample_patch_embed",
    "scaled_dot_product_attention",
    "set_fused_attention",
    "set_switches",
    "sincos_2d_pos_embed",
    "split_heads",
    "split_packed",
    "split_qkv",
    "Switch",
    "switched",
    "switches",
    "token_layout",
    "window_attention",
    "window_layout",
]
