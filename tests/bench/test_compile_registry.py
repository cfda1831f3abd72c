"""``torch.compile`` across the registry: every registered model traces as ONE graph (no graph
break) and the traced model computes what the eager one does.

Each distinct reduced model (``tests/model_outputs.py``: every family, class and code path, small) is run
twice in eager inference first (the second call takes the cached paths: position biases, masks, index
plans) and then traced by dynamo with a counting backend (no code generation) and ``fullgraph=False``,
which is what ``torch.compile(model)`` and ``vit-attention bench --compile`` do: a graph break shows as a
second graph. (``fullgraph=True`` is not the check: torch 2.13 then captures ``Tensor.item()`` and
dynamic-shape operators into the graph instead of refusing them, so a builder that reads a tensor back
to Python passes it while a plain ``torch.compile`` breaks there.) The trace stops at the second graph,
so a breaking model costs little.

Also traced: NaFlexViT's list-of-images and packed-dict inputs, and iGPT's cached sampling step
(``forward_logits`` of one new token with a :class:`~vit_attention.attention.causal.KVCache`).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
from model_outputs import build, distinct_reduced_presets, small_overrides
from torch import nn

pytestmark = [pytest.mark.compile,
              pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")]


class _SecondGraph(RuntimeError):
    """Raised by :class:`_GraphCounter` at a second graph: a graph break (stops the trace early)."""


class _GraphCounter:
    """A dynamo backend that keeps each traced graph and runs it as traced (no code generation)."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs.append(gm)
        if len(self.graphs) > 1:
            raise _SecondGraph(f"graph break: a second graph ({len(gm.graph.nodes)} nodes)")
        return gm.forward


def _trace_once(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """``fn(*args, **kwargs)`` through dynamo: ``(output, number of graphs)``; raises AssertionError at a break."""
    counter = _GraphCounter()
    compiled = torch.compile(fn, backend=counter, fullgraph=False, dynamic=False)
    try:
        out = compiled(*args, **kwargs)
    except Exception as e:  # dynamo wraps the backend's error
        if counter.graphs and len(counter.graphs) > 1:
            raise AssertionError(f"graph break ({len(counter.graphs)} graphs so far); list the reasons with "
                                 "`vit-attention bench MODEL --graph-breaks`") from e
        raise
    finally:
        torch._dynamo.reset()
    return out, len(counter.graphs)


def _close(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k])
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.registry
@pytest.mark.parametrize("name", distinct_reduced_presets())
def test_one_graph_and_same_output(name: str) -> None:
    model, x = build(name, small_overrides(name))
    with torch.inference_mode():
        ref = model(x)
        model(x)  # warm-up: the second call is the one users repeat (cached biases, masks, plans)
        out, graphs = _trace_once(model, x)
    assert graphs == 1
    _close(out, ref)


def _naflex(**over: object) -> nn.Module:
    name = "naflexvit_base_patch16_gap"
    model, _ = build(name, {**small_overrides(name), **over})
    return model


@pytest.mark.parametrize("rope", [None, "axial", "mixed"])
def test_naflexvit_list_of_images_one_graph(rope: str | None) -> None:
    """A list of images: the grids come from the images' sizes (nothing read back from patch_coord); with
    RoPE each block's per-sample tables keep the grids on the device (was a graph break per block)."""
    model = _naflex(**({"rope": rope} if rope else {}))
    g = torch.Generator().manual_seed(0)
    imgs = [torch.randn(3, 16, 32, generator=g), torch.randn(3, 32, 16, generator=g)]
    with torch.inference_mode():
        ref = model(imgs)
        out, graphs = _trace_once(model, imgs)
    assert graphs == 1
    _close(out, ref)


def test_naflexvit_packed_dict_compiles_to_eager_outputs() -> None:
    """A packed dict from a user's ``patch_coord``: NaFlexEmbeds.forward_packed reads each image's grid back
    (``(coord.amax(1) + 1).tolist()``, data-dependent) to resample the position table, so the graph breaks at
    the embedding (the list and tensor forms are one graph); compiled, it still gives eager's outputs."""
    from vit_attention.models.naflexvit import patchify_images

    model = _naflex()
    g = torch.Generator().manual_seed(1)
    packed = patchify_images([torch.randn(3, 16, 32, generator=g), torch.randn(3, 16, 16, generator=g)],
                             model.patch_size)
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    with torch.inference_mode():
        ref = model.forward_features(packed)
        try:
            out = torch.compile(model.forward_features, backend=keep, dynamic=False)(packed)
        finally:
            torch._dynamo.reset()
    assert graphs  # traced (in pieces)
    _close(out, ref)


