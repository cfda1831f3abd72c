"""Differential attention against a dense implementation written here from the paper's formulas (Ye et al.,
"Differential Transformer", ICLR 2025, arXiv 2410.05258, Eq. 1-3 and Sec. 2.1), and its options and refusals."""

from __future__ import annotations

import math

import pytest
import torch
from fixture_utils import assert_parity, load_fixture

from vit_attention import create_attention
from vit_attention.analysis import record_attention
from vit_attention.analysis.flops import measure_flops
from vit_attention.attention import AttentionCall
from vit_attention.functional import switched
from vit_attention.functional.tome import TokenMergeState


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _dense(x: torch.Tensor, sd: dict[str, torch.Tensor], nh: int, depth_index: int,
           mask: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Per head ``h``: ``[q1 | q2]`` and ``[k1 | k2]`` its two adjacent ``hd``-blocks, ``v`` its ``2hd`` block;
    ``(softmax(q1 k1ᵀ/√hd) − λ softmax(q2 k2ᵀ/√hd)) v`` -> RMSNorm -> ``· (1 − λ_init)`` -> proj."""
    B, N, C = x.shape
    hd = C // nh // 2
    qkv = x @ sd["qkv.weight"].T + sd["qkv.bias"]
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * depth_index)
    lam = (torch.exp((sd["lambda_q1"] * sd["lambda_k1"]).sum()) - torch.exp((sd["lambda_q2"] * sd["lambda_k2"]).sum())
           + lam_init)
    heads = []
    for h in range(nh):
        maps = []
        for part in (0, 1):
            lo = (2 * h + part) * hd
            logits = q[..., lo:lo + hd] @ k[..., lo:lo + hd].transpose(-2, -1) / math.sqrt(hd)  # [B, N, N]
            if bias is not None:
                logits = logits + bias
            if mask is not None:
                logits = logits.masked_fill(~mask[:, h], float("-inf"))
            maps.append(logits.softmax(-1))
        o = (maps[0] - lam * maps[1]) @ v[..., 2 * h * hd:2 * (h + 1) * hd]  # [B, N, 2hd]
        heads.append(_rms(o, sd["sub_norm.weight"], 1e-5) * (1 - lam_init))
    return torch.cat(heads, -1) @ sd["proj.weight"].T + sd["proj.bias"]


def _perturbed(dim: int = 48, nh: int = 3, **kw: object) -> torch.nn.Module:
    attn = create_attention("diff", dim, nh, **kw).double().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    return attn


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("depth_index", [0, 5])
def test_matches_the_dense_formula(fused: bool, depth_index: int) -> None:
    torch.manual_seed(0)
    attn = _perturbed(depth_index=depth_index)
    assert set(attn.state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "sub_norm.weight",
                                      "lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}  # timm DiffAttention's keys
    x = torch.randn(2, 13, 48, dtype=torch.float64)
    with torch.no_grad(), switched(attn, fused_attention=fused):
        out = attn(x)
    torch.testing.assert_close(out, _dense(x, attn.state_dict(), 3, depth_index), rtol=1e-10, atol=1e-10)


def test_lambda_init_follows_the_block_index() -> None:
    """``λ_init(i) = 0.8 − 0.6·exp(−0.3·i)``: 0.2 in block 0, 0.3555 in block 1 (the paper's l − 1)."""
    got = [create_attention("diff", 16, 2, depth_index=i).lambda_init for i in range(14)]
    assert got[0] == pytest.approx(0.2) and got[1] == pytest.approx(0.35551, abs=1e-5)
    assert got[13] == pytest.approx(0.78785, abs=1e-5) and got == sorted(got)
    with pytest.raises(ValueError, match="depth_index must be"):
        create_attention("diff", 16, 2, depth_index=-1)


def test_heads_of_odd_width_are_refused() -> None:
    with pytest.raises(ValueError, match="divisible by num_heads=4 into heads of even width"):
        create_attention("diff", 36, 4)  # dim / num_heads = 9 cannot split into two halves


def test_mask_applies_to_both_maps_of_each_head() -> None:
    torch.manual_seed(1)
    attn = _perturbed()
    x = torch.randn(2, 9, 48, dtype=torch.float64)
    mask = torch.rand(2, 3, 9, 9) > 0.3
    mask[..., 0] = True  # every query may attend somewhere
    for fused in (True, False):
        with torch.no_grad(), switched(attn, fused_attention=fused):
            out = attn(x, AttentionCall(mask=mask))
        torch.testing.assert_close(out, _dense(x, attn.state_dict(), 3, 0, mask=mask), rtol=1e-10, atol=1e-10)


def test_token_merging_adds_log_size_to_both_maps_and_reads_the_keys() -> None:
    torch.manual_seed(2)
    attn = _perturbed()
    x = torch.randn(2, 9, 48, dtype=torch.float64)
    tome = TokenMergeState(x, 0, [0])
    tome.size = torch.rand(2, 9, 1, dtype=torch.float64) * 3 + 1  # as if merged
    with torch.no_grad():
        out = attn(x, AttentionCall(tome=tome))
    bias = tome.size.log().transpose(1, 2)  # [B, 1, N]: log(size) of each key
    torch.testing.assert_close(out, _dense(x, attn.state_dict(), 3, 0, bias=bias), rtol=1e-10, atol=1e-10)
    assert tome.metric is not None and tome.metric.shape == (2, 9, 8)  # keys averaged over the 6 half-heads


def test_context_supplies_keys_and_values() -> None:
    torch.manual_seed(3)
    attn = _perturbed()
    x, ctx = torch.randn(2, 4, 48, dtype=torch.float64), torch.randn(2, 7, 48, dtype=torch.float64)
    with torch.no_grad():
        out = attn(x, AttentionCall(context=ctx))
        full = attn(torch.cat([x, ctx], 1))  # a query's row over [x; ctx]: different keys, so not equal
        # the same as attending over ctx alone when ctx is the sequence itself
        self_ctx = attn(ctx, AttentionCall(context=ctx))
        own = attn(ctx)
    assert out.shape == (2, 4, 48) and not torch.allclose(out, full[:, :4])
    torch.testing.assert_close(self_ctx, own, rtol=1e-10, atol=1e-10)


def test_observers_record_the_two_softmax_maps_of_each_head() -> None:
    torch.manual_seed(4)
    attn = _perturbed().float()
    x = torch.randn(1, 10, 48)
    with record_attention(attn) as rec, torch.no_grad():
        attn(x)
    (r,) = rec.records
    w = r.weights  # [B, 2nh, N, N]
    assert w.shape == (1, 6, 10, 10)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 6, 10))  # probability rows: A1, A2 interleaved
    sd = attn.state_dict()
    q = (x @ sd["qkv.weight"][:48].T + sd["qkv.bias"][:48])[0, :, 16:24]  # head 1's first half (half-head 2)
    k = (x @ sd["qkv.weight"][48:96].T + sd["qkv.bias"][48:96])[0, :, 16:24]
    torch.testing.assert_close(w[0, 2], (q @ k.T / math.sqrt(8)).softmax(-1))  # hd = 48 / 3 / 2


