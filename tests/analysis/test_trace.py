"""Shape trace: every module in order, inside attention, on the meta device."""

from __future__ import annotations

import time

import torch

from vit_attention import create_attention, create_model
from vit_attention.analysis import trace


def test_vit_trace_shows_the_documented_flow():
    with torch.device("meta"):
        model = create_model("vit_base_patch16_224")
    t = trace(model, (1, 3, 224, 224))
    text = str(t)
    flow = t.flow()
    assert flow.startswith("[1, 3, 224, 224] → patch_embed → [1, 196, 768] → (VisionTransformer code) → [1, 197, 768]")
    assert flow.endswith("head → [1, 1000]")
    names = [ln.name for ln in t.lines if ln.kind == "module"]
    assert names.index("patch_embed") < names.index("blocks.0.attn.qkv") < names.index("blocks.11.mlp.fc2")
    qkv = next(ln for ln in t.lines if ln.name == "blocks.0.attn.qkv")
    assert qkv.in_shapes == [(1, 197, 768)] and qkv.out_shapes == [(1, 197, 2304)]
    inside = [ln for ln in t.lines if ln.kind == "attention" and ln.name == "blocks.0.attn"]
    assert [ln.what for ln in inside] == ["heads split q|k|v", "logits q·kᵀ", "softmax(logits)·v"]
    assert inside[0].out_shapes == [(1, 12, 197, 64)] * 3
    assert inside[1].out_shapes == [(1, 12, 197, 197)] and "[B, nh, N, M]" in inside[1].note
    assert "[1, 12, 197, 197]" in text and "blocks.11.mlp.fc1" in text


def test_window_trace_shows_windows():
    attn = create_attention("window", 96, 3, window_size=7, shift_size=3)
    t = trace(attn, (2, 14, 14, 96))
    lines = {ln.what: ln for ln in t.lines if ln.kind == "attention"}
    assert lines["windows"].out_shapes == [(8, 49, 96)] and "[B·nW, ws², C]" in lines["windows"].note
    assert "shift=(3, 3)" in lines["windows"].note
    (logits,) = lines["logits q·kᵀ"].out_shapes  # [B·nW, nh, N, M] (or windows folded into heads)
    assert logits[0] * logits[1] == 2 * 4 * 3 and logits[2:] == (49, 49)
    assert t.output_shapes == [(2, 14, 14, 96)]


def test_swin_trace_covers_every_stage():
    with torch.device("meta"):
        model = create_model("swin_tiny_patch4_window7_224")
    t = trace(model, (1, 3, 224, 224), max_depth=2)
    outs = {ln.name: ln.out_shapes[0] for ln in t.lines if ln.kind == "module"}
    assert outs["patch_embed"] == (1, 56, 56, 96)
    assert outs["layers.3"] == (1, 7, 7, 768) and outs["head"] == (1, 1000)
    assert all(ln.depth <= 2 for ln in t.lines)


def test_vit_22b_trace_is_instant_on_meta():
    with torch.device("meta"):
        model = create_model("vit_22b_patch14_224")
    start = time.perf_counter()
    t = trace(model, (1, 3, 224, 224), max_depth=1)
    assert time.perf_counter() - start < 10.0
    assert t.output_shapes == [(1, 1000)]
    logits = [ln for ln in t.lines if ln.what == "logits q·kᵀ"]
    assert logits == []  # depth-limited: attention internals are below depth 1
    full = trace(model, (1, 3, 224, 224))
    logits = [ln for ln in full.lines if ln.what == "logits q·kᵀ"]
    assert len(logits) == 49 and logits[0].out_shapes == [(1, 48, 256, 256)]  # 48 blocks + MAP head (N=1)
    assert logits[-1].out_shapes == [(1, 48, 1, 256)]


def test_trace_leaves_the_model_untouched():
    model = create_model("vit_tiny_patch16_224", img_size=32, depth=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trace(model, (1, 3, 32, 32))
    trace(model, (1, 3, 32, 32), device=None)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_shape_hook_sees_every_call_without_forcing_the_explicit_path(monkeypatch):
    from vit_attention.functional import attention as core
    from vit_attention.functional import observers

    def no_explicit(*args, **kwargs):
        raise AssertionError("the shape hook must not force the explicit path")

    monkeypatch.setattr(core, "_explicit", no_explicit)
    seen = []
    handle = observers.register_attention_hook(lambda q, k, v, info: seen.append((q.shape, k.shape, info)),
                                               weights=False)
    try:
        for device in ("cpu", "meta"):
            q, k = torch.randn(2, 3, 5, 8, device=device), torch.randn(2, 3, 7, 8, device=device)
            with observers.attention_context(module="probe"):
                out = core.scaled_dot_product_attention(q, k, k, mask=torch.ones(5, 7, dtype=torch.bool,
                                                                                  device=device))
            assert out.shape == (2, 3, 5, 8)
    finally:
        handle.remove()
    assert len(seen) == 2 and seen[0][0] == (2, 3, 5, 8) and seen[0][1] == (2, 3, 7, 8)
    assert seen[0][2] == {"module": "probe", "mask": (5, 7), "bias": None, "is_causal": False}
    core.scaled_dot_product_attention(q, k, k)
    assert len(seen) == 2  # removed
