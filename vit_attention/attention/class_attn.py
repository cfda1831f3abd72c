"""CaiT's class attention (Touvron et al., 2021) on tokens ``[B, N, C]``: keys and values from ``context``.

In CaiT's class-attention stage only the class token queries; keys and values come from all of
``u = norm([x_cls; x_patches])`` and only the class token is updated. Under the package's one
calling convention that is cross-attention: the class-attention block calls
``attn(u[:, :1], AttentionCall(context=u))`` (``[B, 1, C] -> [B, 1, C]``) and adds the result to ``x_cls``; the
patch tokens are not passed as queries, so they stay frozen. Without ``context`` the keys and
values come from ``x`` itself (every token queries: self-attention with separate q / k / v
projections), which is how the mechanism sits in a plain block or ``plug``. Key names follow
timm's ``cait.ClassAttn``: ``q``, ``k``, ``v``, ``proj``.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..functional import merge_heads, split_heads
from ..functional.linear import apply_linear
from .base import AttentionCall, AttentionModule, check_tokens_call, observed_layout
from .registry import global_as_built, register_attention

__all__ = ["ClassAttention"]


@register_attention(
    "class_attn", layout="tokens", description="class attention: queries from x, keys / values from context (CaiT)",
    paper="https://arxiv.org/abs/2103.17239",
    formula=(
        "Class attention (CaiT, Touvron et al. 2021). With `u = norm([x_cls; x_patches])` the class token "
        "alone queries all `N+1` tokens and only it is updated; the block calls "
        "`attn(u[:, :1], AttentionCall(context=u))`:\n\n"
        "    q = split_heads(x W_q)                          # [B, nh, N, hd]   (x = u[:, :1] in CaiT: N = 1)\n"
        "    k, v = split_heads(ctx W_k), split_heads(ctx W_v)  # [B, nh, M, hd] (ctx = u, M = N_patches + 1)\n"
        "    out = merge_heads(softmax(q kᵀ · hd^-1/2) v) W_proj   # [B, N, C]\n\n"
        "Without `context`, `ctx = x` (self-attention with separate q / k / v projections)."),
    cost="2·N·C² + 2·M·C² + 2·N·M·C multiply-adds (CaiT: N = 1 query, M = N_patches + 1 keys: linear in the tokens)",
    example_shape=(2, 11, 32), global_kwargs=global_as_built)
class ClassAttention(AttentionModule):
    """Class attention, ``x [B, N, C]`` (queries), ``context [B, M, C]`` (keys, values; default x) -> ``[B, N, C]``.

    ``q``, ``k``, ``v`` are separate ``Linear(C, C)`` (timm's layout). Cost:
    ``2·N·C² + 2·M·C² + 2·N·M·C`` multiply-adds.
    """

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = {"q": "q", "k": "k", "v": "v", "o": "proj"}

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.scale = qk_scale if qk_scale is not None else self.head_dim ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    accepts = frozenset({"context"})

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``x [B, N, C] -> [B, N, C]``.

        ``call.context [B, M, C]``: keys and values come from it (CaiT: ``x = u[:, :1]``, ``context = u``);
        without it they come from ``x``. ``feat_size`` is not needed and prefix tokens attend like
        every other token.
        """
        check_tokens_call(self, x, call)
        context = call.context
        ctx = x if context is None else context  # [B, M, C]
        q = split_heads(apply_linear(self.q, x), self.num_heads)  # [B, nh, N, hd]
        k = split_heads(apply_linear(self.k, ctx), self.num_heads)  # [B, nh, M, hd]
        v = split_heads(apply_linear(self.v, ctx), self.num_heads)  # [B, nh, M, hd]
        layout = observed_layout(x, call, num_context=None if context is None else context.shape[1])
        x = self.attend(q, k, v, scale=self.scale, layout=layout)  # [B, nh, N, hd]
        return self.project_out(merge_heads(x))  # [B, N, C]

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None,
              context_len: int | None = None) -> int:
        """Multiply-adds for one forward on ``input_shape = (B, N, C)`` with ``M = context_len`` keys (default ``N``).

        ``2·N·C² + 2·M·C² + 2·N·M·C`` (CaiT: ``N = 1``, ``M = N_patches + 1``).
        """
        B, N, C = input_shape
        M = N if context_len is None else context_len
        return B * (2 * N * C * C + 2 * M * C * C + 2 * N * M * C)
