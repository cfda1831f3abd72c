"""Live parity with Hugging Face transformers models: seeded weights, loading into ours, comparing logits."""

from __future__ import annotations

from fixture_utils import assert_loads, assert_parity


def load_from_hf(model, hf, via: str):
    """``hf`` (a transformers model) loaded into ``model`` from memory (``via="memory"``: its state dict) or from
    its ``save_pretrained`` folder (``via="file"``), as the Hugging Face layout -> the report."""
    import tempfile

    assert via in ("memory", "file"), via
    if via == "memory":
        return assert_loads(model, hf.state_dict(), "huggingface")
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        return assert_loads(model, d, "huggingface")


def assert_hf_logits_parity(model, ref, size):
    """``ref``'s state dict (a transformers ``*ForImageClassification``) loads into ``model`` as the Hugging Face
    layout, and their logits agree on a random batch ``[2, 3, *size]`` (``size``: an int or ``(h, w)``) -> the batch."""
    import torch

    assert_loads(model, ref.state_dict(), "huggingface")
    x = torch.randn(2, 3, *((size, size) if isinstance(size, int) else size))
    with torch.no_grad():
        assert_parity(model(x), ref(pixel_values=x).logits)
    return x


def perturb_fan_in(model, small: tuple[str, ...] = ("embedding",), layer_scale: str | None = None):
    """Seeded noise on every parameter, in ``named_parameters`` order (generator seed 0); eval mode.

    A matrix (2+ dims) whose name contains none of ``small`` gets ``N(0, 1) / sqrt(fan_in)`` added, any other
    parameter ``0.1 · N(0, 1)``; parameters named ``*<layer_scale>`` are set to ``0.1 + 0.05 · N(0, 1)`` (LayerScale
    away from a 1.0 init). For live parity with Hugging Face models at trained-like scales. Returns ``model``.
    """
    import torch

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if layer_scale is not None and name.endswith(layer_scale):
                p.copy_(0.1 + 0.05 * noise)
            elif p.dim() >= 2 and not any(s in name for s in small):
                p.add_(noise / p[0].numel() ** 0.5)
            else:
                p.add_(0.1 * noise)
    return model.eval()
