"""The attention core's backends: flex (FlexAttention) equals the explicit path, patterns, block-mask cache, errors."""

from __future__ import annotations

import pytest
import torch
from flex_utils import flex_backward_on_cpu, rel_err

from vit_attention.functional import flex
from vit_attention.functional.attention import scaled_dot_product_attention as sdpa
from vit_attention.functional.runtime import ATTENTION_BACKEND, BACKENDS, check_backend

pytestmark = pytest.mark.compile


def _qkv(*shape: int, grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(sum(shape))
    return [torch.randn(*shape, generator=g).requires_grad_(grad) for _ in range(3)]


CASES = {
    "plain": {},
    "bias": {"bias": torch.randn(3, 10, 12)},
    "mask": {"mask": torch.rand(2, 1, 10, 12, generator=torch.Generator().manual_seed(1)) > 0.4},
    "bias+mask": {"bias": torch.randn(1, 3, 10, 12), "mask": torch.rand(10, 12) > 0.3},
    "causal": {"is_causal": True},
    "causal+bias": {"is_causal": True, "bias": torch.randn(10, 12)},
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_backends_equal_explicit_forward_and_backward(case: str, backend: str) -> None:
    kwargs = CASES[case]
    q = _qkv(2, 3, 10, 8, grad=True)[0]
    k, v = _qkv(2, 3, 12, 8, grad=True)[1:]
    weight = torch.randn(2, 3, 10, 8, generator=torch.Generator().manual_seed(5))  # a random projection to backprop
    ref = sdpa(q, k, v, backend="explicit", **kwargs)
    g_ref = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    with flex_backward_on_cpu():
        out = sdpa(q, k, v, backend=backend, **kwargs)
        g_out = torch.autograd.grad((out * weight).sum(), (q, k, v))
    assert rel_err(out, ref) <= 1e-5
    for a, b in zip(g_out, g_ref):
        assert rel_err(a, b) <= 1e-5


def test_flex_rows_that_see_nothing_give_zeros() -> None:
    q, k, v = _qkv(1, 2, 6, 4)
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[2] = False
    out = sdpa(q, k, v, mask=mask, backend="flex")
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert rel_err(out, sdpa(q, k, v, mask=mask, backend="explicit")) <= 1e-6


def test_flex_folds_extra_batch_dims() -> None:
    q, k, v = _qkv(2, 5, 3, 7, 4)
    bias = torch.randn(3, 7, 7)
    assert rel_err(sdpa(q, k, v, bias=bias, backend="flex"), sdpa(q, k, v, bias=bias, backend="explicit")) <= 1e-6


def _band(width: int, n: int) -> flex.AttentionPattern:
    table = torch.linspace(-1.0, 1.0, 2 * n - 1)

    def mask_mod(b, h, q, kv):
        return (q - kv).abs() <= width

    def score_mod(s, b, h, q, kv):
        return s + table[q - kv + n - 1] * (h + 1)

    return flex.AttentionPattern(n, n, mask_mod=mask_mod, score_mod=score_mod, cache_key=("band", width))


def test_pattern_runs_the_same_on_every_backend() -> None:
    n = 40
    pattern = _band(3, n)
    q, k, v = _qkv(2, 2, n, 8)
    # the dense description, written out by hand
    i = torch.arange(n)
    rel = i[:, None] - i[None]
    dense = torch.linspace(-1.0, 1.0, 2 * n - 1)[rel + n - 1] * torch.tensor([1.0, 2.0]).view(2, 1, 1)
    ref = sdpa(q, k, v, bias=dense, mask=rel.abs() <= 3, backend="explicit")
    for backend in BACKENDS:
        assert rel_err(sdpa(q, k, v, pattern=pattern, backend=backend), ref) <= 1e-6, backend
    assert torch.equal(pattern.dense_mask()[0, 0], rel.abs() <= 3)
    assert rel_err(pattern.dense_bias(1, 2)[0], dense) <= 1e-7


def test_block_masks_are_cached_per_key_and_device() -> None:
    flex.clear_block_mask_cache()
    a, b = _band(2, 1024), _band(2, 1024)
    assert flex.block_mask_for(a, torch.device("cpu")) is flex.block_mask_for(b, torch.device("cpu"))
    other = flex.block_mask_for(_band(5, 1024), torch.device("cpu"))
    assert other is not flex.block_mask_for(a, torch.device("cpu"))
    # a band of width 2 over 1024 tokens leaves most 128 x 128 blocks empty: they are skipped
    bm = flex.block_mask_for(a, torch.device("cpu"))
    assert bm.sparsity() > 0.0
    unkeyed = flex.AttentionPattern(1024, 1024, mask_mod=a.mask_mod)
    assert flex.block_mask_for(unkeyed, torch.device("cpu")) is not flex.block_mask_for(unkeyed, torch.device("cpu"))


def test_flex_refuses_cpu_backward_and_dropout_clearly() -> None:
    q, k, v = _qkv(1, 2, 5, 4, grad=True)
    out = sdpa(q, k, v, backend="flex")  # the forward runs in grad mode (inference without no_grad works) ...
    with torch.no_grad():
        torch.testing.assert_close(out, sdpa(q, k, v, backend="explicit"))
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="'flex' has no backward on CPU"):
        out.sum().backward()  # ... and training fails at its backward, naming the backend
    assert q.grad is None and k.grad is None and v.grad is None
    with torch.no_grad(), pytest.raises(ValueError, match="dropout_p=0.1.*'flex'"):
        sdpa(q, k, v, backend="flex", dropout_p=0.1)
    with torch.no_grad():
        sdpa(q, k, v, backend="flex")  # inference is fine


def test_observers_and_logits_fn_take_the_explicit_path_on_flex() -> None:
    q, k, v = _qkv(1, 2, 5, 4)
    out, w = sdpa(q, k, v, backend="flex", return_weights=True)
    assert w.shape == (1, 2, 5, 5) and rel_err(out, sdpa(q, k, v, backend="explicit")) <= 1e-6
    assert rel_err(sdpa(q, k, v, backend="flex", logits_fn=lambda x: x * 2.0),
                   sdpa(q, k, v, backend="explicit", scale=2.0 * 4 ** -0.5)) <= 1e-6  # hd = 4


def test_backend_names_are_checked() -> None:
    assert check_backend("flex") == "flex"
    with pytest.raises(ValueError, match=r"attention backend must be one of \['auto', 'sdpa', 'explicit', 'flex'\]"):
        check_backend("fast")
    with pytest.raises(ValueError, match="must be one of"):
        sdpa(*_qkv(1, 1, 2, 2), backend="cuda")
    with pytest.raises(ValueError, match="must be one of"):
        ATTENTION_BACKEND.set("triton")


def test_pattern_needs_four_dims() -> None:
    q, k, v = _qkv(2, 2, 2, 40, 4)
    with pytest.raises(ValueError, match="4-D q"):
        sdpa(q, k, v, pattern=_band(2, 40), backend="explicit")


def test_the_first_cuda_flex_kernel_raises_dynamos_recompile_limit() -> None:
    # every pattern and shape is a compiled variant of ONE code object; past dynamo's default 8 (a Swin-T has 8)
    # the kernel would silently run unfused on the GPU. torch.compile only wraps here: nothing needs CUDA.
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    saved, compiled = getattr(config, name), dict(flex._COMPILED)
    try:
        setattr(config, name, 8)
        flex._COMPILED.clear()
        kernel = flex._kernel(torch.device("cuda"))
        assert kernel is flex._COMPILED["cuda"] and getattr(config, name) == flex.FLEX_RECOMPILE_LIMIT >= 64
        setattr(config, name, 1000)
        flex._COMPILED.clear()
        flex._kernel(torch.device("cuda"))
        assert getattr(config, name) == 1000  # never lowered
        assert flex._kernel(torch.device("cpu")) is not flex._COMPILED["cuda"]  # CPU: the eager function
    finally:
        setattr(config, name, saved)
        flex._COMPILED.clear()
        flex._COMPILED.update(compiled)


@pytest.mark.slow  # inductor codegen (a few seconds)
def test_compiled_cpu_flex_reads_views_at_an_offset_and_computed_captures() -> None:
    # torch (2.11 - 2.13) inductor's CPU FlexAttention template reads a q / k / v view at an offset of its buffer
    # from the buffer's start (here v, the second slice of `packed`: a silently wrong output), and fails to lower
    # a score_mod capturing a tensor the graph computes pointwise (`bias * 2`); flex_attention hands it copies
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    packed = _qkv(2, 1, 2, 128, 16)[0]  # [2, B, nh, N, hd]: k | v
    q, k = _qkv(1, 2, 128, 16)[:2]
    bias = torch.randn(2, 128, 128, generator=torch.Generator().manual_seed(7))

    def call(packed: torch.Tensor, q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        term = flex.flex_buffer(bias * 2)  # [nh, N, M], computed in the graph
        return flex.flex_attention(q * 1.0, k * 1.0, packed.unbind(0)[1],
                                   score_mod=lambda s, b, h, qi, ki: s + term[h, qi, ki])

    with torch.no_grad():
        ref = torch_flex(q, k, packed[1], score_mod=lambda s, b, h, qi, ki: s + 2 * bias[h, qi, ki])
        torch._dynamo.reset()
        try:
            out = torch.compile(call, fullgraph=True)(packed, q, k, bias)
        finally:
            torch._dynamo.reset()
    assert rel_err(out, ref) <= 1e-5


def test_flex_buffer_is_the_tensor_itself_outside_a_cpu_compile() -> None:
    t = torch.randn(3, 4)
    assert flex.flex_buffer(t) is t


def test_a_mask_cached_in_inference_mode_serves_a_later_backward() -> None:
    """The first call of a geometry under torch.inference_mode caches its block mask; a later call that records
    gradients (training after an evaluation) reuses it, which autograd refuses for inference tensors."""
    from vit_attention import create_attention
    from vit_attention.attention.registry import set_attention_backend

    flex.clear_block_mask_cache()
    attn = set_attention_backend(create_attention("neighborhood", dim=16, num_heads=2, kernel_size=3), "flex")
    x = torch.randn(1, 6, 6, 16)
    with torch.inference_mode():
        first = attn(x)
    x = x.clone().requires_grad_()
    with flex_backward_on_cpu():
        out = attn(x)
        out.sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert torch.allclose(out.detach(), first, atol=1e-6)
    flex.clear_block_mask_cache()


def _brute_force_skipped(pattern: flex.AttentionPattern) -> tuple[int, int]:
    """``(skipped, total)`` 128 x 128 blocks counted from the dense mask itself (zero-padded to whole blocks)."""
    dense = pattern.dense_mask()
    rows, cols = -(-pattern.num_queries // 128), -(-pattern.num_keys // 128)
    padded = torch.zeros(*dense.shape[:2], rows * 128, cols * 128, dtype=torch.bool)
    padded[..., :pattern.num_queries, :pattern.num_keys] = dense
    any_visible = padded.view(*dense.shape[:2], rows, 128, cols, 128).any(dim=(3, 5))
    return int((~any_visible).sum()), any_visible.numel()


@pytest.mark.parametrize(("n", "m"), [(300, 300), (200, 520), (128, 256)])
def test_skipped_blocks_are_counted_exactly(n: int, m: int) -> None:
    """Lengths that are not multiples of 128 (where torch's ``sparsity()`` goes wrong) and a per-head mask."""
    band = flex.AttentionPattern(n, m, mask_mod=lambda b, h, q, kv: (kv - q).abs() <= 40 + 90 * h, mask_heads=2,
                                 cache_key=("band", n, m))
    causal = flex.AttentionPattern(n, m, mask_mod=lambda b, h, q, kv: kv <= q, cache_key=("lower", n, m))
    for pattern in (band, causal):
        assert flex.skipped_blocks(pattern) == _brute_force_skipped(pattern)
    skipped, total = flex.skipped_blocks(causal)
    assert 0 < skipped < total
    assert flex.skipped_blocks(flex.AttentionPattern(n, m)) == (0, -(-n // 128) * -(-m // 128))  # no mask_mod


def test_recording_patterns_sees_each_flex_call_and_only_inside() -> None:
    q, k, v = _qkv(1, 2, 10, 8)
    pattern = flex.AttentionPattern(10, 10, mask_mod=lambda b, h, qi, ki: ki <= qi, cache_key=("rec", 10))
    with flex.recording_patterns() as outer, torch.no_grad():
        sdpa(q, k, v, backend="flex", pattern=pattern)
        with flex.recording_patterns() as inner:
            sdpa(q, k, v, backend="flex")
        sdpa(q, k, v, backend="explicit", pattern=pattern)  # not the flex path: nothing recorded
    assert [p.cache_key for p in outer] == [("rec", 10)] and len(inner) == 1 and inner[0].mask_mod is None
    sdpa(q, k, v, backend="flex", pattern=pattern)
    assert len(outer) == 1 and not flex._RECORDERS
