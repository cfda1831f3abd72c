"""DeiT knowledge distillation (Touvron et al. 2021): a frozen teacher guides the student.

The student's loss mixes the usual loss on its class output with a distillation loss:

* ``soft``: ``KL(softmax(t / τ) || softmax(s / τ)) · τ²`` (Hinton et al.),
* ``hard``: cross-entropy against the teacher's arg-max class (DeiT's recommended choice),

``loss = (1 - α) · base + α · distill``. A distilled DeiT (``distilled=True``) returns
``(cls_logits, dist_logits)`` in training: the class head learns from the labels, the
distillation token's head from the teacher. Other students distil through their single output.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DistillationLoss", "build_teacher", "soft_target_cross_entropy"]

DistillType = Literal["none", "soft", "hard"]


def soft_target_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Per-sample cross-entropy with probability targets: ``[B, K], [B, K] -> [B]``."""
    return -(target * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1)


def build_teacher(name_or_path: str, *, num_classes: int, img_size: tuple[int, int], in_chans: int,
                  checkpoint: str | Path | None = None) -> nn.Module:
    """A frozen teacher in eval mode: a registered model name (weights from ``checkpoint``) or a checkpoint file.

    Refuses (``ValueError`` naming ``--teacher`` / ``--teacher-checkpoint``) a name without weights (a random
    teacher would distil noise), a teacher of another class count, and one that takes another input size than
    the student's ``img_size`` ``(H, W)``.
    """
    from ..factory import create_model
    from ..weights import load_model

    p = Path(name_or_path)
    from_file = checkpoint is None and (p.suffix == ".safetensors" or p.is_dir())
    if checkpoint is None and not from_file:
        if p.exists():
            raise ValueError(f"--teacher {name_or_path}: expected a run folder or a .safetensors file of ours, or a "
                             "registered model name with --teacher-checkpoint")
        raise ValueError(f"--teacher {name_or_path} is a model name without weights: a random teacher would distil "
                         "noise. Give its weights with --teacher-checkpoint FILE (a checkpoint file, a model folder "
                         "or hf-hub:ORG/REPO), or pass a run folder / model.safetensors of ours as --teacher")
    if from_file:
        teacher = load_model(p)  # name + config from the file's metadata
    else:
        teacher = create_model(name_or_path, num_classes=num_classes, img_size=img_size, in_chans=in_chans,
                               pretrained=checkpoint)
    out = getattr(teacher, "num_classes", num_classes)
    if out != num_classes:
        raise ValueError(f"--teacher {name_or_path} predicts {out} classes, the data has {num_classes}")
    size = getattr(getattr(teacher, "cfg", None), "img_size", None)
    size = (size, size) if isinstance(size, int) else tuple(size) if size is not None else None
    if size is not None and size != tuple(img_size) and not getattr(teacher.cfg, "dynamic_img_size", False):
        raise ValueError(f"--teacher {name_or_path} takes {size[0]}x{size[1]} px images, the student trains at "
                         f"{img_size[0]}x{img_size[1]} px (--img-size); give a teacher trained at that size, or "
                         f"train the student at --img-size {size[0]}")
    teacher.eval()
    for q in teacher.parameters():
        q.requires_grad_(False)
    return teacher


class DistillationLoss(nn.Module):
    """Per-sample training loss with optional distillation: ``(images, outputs, targets) -> [B]``.

    ``base_loss(logits [B, K], targets) -> [B]`` is applied to the class output; ``outputs`` is the
    student's logits ``[B, K]`` or ``(cls_logits, dist_logits)``. ``distill_type`` ``"none"`` only
    applies ``base_loss``; with a tuple output and no teacher the two heads are averaged.
    """

    def __init__(self, base_loss: Callable[[Tensor, Tensor], Tensor], teacher: nn.Module | None = None, *,
                 distill_type: DistillType = "none", alpha: float = 0.5, tau: float = 1.0) -> None:
        super().__init__()
        if distill_type not in ("none", "soft", "hard"):
            raise ValueError(f"distill_type must be 'none', 'soft' or 'hard', got {distill_type!r}")
        if distill_type != "none" and teacher is None:
            raise ValueError(f"distill_type={distill_type!r} needs a teacher model")
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if tau <= 0:
            raise ValueError(f"tau must be positive, got {tau}")
        self.base_loss, self.distill_type, self.alpha, self.tau = base_loss, distill_type, alpha, tau
        self.teacher = teacher  # registered as a sub-module: moves with .to(device), never trained

    def forward(self, images: Tensor, outputs: Tensor | tuple[Tensor, Tensor], targets: Tensor) -> Tensor:
        """``images [B, C, H, W]``, ``outputs [B, K]`` or a pair, ``targets`` -> per-sample loss ``[B]``."""
        cls_out, dist_out = (outputs if isinstance(outputs, tuple) else (outputs, outputs))
        if self.distill_type == "none":
            if isinstance(outputs, tuple):  # distilled student without teacher: both heads learn the labels
                return (self.base_loss(cls_out, targets) + self.base_loss(dist_out, targets)) / 2
            return self.base_loss(cls_out, targets)
        base = self.base_loss(cls_out, targets)
        assert self.teacher is not None
        with torch.no_grad():
            t_out = self.teacher(images)
            t_out = t_out[0] if isinstance(t_out, tuple) else t_out
        if self.distill_type == "soft":
            T = self.tau
            dist = F.kl_div(F.log_softmax(dist_out.float() / T, dim=-1), F.log_softmax(t_out.float() / T, dim=-1),
                            reduction="none", log_target=True).sum(-1) * (T * T)
        else:
            dist = F.cross_entropy(dist_out.float(), t_out.argmax(dim=-1), reduction="none")
        return (1 - self.alpha) * base + self.alpha * dist
