"""Training: data (embedded digits, image folders, kornia augmentation), the engine, DeiT distillation,
safe resumable checkpoints, ``torchrun`` data parallelism, and the ``train`` / ``eval`` / ``predict`` /
``compare`` commands. Importing it registers the small digits presets (``vit_digits_patch2_8``, ...).
"""

from . import presets  # noqa: F401  (registers the digits presets)
from .engine import TrainConfig, evaluate, train

__all__ = ["TrainConfig", "evaluate", "train"]
