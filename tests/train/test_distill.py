"""DeiT distillation: the loss formulas, and a distilled student trained against a teacher checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vit_attention.train import TrainConfig, train
from vit_attention.train.distill import DistillationLoss, build_teacher, soft_target_cross_entropy

from ._utils import TINY_KWARGS


class _FixedTeacher(nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits


def _onehot(y: torch.Tensor, k: int) -> torch.Tensor:
    return F.one_hot(y, k).float()


def test_hard_and_soft_distillation_formulas() -> None:
    torch.manual_seed(0)
    cls, dist, t = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    y = torch.tensor([0, 1, 2, 3])
    x = torch.zeros(4, 1, 2, 2)
    hard = DistillationLoss(soft_target_cross_entropy, _FixedTeacher(t), distill_type="hard", alpha=0.25)
    want = 0.75 * F.cross_entropy(cls, y, reduction="none") + 0.25 * F.cross_entropy(dist, t.argmax(-1),
                                                                                      reduction="none")
    assert torch.allclose(hard(x, (cls, dist), _onehot(y, 5)), want, atol=1e-6)
    soft = DistillationLoss(soft_target_cross_entropy, _FixedTeacher(t), distill_type="soft", alpha=0.5, tau=2.0)
    p_t = F.softmax(t / 2, -1)
    kl = (p_t * (p_t.log() - F.log_softmax(dist / 2, -1))).sum(-1) * 4
    assert torch.allclose(soft(x, (cls, dist), _onehot(y, 5)),
                          0.5 * F.cross_entropy(cls, y, reduction="none") + 0.5 * kl, atol=1e-5)
    # a student that copies the teacher has zero soft-distillation loss; a plain student distils its one output
    only = DistillationLoss(soft_target_cross_entropy, _FixedTeacher(t), distill_type="soft", alpha=1.0)
    assert torch.allclose(only(x, t.clone(), _onehot(y, 5)), torch.zeros(4), atol=1e-6)
    none = DistillationLoss(soft_target_cross_entropy)
    assert torch.allclose(none(x, (cls, dist), _onehot(y, 5)),
                          (F.cross_entropy(cls, y, reduction="none") + F.cross_entropy(dist, y, reduction="none")) / 2)
    with pytest.raises(ValueError, match="needs a teacher"):
        DistillationLoss(soft_target_cross_entropy, distill_type="hard")
    with pytest.raises(ValueError, match="distill_type"):
        DistillationLoss(soft_target_cross_entropy, _FixedTeacher(t), distill_type="kd")


def test_distilled_deit_learns_from_a_teacher_checkpoint(tmp_path: Path) -> None:
    common = dict(epochs=1, batch_size=128, warmup_epochs=0.2, lr=3e-3, progress=False, plot=False)
    teacher_run = train(TrainConfig(output=str(tmp_path / "teacher"), **common))  # the full digits ViT
    ckpt = Path(teacher_run["output"]) / "model.safetensors"
    teacher = build_teacher(str(ckpt), num_classes=10, img_size=(8, 8), in_chans=1)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    before = {k: v.clone() for k, v in teacher.state_dict().items()}

    student_kw = dict(TINY_KWARGS, embed_dim=16)
    plain = train(TrainConfig(model="deit_digits_distilled_patch2_8", model_kwargs=student_kw,
                              output=str(tmp_path / "plain"), **common))
    hard = train(TrainConfig(model="deit_digits_distilled_patch2_8", model_kwargs=student_kw, teacher=str(ckpt),
                             output=str(tmp_path / "hard"), **common))
    soft = train(TrainConfig(model="deit_digits_distilled_patch2_8", model_kwargs=student_kw,
                             teacher="vit_digits_patch2_8", teacher_checkpoint=str(ckpt), distill_type="soft",
                             distill_tau=2.0, output=str(tmp_path / "soft"), **common))
    assert hard["model"].cfg.distilled and hard["model"].head_dist is not None
    losses = {r["history"][0]["train_loss"] for r in (plain, hard, soft)}
    assert len(losses) == 3  # the teacher changes the objective, differently for hard and soft
    assert 0.0 <= hard["test_acc"] <= 1.0
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())


def test_teacher_by_name_needs_its_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`train --teacher NAME` without --teacher-checkpoint: refused (a random teacher distils noise), saying what
    to give; nothing is trained or written."""
    from vit_attention.cli import main

    out = tmp_path / "run"
    assert main(["train", "--teacher", "vit_digits_patch2_8", "--model-arg", "depth=1", "--epochs", "1",
                 "--no-progress", "--no-plot", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--teacher vit_digits_patch2_8 is a model name without weights" in err and "--teacher-checkpoint" in err
    assert not out.exists()
    with pytest.raises(ValueError, match="--teacher-checkpoint"):
        build_teacher("deit_tiny_patch16_224.fb_in1k", num_classes=10, img_size=(8, 8), in_chans=1)


def test_teacher_of_another_input_size_is_named(tmp_path: Path) -> None:
    """A teacher file trained at 8 px for a student at 16 px: the error says teacher and both sizes."""
    from vit_attention import create_model, save_weights

    save_weights(create_model("vit_digits_patch2_8", depth=1, num_classes=10, in_chans=1),
                 tmp_path / "t" / "model.safetensors")
    with pytest.raises(ValueError, match=r"--teacher .* takes 8x8 px images, the student trains at 16x16 px"):
        build_teacher(str(tmp_path / "t"), num_classes=10, img_size=(16, 16), in_chans=1)
    assert build_teacher(str(tmp_path / "t"), num_classes=10, img_size=(8, 8), in_chans=1) is not None
