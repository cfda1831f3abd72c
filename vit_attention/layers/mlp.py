"""Transformer feed-forward network."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ..functional.linear import apply_linear, can_fuse, fusable_activation, hookless, linear
from .activation import QuickGELU

__all__ = ["Mlp"]


class Mlp(nn.Module):
    """``Linear(C, hidden) -> act -> drop -> Linear(hidden, out) -> drop``, ``[..., C] -> [..., out]``."""

    accepts_residual = True  # forward(x, residual=r) returns r + mlp(x) (blocks fuse the add into fc2)

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 *, act_layer: Callable[[], nn.Module] = nn.GELU, bias: bool = True, drop: float = 0.0) -> None:
        super().__init__()
        if not isinstance(in_features, int) or isinstance(in_features, bool) or in_features <= 0:
            raise ValueError(f"Mlp in_features must be a positive int, got {in_features!r}")
        for name, value in (("hidden_features", hidden_features), ("out_features", out_features)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"Mlp {name} must be a positive int or None (= in_features), got {value!r}")
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``[..., C] -> [..., out]`` (plus ``residual [..., out]`` when given, fused into fc2 at inference)."""
        fc1, fc2, act_layer = self.fc1, self.fc2, self.act
        if self.training:
            out = self.drop2(apply_linear(fc2, self.drop1(act_layer(apply_linear(fc1, x)))))
            return out if residual is None else residual + out
        # inference: the dropouts are the identity; fused or skipped calls only where no hook could tell
        plain = type(fc1) is nn.Linear and type(fc2) is nn.Linear and hookless(fc1, act_layer, fc2, self.drop1,
                                                                               self.drop2)
        act = fusable_activation(act_layer)
        if act is not None and plain and can_fuse(x, fc1.weight):
            h = linear(x, fc1.weight, fc1.bias, act=act)  # fc1 + bias + act in one kernel
            return linear(h, fc2.weight, fc2.bias, residual=residual)
        if type(act_layer) is QuickGELU and plain and can_fuse(x, fc1.weight):
            # x·σ(a·x) = silu(a·x) / a: fc1 scaled by a fuses with silu, fc2 takes the 1/a (same math)
            a = QuickGELU.alpha
            b1 = None if self.fc1.bias is None else self.fc1.bias * a
            h = linear(x, self.fc1.weight * a, b1, act="silu")  # a · quick_gelu(fc1(x)) in one kernel
            return linear(h, self.fc2.weight / a, self.fc2.bias, residual=residual)
        if plain:
            return apply_linear(fc2, act_layer(apply_linear(fc1, x)), residual=residual)
        out = self.drop2(apply_linear(fc2, self.drop1(act_layer(apply_linear(fc1, x)))))
        return out if residual is None else residual + out


def _project_out(mlp: nn.Module, h: Tensor, residual: Tensor | None) -> Tensor:
    """A gated MLP's tail: ``fc2(h)`` (+ ``residual``, fused into ``fc2`` at inference, where ``drop2`` is the
    identity), ``[..., hidden] -> [..., out]``."""
    if not mlp.training:
        return apply_linear(mlp.fc2, h, residual=residual)
    out = mlp.drop2(apply_linear(mlp.fc2, h))
    return out if residual is None else residual + out


def _check_width(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"{name} must be a positive int or None (= in_features), got {value!r}")


class GluMlp(nn.Module):
    """Gated MLP with one packed input projection (SwiGLU with SiLU; EVA-02 Ti / S, DINOv2-giant),
    ``[..., C] -> [..., out]``.

    ``fc1: Linear(C, hidden)`` gives two halves ``g, u`` (the gate first: ``gate_last=False`` in timm's
    ``GluMlp``, ``w12`` in DINOv2 / EVA-02), ``y = fc2(drop(act(g) · u))`` with ``fc2: Linear(hidden/2, out)``.
    ``hidden_features`` is ``fc1``'s output width (both halves), as timm counts it; an odd width rounds down
    to even, as timm sizes its packed GLU (``2·int(C·ratio/2)``). Keys ``fc1``, ``fc2``.
    """

    accepts_residual = True

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 *, act_layer: Callable[[], nn.Module] = nn.SiLU, bias: bool = True, drop: float = 0.0) -> None:
        super().__init__()
        _check_width("GluMlp in_features", in_features)
        _check_width("GluMlp hidden_features", hidden_features)
        _check_width("GluMlp out_features", out_features)
        half = (hidden_features or in_features) // 2  # an odd width rounds down to even (timm: 2·int(C·r/2))
        if half < 1:
            raise ValueError(f"GluMlp hidden_features counts both halves of fc1 and must be at least 2, "
                             f"got {hidden_features or in_features}")
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, 2 * half, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(half, out_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``[..., C] -> [..., out]`` (plus ``residual [..., out]`` when given)."""
        gate, up = apply_linear(self.fc1, x).chunk(2, dim=-1)  # each [..., hidden/2]
        return _project_out(self, self.drop1(self.act(gate) * up), residual)


class SwiGLU(nn.Module):
    """Gated MLP with separate gate and value projections and an optional inner norm (EVA-02 B / L
    "sub-LN", DINOv3 S+ / H+), ``[..., C] -> [..., out]``.

    ``y = fc2(norm(drop(act(fc1_g(x)) · fc1_x(x))))``, ``fc1_g, fc1_x: Linear(C, hidden)``,
    ``fc2: Linear(hidden, out)``; ``norm_layer(hidden)`` when given (EVA-02's ``ffn_ln``), else none.
    Keys ``fc1_g``, ``fc1_x``, ``norm``, ``fc2`` (timm's ``SwiGLU``).
    """

    accepts_residual = True

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 *, act_layer: Callable[[], nn.Module] = nn.SiLU, bias: bool = True, drop: float = 0.0,
                 norm_layer: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        _check_width("SwiGLU in_features", in_features)
        _check_width("SwiGLU hidden_features", hidden_features)
        _check_width("SwiGLU out_features", out_features)
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1_g = nn.Linear(in_features, hidden_features, bias=bias)
        self.fc1_x = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``[..., C] -> [..., out]`` (plus ``residual [..., out]`` when given)."""
        h = self.norm(self.drop1(self.act(apply_linear(self.fc1_g, x)) * apply_linear(self.fc1_x, x)))
        return _project_out(self, h, residual)


__all__ += ["GluMlp", "SwiGLU"]
