"""Helpers shared by the analysis tests: reduced-depth builds of every registered model on meta."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from vit_attention import create_model
from vit_attention.models.registry import get_model_entry


def reduced(name: str, depth: int = 1) -> tuple[nn.Module, tuple[int, int, int, int]]:
    """Model ``name`` on the meta device with at most ``depth`` blocks per stage, and its input shape.

    Widths, heads, windows and input size stay the preset's, so every code path of the preset runs.
    """
    entry = get_model_entry(name)
    cfg = entry.config()
    over: dict = {}
    if isinstance(getattr(cfg, "depth", None), int):
        over["depth"] = min(cfg.depth, depth)
    if isinstance(getattr(cfg, "depths", None), (tuple, list)):
        over["depths"] = tuple(min(d, depth) for d in cfg.depths)
    with torch.device("meta"):
        model = create_model(name, **over)
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    return model, (1, getattr(cfg, "in_chans", 3), *size)


def input_shape(name: str) -> tuple[int, int, int, int]:
    """The preset's input shape ``(1, Cin, H, W)``."""
    cfg = get_model_entry(name).config()
    size = cfg.img_size if isinstance(cfg.img_size, (tuple, list)) else (cfg.img_size, cfg.img_size)
    return (1, getattr(cfg, "in_chans", 3), *size)


def fields(name: str) -> set[str]:
    """Config field names of the preset's family."""
    return {f.name for f in dataclasses.fields(get_model_entry(name).config_cls)}
