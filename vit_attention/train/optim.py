"""The optimizer-step pieces of the engine: the learning-rate schedule (linear warm-up, cosine decay),
AdamW parameter groups (no weight decay on biases, norms, position embeddings, tokens; optional layer-wise
learning-rate decay), the EMA of
the weights, per-step seeding of the random generators, and the bf16 autocast choice."""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from ..models.layer_groups import layer_ids
from .distributed import unwrap_model

__all__ = ["lr_at", "param_groups", "ModelEma", "seed_step"]


def lr_at(step: int, *, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warm-up, then cosine decay to ``min_lr``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict[str, Any]]:
    """AdamW groups: decay for weight matrices, none for biases, norms, position embeddings and tokens.

    ``layer_decay`` (in (0, 1]; None = off): layer-wise learning-rate decay, the fine-tuning recipe of BEiT,
    MAE, DINOv2 and EVA. Each group also carries ``lr_scale = layer_decay ** (L + 1 - layer)`` from the
    model's :func:`~vit_attention.models.layer_groups.layer_ids` (stem 0, blocks 1..L, head L + 1: the
    head trains at the full rate, each block below it at ``layer_decay`` times the one above); the engine
    multiplies the scheduled rate by it. ``model`` may be wrapped (DDP / FSDP2 keep the parameter names).
    """
    bare_model = unwrap_model(model)
    skip = set(bare_model.no_weight_decay()) if hasattr(bare_model, "no_weight_decay") else set()
    if layer_decay is not None and not hasattr(bare_model, "block_names"):
        raise ValueError(f"layer_decay needs a model with block_names() (every registered model has it); "
                         f"got {type(bare_model).__name__}")
    ids, depth = layer_ids(bare_model) if layer_decay is not None else ({}, 0)
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        bare = name.removeprefix("module.").removeprefix("_fsdp_wrapped_module.")
        no_decay = p.ndim <= 1 or bare in skip or name.endswith(".bias")
        layer = ids.get(bare, depth + 1) if layer_decay is not None else 0
        group = groups.setdefault((layer, no_decay), {"params": [], "weight_decay": 0.0 if no_decay else weight_decay})
        if layer_decay is not None:
            group["lr_scale"] = layer_decay ** (depth + 1 - layer)
        group["params"].append(p)
    if layer_decay is None:  # the two groups, decay first, even when one is empty (optimizer states line up)
        return [groups.get((0, False), {"params": [], "weight_decay": weight_decay}),
                groups.get((0, True), {"params": [], "weight_decay": 0.0})]
    return [groups[k] for k in sorted(groups)]


class ModelEma(nn.Module):
    """Exponential moving average of a model's weights: ``ema = decay · ema + (1 - decay) · w`` per step."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        super().__init__()
        self.module = copy.deepcopy(unwrap_model(model)).eval()
        self.decay = decay
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average one step towards ``model``'s current weights."""
        own = self.module.state_dict()
        for k, v in unwrap_model(model).state_dict().items():
            if own[k].is_floating_point():
                own[k].lerp_(v.to(own[k].dtype), 1.0 - self.decay)
            else:
                own[k].copy_(v)


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed torch's generators for optimizer step ``step`` on ``rank`` (a resumed run draws the same numbers)."""
    torch.manual_seed((seed * 1_000_003 + step) * 4096 + rank)


def _autocast(device: torch.device, amp: str) -> Any:
    if amp == "none" or (amp == "auto" and device.type != "cuda"):
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
