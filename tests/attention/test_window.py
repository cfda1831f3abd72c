"""Swin W-MSA / SW-MSA (attention/window.py)."""

import pytest
import torch
import torch.nn.functional as F

from vit_attention import create_attention
from vit_attention.attention import AttentionCall, WindowAttention
from vit_attention.functional import register_attention_hook, switched
from vit_attention.functional.window import _shift_window_mask, window_partition


def _reference_wmsa(attn: WindowAttention, x: torch.Tensor) -> torch.Tensor:
    """Unshifted window attention written out per window, with plain ops (no library helpers but partition)."""
    B, H, W, C = x.shape
    wh, ww = attn.window_size
    nh, hd = attn.num_heads, attn.head_dim
    win = window_partition(x, (wh, ww))  # [B·nW, N, C]
    qkv = win @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = qkv.view(win.shape[0], wh * ww, 3, nh, hd).permute(2, 0, 3, 1, 4)
    table = attn.relative_position_bias_table
    N = wh * ww
    bias = torch.empty(nh, N, N)
    for i in range(N):
        for j in range(N):
            dh, dw = i // ww - j // ww, i % ww - j % ww
            bias[:, i, j] = table[(dh + wh - 1) * (2 * ww - 1) + dw + ww - 1]
    logits = (q @ k.transpose(-2, -1)) * hd ** -0.5 + bias
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(-1, N, C)
    out = attn.proj(out)
    return out.view(B, H // wh, W // ww, wh, ww, C).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C)


def _randomise(m: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


def test_unshifted_equals_per_window_reference():
    attn = _randomise(WindowAttention(16, 2, window_size=(2, 3)))
    x = torch.randn(2, 4, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), _reference_wmsa(attn, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pad_first", [False, True])
@pytest.mark.parametrize("hw", [(14, 14), (7, 9), (5, 3), (16, 12)])
def test_any_size_shape_and_fused_equals_explicit(hw, pad_first):
    attn = _randomise(WindowAttention(24, 3, window_size=4, shift_size=2, pad_first=pad_first))
    x = torch.randn(2, *hw, 24)
    with torch.no_grad():
        y = attn(x)
        with switched(attn, fused_attention=False):
            y2 = attn(x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, y2, atol=1e-5, rtol=1e-5)


def test_padding_orders_agree_on_window_multiples_and_differ_otherwise():
    timm_like = _randomise(WindowAttention(16, 2, window_size=4, shift_size=2, pad_first=False))
    tv_like = WindowAttention(16, 2, window_size=4, shift_size=2, pad_first=True).eval()
    tv_like.load_state_dict(timm_like.state_dict())
    with torch.no_grad():
        x = torch.randn(1, 16, 12, 16)
        torch.testing.assert_close(timm_like(x), tv_like(x))
        x = torch.randn(1, 15, 15, 16)
        assert (timm_like(x) - tv_like(x)).abs().max() > 1e-3


def _dependencies(attn: WindowAttention, H: int, W: int) -> list[tuple[int, int, int, int]]:
    """(p_row, p_col, q_row, q_col) for every output token p whose value depends on input token q."""
    x = torch.randn(1, H, W, 8, requires_grad=True)
    y = attn(x)
    deps = []
    for i in range(H):
        for j in range(W):
            (g,) = torch.autograd.grad(y[0, i, j].sum(), x, retain_graph=True)
            g = g[0].abs().sum(-1)  # masked pairs get exp(-100): a dependence below 1e-30 of the largest is none
            for qi, qj in (g > 1e-30 * g.max()).nonzero().tolist():
                deps.append((i, j, qi, qj))
    return deps


@pytest.mark.parametrize("hw", [(7, 9), (8, 8), (5, 6)])
def test_default_shift_never_mixes_wrapped_tokens_at_any_size(hw):
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2))
    deps = _dependencies(attn, *hw)
    assert deps
    # a token only ever sees tokens less than a window away in the ORIGINAL map: nothing wrapped around
    assert all(abs(pi - qi) < 4 and abs(pj - qj) < 4 for pi, pj, qi, qj in deps)


def test_timm_order_does_mix_wrapped_tokens_at_odd_sizes():
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2, pad_first=False))
    deps = _dependencies(attn, 7, 9)
    assert any(abs(pi - qi) >= 4 or abs(pj - qj) >= 4 for pi, pj, qi, qj in deps)


