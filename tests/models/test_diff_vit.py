"""Differential attention in the models: every block gets its own index (``λ_init`` follows depth), and timm
1.0.31's differential-attention ViTs (``vit_dwee`` / ``vit_dlittle``) as presets of the ViT family."""

from __future__ import annotations

import pytest
import torch
from fixture_utils import assert_fixture_parity, assert_loads, load_fixture
from model_outputs import first_preset_per_family, small_overrides

from vit_attention import create_model
from vit_attention.attention.diff import DifferentialAttention, lambda_init_at
from vit_attention.layers import Block
from vit_attention.models.pretrained_table import DEFAULT_TAGS, PRETRAINED_CFGS

FAMILIES = sorted(first_preset_per_family().items())


@pytest.mark.registry
@pytest.mark.parametrize(("family", "name"), FAMILIES)
def test_every_family_gives_each_attention_block_its_index(family: str, name: str) -> None:
    """A family that takes a token mechanism numbers its diff blocks 0, 1, 2 ... in order (across stages); one
    that cannot take it refuses, naming attn_layer."""
    try:
        model = create_model(name, **small_overrides(name), attn_layer="diff")
    except (TypeError, ValueError) as err:
        assert "attn_layer" in str(err)
        return
    diffs = [m for m in model.modules() if isinstance(m, DifferentialAttention)]
    assert diffs, f"{name}: attn_layer='diff' built no differential attention"
    assert [m.depth_index for m in diffs] == list(range(len(diffs)))
    assert [m.lambda_init for m in diffs] == [lambda_init_at(i) for i in range(len(diffs))]


def test_the_block_hands_its_index_only_to_a_mechanism_that_takes_it() -> None:
    assert Block(32, 2, attn_layer="diff", depth_index=3).attn.lambda_init == pytest.approx(lambda_init_at(3))
    assert Block(32, 2, attn_layer="diff", attn_kwargs=dict(depth_index=5)).attn.depth_index == 5  # kwargs win
    assert not hasattr(Block(32, 2, attn_layer="mhsa", depth_index=3).attn, "depth_index")


@pytest.mark.parametrize(("name", "params"), [("vit_dwee_patch16_reg1_gap_256", 13_425_256),
                                              ("vit_dlittle_patch16_reg1_gap_256", 22_517_736)])
def test_presets_have_timms_parameter_count(name: str, params: int) -> None:
    """timm 1.0.31 ``timm.create_model(name)`` on the meta device: 13,425,256 / 22,517,736 parameters (its
    ``vit_wee`` / ``vit_little`` plus, per block, four ``hd``-vectors λ and the ``2·hd`` sub-norm weight)."""
    with torch.device("meta"):
        model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) == params
    diffs = [m for m in model.modules() if isinstance(m, DifferentialAttention)]
    assert len(diffs) == 14 and diffs[0].lambda_init == pytest.approx(0.2)


def test_presets_carry_timms_tags_and_data_config() -> None:
    """timm 1.0.31's tags (the NAdaMuon weights first, its default) and data config: 256 px, crop 0.95, mean = std
    = 0.5, bicubic."""
    assert DEFAULT_TAGS["vit_dwee_patch16_reg1_gap_256"] == "sbb_nadamuon_in1k"
    assert DEFAULT_TAGS["vit_dlittle_patch16_reg1_gap_256"] == "sbb_nadamuon_in1k"
    cfg = PRETRAINED_CFGS["vit_dwee_patch16_reg1_gap_256.sbb_in1k"]
    assert cfg["hf_hub_id"] == "timm/vit_dwee_patch16_reg1_gap_256.sbb_in1k" and cfg["num_classes"] == 1000
    assert cfg["input_size"] == (3, 256, 256) and cfg["crop_pct"] == 0.95 and cfg["mean"] == (0.5, 0.5, 0.5)
    assert cfg["interpolation"] == "bicubic"


@pytest.mark.parity
@pytest.mark.parametrize("fused", [True, False])
def test_the_dwee_preset_equals_timms_diff_vit(fused: bool) -> None:
    """``tests/fixtures/timm_vit_diff.safetensors`` (make_fixtures_diff.py: timm 1.0.31's VisionTransformer with
    ``attn_layer='diff'`` as ``vit_dwee`` builds it, reduced to 3 blocks, perturbed weights): the preset with the
    same sizes loads timm's keys as they are and gives its features, pooled features and logits (1e-5 relative),
    on the fused and the explicit attention path."""
    state, t, cfg = load_fixture("timm_vit_diff")
    assert cfg["attn_layer"] == "diff" and cfg["depth"] == 3
    sizes = {k: cfg[k] for k in ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio",
                                 "num_classes")}
    model = create_model("vit_dwee_patch16_reg1_gap_256", **sizes).eval()
    assert_loads(model, state, "vit_attention")
    diffs = [m for m in model.modules() if isinstance(m, DifferentialAttention)]
    assert all(abs(m.lambda_full().item() - m.lambda_init) > 1e-3 for m in diffs)  # the learned part matters
    assert_fixture_parity(model, t, fused=fused)


