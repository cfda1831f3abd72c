"""PVTv2's feed-forward network with a depthwise 3x3 conv: ``fc1 -> (ReLU) -> dwconv -> GELU -> fc2``."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ..functional.conv_act import conv2d_act
from ..functional.linear import apply_linear, can_fuse, fusable_activation, hookless, linear

__all__ = ["MlpDWConv"]


class MlpDWConv(nn.Module):
    """Depthwise-conv MLP on a channels-last map, ``[B, H, W, C] -> [B, H, W, out]`` (PVTv2, Wang et al. 2022).

    ``fc1 (C -> hidden) -> ReLU (extra_relu, PVTv2-Li) -> depthwise 3x3 conv (bias) -> act -> drop
    -> fc2 (hidden -> out) -> drop``. The conv mixes neighbouring tokens, so the input must be the map
    (the blocks of a hierarchical stage hand it over as ``[B, H, W, C]``). Keys: ``fc1``, ``dwconv``,
    ``fc2`` (timm's ``MlpWithDepthwiseConv``; the original repository nests ``dwconv.dwconv``).
    """

    accepts_residual = True  # forward(x, residual=r) returns r + mlp(x) (blocks fuse the add into fc2)

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 *, act_layer: Callable[[], nn.Module] = nn.GELU, bias: bool = True, drop: float = 0.0,
                 extra_relu: bool = False, kernel_size: int = 3) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("hidden_features", hidden_features or 1),
                            ("out_features", out_features or 1), ("kernel_size", kernel_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MlpDWConv {name} must be a positive int, got {value!r}")
        hidden = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden, bias=bias)
        self.relu = nn.ReLU() if extra_relu else nn.Identity()
        self.dwconv = nn.Conv2d(hidden, hidden, kernel_size, padding=kernel_size // 2, groups=hidden, bias=True)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, out_features or in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``[B, H, W, C] -> [B, H, W, out]`` (plus ``residual`` when given, fused into fc2 at inference)."""
        if x.dim() != 4:
            raise ValueError(f"MlpDWConv takes a channels-last map [B, H, W, C], got {tuple(x.shape)}")
        fast = (not self.training and type(self.fc1) is nn.Linear and hookless(self.fc1, self.relu, self.fc2)
                and can_fuse(x, self.fc1.weight))
        relu = fusable_activation(self.relu) if isinstance(self.relu, nn.ReLU) else None
        if fast and (relu is not None or isinstance(self.relu, nn.Identity)):
            h = linear(x, self.fc1.weight, self.fc1.bias, act=relu)  # [B, H, W, hidden] (ReLU fused)
        else:
            h = self.relu(apply_linear(self.fc1, x))  # [B, H, W, hidden]
        act = fusable_activation(self.act)
        if fast and act is not None and type(self.dwconv) is nn.Conv2d and hookless(self.dwconv, self.act):
            d = self.dwconv  # dwconv + act in one oneDNN kernel (channels-last in and out)
            h = conv2d_act(h.permute(0, 3, 1, 2), d.weight, d.bias, padding=d.padding[0], groups=d.groups, act=act)
            h = h.permute(0, 2, 3, 1)  # [B, H, W, hidden]
        else:
            h = self.drop1(self.act(self.dwconv(h.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)))  # [B, H, W, hidden]
        if fast:
            return linear(h, self.fc2.weight, self.fc2.bias, residual=residual)  # [B, H, W, out]
        out = self.drop2(apply_linear(self.fc2, h))
        return out if residual is None else residual + out