def test_shifted_windows_never_attend_across_the_wrap_around():
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2))
    seen = []
    handle = register_attention_hook(lambda w, info: seen.append((w, info)))
    try:
        with torch.no_grad():
            attn(torch.randn(1, 8, 8, 8))
    finally:
        handle.remove()
    (weights, info), = seen
    # shifted windows are folded into the head axis: [B, nW·nh, N, N]
    assert weights.shape == (1, 8, 16, 16) and info["shift_size"] == (2, 2) and info["heads_layout"] == "windows*heads"
    weights = weights.view(4, 2, 16, 16)  # [nW, nh, N, N]
    # label each token of the rolled map by the region it came from (0..2 per axis)
    rows = torch.tensor([0] * 4 + [1] * 2 + [2] * 2)  # after roll(-2): rows 6, 7 came from rows 0, 1
    labels = (rows[:, None] * 3 + rows[None, :]).view(1, 8, 8, 1).float()
    lab = window_partition(labels, 4).squeeze(-1)  # [nW, N]
    cross = lab[:, :, None] != lab[:, None, :]  # [nW, N, N]
    assert cross.any()
    assert weights.permute(1, 0, 2, 3)[:, cross].max() < 1e-30
    assert weights.sum(-1).sub(1).abs().max() < 1e-5


def test_mask_and_bias_cached_in_eval_and_refreshed_after_updates():
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2))
    x = torch.randn(2, 8, 8, 8)
    before = _shift_window_mask.cache_info().misses
    with torch.no_grad():
        y1 = attn(x)
        key = (8, 8, (2, 2), x.device)
        m1 = attn._mask_cache[key]
        attn(x)
        assert attn._mask_cache[key] is m1  # combined bias + shift mask reused
        assert _shift_window_mask.cache_info().misses <= before + 1  # region mask built at most once
        attn.relative_position_bias_table.add_(1.0 * torch.randn_like(attn.relative_position_bias_table))
        y2 = attn(x)
    assert attn._mask_cache[key] is not m1
    assert (y1 - y2).abs().max() > 1e-3
    # with gradients on, the bias is recomputed each call and the table gets a gradient
    attn.train()
    attn(x).sum().backward()
    assert attn.relative_position_bias_table.grad is not None
    assert attn.relative_position_bias_table.grad.abs().sum() > 0


def test_load_state_dict_refreshes_cached_bias():
    a, b = _randomise(WindowAttention(8, 2, window_size=4)), _randomise(WindowAttention(8, 2, window_size=4))
    x = torch.randn(1, 8, 8, 8)
    with torch.no_grad():
        a(x)
        a.load_state_dict(b.state_dict())
        torch.testing.assert_close(a(x), b(x))


def _fresh_output(attn: WindowAttention, x: torch.Tensor) -> torch.Tensor:
    """``attn(x)`` from a copy built now (an empty cache): what a refreshed cache must give."""
    twin = WindowAttention(attn.dim, attn.num_heads, window_size=attn.window_size, shift_size=attn.shift_size)
    twin = twin.to(attn.relative_position_bias_table.dtype).eval()
    twin.load_state_dict(attn.state_dict())
    with torch.no_grad():
        return twin(x)


def test_bias_cache_hits_while_the_table_is_unchanged():
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2))
    with torch.no_grad():
        assert attn.position_bias() is attn.position_bias()  # served from the cache
    with torch.enable_grad():  # autograd records through the table: computed each call, the cache dropped
        assert attn.position_bias().requires_grad and attn._bias_cache.value is None


