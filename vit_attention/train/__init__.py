"""Training: data (embedded digits, image folders, kornia augmentation), the engine, DeiT distillation,
safe resumable checkpoints, ``torchrun`` data parallelism, and the ``train`` / ``eval`` / ``predict`` /
``compare`` commands. (The small digits presets, ``vit_digits_patch2_8`` ..., live in ``models/digits.py``.)
"""

from .config import TrainConfig
from .engine import train
from .metrics import evaluate

__all__ = ["TrainConfig", "evaluate", "train"]
