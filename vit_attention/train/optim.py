"""The optimizer-step pieces of the engine: the learning-rate schedule (linear warm-up, cosine decay),
AdamW parameter groups (no weight decay on biases, norms, position embeddings, tokens), the EMA of
the weights, per-step seeding of the random generators, and the bf16 autocast choice."""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from .distributed import unwrap_model

__all__ = ["lr_at", "param_groups", "ModelEma", "seed_step"]


def lr_at(step: int, *, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warm-up, then cosine decay to ``min_lr``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay for weight matrices, none for biases, norms, position embeddings and tokens."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        bare = name.removeprefix("module.").removeprefix("_fsdp_wrapped_module.")
        (no_decay if p.ndim <= 1 or bare in skip or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


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
