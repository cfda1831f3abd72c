import pytest
import torch
from torch import nn

from vit_attention.attention import AttentionCall, MultiHeadAttention, MultiHeadSelfAttention
from vit_attention.functional import switched


def _pair(E=16, nh=4, kdim=None, vdim=None, bias=True):
    ref = nn.MultiheadAttention(E, nh, kdim=kdim, vdim=vdim, bias=bias, batch_first=True).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = MultiHeadAttention(E, nh, kdim=kdim, vdim=vdim, bias=bias).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("kv", [(None, None), (12, 20)])
def test_matches_nn_multihead_attention(kv):
    kdim, vdim = kv
    ref, ours = _pair(kdim=kdim, vdim=vdim)
    q = torch.randn(2, 5, 16)
    k = torch.randn(2, 7, kdim or 16)
    v = torch.randn(2, 7, vdim or 16)
    out_ref, w_ref = ref(q, k, v, need_weights=True)
    out, w = ours(q, k, v, need_weights=True)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
    out_nw, w_none = ours(q, k, v)
    assert w_none is None
    torch.testing.assert_close(out_nw, out_ref, atol=1e-5, rtol=1e-5)


def test_masks_follow_nn_conventions():
    ref, ours = _pair()
    q, k = torch.randn(2, 5, 16), torch.randn(2, 6, 16)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[0, -2:] = True  # ignore the last two keys of sample 0
    causal = torch.triu(torch.ones(5, 6, dtype=torch.bool), diagonal=1)
    out_ref, w_ref = ref(q, k, k, key_padding_mask=kpm, attn_mask=causal, need_weights=True,
                         average_attn_weights=False)
    out, w = ours(q, k, k, key_padding_mask=kpm, attn_mask=causal, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
    float_mask = torch.randn(2 * 4, 5, 6)
    out_ref, _ = ref(q, k, k, key_padding_mask=kpm, attn_mask=float_mask)
    out, _ = ours(q, k, k, key_padding_mask=kpm, attn_mask=float_mask)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)


def test_self_attention_call_and_mask_shape_errors():
    _, ours = _pair()
    x = torch.randn(2, 5, 16)
    assert ours(x).shape == (2, 5, 16)
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        ours(x, x, x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask must be"):
        ours(x, x, x, attn_mask=torch.zeros(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="kdim"):
        ours(x, torch.randn(2, 5, 9), torch.randn(2, 5, 16))


def test_mhsa_qk_norm_and_scale():
    attn = MultiHeadSelfAttention(32, 4, qk_norm=True, qk_scale=0.5).eval()
    x = torch.randn(2, 6, 32)
    y = attn(x)
    with switched(attn, fused_attention=False):
        torch.testing.assert_close(attn(x), y, atol=1e-5, rtol=1e-5)
    assert isinstance(attn.q_norm, nn.LayerNorm) and attn.scale == 0.5
    with pytest.raises(ValueError, match="expected tokens"):
        attn(torch.randn(2, 6, 16))
    with pytest.raises(ValueError, match="attn_drop"):
        MultiHeadSelfAttention(32, 4, attn_drop=1.5)


def test_contract_names_and_torch_aliases_build_the_same_module():
    a = MultiHeadAttention(16, 4, qkv_bias=False, proj_bias=False, attn_drop=0.1)
    b = MultiHeadAttention(embed_dim=16, num_heads=4, bias=False, dropout=0.1)
    assert a.dim == a.embed_dim == b.dim == 16 and a.attn_drop == b.attn_drop == b.dropout == 0.1
    assert a.q_proj.bias is None and a.out_proj.bias is None and b.q_proj.bias is None and b.out_proj.bias is None
    assert list(a.state_dict()) == list(b.state_dict())
    with pytest.raises(ValueError, match="dim=16 and its alias embed_dim=8 disagree"):
        MultiHeadAttention(16, 4, embed_dim=8)
    with pytest.raises(ValueError, match="attn_drop=0.1 and its alias dropout=0.2 disagree"):
        MultiHeadAttention(16, 4, attn_drop=0.1, dropout=0.2)


def test_context_is_cross_attention():
    _, ours = _pair(kdim=12, vdim=12)
    x, ctx = torch.randn(2, 5, 16), torch.randn(2, 7, 12)
    out = ours(x, AttentionCall(context=ctx))
    assert out.shape == x.shape
    torch.testing.assert_close(out, ours(x, ctx, ctx)[0])
    with pytest.raises(ValueError, match="belong to torch's form"):  # torch's value / masks need torch's key
        ours(x, AttentionCall(context=ctx), ctx)
    with pytest.raises(TypeError, match="context"):  # the old keyword: the call carries it now
        ours(x, context=ctx)


@pytest.mark.parametrize("name", ["mha", "causal"])
def test_the_scale_attribute_is_the_logit_scale_the_forward_uses(name: str) -> None:
    """``module.scale`` (torch's ``hd^-1/2`` by default; attention.transfer reads it) is what the forward applies:
    doubling it equals doubling the query projection."""
    from vit_attention.attention import create_attention

    torch.manual_seed(0)
    m = create_attention(name, 16, 2).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        ref = m(x)
        m.scale = m.scale * 2
        doubled = m(x)
        m.scale = m.scale / 2
        q = m.q_proj if name == "mha" else None
        if q is not None:
            q.weight.mul_(2)
            q.bias.mul_(2)
        else:
            m.qkv.weight[:16].mul_(2)
            m.qkv.bias[:16].mul_(2)
        torch.testing.assert_close(doubled, m(x))
    assert not torch.allclose(ref, doubled)