def test_dual_lambda_uses_two_scalars() -> None:
    attn = create_attention("diff", 16, 2, dual_lambda=True, depth_index=2)
    assert {n for n, _ in attn.named_parameters() if n.startswith("lambda")} == {"lambda_a", "lambda_b"}
    assert attn.lambda_full().item() == pytest.approx(attn.lambda_init)  # e^0 − e^0 + λ_init
    with torch.no_grad():
        attn.lambda_a.fill_(0.5)
    assert attn.lambda_full().item() == pytest.approx(math.exp(0.5) - 1 + attn.lambda_init)


@pytest.mark.parametrize(("switches", "maps"), [(dict(fused_attention=True), 4), (dict(fused_attention=False), 2),
                                                (dict(attention_backend="explicit"), 2)])
def test_declared_flops_equal_the_measured_ones(switches: dict[str, object], maps: int) -> None:
    """``4·N·C² + 2·N²·C`` on the explicit path (the maps subtracted before one A·V, as timm's explicit path);
    the fused kernel multiplies both maps by the ``2·hd``-wide value and takes q and k zero-padded: ``+ 2·N²·C``."""
    attn = create_attention("diff", 48, 3)
    for shape in [(2, 13, 48), (1, 50, 48)]:
        B, N, C = shape
        with switched(attn, **switches):
            assert attn.flops(shape) == B * (4 * N * C * C + maps * N * N * C)
            assert attn.flops(shape) == measure_flops(attn, shape, device=None)[0]
            assert attn.flops(shape) == measure_flops(attn, shape)[0]  # on meta


