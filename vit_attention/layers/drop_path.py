"""Stochastic depth (Huang et al., 2016): drop whole residual branches per sample."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["drop_path", "DropPath"]


def drop_path(x: Tensor, p: float = 0.0, training: bool = False) -> Tensor:
    """Zero each sample's branch with probability ``p`` and rescale the rest by ``1/(1-p)``; any shape."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    shape = (x.shape[0],) + (1,) * (x.dim() - 1)
    return x * x.new_empty(shape).bernoulli_(keep).div_(keep)


class DropPath(nn.Module):
    """Module form of :func:`drop_path`; shape preserved."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop path probability p must be in [0, 1), got {p!r}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """Any shape -> same shape."""
        return drop_path(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
