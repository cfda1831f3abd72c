"""ReLU linear attention (EfficientViT-MIT's LiteMLA, Cai et al., ICCV 2023): a ratio of linear sums, no softmax.

With the kernel ``phi = ReLU`` on queries and keys (values untouched), each query's output is

    out_i = Σ_j (phi(q_i) · phi(k_j)) v_j / (Σ_j phi(q_i) · phi(k_j) + eps)

computed right to left as two matrix products, so no ``N x N`` matrix exists and the cost grows
linearly with the tokens: ``v`` gets a column of ones (its product gives the denominator), then
``kv = phi(k)ᵀ [v | 1]`` ``[.., hd, hd + 1]`` and ``phi(q) kv`` ``[.., N, hd + 1]``, whose last column
divides the others. The products and the division run in float32 with autocast off and the result is
cast back to the values' dtype (timm 1.0.31 ``timm/models/efficientvit_mit.py`` ``LiteMLA._attn``,
"need to be in float32 to train w/o NaN"); ``eps = 1e-5`` is timm's (the original
mit-han-lab/efficientvit ``models/nn/ops.py`` uses ``1e-15``).

There are no attention weights: no row of probabilities is formed, so nothing is handed to the
library's attention core (and no observer sees a call).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["relu_linear_attention", "relu_linear_attention_flops"]


def relu_linear_attention(q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-5) -> Tensor:
    """ReLU linear attention over the token axis: ``q [*b, Nq, hd]``, ``k, v [*b, N, hd]`` -> ``[*b, Nq, hdv]``
    (``v``'s dtype and width).

    ``q`` and ``k`` go through ReLU here; ``eps`` keeps the division finite where a query meets no key
    (``ReLU(q_i) · Σ_j ReLU(k_j) = 0``: the output row is then 0).
    """
    if q.dim() < 2 or q.shape[-1] != k.shape[-1] or q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"expected q [*b, Nq, hd], k [*b, N, hd] and v [*b, N, hdv], got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    dtype = v.dtype
    q, k = F.relu(q), F.relu(k)
    v = F.pad(v, (0, 1), mode="constant", value=1.0)  # [*b, N, hd + 1]: the ones column gives the denominator
    if v.device.type != "meta" and not torch.jit.is_scripting():
        with torch.autocast(device_type=v.device.type, enabled=False):
            out = _ratio(q.float(), k.float(), v.float(), eps)
    else:
        out = _ratio(q.float(), k.float(), v.float(), eps)
    return out.to(dtype)


def _ratio(q: Tensor, k: Tensor, v: Tensor, eps: float) -> Tensor:
    kv = k.transpose(-1, -2) @ v  # [*b, hd, hd + 1]
    out = q @ kv  # [*b, N, hd + 1]
    return out[..., :-1] / (out[..., -1:] + eps)  # [*b, N, hd]


def relu_linear_attention_flops(groups: int, tokens: int, head_dim: int) -> int:
    """Multiply-adds of :func:`relu_linear_attention` on ``groups`` sequences of ``tokens`` x ``head_dim``:
    the two products, ``2 · groups · N · hd · (hd + 1)`` (ReLU, padding and the division are not counted)."""
    return 2 * groups * tokens * head_dim * (head_dim + 1)
