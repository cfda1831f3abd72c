"""Multi-head attention with separate query / key / value widths (cross-attention).

A batch-first counterpart of ``torch.nn.MultiheadAttention`` that computes through the
library's single attention function. It loads an ``nn.MultiheadAttention`` state dict (packed
``in_proj_weight`` or separate ``q/k/v_proj_weight``) and reproduces its outputs; masks follow
``nn.MultiheadAttention``'s conventions so it is a drop-in replacement.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_heads
from ..functional.layout import token_layout
from ..functional.observers import attention_observed
from .base import AttentionCall, AttentionModule, refuse_unaccepted
from .registry import global_as_built, register_attention

__all__ = ["MultiHeadAttention"]


def _pick(name: str, value: Any, alias: str, alias_value: Any, default: Any) -> Any:
    """One value from a keyword and its torch alias; both given and different raises naming both."""
    if value is not None and alias_value is not None and value != alias_value:
        raise ValueError(f"{name}={value!r} and its alias {alias}={alias_value!r} disagree; pass one of them")
    return value if value is not None else alias_value if alias_value is not None else default


@register_attention(
    "mha", layout="tokens", description="multi-head attention with kdim/vdim (cross-attention)",
    paper="https://arxiv.org/abs/1706.03762",
    formula=(
        "Multi-head attention with separate query / key / value inputs (Vaswani et al. 2017), the batch-first "
        "counterpart of `torch.nn.MultiheadAttention` (loads its state dict):\n\n"
        "    q = split_heads(query W_q); k = split_heads(key W_k); v = split_heads(value W_v)\n"
        "    out = merge_heads(softmax(q kᵀ · hd^-1/2 + mask) v) W_o     # [B, N, E]\n\n"
        "Called with one tensor it is self-attention (the plug-and-play contract; `AttentionCall(context=...)` "
        "takes keys / values from another sequence); with three it is cross-attention in torch's form."),
    cost="4·N·C² + 2·N·M·C multiply-adds (M = N for self-attention)",
    example_shape=(2, 11, 32), global_kwargs=global_as_built)
class MultiHeadAttention(AttentionModule):
    """Multi-head attention, query ``[B, N, E]``, key ``[B, M, kdim]``, value ``[B, M, vdim]`` -> ``[B, N, E]``.

    Called as a mechanism, ``forward(x, call)``, it is self-attention (``[B, N, E] -> [B, N, E]``); with
    ``call.context [B, M, kdim]`` keys and values come from it. Called in torch's form,
    ``forward(query, key, value, ...)``, it returns ``(out, weights)``. Masks of torch's form use
    ``nn.MultiheadAttention`` conventions: ``key_padding_mask [B, M]`` bool with True = ignore
    this key (or additive float); ``attn_mask [N, M]`` or ``[B*nh, N, M]``, bool True = not
    allowed (or additive float; a float ``-inf`` row gives NaN, as in torch).

    Args:
        dim: width ``E`` (alias ``embed_dim``, torch's name). num_heads: ``nh``.
        kdim, vdim: key / value widths (default ``E``).
        qkv_bias: bias on the q, k, v projections; proj_bias: on the output projection (alias
            ``bias``, torch's name, sets both).
        attn_drop: dropout on the weights (alias ``dropout``, torch's name). proj_drop: on the output.
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    accepts = frozenset({"context"})

    def __init__(
        self,
        dim: int | None = None,
        num_heads: int = 8,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        qkv_bias: bool | None = None,
        proj_bias: bool | None = None,
        attn_drop: float | None = None,
        proj_drop: float = 0.0,
        embed_dim: int | None = None,
        bias: bool | None = None,
        dropout: float | None = None,
    ) -> None:
        super().__init__()
        dim = _pick("dim", dim, "embed_dim", embed_dim, None)
        attn_drop = _pick("attn_drop", attn_drop, "dropout", dropout, 0.0)
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)  # type: ignore[arg-type]
        self.scale = self.head_dim ** -0.5  # the logit scale (torch's default; the forward and transfer read it)
        self.embed_dim = self.dim
        self.kdim, self.vdim = kdim or self.dim, vdim or self.dim
        in_bias = bool(_pick("qkv_bias", qkv_bias, "bias", bias, True))
        out_bias = bool(_pick("proj_bias", proj_bias, "bias", bias, True))
        self.q_proj = nn.Linear(self.dim, self.dim, bias=in_bias)
        self.k_proj = nn.Linear(self.kdim, self.dim, bias=in_bias)
        self.v_proj = nn.Linear(self.vdim, self.dim, bias=in_bias)
        self.out_proj = nn.Linear(self.dim, self.dim, bias=out_bias)

    @property
    def dropout(self) -> float:
        """torch's name of :attr:`attn_drop`."""
        return self.attn_drop

    def _build_masks(self, B: int, N: int, M: int, key_padding_mask: Tensor | None,
                     attn_mask: Tensor | None, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """torch's masks -> the core's ``(bias, mask)``: additive float ``[B | 1, nh | 1, N | 1, M]`` and bool
        (True = may attend)."""
        parts: list[Tensor] = []
        if attn_mask is not None:
            if attn_mask.dim() == 2:
                if attn_mask.shape != (N, M):
                    raise ValueError(f"attn_mask must be [N, M] = [{N}, {M}], got {tuple(attn_mask.shape)}")
                attn_mask = attn_mask.view(1, 1, N, M)
            elif attn_mask.dim() == 3:
                if attn_mask.shape != (B * self.num_heads, N, M):
                    raise ValueError(f"attn_mask must be [B*nh, N, M] = [{B * self.num_heads}, {N}, {M}], "
                                     f"got {tuple(attn_mask.shape)}")
                attn_mask = attn_mask.view(B, self.num_heads, N, M)
            else:
                raise ValueError(f"attn_mask must be 2-D or 3-D, got {attn_mask.dim()}-D")
            parts.append(attn_mask)
        if key_padding_mask is not None:
            if key_padding_mask.shape != (B, M):
                raise ValueError(f"key_padding_mask must be [B, M] = [{B}, {M}], got {tuple(key_padding_mask.shape)}")
            parts.append(key_padding_mask.view(B, 1, 1, M))
        bias: Tensor | None = None
        mask: Tensor | None = None
        for part in parts:
            if part.dtype == torch.bool:  # torch: True = not allowed
                mask = ~part if mask is None else mask & ~part
            else:
                bias = part.to(dtype) if bias is None else bias + part.to(dtype)
        return bias, mask

    def forward(self, x: Tensor, call: AttentionCall | Tensor = AttentionCall(), value: Tensor | None = None, *,
                key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None, need_weights: bool = False,
                average_attn_weights: bool = True) -> Any:
        """Two forms: the mechanism's ``forward(x, call)`` and ``torch.nn.MultiheadAttention``'s
        ``forward(query, key, value, ...)``.

        The mechanism's: ``x [B, N, E]`` attends to itself, or to ``call.context [B, M, kdim]`` (keys and
        values); ``call.feat_size`` is not needed and prefix tokens attend like the others; returns ``[B, N, E]``.
        torch's (a tensor in second place): ``x`` is the query, ``call`` the key ``[B, M, kdim]``, ``value``
        ``[B, M, vdim]`` (default the key), with torch's masks; returns ``(out [B, N, E], weights)``, the
        weights ``[B, N, M]`` averaged over heads, ``[B, nh, N, M]`` if not averaged, or None without
        ``need_weights``.
        """
        if isinstance(call, Tensor):  # torch's form: (query, key, value)
            return self._attend(x, call, call if value is None else value, key_padding_mask=key_padding_mask,
                                attn_mask=attn_mask, need_weights=need_weights,
                                average_attn_weights=average_attn_weights)
        if value is not None or key_padding_mask is not None or attn_mask is not None or need_weights:
            raise ValueError("value / key_padding_mask / attn_mask / need_weights belong to torch's form "
                             "forward(query, key, value, ...): pass the key tensor second")
        refuse_unaccepted(self, call)
        key = x if call.context is None else call.context
        return self._attend(x, key, key, feat_size=call.feat_size, num_prefix_tokens=call.num_prefix_tokens)[0]

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, *, feat_size: tuple[int, int] | None = None,
                num_prefix_tokens: int = 0, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                need_weights: bool = False, average_attn_weights: bool = True) -> tuple[Tensor, Tensor | None]:
        """``query [B, N, E]`` attends to ``key [B, M, kdim]`` / ``value [B, M, vdim]`` -> ``(out [B, N, E],
        weights or None)`` (:meth:`forward`)."""
        if query.dim() != 3 or query.shape[-1] != self.dim:
            raise ValueError(f"query must be [B, N, {self.dim}], got {tuple(query.shape)}")
        if key.dim() != 3 or key.shape[-1] != self.kdim:
            raise ValueError(f"key must be [B, M, kdim={self.kdim}], got {tuple(key.shape)}")
        if value.dim() != 3 or value.shape[-1] != self.vdim or value.shape[:2] != key.shape[:2]:
            raise ValueError(f"value must be [B, M, vdim={self.vdim}] with key's B, M; got {tuple(value.shape)}")
        B, N, _ = query.shape
        M = key.shape[1]
        q = split_heads(self.q_proj(query), self.num_heads)  # [B, nh, N, hd]
        k = split_heads(self.k_proj(key), self.num_heads)  # [B, nh, M, hd]
        v = split_heads(self.v_proj(value), self.num_heads)  # [B, nh, M, hd]
        bias, mask = self._build_masks(B, N, M, key_padding_mask, attn_mask, q.dtype)
        layout = token_layout(N, feat_size, num_prefix_tokens, num_context=None if key is query else M) \
            if attention_observed() else None  # where the rows sit on the grid (observers only; cached)
        weights: Tensor | None = None
        if need_weights:
            out, weights = self.attend(q, k, v, scale=self.scale, bias=bias, mask=mask, layout=layout,
                                       return_weights=True)
        else:
            out = self.attend(q, k, v, scale=self.scale, bias=bias, mask=mask, layout=layout)
        out = self.project_out(merge_heads(out), proj=self.out_proj)  # [B, N, E]
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # [B, N, M]
        return out, weights

    def _load_from_state_dict(self, state_dict: dict[str, Tensor], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Accept ``nn.MultiheadAttention`` keys: packed ``in_proj_*`` or ``{q,k,v}_proj_weight``."""
        E = self.dim
        packed_w = state_dict.pop(prefix + "in_proj_weight", None)
        if packed_w is not None:
            for i, name in enumerate("qkv"):
                state_dict[f"{prefix}{name}_proj.weight"] = packed_w[i * E:(i + 1) * E]
        for name in "qkv":
            sep = state_dict.pop(f"{prefix}{name}_proj_weight", None)
            if sep is not None:
                state_dict[f"{prefix}{name}_proj.weight"] = sep
        packed_b = state_dict.pop(prefix + "in_proj_bias", None)
        if packed_b is not None:
            for i, name in enumerate("qkv"):
                state_dict[f"{prefix}{name}_proj.bias"] = packed_b[i * E:(i + 1) * E]
        for unsupported in ("bias_k", "bias_v"):
            if prefix + unsupported in state_dict:
                raise ValueError(f"{prefix}{unsupported}: add_bias_kv checkpoints are not supported")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None) -> int:
        """Multiply-adds for self-attention on ``input_shape = (B, N, E)``."""
        B, N, C = input_shape
        return B * (4 * N * C * C + 2 * N * N * C)