def test_bias_cache_refreshed_after_to_dtype():
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2))
    x = torch.randn(2, 8, 8, 8)
    with torch.no_grad():
        attn(x)
    attn.to(torch.float64)
    x = x.double()
    with torch.no_grad():
        out = attn(x)
    assert out.dtype == torch.float64 and attn._bias_cache.value.dtype == torch.float64
    torch.testing.assert_close(out, _fresh_output(attn, x), rtol=0, atol=0)


def test_bias_cache_refreshed_after_an_optimizer_step_without_a_forward_in_between():
    """The step updates the table in place under no_grad; no grad-mode forward runs between the cached
    call and the next one (gradients set by hand), so only comparing the values can notice."""
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2))
    x = torch.randn(2, 8, 8, 8)
    with torch.no_grad():
        before = attn(x)
    opt = torch.optim.SGD(attn.parameters(), lr=1.0)
    for p in attn.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    with torch.no_grad():
        after = attn(x)
    assert (before - after).abs().max() > 1e-3
    torch.testing.assert_close(after, _fresh_output(attn, x), rtol=0, atol=0)


def test_bias_cache_refreshed_after_a_training_step():
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2))
    x = torch.randn(2, 8, 8, 8)
    opt = torch.optim.AdamW(attn.parameters(), lr=0.1)
    with torch.no_grad():
        attn(x)
    attn.train()
    attn(x).square().mean().backward()
    opt.step()
    attn.eval()
    with torch.no_grad():
        torch.testing.assert_close(attn(x), _fresh_output(attn, x), rtol=0, atol=0)


@pytest.mark.parametrize("edit", ["lerp", "copy", "data"])
def test_bias_cache_refreshed_after_an_in_place_edit(edit):
    """EMA updates, ``copy_`` and ``.data`` assignments under no_grad: all change the values the cache compares."""
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2))
    x = torch.randn(2, 8, 8, 8)
    table = attn.relative_position_bias_table
    other = torch.randn_like(table)
    with torch.no_grad():
        before = attn(x)
        if edit == "lerp":
            table.lerp_(other, 0.5)  # an EMA update
        elif edit == "copy":
            table.copy_(other)
        else:
            table.data = other
        after = attn(x)
    assert (before - after).abs().max() > 1e-3
    torch.testing.assert_close(after, _fresh_output(attn, x), rtol=0, atol=0)


def test_functional_call_with_other_tables_is_not_served_from_the_cache():
    attn = _randomise(WindowAttention(8, 2, window_size=4, shift_size=2))
    x = torch.randn(2, 8, 8, 8)
    state = {k: v + 0.5 for k, v in attn.state_dict().items()}
    with torch.no_grad():
        attn(x)
        out = torch.func.functional_call(attn, state, (x,))
        ref = WindowAttention(8, 2, window_size=4, shift_size=2).eval()
        ref.load_state_dict(state)
        torch.testing.assert_close(out, ref(x), rtol=0, atol=0)


def test_built_and_run_in_inference_mode():
    """Parameters made in inference mode are inference tensors (no version counter): the cache still works."""
    with torch.inference_mode():
        attn = WindowAttention(8, 2, window_size=4, shift_size=2).eval()
        x = torch.randn(2, 7, 9, 8)
        a = attn(x)
        torch.testing.assert_close(attn(x), a, rtol=0, atol=0)
        attn.relative_position_bias_table.add_(1.0)
        assert (attn(x) - a).abs().max() > 0


def test_bias_cache_on_the_meta_device():
    attn = WindowAttention(8, 2, window_size=4, shift_size=2).to("meta").eval()
    with torch.no_grad():
        assert attn(torch.empty(2, 8, 8, 8, device="meta")).shape == (2, 8, 8, 8)
    assert attn._bias_cache.value is None  # nothing to compare on meta: not cached


