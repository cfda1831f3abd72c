"""The PEG (CPVT's conditional position encoding, ``layers.PosConv``): timm parity and its placements.

timm fixture: tests/fixtures/make_fixtures_twins.py (``timm_twins_posconv``).
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vit_attention.functional.runtime import CHUNK_ELEMENTS
from vit_attention.layers import Block, PosConv, Stage
from vit_attention.models.twins import TwinsPosConv
from vit_attention.models.vit import VisionTransformer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parity
def test_matches_timm_twins_posconv():
    t = load_file(FIXTURES / "timm_twins_posconv.safetensors")
    w, b = t["state_dict.proj.0.weight"], t["state_dict.proj.0.bias"]
    C = w.shape[0]
    img = t["input"]  # [2, 3, 6, 9], tiled to C channels by the fixture's wrapper
    B, _, H, W = img.shape
    grid = img.repeat(1, C // 3, 1, 1).permute(0, 2, 3, 1)  # [B, H, W, C]
    peg = PosConv(C).eval()
    peg.load_state_dict({"proj.weight": w, "proj.bias": b})
    with torch.no_grad():
        tokens = peg(grid.reshape(B, H * W, C), (H, W))  # tokens [B, H·W, C]
        assert _rel_err(tokens, t["output"]) <= 1e-5
        assert _rel_err(peg(grid).reshape(B, H * W, C), t["output"]) <= 1e-5  # the map path
        twins = TwinsPosConv(C).eval()  # timm's key layout, same math
        twins.load_state_dict({"proj.0.weight": w, "proj.0.bias": b})
        assert _rel_err(twins(grid).reshape(B, H * W, C), t["output"]) <= 1e-5


def test_is_depthwise_3x3_stride_1_with_bias_and_identity():
    peg = PosConv(8)
    conv = peg.proj
    assert conv.groups == 8 and conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.padding == (1, 1)
    assert conv.bias is not None
    with torch.no_grad():
        conv.weight.zero_()
        conv.bias.zero_()
        x = torch.randn(2, 5, 4, 8)
        assert torch.equal(peg(x), x)  # zero conv: the identity remains


def test_prefix_tokens_pass_unchanged_and_grid_is_the_map_path():
    peg = PosConv(8).eval()
    grid = torch.randn(2, 3, 4, 8)
    cls = torch.randn(2, 1, 8)
    with torch.no_grad():
        out = peg(torch.cat([cls, grid.reshape(2, 12, 8)], 1), (3, 4), 1)
        assert torch.equal(out[:, :1], cls)
        torch.testing.assert_close(out[:, 1:], peg(grid).reshape(2, 12, 8))
    with pytest.raises(ValueError, match="feat_size"):
        peg(torch.randn(2, 12, 8))


def test_zero_padding_gives_absolute_position_cues():
    """A constant map is not constant after the PEG: borders see zeros (CPVT's argument)."""
    peg = PosConv(4).eval()
    with torch.no_grad():
        peg.proj.weight.fill_(1.0)
        peg.proj.bias.zero_()
        out = peg(torch.ones(1, 5, 5, 4))
    assert out[0, 2, 2, 0] == 10.0 and out[0, 0, 0, 0] == 5.0 and out[0, 0, 2, 0] == 7.0


def test_stage_places_the_position_layer_after_a_block():
    torch.manual_seed(0)
    blocks = [Block(8, 2, attn_layer="lsa", attn_kwargs=dict(window_size=2)) for _ in range(3)]
    peg = PosConv(8)
    stage = Stage(blocks, pos=peg, pos_index=1).eval()
    x = torch.randn(2, 4, 6, 8)
    with torch.no_grad():
        ref = blocks[2](peg(blocks[1](blocks[0](x))))
        torch.testing.assert_close(stage(x), ref)
    assert any(k.startswith("pos.proj.") for k in stage.state_dict())
    assert "pos.proj.weight" not in Stage(blocks).state_dict()
    with pytest.raises(ValueError, match="pos_index"):
        Stage(blocks, pos=PosConv(8), pos_index=3)


def test_stage_position_layer_in_batch_chunks_and_checkpointing():
    torch.manual_seed(0)
    stage = Stage([Block(8, 2, attn_layer="lsa", attn_kwargs=dict(window_size=2)) for _ in range(2)],
                  pos=PosConv(8)).eval()
    x = torch.randn(6, 4, 4, 8)
    with torch.no_grad():
        with CHUNK_ELEMENTS.override(0):
            whole = stage(x)
        with CHUNK_ELEMENTS.override(4 * 4 * 8 * 2):  # two images per chunk
            torch.testing.assert_close(stage(x), whole)
    stage.train()
    stage.grad_checkpointing = True
    y = stage(x.requires_grad_())
    y.sum().backward()
    assert x.grad is not None and stage.pos.proj.weight.grad is not None


def test_vit_peg_after_runs_on_block_output_with_prefix_tokens():
    torch.manual_seed(0)
    m = VisionTransformer(img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=3,
                          pos_embed="none", peg_after=(0,), dynamic_img_size=True).eval()
    assert m.pos_embed is None and set(m.pos_block) == {"0"}
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        t = torch.cat([m.cls_token.expand(2, -1, -1), m.patch_embed(x)], 1)  # [B, 1 + 4·6, C]
        t = m.blocks[0](t, (4, 6), 1)
        t = m.pos_block["0"](t, (4, 6), 1)
        t = m.norm(m.blocks[1](t, (4, 6), 1))
        torch.testing.assert_close(m.forward_features(x), t)
        _, inter = m.forward_intermediates(x, indices=[0], output_fmt="NLC")
        ref0 = m.pos_block["0"](m.blocks[0](torch.cat([m.cls_token.expand(2, -1, -1), m.patch_embed(x)], 1),
                                            (4, 6), 1), (4, 6), 1)
        torch.testing.assert_close(inter[0], ref0[:, 1:])  # intermediates include the PEG
    with pytest.raises(ValueError, match="peg_after"):
        VisionTransformer(depth=2, peg_after=(2,))
    with pytest.raises(TypeError, match="peg_after"):
        VisionTransformer(depth=2, peg_after=1)  # type: ignore[arg-type]