def test_the_explicit_path_multiplies_the_value_once_unless_observed() -> None:
    """Explicit, unobserved: one ``[B, 2nh, N, N] @ [B, 2nh, N, hd]`` product (the difference of each head's maps
    times the halves of its value); observed, the two softmax maps each times the ``2·hd``-wide value (the maps
    the observers record), with the same output."""
    from torch.profiler import profile

    torch.manual_seed(5)
    attn = _perturbed().float()
    x = torch.randn(2, 10, 48)

    def value_products() -> list[list[int]]:  # the shapes of the values the maps multiply
        return [list(e.input_shapes[1]) for e in prof.key_averages(group_by_input_shape=True)
                if e.key in ("aten::matmul", "aten::bmm") and len(e.input_shapes) > 1 and e.input_shapes[0]
                and e.input_shapes[0][-1] == 10 and len(e.input_shapes[1]) >= 3]

    with torch.no_grad(), switched(attn, fused_attention=False):
        with profile(record_shapes=True) as prof:
            out = attn(x)
        plain = value_products()
        with record_attention(attn), profile(record_shapes=True) as prof:
            observed = attn(x)
        seen = value_products()
    assert plain and all(s[-1] == 8 for s in plain)  # hd = 48 / 3 / 2
    assert seen and all(s[-1] == 16 for s in seen)  # 2·hd
    torch.testing.assert_close(out, observed)


def test_the_fused_cpu_kernel_runs_and_holds_no_weights() -> None:
    """torch's CPU SDPA kernel needs one width for q, k and v: q and k are zero-padded to v's, so it runs (the
    math fallback would hold the ``[B, 2nh, N, N]`` weights)."""
    from torch.profiler import profile

    attn = create_attention("diff", 48, 3).eval()
    with torch.no_grad(), profile() as prof:
        attn(torch.randn(1, 64, 48))
    ops = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops


@pytest.mark.parity
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("path", ["fused", "explicit"])
def test_equals_timms_diff_attention(fused: bool, path: str) -> None:
    """``tests/fixtures/timm_diff_attn.safetensors`` (make_fixtures_diff.py): timm 1.0.31's ``DiffAttention`` with
    ``dual_lambda`` at depth 4, perturbed, on its fused and explicit paths, unmasked and under a key mask; its
    state dict loads as it is and gives the same outputs (1e-5 relative) on either of our paths."""
    state, t, cfg = load_fixture("timm_diff_attn")
    attn = create_attention("diff", cfg["dim"], cfg["num_heads"], qkv_bias=cfg["qkv_bias"],
                            depth_index=cfg["depth"], dual_lambda=cfg["dual_lambda"]).eval()
    attn.load_state_dict(state)
    x, keep = t["input"], t["mask"] == 0  # the additive 0 / -inf mask as ours: True = may attend
    with torch.no_grad(), switched(attn, fused_attention=fused):
        assert_parity(attn(x), t[f"output.{path}"])
        assert_parity(attn(x, AttentionCall(mask=keep)), t[f"output_masked.{path}"])
