import pytest
import torch
from torch import nn

from vit_attention.attention import AttentionCall
from vit_attention.layers import (
    Block,
    ConvStemPatchEmbed,
    DropPath,
    LayerScale,
    Mlp,
    PatchEmbed,
    PosConv,
    drop_path,
)


def test_patch_embed_shapes_and_conv_equivalence():
    pe = PatchEmbed(32, 8, 3, 16)
    x = torch.randn(2, 3, 32, 32)
    y = pe(x)
    assert y.shape == (2, 16, 16) and pe.grid_size == (4, 4)
    # token (row 1, col 2) is the projection of that 8x8 patch
    patch = x[:, :, 8:16, 16:24].reshape(2, -1)
    expected = patch @ pe.proj.weight.reshape(16, -1).T + pe.proj.bias
    torch.testing.assert_close(y[:, 1 * 4 + 2], expected, atol=1e-5, rtol=1e-5)
    assert PatchEmbed(32, 8, 3, 16, flatten=False)(x).shape == (2, 4, 4, 16)


def test_patch_embed_errors_name_what_was_expected():
    pe = PatchEmbed(32, 8, 3, 16)
    with pytest.raises(ValueError, match="expected 3 input channels"):
        pe(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match=r"expected image size \(32, 32\), got \(40, 40\)"):
        pe(torch.randn(1, 3, 40, 40))
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        PatchEmbed(30, 8, 3, 16)
    loose = PatchEmbed(32, 8, 3, 16, strict_img_size=False)
    assert loose(torch.randn(1, 3, 40, 48)).shape == (1, 30, 16)
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        loose(torch.randn(1, 3, 36, 40))
    padded = PatchEmbed(32, 8, 3, 16, strict_img_size=False, dynamic_img_pad=True)
    assert padded(torch.randn(1, 3, 36, 40)).shape == (1, 25, 16)


def test_conv_stem():
    stem = ConvStemPatchEmbed(32, 16, 3, 24, stem_chs=(4, 8, 8, 16))
    assert stem(torch.randn(2, 3, 32, 32)).shape == (2, 4, 24)
    with pytest.raises(ValueError, match="gives patch 8"):
        ConvStemPatchEmbed(32, 16, 3, 24, stem_chs=(4, 8, 8))


def test_mlp_widths():
    # the study notes' MLP fed fc2 with the input width; ours maps hidden -> out
    mlp = Mlp(8, 32, 5)
    assert mlp.fc1.weight.shape == (32, 8) and mlp.fc2.weight.shape == (5, 32)
    assert mlp(torch.randn(3, 4, 8)).shape == (3, 4, 5)


