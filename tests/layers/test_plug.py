"""The CNN adapter: every registered mechanism plugged into the same small CNN."""

import dataclasses

import pytest
import torch
from torch import nn

import vit_attention as va
from vit_attention import list_attention
from vit_attention.attention import AttentionCall, get_attention_spec

DIM, HEADS = 16, 4


def _cnn(mid: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, DIM, 3, padding=1), nn.GELU(), mid,
                         nn.Conv2d(DIM, 8, 3, stride=2, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 3))


@pytest.mark.parametrize("name", list_attention())
@pytest.mark.parametrize("mlp_ratio", [None, 2.0])
def test_every_mechanism_plugs_into_a_cnn(name, mlp_ratio):
    block = va.plug(name, DIM, HEADS, mlp_ratio=mlp_ratio, **get_attention_spec(name).example_kwargs)
    net = _cnn(block)
    x = torch.randn(2, 3, 9, 10)  # odd, non-square: window mechanisms must pad
    y = net(x)
    assert y.shape == (2, 3)
    y.square().sum().backward()
    for n, p in block.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    assert block.attn.__class__ is get_attention_spec(name).cls
    # the attention branch changes the map: the block is not an identity
    fmap = torch.randn(2, DIM, 6, 5)
    assert block(fmap).shape == fmap.shape
    assert not torch.allclose(block(fmap), fmap)


def test_plug_accepts_a_built_module_and_infers_dim():
    attn = va.create_attention("mhsa", DIM, HEADS)
    block = va.plug(attn)
    assert block.dim == DIM and block.layout == "tokens" and block.attn is attn
    assert block(torch.randn(1, DIM, 4, 4)).shape == (1, DIM, 4, 4)


def test_plug_layerscale_starts_near_identity():
    block = va.plug("mhsa", DIM, HEADS, mlp_ratio=4.0, init_values=1e-6)
    x = torch.randn(1, DIM, 5, 5)
    torch.testing.assert_close(block(x), x, atol=1e-4, rtol=0)


def test_plug_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_heads"):
        va.plug("mhsa", DIM)
    with pytest.raises(ValueError, match=r"\[B, 16, H, W\]"):
        va.plug("mhsa", DIM, HEADS)(torch.randn(1, 8, 4, 4))
    with pytest.raises(KeyError, match="unknown attention"):
        va.plug("mhsaa", DIM, HEADS)
    with pytest.raises(TypeError, match="registered name or an nn.Module"):
        va.plug(3, DIM, HEADS)  # type: ignore[arg-type]


def test_readme_example_trains():
    """README example: window attention between two conv stages, a few optimisation steps."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        va.plug("window", 32, num_heads=4, window_size=4, mlp_ratio=2.0),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    x, y = torch.randn(8, 3, 12, 12), torch.randint(0, 10, (8,))
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


# ----------------------------------------------------------------------------- the adapter (blocks and plug)
@pytest.mark.parametrize("name", list_attention())
def test_adapter_takes_tokens_or_maps_and_prefix_tokens_attend_globally_in_spatial_mechanisms(name):
    from vit_attention.layers.layout_adapter import apply_attention

    spec = get_attention_spec(name)
    torch.manual_seed(0)
    attn = va.create_attention(name, DIM, HEADS, **spec.example_kwargs).eval()
    B, H, W, P = 2, 5, 6, 2
    fmap = torch.randn(B, H, W, DIM)
    tokens = torch.cat([torch.randn(B, P, DIM), fmap.reshape(B, H * W, DIM)], dim=1)  # [B, P + H·W, C]
    with torch.no_grad():
        out_map = apply_attention(attn, fmap)
        out_tok = apply_attention(attn, tokens, AttentionCall(feat_size=(H, W), num_prefix_tokens=P))
        call = AttentionCall(feat_size=(H, W), num_prefix_tokens=P)
        with_res = apply_attention(attn, tokens, dataclasses.replace(call, residual=tokens))
    assert out_map.shape == fmap.shape and out_tok.shape == tokens.shape
    torch.testing.assert_close(with_res, tokens + out_tok, atol=1e-5, rtol=1e-5)
    if spec.prefix_tokens == "global":
        torch.testing.assert_close(out_tok[:, P:].reshape(B, H, W, DIM), out_map)  # the grid: its own pattern
        moved = tokens.clone()
        moved[:, P:] += torch.randn(B, H * W, DIM)  # another image, the same prefix tokens
        with torch.no_grad():
            prefix = apply_attention(attn, moved, AttentionCall(feat_size=(H, W), num_prefix_tokens=P))[:, :P]
            torch.testing.assert_close(out_tok[:, :P], attn.attend_prefix(tokens[:, :P], tokens))
        assert not torch.allclose(prefix, out_tok[:, :P])  # the prefix tokens read the grid
        with pytest.raises(ValueError, match="feat_size"):
            apply_attention(attn, tokens, AttentionCall(num_prefix_tokens=P))
    else:
        assert out_tok[:, :P].abs().max() > 0  # prefix tokens attend like the others
        with torch.no_grad():
            grid = AttentionCall((H, W) if spec.needs_feat_size else None)  # a token mechanism that uses the grid
            torch.testing.assert_close(out_map.reshape(B, H * W, DIM), attn(fmap.reshape(B, H * W, DIM), grid))


def test_adapter_plain_modules():
    from vit_attention.layers.layout_adapter import apply_attention

    x = torch.randn(1, 1 + 16, DIM)
    lin = nn.Linear(DIM, DIM)
    assert apply_attention(lin, x).shape == x.shape  # a plain module gets x alone
    with pytest.raises(ValueError, match="Linear is not a registered mechanism: it is called with x alone and takes "
                                         "no context"):
        apply_attention(lin, x, AttentionCall(context=x))
    r = torch.randn_like(x)  # the residual is the adapter's to add
    torch.testing.assert_close(apply_attention(lin, x, AttentionCall(residual=r)), r + lin(x))


@pytest.mark.parametrize("rope", ["axial", "mixed"])
def test_rope_plugs_into_a_cnn_at_any_aspect(rope):
    """A CNN gets 2-D rotary positions with ``plug("mhsa", rope=...)``: the grid comes from the feature map, so
    any size and aspect runs, the positions matter (without them attention is permutation-equivariant), and
    mixed frequencies learn."""
    torch.manual_seed(0)
    p = va.plug("mhsa", 32, 4, rope=rope).eval()
    plain = va.plug("mhsa", 32, 4).eval()
    plain.load_state_dict({k: v for k, v in p.state_dict().items() if "rope" not in k})
    x = torch.randn(2, 32, 3, 7)
    with torch.no_grad():
        y, y0 = p(x), plain(x)
        assert y.shape == (2, 32, 3, 7) and p(torch.randn(1, 32, 5, 2)).shape == (1, 32, 5, 2)
        assert not torch.allclose(y, y0, atol=1e-4)  # the rotation changed the attention
        # without RoPE, attention is permutation-equivariant: rolling the map rolls the output; with RoPE it is not
        # equivariant to a roll that wraps around (positions are absolute in the rotation, relative in q·k)
        shifted0 = plain(torch.roll(x, 1, dims=-1))
        torch.testing.assert_close(shifted0, torch.roll(y0, 1, dims=-1), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(p(torch.roll(x, 1, dims=-1)), torch.roll(y, 1, dims=-1), atol=1e-4)
    if rope == "mixed":
        p.train()
        p(x).square().mean().backward()
        assert p.attn.rope.freqs.grad is not None and p.attn.rope.freqs.grad.abs().sum() > 0
