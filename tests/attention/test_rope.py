"""RotaryEmbedding as a module and inside MultiHeadSelfAttention (rope=, rope_kwargs=, qkv_bias='qv')."""

import pytest
import torch
import torch.nn.functional as F

from vit_attention.attention import AttentionCall, create_attention
from vit_attention.attention.mhsa import MultiHeadSelfAttention
from vit_attention.attention.rope import ROPE_CONVENTIONS, RotaryEmbedding, make_rope
from vit_attention.functional.rope import TWO_PI

DIM, HEADS = 32, 2
HD = DIM // HEADS


def test_conventions_are_the_published_rules():
    assert ROPE_CONVENTIONS["dinov3"] == dict(theta=100.0, scale=TWO_PI, coords="centered", layout="half", axes="yx")
    assert ROPE_CONVENTIONS["eva"] == dict(theta=10000.0, scale=1.0, coords="ref", layout="interleaved", axes="yx")
    assert ROPE_CONVENTIONS["naver"] == dict(theta=100.0, scale=1.0, coords="index", layout="interleaved", axes="xy")
    r = RotaryEmbedding(HD, HEADS)
    assert (r.convention, r.layout, r.coords) == ("dinov3", "half", "centered")
    m = RotaryEmbedding(HD, HEADS, "mixed")
    assert (m.theta, m.coords, m.layout, m.axes) == (10.0, "index", "interleaved", "xy")
    over = RotaryEmbedding(HD, HEADS, convention="naver", theta=10000.0, axes="yx")
    assert (over.theta, over.axes, over.layout) == (10000.0, "yx", "interleaved")
    assert "convention='naver'" in repr(over) and "theta=10000" in repr(over)


@pytest.mark.parametrize("kwargs,match", [
    (dict(kind="spiral"), "rope must be one of"),
    (dict(head_dim=18), "divisible by 4"),
    (dict(convention="rope2d"), "convention must be one of"),
    (dict(kind="mixed", convention="naver"), "rope='axial' only"),
    (dict(convention="eva"), "ref_feat_shape"),
    (dict(coords="pixel"), "coords must be one of"),
    (dict(layout="complex"), "layout must be one of"),
    (dict(axes="zx"), "axes must be"),
    (dict(theta=-1.0), "theta must be a positive"),
])
def test_bad_options_raise(kwargs, match):
    kw = {"head_dim": HD, "num_heads": HEADS, **kwargs}
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(**kw)


def test_make_rope():
    assert make_rope(None, None, HD, HEADS) is None
    assert isinstance(make_rope("axial", {"convention": "naver"}, HD, HEADS), RotaryEmbedding)
    with pytest.raises(ValueError, match="without rope"):
        make_rope(None, {"theta": 10.0}, HD, HEADS)
    with pytest.raises(ValueError, match="rope must be one of"):
        make_rope(True, None, HD, HEADS)