@pytest.mark.parametrize("act", [nn.GELU, nn.Tanh])  # fusable on CPU, and not
@pytest.mark.parametrize("hooked", ["fc1", "act", "fc2", "drop1", "drop2", None])
def test_mlp_inference_paths_equal_the_modules_in_order_and_honour_hooks(act, hooked):
    # inference skips the identity dropouts and may fuse fc1 + act and fc2 + residual; a forward hook on any
    # submodule sends it through every module call, so the hook sees what it always saw
    torch.manual_seed(0)
    mlp = Mlp(8, 16, 8, act_layer=act, drop=0.1).eval()
    x, r = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    seen = []
    if hooked:
        getattr(mlp, hooked).register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        want = mlp.fc2(mlp.act(mlp.fc1(x)))  # the dropouts are the identity in eval
        seen.clear()
        torch.testing.assert_close(mlp(x), want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(mlp(x, residual=r), r + want, atol=1e-6, rtol=1e-5)
    assert len(seen) == (2 if hooked else 0)
    mlp.train()
    with torch.no_grad():  # training: dropout active
        assert not torch.allclose(mlp(x), want)


def test_drop_path_statistics_and_eval_identity():
    x = torch.ones(4000, 3)
    y = drop_path(x, 0.25, training=True)
    kept = (y[:, 0] != 0).float().mean()
    assert 0.70 < kept < 0.80
    torch.testing.assert_close(y.mean(), torch.tensor(1.0), atol=0.05, rtol=0)
    assert torch.equal(drop_path(x, 0.25, training=False), x)
    assert (y == 0).all(dim=1).eq((y == 0).any(dim=1)).all()  # whole samples dropped
    with pytest.raises(ValueError):
        DropPath(1.0)


def test_layer_scale():
    ls = LayerScale(4, 0.1)
    torch.testing.assert_close(ls(torch.ones(2, 4)), torch.full((2, 4), 0.1))


@pytest.mark.parametrize("style", ["pre", "post", "res_post", "parallel"])
def test_blocks_shape_and_residual_structure(style):
    blk = Block(32, 4, style=style, init_values=1e-5).eval()
    x = torch.randn(2, 9, 32)
    y = blk(x)
    assert y.shape == x.shape
    if style != "post":  # tiny LayerScale: residual blocks start near the identity
        assert (y - x).abs().max() < 1e-2


def test_parallel_block_formula():
    blk = Block(16, 2, style="parallel").eval()
    assert isinstance(blk.norm2, nn.Identity)  # one norm feeds both branches
    x = torch.randn(2, 5, 16)
    y = blk.norm1(x)
    torch.testing.assert_close(blk(x), x + blk.attn(y) + blk.mlp(y))


def test_post_norm_formula():
    blk = Block(16, 2, style="post").eval()
    x = torch.randn(2, 5, 16)
    h = blk.norm1(x + blk.attn(x))
    torch.testing.assert_close(blk(x), blk.norm2(h + blk.mlp(h)))


def test_res_post_norm_formula_on_a_map():
    blk = Block(16, 2, style="res_post", attn_layer="window", attn_kwargs=dict(window_size=2)).eval()
    x = torch.randn(2, 4, 6, 16)  # [B, H, W, C]
    h = x + blk.norm1(blk.attn(x))
    torch.testing.assert_close(blk(x), h + blk.norm2(blk.mlp(h)))


def test_pre_norm_fast_path_equals_the_plain_formula():
    for kw, x in ((dict(), torch.randn(2, 5, 16)), (dict(attn_layer="window", attn_kwargs=dict(window_size=2)),
                                                   torch.randn(2, 4, 4, 16))):
        blk = Block(16, 2, **kw).eval()
        with torch.no_grad():
            h = x + blk.attn(blk.norm1(x))
            torch.testing.assert_close(blk(x), h + blk.mlp(blk.norm2(h)), rtol=1e-5, atol=1e-5)


def test_layer_scale_block_at_inference_equals_the_training_formula():
    """Eval folds ``x + gamma * branch`` into one addcmul: the same numbers as the train-mode ops."""
    torch.manual_seed(0)
    blk = Block(16, 2, init_values=0.5)
    with torch.no_grad():
        blk.ls1.gamma.uniform_(-1, 1)
        blk.ls2.gamma.uniform_(-1, 1)
        x = torch.randn(2, 5, 16)
        train = blk.train()(x)
        h = x + blk.ls1(blk.attn(blk.norm1(x)))
        torch.testing.assert_close(train, h + blk.ls2(blk.mlp(blk.norm2(h))))
        torch.testing.assert_close(blk.eval()(x), train, rtol=1e-6, atol=1e-6)


def test_block_with_context_is_the_class_attention_block():
    """``blk(x_cls, context=x)``: queries x_cls, keys / values norm1([x_cls; x]); the MLP updates x_cls alone."""
    blk = Block(16, 2, attn_layer="class_attn", init_values=0.3).eval()
    cls, x = torch.randn(2, 1, 16), torch.randn(2, 6, 16)
    x0 = x.clone()
    with torch.no_grad():
        u = blk.norm1(torch.cat([cls, x], dim=1))
        h = cls + blk.ls1(blk.attn(u[:, :1], AttentionCall(context=u)))
        want = h + blk.ls2(blk.mlp(blk.norm2(h)))
        out = blk(cls, context=x)
    assert out.shape == (2, 1, 16)
    torch.testing.assert_close(out, want)
    assert torch.equal(x, x0)  # the context is read, never written
    with pytest.raises(ValueError, match="pre-norm"):
        Block(16, 2, style="post", attn_layer="class_attn")(cls, context=x)
    with pytest.raises(ValueError, match="context must be tokens"):
        blk(cls, context=torch.randn(3, 6, 16))


def test_block_takes_tokens_or_maps_for_any_mechanism_layout():
    tok = Block(16, 2).eval()  # token mechanism on a map: flattened and back
    x = torch.randn(2, 3, 4, 16)
    with torch.no_grad():
        torch.testing.assert_close(tok(x), tok(x.flatten(1, 2)).view_as(x))
    win = Block(16, 2, attn_layer="window", attn_kwargs=dict(window_size=2)).eval()  # spatial on tokens
    t = torch.randn(2, 1 + 12, 16)
    with torch.no_grad():
        y = win(t, (3, 4), 1)
        torch.testing.assert_close(y[:, 1:], win(t[:, 1:].reshape(2, 3, 4, 16)).flatten(1, 2))


def test_block_keywords_reach_only_mechanisms_that_take_them():
    assert Block(16, 2, qk_norm=True).attn.q_norm is not None
    win = Block(16, 2, attn_layer="window", proj_bias=True, qk_norm=False)  # defaults: silently not given
    assert win.attn.qkv.bias is not None
    with pytest.raises(ValueError, match="attn_layer 'window' does not take qk_norm"):
        Block(16, 2, attn_layer="window", qk_norm=True)
    with pytest.raises(ValueError, match="style must be one of"):
        Block(16, 2, style="sandwich")


def test_pos_conv_on_tokens_and_maps():
    pe = PosConv(8)
    x = torch.randn(2, 3, 4, 8)
    y = pe(x)
    assert y.shape == x.shape
    t = torch.cat([torch.randn(2, 1, 8), x.flatten(1, 2)], dim=1)
    out = pe(t, (3, 4), 1)
    torch.testing.assert_close(out[:, 0], t[:, 0])  # prefix tokens unchanged
    torch.testing.assert_close(out[:, 1:], y.flatten(1, 2))
    blk = Block(8, 2, pos_layer=PosConv).eval()
    assert blk(t, (3, 4), 1).shape == t.shape and "pos.proj.weight" in blk.state_dict()
    with pytest.raises(ValueError, match="feat_size"):
        pe(t)


def test_block_mlp_layer_is_any_module_with_the_mlp_constructor():
    class Gated(nn.Module):  # no residual fast path: the block adds the residual itself
        def __init__(self, dim, hidden, *, act_layer, bias, drop):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(dim, 2 * hidden, bias=bias), nn.Linear(hidden, dim, bias=bias)

        def forward(self, x):
            a, b = self.fc1(x).chunk(2, dim=-1)
            return self.fc2(a * torch.sigmoid(b))

    blk = Block(16, 2, mlp_layer=Gated, mlp_ratio=2.0).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        h = x + blk.attn(blk.norm1(x))
        torch.testing.assert_close(blk(x), h + blk.mlp(blk.norm2(h)), rtol=1e-5, atol=1e-5)
    assert blk.mlp.fc2.in_features == 32


def test_a_kwargs_constructor_gets_every_offered_keyword():
    from vit_attention.attention import register_attention
    from vit_attention.attention.base import AttentionModule
    from vit_attention.attention.registry import _ATTENTION

    @register_attention("_test_any_kwargs", layout="tokens")
    class AnyKwargs(AttentionModule):
        """Identity on tokens ``[B, N, C]`` recording its keywords."""

        def __init__(self, dim, num_heads, **kwargs):
            super().__init__()
            self.kwargs = kwargs

        def forward(self, x, call=AttentionCall()):
            return x * 0

    try:
        blk = Block(8, 2, attn_layer="_test_any_kwargs", qk_norm=True)
        assert blk.attn.kwargs["qk_norm"] is True and "proj_drop" in blk.attn.kwargs
    finally:
        _ATTENTION.pop("_test_any_kwargs")


def test_glu_mlps_compute_their_formulas_and_fuse_the_residual():
    """GluMlp: fc2(act(gate) · up) with the gate the FIRST half of fc1 (DINOv2 w12, EVA-02, timm gate_last=False);
    an odd width rounds down to even as timm sizes it. SwiGLU: fc2(norm(act(fc1_g x) · fc1_x x)). In eval the
    residual add fused into fc2 gives the same numbers as adding it after."""
    from vit_attention.layers import GluMlp, SwiGLU

    torch.manual_seed(0)
    x, r = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    glu = GluMlp(16, 21).eval()  # 21 -> fc1 20 outputs, two halves of 10
    assert (glu.fc1.out_features, glu.fc2.in_features) == (20, 10)
    g, u = (x @ glu.fc1.weight.T + glu.fc1.bias).split(10, dim=-1)
    want = (torch.nn.functional.silu(g) * u) @ glu.fc2.weight.T + glu.fc2.bias
    with torch.no_grad():
        torch.testing.assert_close(glu(x), want)
        torch.testing.assert_close(glu(x, residual=r), r + want)
        swapped = (torch.nn.functional.silu(u) * g) @ glu.fc2.weight.T + glu.fc2.bias
        assert not torch.allclose(glu(x), swapped, atol=1e-3)  # the gate half matters
    sw = SwiGLU(16, 12, norm_layer=torch.nn.LayerNorm).eval()
    h = torch.nn.functional.silu(x @ sw.fc1_g.weight.T + sw.fc1_g.bias) * (x @ sw.fc1_x.weight.T + sw.fc1_x.bias)
    want = torch.nn.functional.layer_norm(h, (12,), sw.norm.weight, sw.norm.bias) @ sw.fc2.weight.T + sw.fc2.bias
    with torch.no_grad():
        torch.testing.assert_close(sw(x), want)
        torch.testing.assert_close(sw(x, residual=r), r + want)
    assert isinstance(SwiGLU(16, 12).norm, torch.nn.Identity)
    with pytest.raises(ValueError, match="at least 2"):
        GluMlp(16, 1)
