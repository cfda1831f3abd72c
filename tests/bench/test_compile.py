"""torch.compile traces our models in one graph (no graph breaks) and compiles to the same outputs.

Cheap: dynamo's ``explain`` and the ``eager`` backend (no code generation) on reduced models.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from vit_attention import create_model
from vit_attention.bench.harness import explain_graph_breaks

# Swin's shifted windows and masks through the harness's explain (`bench --graph-breaks`) and a fullgraph compile;
# that every distinct reduced model traces as one graph is test_compile_registry.py's sweep
SMALL = {
    "swin_tiny_patch4_window7_224": (dict(depths=(1, 1), num_heads=(2, 4), embed_dim=32, window_size=4), 64),
}


@pytest.mark.slow  # a dynamo explain and a compile (about 10 s)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_one_graph_and_same_output(name: str) -> None:
    kwargs, img = SMALL[name]
    torch.manual_seed(0)
    model = create_model(name, img_size=img, **kwargs).eval()
    x = torch.randn(2, 3, img, img)
    info = explain_graph_breaks(model, x)
    assert info["graph_breaks"] == 0 and info["graphs"] == 1, info
    try:
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    finally:
        torch._dynamo.reset()


@pytest.mark.compile
def test_cli_graph_breaks_lists_models(capsys: pytest.CaptureFixture[str]) -> None:
    from vit_attention.cli import main

    assert main(["bench", "vit_tiny_patch16_224", "--graph-breaks"]) == 0
    assert "| vit_tiny_patch16_224 | 1 | 0 | - |" in capsys.readouterr().out
    assert main(["bench", "nonexistent*", "--graph-breaks"]) == 2
    assert "no registered model matches" in capsys.readouterr().err
