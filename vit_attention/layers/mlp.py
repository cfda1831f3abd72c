"""Transformer feed-forward network."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

__all__ = ["Mlp"]


class Mlp(nn.Module):
    """``Linear(C, hidden) -> act -> drop -> Linear(hidden, out) -> drop``, ``[..., C] -> [..., out]``."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 *, act_layer: Callable[[], nn.Module] = nn.GELU, bias: bool = True, drop: float = 0.0) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """``[..., C] -> [..., out]``."""
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))