def test_igpt_cached_sampling_step_one_graph() -> None:
    """One step of cached sampling (a new token against the key / value cache) traces as one graph and
    gives the eager step's logits; the cache is updated alike."""
    from vit_attention.attention.causal import KVCache

    name = "igpt_digits"
    model, _ = build(name, small_overrides(name))
    N = model.num_tokens
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 3), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([torch.full((2, 1), model.sos_token), prompt], dim=1)  # [2, 4]
    nxt = torch.randint(0, model.cfg.vocab_size, (2, 1), generator=torch.Generator().manual_seed(1))

    def step(tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:  # [B, 1] -> next-token logits [B, K]
        return model.lm_head(model._tokens(tokens, cache))[:, -1]

    with torch.inference_mode():
        eager_cache, traced_cache = KVCache(len(model.blocks), capacity=N), KVCache(len(model.blocks), capacity=N)
        model._tokens(ids, eager_cache)
        model._tokens(ids, traced_cache)  # the prompt, eager
        ref = step(nxt, eager_cache)
        out, graphs = _trace_once(step, nxt, traced_cache)
    assert graphs == 1
    _close(out, ref)
    assert len(traced_cache) == len(eager_cache) == ids.shape[1] + 1
    for layer in range(len(model.blocks)):
        for a, b in zip(traced_cache.get(layer), eager_cache.get(layer)):
            _close(a, b)


# families that take any map size and build index plans as graph constants: a second input size makes
# torch.compile (default settings) recompile with dynamic sizes, which those builders specialise (the other
# families were checked by hand: Swin, HaloNet, DaViT, PVTv2, CvT, ViT with dynamic_img_size had no break)
ANY_SIZE = ("nat", "vil")


@pytest.mark.slow  # dynamo traces each model twice, the second time with symbolic sizes (about 10 s each)
@pytest.mark.parametrize("family", ANY_SIZE)
def test_new_input_sizes_compile_without_graph_breaks(family: str) -> None:
    """``torch.compile(model)`` at two input sizes: at most one new graph per size (none broken), the eager
    outputs. NAT and ViL broke into 2-8 graphs per new size before: dynamo made the map size symbolic, and their
    index builders (``assume_constant_result``) refuse symbolic arguments
    (:func:`~vit_attention.functional.window.static_args` now specialises them: one graph per size)."""
    from model_outputs import first_preset_per_family

    name = first_preset_per_family()[family]
    model, x = build(name, small_overrides(name))
    model.eval()
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    s = x.shape[-1]
    sizes = [(s, s), (s + 16, s + 32)]  # the second size is the dynamic recompile (2 graphs there before the fix)
    compiled = torch.compile(model, backend=keep)
    try:
        with torch.no_grad():
            for i, size in enumerate(sizes, 1):
                xi = nn.functional.interpolate(x[:1], size=size)
                _close(compiled(xi), model(xi))
                assert len(graphs) <= i, f"a graph break at input size {size}: {len(graphs)} graphs for {i} sizes"
    finally:
        torch._dynamo.reset()


@pytest.mark.registry
@pytest.mark.parametrize("name", ["swin_tiny_patch4_window7_224", "deit_small_patch16_224", "vitdet_base_patch16_1024",
                                  "halonet26t", "cait_xxs24_224"])
def test_features_models_trace_as_one_graph(name: str) -> None:
    """A pruned features model (early stop, ViTDet's chosen pyramid branches, CaiT without its class stage) is
    one graph too, and the traced maps are the eager ones."""
    from vit_attention import create_model

    model = create_model(name, features_only=True, out_indices=(0, 1), **small_overrides(name)).eval()
    size = model.cfg.img_size if isinstance(model.cfg.img_size, (tuple, list)) else (model.cfg.img_size,) * 2
    x = torch.randn(2, model.cfg.in_chans, *size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = model(x)
        model(x)
        out, graphs = _trace_once(model, x)
    assert graphs == 1 and len(out) == len(ref) == 2
    for a, b in zip(out, ref, strict=True):
        _close(a, b)
