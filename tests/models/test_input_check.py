"""Every model's entry points refuse what no family takes (Backbone.check_input), naming it and what is expected."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_outputs import first_preset_per_family, small_overrides

from vit_attention import create_model

FAMILIES = sorted(first_preset_per_family().values())
EXPECTED = r"expected a floating-point tensor \[B, \d+, H, W\] in the model's dtype"


def _model(name: str) -> tuple[torch.nn.Module, tuple[int, ...]]:
    model = create_model(name, **small_overrides(name)).eval()
    size = model.cfg.img_size if isinstance(model.cfg.img_size, (tuple, list)) else (model.cfg.img_size,) * 2
    return model, (1, model.cfg.in_chans, *size)


@pytest.mark.registry
@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_refuses_non_tensor_and_integer_input_by_name(name: str) -> None:
    model, shape = _model(name)
    entries = {"forward": model, "forward_features": model.forward_features,
               "forward_intermediates": model.forward_intermediates}
    for entry, call in entries.items():
        with pytest.raises(TypeError, match=rf"{entry}\(x\): x is a numpy.ndarray; {EXPECTED}.*torch.from_numpy"):
            call(np.zeros(shape, dtype=np.float32))
        with pytest.raises(TypeError, match=rf"{entry}\(x\): x is None; {EXPECTED}.*create_transform"):
            call(None)
        with pytest.raises(ValueError, match=rf"{entry}\(x\): x has dtype torch.int64; {EXPECTED}"):
            call(torch.zeros(shape, dtype=torch.long))
        with pytest.raises(ValueError, match=rf"{entry}\(x\): x is torch.float64, the model torch.float32"):
            call(torch.zeros(shape, dtype=torch.float64))
    with torch.no_grad():
        out = model(torch.randn(shape))  # the expected input still runs
    assert (out[0] if isinstance(out, tuple) else out).shape[0] == 1


def test_other_inputs_name_their_type_and_the_expected_form() -> None:
    from PIL import Image

    model, shape = _model("deit3_base_patch16_224")
    with pytest.raises(TypeError, match=r"x is a PIL.Image.Image; .*create_transform"):
        model(Image.new("RGB", shape[-2:]))
    with pytest.raises(TypeError, match=r"x is a list; "):
        model([torch.zeros(shape[1:])])
    with pytest.raises(ValueError, match=r"x has dtype torch.uint8; .*x.float\(\) / 255"):
        model(torch.zeros(shape, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"x has shape \(3, \d+, \d+\); .*x.unsqueeze\(0\)"):
        model(torch.zeros(shape[1:]))


def test_autocast_and_the_models_own_dtype_pass() -> None:
    model, shape = _model("deit3_base_patch16_224")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(torch.randn(shape)).shape[0] == 1  # float32 input, autocast casts
    with torch.no_grad():
        assert model.double()(torch.randn(shape, dtype=torch.float64)).dtype == torch.float64


def test_families_widen_the_check_where_their_own_code_takes_more() -> None:
    igpt, shape = _model("igpt_digits")
    with torch.no_grad():
        assert igpt(torch.zeros(2, 4, dtype=torch.long)).shape[0] == 2  # token ids [B, n]
    nf, shape = _model("naflexvit_base_patch16_gap")
    with torch.no_grad():
        out = nf([torch.randn(shape[1:]), torch.randn(shape[1:])])  # a list of images
    assert out.shape[0] == 2
    with pytest.raises(TypeError, match=r"x is None; "):
        nf(None)
