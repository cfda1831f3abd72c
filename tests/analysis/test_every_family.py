"""``info``, ``trace`` and ``summary`` work for every registered model family.

One preset per family (the first registered name in sorted order), on the meta device: the
library functions (:func:`model_info`, :func:`trace`) and the command-line entries
(``vit-attention info / trace / summary --meta``). Each family's attention reaches the core in
its own shape (gathered neighbourhoods and halos hand it 5-D queries), so a report that assumes
``[B, nh, N, hd]`` fails here for the family that breaks it.
"""

from __future__ import annotations

import math

import pytest
import torch
from model_outputs import first_preset_per_family

from vit_attention import create_model
from vit_attention.analysis.info import activation_bytes, model_info
from vit_attention.analysis.trace import trace
from vit_attention.attention import get_attention_spec
from vit_attention.cli import main
from vit_attention.models import get_model_entry, list_models
from vit_attention.models.families import builtin_families

FAMILIES = first_preset_per_family()


def test_the_sweep_covers_the_families_with_gathered_attention() -> None:
    """The families whose core calls are not ``[B, nh, N, hd]`` (neighbourhoods, halos) are in the sweep,
    and every family module's presets belong to a swept family."""
    assert {"nat", "halonet", "pvt", "pvt_v2", "vil"} <= set(FAMILIES)
    modules = {get_model_entry(n).model_cls.__module__.rsplit(".", 1)[-1] for n in list_models()}
    assert modules <= set(builtin_families())


@pytest.mark.slow  # every family at full size on the meta device (~0.3 s a family)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_info_and_trace_run_for_every_family(family: str) -> None:
    name = FAMILIES[family]
    info = model_info(name, batch_size=2)
    assert info.family == family and info.input_shape[0] == 2
    assert info.output_shapes[0][0] == 2
    assert info.params > 0 and info.macs > 0 and info.activation_bytes > 0
    assert name in info.format()

    with torch.device("meta"):
        model = create_model(name).eval()
    t = trace(model, info.input_shape)
    assert t.output_shapes == info.output_shapes
    attention_steps = [ln for ln in t.lines if ln.kind == "attention"]
    # a mechanism that forms no attention weights (its spec's weights_note) never reaches the core: its calls show
    weightless = {n for n, m in model.named_modules()
                  if getattr(m, "attention_name", "") and get_attention_spec(m.attention_name).weights_note}
    assert attention_steps or weightless, f"{name}: the trace shows no attention step"
    assert weightless <= {ln.name for ln in t.lines if ln.kind == "module"}
    assert t.flow(max_depth=1).startswith(f"[{', '.join(map(str, info.input_shape))}]")


@pytest.mark.slow  # the command-line twin of the library sweep above (~15 s)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cli_info_trace_summary_run_for_every_family(family: str, capsys: pytest.CaptureFixture[str]) -> None:
    name = FAMILIES[family]
    for argv in (["info", name], ["trace", name, "--flow"], ["summary", name, "--meta", "--batch-size", "2"]):
        assert main(argv) == 0, f"vit-attention {' '.join(argv)}"
        out, err = capsys.readouterr()
        assert "error" not in err and out.strip(), argv
        if argv[0] == "summary":
            assert "output shape: [2, " in out


def test_activation_bytes_count_gathered_queries_with_five_dims() -> None:
    """Neighbourhood attention hands the core queries ``[B, nT, nh, T², hd]`` (tiles folded into leading
    dims): the weights counted are ``prod(q[:-1]) · M`` for every such call, the same as if the tiles
    had been folded into the batch."""
    from vit_attention.analysis.recording import record_forward

    with torch.device("meta"):
        model = create_model("nat_mini", depths=(1, 1, 1, 1)).eval()
    shape = (1, 3, 64, 64)
    rec = record_forward(model, shape)
    assert any(len(a.q) == 5 for a in rec.attention)
    leaves = sum(math.prod(s) for c in rec.calls if not any(True for _ in c.module.children())
                 and not isinstance(c.module, (torch.nn.Identity, torch.nn.Dropout)) for s in c.out_shapes)
    weights = sum(math.prod(a.q[:-1]) * a.k[-2] for a in rec.attention)
    assert activation_bytes(model, shape) == 4 * (leaves + weights)