def test_mixed_init_follows_the_paper():
    """Magnitudes theta^(-4i/hd) in each half; the second half turns pi/2 from the first; one angle per head."""
    torch.manual_seed(0)
    m = RotaryEmbedding(HD, HEADS, "mixed")
    fx, fy = m.freqs.detach()
    mag = 10.0 ** (-torch.arange(HD // 4) * 4 / HD)
    nb = HD // 4
    torch.testing.assert_close(torch.hypot(fx, fy), torch.cat([mag, mag]).expand(HEADS, -1))
    phi = torch.atan2(fy[:, :nb], fx[:, :nb])  # the same direction for every pair of a head
    torch.testing.assert_close(phi, phi[:, :1].expand(-1, nb))
    torch.testing.assert_close(fx[:, nb:], -fy[:, :nb])  # cos(phi + pi/2) = -sin(phi)
    assert not torch.allclose(phi[0, 0], phi[1, 0])


# ------------------------------------------------------------------ inside MHSA
def _manual(attn: MultiHeadSelfAttention, x: torch.Tensor, feat_size, npt: int) -> torch.Tensor:
    """The rule of EVA-02 / DINOv3 / RoPE-ViT (timm 1.0.31 ``EvaAttention`` / ``AttentionRope``), written out."""
    B, N, C = x.shape
    bias = attn.qkv.bias
    if attn.q_bias is not None:
        bias = torch.cat([attn.q_bias, torch.zeros_like(attn.q_bias), attn.v_bias])
    qkv = F.linear(x, attn.qkv.weight, bias).reshape(B, N, 3, HEADS, HD).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    cos, sin = attn.rope.tables(feat_size)
    lay = attn.rope.layout

    def rot(t):
        g = t[:, :, npt:]
        if lay == "half":
            r = torch.cat([-g[..., HD // 2:], g[..., :HD // 2]], -1)
        else:
            r = torch.stack([-g[..., 1::2], g[..., ::2]], -1).flatten(-2)
        return torch.cat([t[:, :, :npt], g * cos + r * sin], 2)

    a = (rot(q) @ rot(k).transpose(-1, -2) * HD ** -0.5).softmax(-1)
    return attn.proj((a @ v).transpose(1, 2).reshape(B, N, C))


@pytest.mark.parametrize("rope,kw", [("axial", {}), ("axial", {"convention": "naver"}), ("mixed", {})])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("qkv_bias", [True, "qv"])
def test_mhsa_with_rope_equals_the_rule(rope, kw, qk_norm, qkv_bias):
    torch.manual_seed(0)
    attn = MultiHeadSelfAttention(DIM, HEADS, rope=rope, rope_kwargs=kw, qk_norm=qk_norm, qkv_bias=qkv_bias).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.2 * torch.randn_like(p))
        x = torch.randn(2, 2 + 12, DIM)
        out = attn(x, AttentionCall(feat_size=(3, 4), num_prefix_tokens=2))
        torch.testing.assert_close(out, _manual(attn, x, (3, 4), 2), rtol=1e-5, atol=1e-5)
        plain = MultiHeadSelfAttention(DIM, HEADS, qk_norm=qk_norm, qkv_bias=qkv_bias).eval()
        plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("rope.")})
        assert (plain(x) - out).abs().max() > 1e-3  # the rotation changes the output


def test_rope_state_dict_keys():
    assert not [k for k in MultiHeadSelfAttention(DIM, HEADS, rope="axial").state_dict() if "rope" in k]
    mixed = MultiHeadSelfAttention(DIM, HEADS, rope="mixed").state_dict()
    assert mixed["rope.freqs"].shape == (2, HEADS, HD // 2)


def test_qv_bias_layout():
    attn = MultiHeadSelfAttention(DIM, HEADS, qkv_bias="qv")
    sd = attn.state_dict()
    assert set(sd) == {"qkv.weight", "q_bias", "v_bias", "proj.weight", "proj.bias"}
    with torch.no_grad():
        attn.q_bias.normal_()
        attn.v_bias.normal_()
    ref = MultiHeadSelfAttention(DIM, HEADS, qkv_bias=True)
    ref.load_state_dict({"qkv.weight": sd["qkv.weight"], "proj.weight": sd["proj.weight"],
                         "proj.bias": sd["proj.bias"],
                         "qkv.bias": torch.cat([attn.q_bias, torch.zeros(DIM), attn.v_bias]).detach()})
    x = torch.randn(2, 9, DIM)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), ref(x))
        ctx = torch.randn(2, 5, DIM)
        torch.testing.assert_close(attn(x, AttentionCall(context=ctx)), ref(x, AttentionCall(context=ctx)))
    with pytest.raises(ValueError, match="qkv_bias must be"):
        MultiHeadSelfAttention(DIM, HEADS, qkv_bias="qk")


def test_create_attention_with_rope_and_its_cost():
    attn = create_attention("mhsa", DIM, HEADS, rope="mixed")
    assert isinstance(attn.rope, RotaryEmbedding) and attn.rope.kind == "mixed"
    x = torch.randn(1, 1 + 16, DIM)
    assert attn(x, AttentionCall(feat_size=(4, 4), num_prefix_tokens=1)).shape == x.shape
    plain = create_attention("mhsa", DIM, HEADS)
    assert attn.flops((1, 17, DIM)) - plain.flops((1, 17, DIM)) == 2 * 2 * 17 * DIM
    with pytest.raises(ValueError, match="takes no context"):
        attn(x, AttentionCall(context=torch.randn(1, 4, DIM)))


def test_rope_in_a_block_gets_the_grid_from_the_model():
    """A ViT preset with rope: the grid and prefix count reach every block's attention (any aspect)."""
    from vit_attention import create_model

    torch.manual_seed(0)
    m = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                     rope="axial", dynamic_img_size=True, reg_tokens=2).eval()
    assert all(isinstance(b.attn.rope, RotaryEmbedding) for b in m.blocks)
    with torch.no_grad():
        assert m(torch.randn(1, 3, 24, 40)).shape == (1, 1000)


@pytest.mark.compile
@pytest.mark.parametrize("kw", [dict(kind="axial", coords="index"), dict(kind="axial", coords="centered"),
                                dict(kind="axial", coords="ref", ref_feat_shape=(4, 4)), dict(kind="mixed")])
def test_batch_tables_give_each_sample_its_own_grids_tables_without_a_host_read(kw):
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 2, **kw)
    grids = [(3, 5), (4, 2), (1, 1)]
    L = 16
    coords = torch.zeros(3, L, 2, dtype=torch.long)
    valid = torch.zeros(3, L, dtype=torch.bool)
    for b, (h, w) in enumerate(grids):  # each image's tokens, shuffled, then padding
        yx = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2)
        order = torch.randperm(h * w)
        coords[b, :h * w], valid[b, :h * w] = yx[order], True
        coords[b, h * w:] = 7  # padding rows hold anything
    cos, sin = rope.batch_tables(coords, valid)
    lead = 1 if kw["kind"] == "axial" else 2
    assert cos.shape == sin.shape == (3, lead, L, 16)
    for b, (h, w) in enumerate(grids):  # the oracle: the sample's own grid table, gathered
        tc, ts = rope.tables((h, w))
        flat = coords[b, :h * w, 0] * w + coords[b, :h * w, 1]
        torch.testing.assert_close(cos[b][:, :h * w], tc.reshape(-1, h * w, 16)[:, flat], atol=1e-6, rtol=0)
        torch.testing.assert_close(sin[b][:, :h * w], ts.reshape(-1, h * w, 16)[:, flat], atol=1e-6, rtol=0)
        assert (cos[b][:, h * w:] == 1).all() and (sin[b][:, h * w:] == 0).all()
    explained = torch._dynamo.explain(rope.batch_tables)(coords, valid)  # grids stay on the device: one graph
    assert explained.graph_break_count == 0 and explained.graph_count == 1