# timm 1.0.31 results/benchmark-infer-amp-nchw-pt291-cu128-4090.csv, infer_gmacs at 256 px. Its counter (fvcore)
# saw timm's explicit path: the activation counts (infer_macts 17.6 M for vit_dwee vs 13.9 M for vit_wee) are
# vit_wee's plus one more [nh, N, N] map per block, and the GMACs equal the plain models' (one A·V per head).
TIMM_TABLE_GMACS = {"vit_dwee_patch16_reg1_gap_256": 3.83, "vit_dlittle_patch16_reg1_gap_256": 6.27,
                    "vit_dpwee_patch16_reg1_gap_256": 4.37}


@pytest.mark.parametrize("name", sorted(TIMM_TABLE_GMACS))
def test_the_explicit_count_is_timms_table_and_the_fused_kernel_adds_two_maps_times_the_value(name: str) -> None:
    """On the explicit path (the maps subtracted, then one A·V) the analytic count rounds to timm's published
    GMACs; the fused kernel (both maps times the ``2·hd``-wide value, q and k zero-padded to it) adds exactly
    ``2·N²·C`` per block (``N`` = 256 patches + 1 register): the 4.31 GMACs the default runtime reports for
    ``vit_dwee``."""
    from vit_attention.analysis import flops
    from vit_attention.functional import switched

    with torch.device("meta"):
        model = create_model(name).eval()
    fused = flops(model, (1, 3, 256, 256)).total
    with switched(model, fused_attention=False):
        explicit = flops(model, (1, 3, 256, 256)).total
    assert round(explicit / 1e9, 2) == TIMM_TABLE_GMACS[name]
    N, C, depth = 257, model.embed_dim, len(model.blocks)
    assert fused - explicit == depth * 2 * N * N * C


def test_dpwee_has_timms_parameter_count_and_parallel_scaling_blocks() -> None:
    """timm 1.0.31 ``timm.create_model("vit_dpwee_patch16_reg1_gap_256")`` on the meta device: 15,252,456
    parameters; 16 parallel-scaling blocks (one LayerScale and one output bias over both branches)."""
    from vit_attention.layers.parallel_scaling import ParallelScalingBlock

    with torch.device("meta"):
        model = create_model("vit_dpwee_patch16_reg1_gap_256")
    assert sum(p.numel() for p in model.parameters()) == 15_252_456
    assert len(model.blocks) == 16 and all(isinstance(b, ParallelScalingBlock) for b in model.blocks)
    assert model.blocks[0].attn.proj.bias is None and model.blocks[0].mlp.fc2.bias is not None
    assert [b.attn.depth_index for b in model.blocks] == list(range(16))
    assert DEFAULT_TAGS["vit_dpwee_patch16_reg1_gap_256"] == "sbb_nadamuon_in1k"
    assert PRETRAINED_CFGS["vit_dpwee_patch16_reg1_gap_256.sbb_in1k"]["crop_pct"] == 0.95


@pytest.mark.parity
@pytest.mark.parametrize("fused", [True, False])
def test_the_dpwee_preset_equals_timms_diff_parallel_scaling_vit(fused: bool) -> None:
    """``tests/fixtures/timm_vit_dpwee.safetensors`` (make_fixtures_diff.py: timm 1.0.31's VisionTransformer with
    ``block_fn=DiffParallelScalingBlock`` as ``vit_dpwee`` builds it, reduced to 3 blocks, perturbed weights): the
    preset with the same sizes loads timm's fused ``in_proj`` / ``out_proj`` keys (converted) and gives its
    features, pooled features and logits (1e-5 relative), on the fused and the explicit attention path."""
    state, t, cfg = load_fixture("timm_vit_dpwee")
    assert cfg["block_fn"] == "DiffParallelScalingBlock" and cfg["depth"] == 3
    sizes = {k: cfg[k] for k in ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio",
                                 "num_classes")}
    model = create_model("vit_dpwee_patch16_reg1_gap_256", **sizes).eval()
    assert_loads(model, state, "timm_parallel_scaling")
    diffs = [m for m in model.modules() if isinstance(m, DifferentialAttention)]
    assert len(diffs) == 3 and all(abs(m.lambda_full().item() - m.lambda_init) > 1e-3 for m in diffs)
    assert_fixture_parity(model, t, fused=fused)