def test_clear_errors():
    with pytest.raises(ValueError, match="shift_size.*smaller than window_size"):
        WindowAttention(32, 4, window_size=7, shift_size=7)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        create_attention("window", 30, 4, window_size=7)
    attn = WindowAttention(32, 4, window_size=7, allow_padding=False)
    with pytest.raises(ValueError, match="does not tile the 9x9 map and allow_padding=False"):
        attn(torch.randn(1, 9, 9, 32))
    assert attn(torch.randn(1, 14, 7, 32)).shape == (1, 14, 7, 32)
    assert attn(torch.randn(1, 5, 5, 32)).shape == (1, 5, 5, 32)  # the window clamped to the 5x5 map
    with pytest.raises(ValueError, match="does not tile the 5x5 map and allow_padding=False"):
        WindowAttention(32, 4, window_size=7, allow_padding=False, clamp_window=False)(torch.randn(1, 5, 5, 32))
    with pytest.raises(TypeError, match="clamp_window must be a bool"):
        WindowAttention(32, 4, clamp_window="yes")
    with pytest.raises(ValueError, match=r"\[B, H, W, 32\]"):
        attn(torch.randn(1, 49, 32))


def test_flops_formula_swin_t_stage1():
    attn = WindowAttention(96, 3, window_size=7)
    hw, C = 56 * 56, 96
    assert attn.flops((1, 56, 56, 96)) == 4 * hw * C * C + 2 * 49 * hw * C
    # padded map: attention on the padded 56x56, projections on the 55x55 real tokens (+ one zero token for qkv)
    t, tp = 55 * 55, 56 * 56
    assert attn.flops((2, 55, 55, 96)) == 2 * (3 * (t + 1) * C * C + t * C * C + 2 * 49 * tp * C)


def test_bf16_autocast_runs():
    attn = WindowAttention(16, 2, window_size=4, shift_size=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attn(torch.randn(1, 6, 10, 16))
    assert y.shape == (1, 6, 10, 16) and torch.isfinite(y.float()).all()


def test_dropout_only_in_training():
    attn = WindowAttention(16, 2, window_size=4, attn_drop=0.5, proj_drop=0.5)
    x = torch.randn(1, 8, 8, 16)
    attn.eval()
    with torch.no_grad():
        assert torch.equal(attn(x), attn(x))
    attn.train()
    assert not torch.allclose(attn(x), attn(x))
    assert F.mse_loss(attn(x), torch.zeros_like(x)) > 0


@pytest.mark.parametrize("name", ["window", "cosine_window"])
def test_caches_built_in_inference_mode_do_not_break_training(name):
    attn = create_attention(name, 16, 2, window_size=3, shift_size=1)
    x = torch.randn(1, 7, 8, 16)  # padded and shifted: every cached index / mask is used
    with torch.inference_mode():
        attn.eval()(x)
    attn.train()(x).sum().backward()  # autograd may save the cached index tensors
    for p in attn.parameters():
        p.requires_grad_(False)
    with torch.inference_mode():
        attn.eval()(x)
    xg = x.clone().requires_grad_()
    attn(xg).sum().backward()  # frozen mechanism, gradient to the input only
    assert xg.grad is not None and xg.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["window", "cosine_window"])
