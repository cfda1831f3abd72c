"""VOLO checkpoint layouts (weights/volo.py): timm's (= sail-sg/volo's) keys with the class blocks' fused ``kv``, the
original repository's file wrapper, the inverse conversion, a position embedding of another grid and classifiers of
another size."""

import pytest
import torch
from fixture_utils import assert_loads, assert_parity, load_fixture

from vit_attention import create_model
from vit_attention.models.volo import Volo, VoloConfig
from vit_attention.weights import load_weights
from vit_attention.weights.volo import from_timm, to_timm

pytestmark = pytest.mark.parity

_SAME = ("img_size", "layers", "embed_dims", "num_heads", "stem_hidden_dim", "mlp_ratio", "num_classes")


def _config(cfg: dict, **kw) -> VoloConfig:
    base = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k in _SAME}
    return VoloConfig(**{**base, **kw})


def test_kv_is_split_into_k_and_v_and_joined_back():
    state, _, cfg = load_fixture("timm_volo")
    ours = from_timm(dict(state))
    kv = state["post_network.0.attn.kv.weight"]  # [2C, C], the key rows first
    C = kv.shape[1]
    assert torch.equal(ours["post_network.0.attn.k.weight"], kv[:C])
    assert torch.equal(ours["post_network.0.attn.v.weight"], kv[C:])
    assert not any(".attn.kv." in k for k in ours)
    back = to_timm(ours)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    assert Volo(_config(cfg)).state_dict().keys() == ours.keys()  # every other key is timm's as it is


def test_the_original_file_wrapper_loads_with_the_timm_layout():
    """sail-sg/volo's ``.pth.tar`` holds the state dict under ``state_dict`` (timm reads it unfiltered)."""
    state, t, cfg = load_fixture("timm_volo")
    model = Volo(_config(cfg)).eval()
    report = load_weights(model, {"state_dict": dict(state)})
    assert report.ok and report.layout == "timm", report
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


def test_another_grid_is_resampled_and_other_classes_dropped():
    """A 2x3 ``pos_embed`` into a model built at 48 px (3x3) is resampled bicubic without antialias (the original
    repository's rule); 10-class heads into a 4-class model are left fresh with a warning, both of them."""
    state, _, cfg = load_fixture("timm_volo")
    model = Volo(_config(cfg, img_size=48, num_classes=4)).eval()
    head = model.head.weight.clone()
    with pytest.warns(UserWarning, match="classes in the checkpoint"):
        report = load_weights(model, dict(state))
    assert report.ok and any("pos_embed resampled from 2x3 to 3x3" in n for n in report.notes), report
    assert {"head", "aux_head"} <= set(report.dropped) and torch.equal(model.head.weight, head)
    want = torch.nn.functional.interpolate(state["pos_embed"].permute(0, 3, 1, 2), size=(3, 3), mode="bicubic",
                                           align_corners=False).permute(0, 2, 3, 1)
    torch.testing.assert_close(model.pos_embed, want)


def test_a_preset_takes_the_reduced_fixture_through_create_model(tmp_path):
    state, t, cfg = load_fixture("timm_volo")
    path = tmp_path / "volo.pth"
    torch.save(dict(state), path)
    model = create_model("volo_d1_224", pretrained=path, **{k: v for k, v in _config(cfg).to_dict().items()
                                                            if k in _SAME}).eval()
    assert_loads(model, dict(state), "timm")
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])
