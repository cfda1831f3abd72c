"""HaloNet checkpoints: reduced timm ByobNet fixtures load into :class:`HaloNet` key for key and match.

The fixtures (``tests/fixtures/make_fixtures_halonet.py``) are timm ``ByobNet`` configs of the
``halonet26t`` / ``halonet_h1`` / ``haloregnetz_b`` kinds with eval BatchNorm and perturbed
running statistics. Tolerance: max |ours - ref| <= 1e-5 * max |ref|.
"""

from __future__ import annotations

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_parity, load_fixture

from vit_attention.models.halonet import HaloNet, HaloNetConfig
from vit_attention.weights import load_weights

pytestmark = pytest.mark.parity  # every test here compares with a reference implementation

# the fixtures' timm ByoModelCfg, in our fields
_FIXTURE_CFG = {
    "timm_halonet26t": dict(stem_chs=16, block_types=("b", "b", "ba", "aa"), channels=(16, 32, 32, 64),
                            bottle_ratios=(0.5, 0.5, 0.5, 0.25), num_heads=(2,) * 4,
                            attn_kwargs={"block_size": 2, "halo_size": 1}),
    "timm_halonet_h1": dict(stem_type="7x7", stem_chs=16, block_types=("a", "a", "a", "a"),
                            channels=(16, 16, 32, 32), bottle_ratios=(1.0,) * 4, num_heads=(2,) * 4,
                            attn_kwargs={"block_size": 4, "halo_size": 2}),
    "timm_haloregnetz": dict(stem_type="3x3", stem_chs=16, stem_pool=False, block_types=("b", "b", "ba", "a"),
                             channels=(16, 24, 32, 32), strides=(2, 2, 2, 2), bottle_ratios=(3.0,) * 4,
                             group_sizes=(8,) * 4, num_heads=(2,) * 4, act_layer="silu", se_ratio=0.25, downsample="",
                             bottle_in=True, linear_out=True, num_features=64,
                             attn_kwargs={"block_size": 3, "halo_size": 1, "qk_ratio": 0.33}),
}


def _fixture_model(name: str) -> HaloNet:
    return HaloNet(HaloNetConfig(num_classes=10, img_size=64, **_FIXTURE_CFG[name])).eval()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("name", sorted(_FIXTURE_CFG))
def test_timm_fixture_parity(name: str, fused: bool) -> None:
    state, t, _ = load_fixture(name)
    model = _fixture_model(name)
    assert set(model.state_dict()) == set(state)  # timm's key layout, one to one
    report = load_weights(model, state)
    assert report.ok, str(report)
    assert_fixture_parity(model, t, fused=fused)


@pytest.mark.parametrize("name", sorted(_FIXTURE_CFG))
def test_intermediates_end_with_the_features(name: str) -> None:
    state, t, _ = load_fixture(name)
    model = _fixture_model(name)
    model.load_state_dict(state)
    with torch.no_grad():
        final, maps = model.forward_intermediates(t["input"])
    assert [m.shape[1] for m in maps] == [d["num_chs"] for d in model.feature_info]
    assert [t["input"].shape[-1] // m.shape[-1] for m in maps] == [d["reduction"] for d in model.feature_info]
    assert_parity(maps[-1], t["features"])
    assert_parity(final, t["features"])