@pytest.mark.parametrize("hw", [(8, 8), (6, 10)])
def test_residual_is_fused_into_proj_with_the_same_result(name, hw):
    from vit_attention import create_attention

    torch.manual_seed(0)
    attn = create_attention(name, 16, 2, window_size=4, shift_size=2).eval()
    x, r = torch.randn(2, *hw, 16), torch.randn(2, *hw, 16)
    with torch.inference_mode():
        torch.testing.assert_close(attn(x, AttentionCall(residual=r)), r + attn(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="residual"):
        attn(x, AttentionCall(residual=r[:1]))


@pytest.mark.parametrize("name", ["window", "cosine_window"])
def test_inference_runs_bias_and_shift_mask_through_the_fused_kernel(name, monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    attn = create_attention(name, 8, 2, window_size=4, shift_size=2).eval()
    x = torch.randn(2, 8, 8, 8)
    with torch.no_grad():
        attn(x)
    (kw,) = calls
    assert kw["attn_mask"].shape == (1, 4 * 2, 16, 16) and kw["attn_mask"].is_floating_point()
    attn.train()
    attn(x).sum().backward()  # CPU training: the learned bias takes the explicit path (no torch math fallback)
    assert len(calls) == 1


def test_bias_cache_is_a_cpu_inference_saving_only() -> None:
    """Cached only for CPU parameters outside autograd: an accelerator recomputes (comparing values would
    synchronise the host every block), the meta device has no values, autograd must see the computation."""
    from vit_attention.attention.base import uncacheable

    p = torch.nn.Parameter(torch.zeros(3))
    with torch.no_grad():
        assert not uncacheable([p])
        assert uncacheable([p.to("meta")])
    assert uncacheable([p])  # grad enabled, requires_grad


def _clamped_pair(name: str, kwargs: dict, **small: object) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``name`` built with a 256 window and with the map's 4 window, the second holding the same weights
    (a relative table: the first's central offsets, the entries the clamped window reads)."""
    torch.manual_seed(0)
    big = create_attention(name, 16, 2, window_size=256, **kwargs).eval()
    fitted = create_attention(name, 16, 2, window_size=4, **small).eval()
    with torch.no_grad():
        for p in big.parameters():
            p.add_(0.3 * torch.randn_like(p))
        state = dict(big.state_dict())
        if "relative_position_bias_table" in state:
            state["relative_position_bias_table"] = state["relative_position_bias_table"].view(511, 511, -1)[
                252:259, 252:259].reshape(49, -1)
        for key in ("rel_pos_h", "rel_pos_w"):
            if key in state:
                state[key] = state[key][252:259]
    fitted.load_state_dict(state)
    return big, fitted


@pytest.mark.parametrize(("name", "kwargs", "small"), [
    ("window", dict(shift_size=128), {}),  # a window the map fits in: no shift, as Swin's stages
    ("cosine_window", dict(shift_size=100), {}),
    ("lsa", {}, {}),
    ("rel_pos", dict(rel_pos_zero_init=False), dict(rel_pos_zero_init=False)),
])
def test_a_window_larger_than_the_map_is_clamped_to_it(name: str, kwargs: dict, small: dict) -> None:
    """``window_size=256`` on a 4x4 map attends over the 16 tokens of the map (padding it would ask for
    65,536-token windows, tens of GB) and equals ``window_size=4`` with the same weights."""
    big, fitted = _clamped_pair(name, kwargs, **small)
    x = torch.randn(2, 4, 4, 16)
    keys: list[int] = []
    handle = register_attention_hook(lambda q, k, v, info: keys.append(k.shape[-2]), weights=False)
    try:
        with torch.no_grad():
            out = big(x)
    finally:
        handle.remove()
    assert keys and max(keys) == 16  # one 4x4 window: no padded 256x256 window
    with torch.no_grad():
        torch.testing.assert_close(out, fitted(x), atol=1e-5, rtol=1e-5)
    assert big.flops((2, 4, 4, 16)) == fitted.flops((2, 4, 4, 16))


def test_window_clamp_per_axis_and_opt_out() -> None:
    attn = WindowAttention(16, 2, window_size=(8, 3), shift_size=(4, 1))
    assert attn.fitted_window(5, 9) == ((5, 3), (0, 1))  # height clamped (unshifted), width kept
    assert attn.fitted_window(16, 16) == ((8, 3), (4, 1))
    kept = WindowAttention(16, 2, window_size=(8, 3), shift_size=(4, 1), clamp_window=False)
    assert kept.fitted_window(5, 9) == ((8, 3), (4, 1))  # padded up to the window (Swin / Twins / DaViT models)


def test_a_plugged_window_larger_than_the_token_grid_runs_in_a_vit() -> None:
    from vit_attention import create_model

    model = create_model("vit_digits_patch2_8", num_classes=3, attn_layer="window",
                         attn_kwargs={"window_size": 256}).eval()
    ref = create_model("vit_digits_patch2_8", num_classes=3, attn_layer="window",
                       attn_kwargs={"window_size": 4}).eval()
    state = model.state_dict()
    for k, v in state.items():
        if k.endswith("relative_position_bias_table"):
            state[k] = v.view(511, 511, -1)[252:259, 252:259].reshape(49, -1)
    ref.load_state_dict(state)
    x = torch.randn(2, model.cfg.in_chans, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
