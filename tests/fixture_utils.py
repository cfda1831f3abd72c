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
    """max |ours - ref| <= rel * max |ref| (REFERENCES.md tolerance for reduced fixtures)."""
    scale = ref.abs().max().item()
    err = (ours - ref).abs().max().item()
    assert err <= rel * scale, f"max abs diff {err:.3e} > {rel:.0e} x output scale {scale:.3e}"