def test_the_parallel_scaling_block_sums_the_branches_under_one_layer_scale() -> None:
    """``x + ls(attn(norm1(x)) + mlp(norm1(x)))``, the attention without its own output bias (any mechanism)."""
    from vit_attention.layers.parallel_scaling import ParallelScalingBlock

    torch.manual_seed(0)
    blk = ParallelScalingBlock(32, 2, init_values=0.5, attn_layer="mhsa").eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        y = blk.norm1(x)
        want = x + blk.ls.gamma * (blk.attn(y) + blk.mlp(y))
        torch.testing.assert_close(blk(x), want)
    assert blk.attn.proj.bias is None and {n.split(".")[0] for n, _ in blk.named_parameters()} == {
        "norm1", "attn", "mlp", "ls"}
    with pytest.raises(ValueError, match="proj_bias and mlp_bias must agree"):
        ParallelScalingBlock(32, 2, proj_bias=False)
    with pytest.raises(ValueError, match="context"):
        blk(x, context=x)


def test_the_fused_layout_converter_splits_by_the_block_sizes_and_refuses_other_shapes() -> None:
    """``in_proj`` rows ``[fc1 | q | k | v]`` and ``out_proj`` columns ``[attn | mlp]`` (C = 4, H = 6 here); an
    ``out_proj`` that is not ``[C, C + H]`` raises, naming the block and both shapes."""
    from vit_attention.weights.parallel_scaling import from_timm_parallel_scaling, is_timm_parallel_scaling

    w_in, b_in, w_out = torch.randn(18, 4), torch.randn(18), torch.randn(4, 10)
    state = {"blocks.0.in_proj.weight": w_in, "blocks.0.in_proj.bias": b_in, "blocks.0.out_proj.weight": w_out,
             "blocks.0.out_proj.bias": torch.randn(4), "blocks.0.lambda_q1": torch.randn(2),
             "blocks.0.in_norm.weight": torch.randn(4), "blocks.0.ls.gamma": torch.randn(4)}
    assert is_timm_parallel_scaling(state)
    out = from_timm_parallel_scaling(dict(state), torch.nn.Identity())
    blk = "blocks.0"
    assert torch.equal(out[f"{blk}.mlp.fc1.weight"], w_in[:6]) and torch.equal(out[f"{blk}.attn.qkv.weight"], w_in[6:])
    assert torch.equal(out[f"{blk}.mlp.fc1.bias"], b_in[:6]) and torch.equal(out[f"{blk}.attn.qkv.bias"], b_in[6:])
    assert torch.equal(out["blocks.0.attn.proj.weight"], w_out[:, :4])
    assert torch.equal(out["blocks.0.mlp.fc2.weight"], w_out[:, 4:])
    assert {"blocks.0.attn.lambda_q1", "blocks.0.norm1.weight", "blocks.0.ls.gamma", "blocks.0.mlp.fc2.bias"} < set(out)
    with pytest.raises(ValueError, match=r"blocks\.0: in_proj\.weight \(18, 4\) and out_proj\.weight \(4, 9\)"):
        from_timm_parallel_scaling({**state, "blocks.0.out_proj.weight": torch.randn(4, 9)}, torch.nn.Identity())


def test_dpwee_merges_tokens_after_each_block_and_trains_with_drop_path() -> None:
    """Token merging (both branches read one norm, so the merge follows the block) and stochastic depth on the
    sum of the branches, on the reduced preset."""
    torch.manual_seed(0)
    model = create_model("vit_dpwee_patch16_reg1_gap_256", img_size=64, embed_dim=32, num_heads=2, depth=2,
                         num_classes=5, drop_path_rate=0.5).eval()
    x = torch.randn(2, 3, 64, 64)
    seen: list[int] = []
    model.blocks[1].register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    with torch.no_grad():
        full = model.forward_features(x)  # [B, 1 + 16, C]
        model.set_token_merging(3)
        merged = model.forward_features(x)  # back in image space
    assert seen == [17, 14]  # block 0 merged 3 tokens before block 1 read them
    assert merged.shape == full.shape and not torch.allclose(merged, full)
    model.set_token_merging(0)
    model.train()
    model(x).sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if n.startswith("blocks.1.ls"))
