"""Every registered attention mechanism takes an empty batch: ``[0, N, C]`` tokens or a ``[0, H, W, C]`` map.

Built with :func:`vit_attention.create_attention` from the spec's small example (as the contract
tests build it) and from its docs configuration (ViT-B/16's 197 tokens or a 14x14 map, with the
keywords the docs show); on an empty batch both cost nothing. The output has batch 0 and the
input's other sizes, and the backward pass runs: the input and every parameter get a (zero,
finite) gradient. A reshape that infers a size beside a zero batch (``reshape(B, -1, C)``) fails here.
"""

from __future__ import annotations

import pytest
import torch

from vit_attention import create_attention, list_attention
from vit_attention.attention import AttentionCall, get_attention_spec

NAMES = list_attention()


def _configs(name: str) -> list[tuple[dict, tuple[int, ...], int]]:
    """``(kwargs, input_shape, num_heads)`` of the spec's example and of its docs example."""
    spec = get_attention_spec(name)
    out = [(spec.example_kwargs, spec.example_shape, spec.example_heads)]
    if spec.doc_example is not None:
        out.append((spec.doc_example[0], spec.doc_example[1], 3))  # the docs build it with 3 heads
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_empty_batch_forward_and_backward(name: str, mode: str) -> None:
    for kwargs, shape, heads in _configs(name):
        attn = create_attention(name, shape[-1], heads, **kwargs).train(mode == "train")
        x = torch.randn(0, *shape[1:], requires_grad=True)  # [0, N, C] or [0, H, W, C]
        grid = tuple(shape[1:3]) if len(shape) == 4 else None
        y = attn(x, AttentionCall(feat_size=grid, num_prefix_tokens=0, context=None))
        assert y.shape == x.shape, f"{name} {kwargs}: {tuple(y.shape)} for input {tuple(x.shape)}"
        y.square().sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape
        for pname, p in attn.named_parameters():
            if p.requires_grad:
                assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: {pname}"


@pytest.mark.parametrize("name", [n for n in NAMES if get_attention_spec(n).layout == "spatial"
                                  and not get_attention_spec(n).weights_note])  # no weights: no maps
def test_empty_batch_weights_place_on_the_grid(name: str) -> None:
    """The weights of an empty batch go through the layout (attention maps): per-query and received maps
    ``[0, H, W]``."""
    from vit_attention.functional import register_attention_hook

    spec = get_attention_spec(name)
    attn = create_attention(name, spec.example_shape[-1], spec.example_heads, **spec.example_kwargs).eval()
    _, H, W, _ = spec.example_shape
    seen: list[tuple[torch.Tensor, dict]] = []
    handle = register_attention_hook(lambda w, info: seen.append((w, info)))
    try:
        with torch.no_grad():
            attn(torch.randn(0, H, W, spec.example_shape[-1]))
    finally:
        handle.remove()
    layouts = [(w, info["layout"]) for w, info in seen if "layout" in info and info["layout"].axis == "tokens"]
    assert layouts, f"{name}: no call with a token layout"
    for w, layout in layouts:
        grid = layout.grid
        assert layout.received(w).shape == (0, *grid)
        assert layout.query_map(w, (grid[0] // 2, grid[1] // 2)).shape == (0, *grid)
