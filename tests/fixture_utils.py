"""Read the committed reference fixtures (tests/fixtures/*.safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def load_fixture(name: str) -> tuple[dict, dict, dict]:
    """-> (reference state dict, other tensors (input, output, ...), reference constructor kwargs)."""
    path = FIXTURES / f"{name}.safetensors"
    state, tensors = {}, {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        for key in f.keys():
            if key.startswith("state_dict."):
                state[key[len("state_dict."):]] = f.get_tensor(key)
            else:
                tensors[key] = f.get_tensor(key)
    return state, tensors, json.loads(meta["config"])


def assert_parity(ours, ref, rel: float = 1e-5) -> None:
    """max |ours - ref| <= rel * max |ref| (the tolerance for reduced fp32 fixtures)."""
    scale = ref.abs().max().item()
    err = (ours - ref).abs().max().item()
    assert err <= rel * scale, f"max abs diff {err:.3e} > {rel:.0e} x output scale {scale:.3e}"


def rel_err(ours, ref) -> float:
    """max |ours - ref| / max |ref| of two tensors of the same shape (asserted: no broadcasting)."""
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def fixture_metadata(name: str) -> dict[str, str]:
    """The safetensors metadata of fixture ``name`` (``config`` JSON, ``model``, ``reference``, ...)."""
    with safe_open(str(FIXTURES / f"{name}.safetensors"), framework="pt") as f:
        return dict(f.metadata())


def assert_loads(model, source, layout: str | None = None, **kwargs):
    """``load_weights(model, source, **kwargs)`` succeeds and, when ``layout`` is given, recognises that layout
    -> the report."""
    from vit_attention.weights import load_weights

    report = load_weights(model, source, **kwargs)
    assert report.ok and (layout is None or report.layout == layout), str(report)
    return report


def assert_fixture_parity(model, t: dict, suffix: str = "",
                          outputs: tuple[str, ...] = ("features", "pre_logits", "output"),
                          fused: bool | None = None) -> None:
    """``model`` reproduces the fixture on ``t["input" + suffix]`` (no grad; :func:`assert_parity` tolerance).

    ``outputs`` names what is compared: ``features`` (``forward_features``), ``pre_logits``
    (``forward_head(features, pre_logits=True)``), ``output`` (``model(x)``), each against ``t[what + suffix]``.
    ``fused``: run with the fused (``True``) or explicit (``False``) attention path switched on (``None``: as set).
    """
    import contextlib

    import torch

    from vit_attention.functional import switched

    unknown = sorted(set(outputs) - {"features", "pre_logits", "output"})
    assert not unknown, f"unknown outputs {unknown}"
    x = t[f"input{suffix}"]
    path = contextlib.nullcontext() if fused is None else switched(model, fused_attention=fused)
    with torch.no_grad(), path:
        feats = model.forward_features(x)
        if "features" in outputs:
            assert_parity(feats, t[f"features{suffix}"])
        if "pre_logits" in outputs:
            assert_parity(model.forward_head(feats, pre_logits=True), t[f"pre_logits{suffix}"])
        if "output" in outputs:
            assert_parity(model(x), t[f"output{suffix}"])


def check_wide_fixture(name: str, build, wide: tuple[str, ...] = ("features", "pre_logits", "output")):
    """Fixture ``name``'s weights load as our own key layout into ``build(reference kwargs)``, which reproduces the
    fixture at ``input`` and at the non-square ``input_wide`` (``wide``: what the fixture records there)
    -> (model, state, tensors, reference kwargs)."""
    state, t, cfg = load_fixture(name)
    model = build(cfg)
    assert_loads(model, state, "vit_attention")
    assert_fixture_parity(model, t)
    assert_fixture_parity(model, t, "_wide", outputs=wide)
    return model, state, t, cfg


# (tag, img_size, patch_size) of the resized inputs / outputs make_fixtures_flexivit.py records in timm_flexivit
FLEXIVIT_RESIZES = (("p12", 48, 12), ("rect", (40, 48), (10, 6)), ("p4", (24, 40), 4))


def assert_resized_parity(model, t: dict) -> None:
    """A copy of ``model`` after ``set_input_size`` to each of :data:`FLEXIVIT_RESIZES` reproduces the fixture's
    ``output_<tag>`` on ``input_<tag>`` (timm's ``set_input_size``; ``model`` itself is left as it is)."""
    import copy

    import torch

    for tag, img, patch in FLEXIVIT_RESIZES:
        m = copy.deepcopy(model)
        m.set_input_size(img_size=img, patch_size=patch)
        with torch.no_grad():
            assert_parity(m(t[f"input_{tag}"]), t[f"output_{tag}"])


def add_noise(module, scale: float):
    """``scale · N(0, 1)`` added to every parameter of ``module`` (the global RNG), so a parity test cannot pass on
    zero-initialised tables or identity norms. Returns ``module``."""
    import torch

    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))
    return module


def perturb_like_trained(model):
    """Random weights and BatchNorm running statistics away from the 0 / 1 initialisation; eval mode.

    Seeded (``torch.manual_seed(0)``): every parameter gets ``0.05 · N(0, 1)`` added, every
    ``BatchNorm2d`` a running mean ``0.1 · N(0, 1)`` and variance in ``[0.5, 1.5)``, so a parity test
    of freshly initialised models cannot pass on zero tables or identity norms. Returns ``model``.
    """
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn_like(m.running_mean))
                m.running_var.copy_(0.5 + torch.rand_like(m.running_var))
    return model.eval()


def meta_model_with_timm_params(name: str, params: int | None = None):
    """``create_model(name)`` on the meta device, after checking its parameter count equals the registry's
    published figure (``published_params_m``, timm's count to the thousand) and, when ``params`` is given, is exactly
    ``params`` (timm 1.0.31 on the meta device, the source the registry names)."""
    import torch

    from vit_attention import create_model
    from vit_attention.models import get_model_entry

    meta = get_model_entry(name).meta
    with torch.device("meta"):
        m = create_model(name)
    n = sum(p.numel() for p in m.parameters())
    assert round(n / 1e6, 3) == meta["published_params_m"]
    if params is not None:
        assert meta["published_params_source"] == "timm 1.0.31 on the meta device"
        assert n == params
    return m


def assert_edited_table_takes_effect(model, x, name: str, overrides: dict, key: str) -> None:
    """After an eval forward, ``load_state_dict`` with the tensor ``key`` (an attention-bias table) changed: the next
    forward of ``model`` equals a freshly built ``name(**overrides)`` with that state and differs from the first one
    (timm and the original repositories keep the gathered bias of an eval forward until ``train()`` / ``.to()``)."""
    import torch

    from vit_attention import create_model

    with torch.no_grad():
        before = model(x)
        state = model.state_dict()
        state[key] = state[key] + torch.randn(state[key].shape, generator=torch.Generator().manual_seed(3))
        model.load_state_dict(state)
        after = model(x)
        fresh = create_model(name, **overrides).eval()
        fresh.load_state_dict(state)
        torch.testing.assert_close(after, fresh(x), rtol=0, atol=0)
    assert not torch.allclose(after, before, atol=1e-4)


def seeded(module, seed: int, scale: float = 0.2):
    """``module`` in eval mode with every parameter drawn from N(0, ``scale``²) by a generator seeded with ``seed``
    (in ``parameters()`` order): the same weights on every machine."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module.eval()
