"""Causal (autoregressive) multi-head self-attention (GPT-2; iGPT, Chen et al. 2020) on tokens ``[B, N, C]``.

Token ``i`` attends to tokens ``j <= i`` of the sequence: in raster order over an image, a pixel
sees the rows above it and the pixels to its left in its own row. The mask is the core's
``is_causal`` flag (torch's fused kernel; the explicit path builds the lower-triangular mask).

For generation a :class:`KVCache` holds the keys and values of the tokens seen so far: each call
with a cache projects only the new tokens, writes their k / v after the cached ones and attends
over all of them, so one new token costs ``O(M·C)`` attention (``M`` cached tokens), not
``O(M²·C)``. Key names follow GPT-2 / timm: ``qkv`` (packed ``[q | k | v]``), ``proj``.

A :class:`StaticKVCache` is the same cache with fixed shapes, for ``torch.compile`` and CUDA graphs:
one preallocated ``[B, nh, L, hd]`` buffer per layer written in place at a position held in a
tensor, and every call attends over all ``L`` slots with a mask (the slots not yet written are
masked). Each step then has the same shapes and addresses, so one compiled graph (one CUDA graph
with ``mode="reduce-overhead"``) serves every step of a generation.

On the ``"flex"`` backend every call runs the pattern of :func:`causal_pattern` (``kv <= q + M - N``,
bottom-right aligned as :func:`causal_mask`; none for one new token), whose block mask skips the
blocks above the diagonal.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional import merge_heads, split_qkv
from ..functional.flex import AttentionPattern, PatternDoc, use_flex
from ..functional.linear import apply_linear
from .base import AttentionCall, AttentionModule, check_tokens_call, observed_layout
from .registry import register_attention
from .transfer import PACKED_QKV_SLOTS

__all__ = ["CausalSelfAttention", "KVCache", "StaticKVCache", "causal_mask", "causal_pattern"]


def causal_mask(num_queries: int, num_keys: int, *, device: torch.device | str | None = None) -> Tensor:
    """Bool ``[N, M]``, True = may attend, for the LAST ``N`` of ``M`` positions (bottom-right aligned).

    Query ``i`` is position ``M - N + i`` and may attend to keys ``j <= M - N + i``. With ``N == M``
    this is the lower triangle (``is_causal``); with a cache (``N < M``) the new queries see every
    cached key. (torch's ``is_causal`` aligns top-left, which is wrong once ``N < M``.)
    """
    if not 0 < num_queries <= num_keys:
        raise ValueError(f"causal_mask needs 0 < num_queries <= num_keys, got {num_queries} and {num_keys}")
    return torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril(num_keys - num_queries)


def causal_pattern(num_queries: int, num_keys: int) -> AttentionPattern:
    """:func:`causal_mask` as a flex :class:`~vit_attention.functional.flex.AttentionPattern` over ``N`` queries
    and ``M`` keys: query ``i`` sees keys ``j <= i + M - N`` (``mask_mod``; none when ``N == 1``: the last
    position sees every key). ``cache_key`` ``("causal", N, M)``."""
    if not 0 < num_queries <= num_keys:
        raise ValueError(f"causal_pattern needs 0 < num_queries <= num_keys, got {num_queries} and {num_keys}")
    N, M = int(num_queries), int(num_keys)
    if N == 1:
        return AttentionPattern(N, M, cache_key=("causal", N, M))
    offset = M - N

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return kv <= q + offset

    return AttentionPattern(N, M, mask_mod=mask_mod, cache_key=("causal", N, M))


class KVCache:
    """Keys and values of the tokens seen so far, one entry per attention layer.

    ``KVCache(num_layers)`` starts empty; layer ``i``'s mechanism calls :meth:`update` with its new
    ``k, v [B, nh, N, hd]`` and gets back all keys and values ``[B, nh, M, hd]`` (``M`` = cached +
    new). Storage is preallocated in chunks of ``capacity`` positions and grows by doubling, so
    appending one token copies only that token (no ``O(M)`` concatenation per step).
    """

    def __init__(self, num_layers: int, capacity: int = 256) -> None:
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
        self.capacity = max(1, int(capacity))
        self._k: list[Tensor | None] = [None] * num_layers
        self._v: list[Tensor | None] = [None] * num_layers
        self._len = [0] * num_layers

    def __len__(self) -> int:
        """Tokens cached in layer 0 (every layer holds the same number after a full forward)."""
        return self._len[0]

    def length(self, layer: int) -> int:
        """Tokens cached in ``layer``."""
        return self._len[layer]

    def get(self, layer: int) -> tuple[Tensor, Tensor]:
        """The cached keys and values of ``layer``, ``[B, nh, M, hd]`` each (views of the storage)."""
        k, v, L = self._k[layer], self._v[layer], self._len[layer]
        if k is None or v is None:
            raise ValueError(f"KVCache layer {layer} is empty")
        return k[..., :L, :], v[..., :L, :]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k [B, nh, N, hd]``, ``v [B, nh, N, hdv]`` to ``layer``; all of them ``[B, nh, M, ·]``."""
        L, N = self._len[layer], k.shape[-2]
        buf_k, buf_v = self._k[layer], self._v[layer]
        if buf_k is None or buf_v is None or L + N > buf_k.shape[-2] or buf_k.shape[:2] != k.shape[:2]:
            if buf_k is not None and buf_k.shape[:2] != k.shape[:2]:
                raise ValueError(f"KVCache layer {layer} holds [B, nh] = {list(buf_k.shape[:2])}, "
                                 f"got k {tuple(k.shape)}")
            size = max(self.capacity, 2 * (L + N))
            new_k = k.new_empty(*k.shape[:-2], size, k.shape[-1])  # [B, nh, size, hd]
            new_v = v.new_empty(*v.shape[:-2], size, v.shape[-1])
            if buf_k is not None and buf_v is not None and L:
                new_k[..., :L, :] = buf_k[..., :L, :]
                new_v[..., :L, :] = buf_v[..., :L, :]
            self._k[layer], self._v[layer] = buf_k, buf_v = new_k, new_v
        buf_k[..., L:L + N, :] = k
        buf_v[..., L:L + N, :] = v
        self._len[layer] = L + N
        return buf_k[..., :L + N, :], buf_v[..., :L + N, :]  # [B, nh, M, hd]


def _mark_static(t: Tensor) -> None:
    """Tell dynamo (CUDA graphs) that ``t`` keeps its address across calls, without guarding on it."""
    mark = getattr(getattr(torch, "_dynamo", None), "mark_static_address", None)
    if mark is None:
        return
    try:
        mark(t, guard=False)  # a new cache (a new generation) re-records instead of recompiling
    except TypeError:  # an older torch without the guard argument
        mark(t)


class StaticKVCache:
    """A key/value cache of fixed shapes: ``[B, nh, max_len, hd]`` per layer, written in place.

    Layer ``i``'s mechanism calls :meth:`update` with its new ``k, v [B, nh, N, hd]``; they are
    written at slots ``pos[i] .. pos[i] + N - 1`` (``pos`` a tensor, so no host sync and no
    recompilation as it advances) and it gets back the whole buffers ``[B, nh, max_len, hd]`` with
    the mask ``visible [N, max_len]`` (True = may attend: the slots written so far, causally). Every
    call has the same shapes, which is what ``torch.compile`` and CUDA graphs need; the price is
    attending over ``max_len`` slots each step instead of the ``M`` written ones.

    Unwritten slots hold zeros and are masked. Writing past ``max_len`` is an index error (a device
    assert on CUDA): :meth:`ImageGPT.generate` sizes the cache to the model's positions.
    """

    static = True  # what mechanisms test to take the fixed-shape path

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, max_len: int, head_dim: int, *,
                 head_dim_v: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        for value, arg in ((num_layers, "num_layers"), (batch_size, "batch_size"), (num_heads, "num_heads"),
                           (max_len, "max_len"), (head_dim, "head_dim"), (head_dim_v or head_dim, "head_dim_v")):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"StaticKVCache: {arg} must be a positive int, got {value!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"StaticKVCache: dtype must be a floating torch.dtype, got {dtype!r}")
        hdv = head_dim_v or head_dim
        self.max_len = max_len
        self._k = [torch.zeros(batch_size, num_heads, max_len, head_dim, dtype=dtype, device=device)
                   for _ in range(num_layers)]
        self._v = [torch.zeros(batch_size, num_heads, max_len, hdv, dtype=dtype, device=device)
                   for _ in range(num_layers)]
        self.pos = torch.zeros(num_layers, dtype=torch.long, device=device)  # [num_layers]: slots written
        self._slots = torch.arange(max_len, device=device)  # [max_len]
        for t in (*self._k, *self._v, self.pos, self._slots):
            _mark_static(t)

    def __len__(self) -> int:
        """Tokens written in layer 0 (reads ``pos`` back to the host: a sync on a GPU)."""
        return int(self.pos[0])

    def length(self, layer: int) -> int:
        """Tokens written in ``layer`` (a host sync on a GPU)."""
        return int(self.pos[layer])

    def position(self, layer: int = 0) -> Tensor:
        """The first free slot of ``layer``, a 0-d long tensor (no host sync)."""
        return self.pos[layer]

    def reset(self) -> None:
        """Forget every token (the buffers are kept: unwritten slots are masked, whatever they hold)."""
        self.pos.zero_()
        for t in (*self._k, *self._v):
            t.zero_()

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write ``k [B, nh, N, hd]``, ``v [B, nh, N, hdv]`` at the next ``N`` slots of ``layer``.

        Returns ``(keys [B, nh, max_len, hd], values [B, nh, max_len, hdv], visible [N, max_len])``:
        new token ``i`` (slot ``p + i``) may attend to slots ``<= p + i``.
        """
        buf_k, buf_v = self._k[layer], self._v[layer]
        if k.shape[:2] != buf_k.shape[:2] or k.shape[-1] != buf_k.shape[-1] or v.shape[-1] != buf_v.shape[-1]:
            raise ValueError(f"StaticKVCache layer {layer} holds [B, nh, ·, hd] = "
                             f"{[*buf_k.shape[:2], '·', buf_k.shape[-1]]}, got k {tuple(k.shape)}, v {tuple(v.shape)}")
        if k.dtype != buf_k.dtype:
            raise ValueError(f"StaticKVCache holds {buf_k.dtype}, got k of {k.dtype}: build it with "
                             f"dtype={k.dtype} (the dtype the attention computes in)")
        N = k.shape[-2]
        slots = self.pos[layer] + torch.arange(N, device=k.device)  # [N]
        buf_k.index_copy_(2, slots, k)
        buf_v.index_copy_(2, slots, v)
        self.pos[layer] += N
        visible = self._slots[None, :] <= slots[:, None]  # [N, max_len]
        return buf_k, buf_v, visible


@register_attention(
    "causal", layout="tokens", description="causal multi-head self-attention (GPT-2 / iGPT) with a key/value cache",
    paper="https://cdn.openai.com/papers/Generative_Pretraining_from_Pixels_V2.pdf",
    formula=(
        "Autoregressive self-attention over the sequence, e.g. the pixels of an image in raster order "
        "(GPT-2, Radford et al. 2019; iGPT, Chen et al. 2020):\n\n"
        "    q, k, v = split_heads(x W_qkv)                 # each [B, nh, N, hd]\n"
        "    A = softmax(q kᵀ · hd^-1/2 + M_causal)          # [B, nh, N, N], M_causal[i, j] = -inf for j > i\n"
        "    out = merge_heads(A v) W_proj                  # [B, N, C]\n\n"
        "Token `i` sees tokens `0..i` only: on an image flattened row by row, a pixel sees every row above "
        "and the pixels to its left. Training computes all `N` outputs at once (the dense `N²` product, "
        "masked). Generation keeps a key/value cache (`KVCache`): each new token projects only itself and "
        "attends to the `M` cached keys, `4·C² + 2·M·C` multiply-adds per token instead of a full forward."),
    cost="4·N·C² + 2·N²·C multiply-adds (dense masked product); with the cache, 4·C² + 2·M·C per new token",
    example_shape=(2, 11, 32), doc_example=({}, (1, 64, 96)))
class CausalSelfAttention(AttentionModule):
    """Causal self-attention, ``[B, N, C] -> [B, N, C]``; optional key/value cache for generation.

    ``qkv`` is one packed ``Linear(C, 3C)``, ``proj`` a ``Linear(C, C)`` (GPT-2's ``c_attn`` /
    ``c_proj``, stored as ``nn.Linear``). Cost: ``4·N·C² + 2·N²·C`` multiply-adds.
    """

    # docs/flex.md's row of patterns (analysis.docs.pattern_table); skipped blocks counted on `example`
    flex_pattern = PatternDoc(
        families="iGPT",
        keys="`kv <= q + (M - N)` (bottom-right aligned: a cache of `M - N` earlier keys); one new "
            "token: no mask",
        term="-",
        order="sequence",
        example=(dict(), (1, 1024, 96)))

    # where its q / k / v / output projections sit (attention.transfer: pretrained weights into another mechanism)
    transfer_slots = PACKED_QKV_SLOTS

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.init_attention(dim, num_heads, attn_drop=attn_drop, proj_drop=proj_drop)
        self.scale = self.head_dim ** -0.5  # the logit scale (torch's default; the forward and transfer read it)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    accepts = frozenset({"residual"})
    causal = True  # token i sees tokens <= i, and forward takes a KVCache (what autoregressive models require)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall(), *,
                cache: KVCache | StaticKVCache | None = None, layer: int = 0) -> Tensor:
        """``x [B, N, C] -> [B, N, C]``, token ``i`` attending to tokens ``<= i``.

        ``call.feat_size`` only places recorded maps on the grid; prefix tokens are ordinary positions of
        the sequence; no ``context`` (a causal order needs one sequence). ``call.residual [B, N, C]``, when
        given, is added to the output (fused into ``proj`` at inference).
        ``cache`` (generation, beside the contract): a :class:`KVCache`; ``x`` is then the next ``N`` tokens
        after the ``M - N`` cached ones, their k / v are appended to the cache's ``layer`` and they attend to
        all ``M``. A :class:`StaticKVCache` does the same at fixed shapes (all its slots, the unwritten ones
        masked).
        """
        check_tokens_call(self, x, call)
        q, k, v = split_qkv(apply_linear(self.qkv, x), self.num_heads)  # each [B, nh, N, hd]
        if getattr(cache, "static", False):  # fixed shapes: every slot, the unwritten ones masked
            k, v, visible = cache.update(layer, k, v)  # [B, nh, L, hd] x 2, [N, L]
            out = self.attend(q, k, v, scale=self.scale, mask=visible)  # [B, nh, N, hd]
        elif use_flex(self.attention_backend, self.fused_attention, x.device, mechanism="causal"):
            if cache is not None:
                k, v = cache.update(layer, k, v)  # [B, nh, M, hd]: cached keys, then the new ones
            out = self.attend(q, k, v, scale=self.scale,
                              pattern=causal_pattern(q.shape[-2], k.shape[-2]))  # [B, nh, N, hd]
        elif cache is None or cache.length(layer) == 0:
            if cache is not None:
                k, v = cache.update(layer, k, v)  # [B, nh, N, hd]
            out = self.attend(q, k, v, scale=self.scale, is_causal=True,
                              layout=observed_layout(x, call))  # [B, nh, N, hd]
        else:
            k, v = cache.update(layer, k, v)  # [B, nh, M, hd]: cached keys, then the new ones
            N, M = q.shape[-2], k.shape[-2]
            mask = None if N == 1 else causal_mask(N, M, device=q.device)  # one new token sees every key
            out = self.attend(q, k, v, scale=self.scale, mask=mask)  # [B, nh, N, hd]
        return self.project_out(merge_heads(out), call.residual)  # [B, N, C]

    def step(self, x: Tensor, past: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Past keys / values in, new ones out (the functional form of the cache).

        ``x [B, N, C]``: the next ``N`` tokens; ``past``: ``(k, v)`` ``[B, nh, M0, hd]`` of the tokens before
        them (None at the start). Returns ``(out [B, N, C], (k, v) [B, nh, M0 + N, hd])``, the ``past`` of the
        next call. Each call copies ``past`` once (``O(M·C)``): a :class:`KVCache` passed to ``forward``
        avoids even that.
        """
        cache = KVCache(1, capacity=(0 if past is None else past[0].shape[-2]) + x.shape[1])
        if past is not None:
            cache.update(0, *past)
        out = self(x, cache=cache)
        return out, cache.get(0)

    def flops(self, input_shape: tuple[int, ...], *, feat_size: tuple[int, int] | None = None,
              num_cached: int = 0) -> int:
        """Multiply-adds for one forward on ``input_shape = (B, N, C)``.

        ``4·N·C² + 2·N·M·C`` with ``M = num_cached + N`` keys: ``4·N·C² + 2·N²·C`` without a cache
        (the dense masked product, as the fused kernel computes it), ``4·C² + 2·M·C`` for one new token.
        """
        B, N, C = input_shape
        M = num_cached + N
        return B * (4 * N * C * C + 2 * N * M * C)
