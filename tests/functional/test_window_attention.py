"""``functional.window_attention``: the plain function of tensors against a step-by-step reference."""

from __future__ import annotations

import importlib
import math
import threading

import pytest
import torch
import torch.nn.functional as F

from vit_attention.functional.window import shift_window_mask, window_partition, window_reverse
from vit_attention.functional.window_attention import window_attention, window_geometry, window_tokens


def _reference(x, w_qkv, bias, nh, ws, shift, pad_first, temperature=None):
    """Roll / pad / partition / attend / reverse / unroll / crop, one step at a time (torchvision or timm order)."""
    B, H, W, C = x.shape
    (Hp, Wp), (sh, sw) = window_geometry(H, W, ws, shift, pad_first=pad_first)
    pad = (0, 0, 0, Wp - W, 0, Hp - H)
    y = torch.roll(F.pad(x, pad), (-sh, -sw), (1, 2)) if pad_first else F.pad(torch.roll(x, (-sh, -sw), (1, 2)), pad)
    win = window_partition(y, ws)  # [B·nW, N, C]
    q, k, v = (win @ w_qkv.t()).view(win.shape[0], -1, 3, nh, C // nh).permute(2, 0, 3, 1, 4)
    if temperature is None:
        logits = q @ k.transpose(-2, -1) / math.sqrt(C // nh)
    else:
        logits = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) * temperature
    region = shift_window_mask(Hp, Wp, ws, (sh, sw))  # [nW, N, N]
    logits = logits.view(B, -1, nh, *logits.shape[-2:]) + bias + region[:, None]
    out = (logits.softmax(-1).flatten(0, 1) @ v).transpose(1, 2).reshape(win.shape)  # [B·nW, N, C]
    out = window_reverse(out, ws, Hp, Wp)
    if pad_first:
        return torch.roll(out, (sh, sw), (1, 2))[:, :H, :W]
    return torch.roll(out[:, :H, :W], (sh, sw), (1, 2))


@pytest.mark.parametrize("hw", [(8, 8), (7, 9), (4, 4), (3, 10)])
@pytest.mark.parametrize("shift", [(0, 0), (2, 2), (0, 1)])
@pytest.mark.parametrize("pad_first", [True, False])
@pytest.mark.parametrize("cosine", [False, True])
def test_matches_the_step_by_step_reference(hw, shift, pad_first, cosine):
    torch.manual_seed(0)
    B, C, nh, ws = 2, 8, 2, (4, 4)
    x = torch.randn(B, *hw, C)
    w_qkv = torch.randn(3 * C, C) / math.sqrt(C)
    bias = torch.randn(nh, 16, 16)
    temperature = torch.tensor([3.0, 7.0]).view(nh, 1, 1) if cosine else None
    tokens = window_tokens(x, ws, shift, pad_first=pad_first)
    out = window_attention(tokens @ w_qkv.t(), bias, feat_size=hw, num_heads=nh, window_size=ws, shift_size=shift,
                           pad_first=pad_first, logit_scale=temperature)  # [B, H·W, C]
    ref = _reference(x, w_qkv, bias, nh, ws, shift, pad_first, temperature)
    torch.testing.assert_close(out.view(B, *hw, C), ref, atol=1e-5, rtol=1e-5)


def test_window_tokens_layouts_and_the_bias_cache():
    x = torch.randn(2, 8, 8, 4)
    assert window_tokens(x, 4).shape == (8, 16, 4)  # neither shifted nor padded: windows
    assert window_tokens(x, 4, 2).shape == (2, 64, 4)  # shifted: the map's tokens
    padded = window_tokens(torch.randn(2, 7, 8, 4), 4)
    assert padded.shape == (2, 57, 4) and padded[:, -1].abs().max() == 0  # + one zero token
    cache: dict = {}
    qkv = torch.randn(2, 64, 12)
    bias = torch.randn(1, 16, 16)
    a = window_attention(qkv, bias, feat_size=(8, 8), num_heads=1, window_size=4, shift_size=2, bias_cache=cache)
    (key, combined), = cache.items()
    b = window_attention(qkv, bias, feat_size=(8, 8), num_heads=1, window_size=4, shift_size=2, bias_cache=cache)
    assert cache[key] is combined and torch.equal(a, b) and combined.shape == (1, 4, 16, 16)


# ----------------------------------------------------------------------------- observers, context frames, threads
def test_no_context_frame_while_nobody_observes(monkeypatch) -> None:
    """The unobserved path pushes nothing; with an observer the call carries the window geometry."""
    from vit_attention.attention import WindowAttention
    from vit_attention.functional.observers import attention_context, register_attention_hook

    def refuse(**info):
        raise AssertionError("a context frame was opened while nobody observes")

    wa = importlib.import_module("vit_attention.functional.window_attention")  # the module, not the function
    attn = WindowAttention(16, 2, window_size=4, shift_size=2).eval()
    x = torch.randn(1, 8, 8, 16)
    monkeypatch.setattr(wa, "attention_context", refuse)
    with torch.no_grad():
        attn(x)
    monkeypatch.setattr(wa, "attention_context", attention_context)
    seen = []
    handle = register_attention_hook(lambda w, info: seen.append(info))
    try:
        with torch.no_grad():
            attn(x)
    finally:
        handle.remove()
    (info,) = seen
    assert info["mechanism"] == "window" and info["shift_size"] == (2, 2) and info["num_windows"] == 4


def test_context_frames_are_per_thread() -> None:
    """Two threads run window attention at the same time, each inside its own attention_context and with
    its own observer registered. Observers are process-wide (each sees both threads' calls), but the
    info of a call holds only the frames of the thread that made it."""
    from vit_attention.attention import WindowAttention
    from vit_attention.functional.observers import attention_context, current_frames, register_attention_hook

    tags = ("a", "b")
    modules = {t: WindowAttention(16, 2, window_size=4, shift_size=2).eval() for t in tags}
    x = torch.randn(1, 8, 8, 16)
    seen: dict[str, list[tuple[str, object, object]]] = {t: [] for t in tags}
    barrier = threading.Barrier(len(tags), timeout=60)
    errors: list[BaseException] = []
    steps = 8

    def observer(tag: str):
        def hook(weights: torch.Tensor, info: dict) -> None:
            seen[tag].append((threading.current_thread().name, info.get("thread"), info.get("mechanism")))
        return hook

    def run(tag: str) -> None:
        try:
            handle = register_attention_hook(observer(tag))
            try:
                barrier.wait()  # both observers registered
                with torch.no_grad():
                    for step in range(steps):
                        with attention_context(thread=tag, step=step):
                            barrier.wait()  # both threads' frames are open now
                            modules[tag](x)
                            barrier.wait()
                assert current_frames() == ()
            finally:
                barrier.wait()  # neither observer is removed before both threads are done
                handle.remove()
        except BaseException as e:  # noqa: BLE001  (re-raised in the main thread)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(t,), name=t) for t in tags]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for tag in tags:
        records = seen[tag]
        assert {caller for caller, _, _ in records} == set(tags)  # process-wide: both threads' calls
        assert len(records) == steps * len(tags)
        for caller, frame_tag, mechanism in records:
            assert frame_tag == caller and mechanism == "window"  # never the other thread's frame
    assert current_frames() == ()


def test_a_frame_is_closed_after_an_error() -> None:
    from vit_attention.functional.observers import attention_context, current_frames

    with pytest.raises(RuntimeError), attention_context(module="outer"):
        with attention_context(module="inner"):
            assert [f["module"] for f in current_frames()] == ["outer", "inner"]
            raise RuntimeError
    assert current_frames() == ()
