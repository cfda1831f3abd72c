"""``scaled_dot_product_attention`` names ``mask`` / ``bias`` when it does not broadcast to the logits."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from vit_attention.attention import AttentionCall, create_attention
from vit_attention.functional import attention as attention_module
from vit_attention.functional import scaled_dot_product_attention


def _qkv(B: int = 2, nh: int = 3, N: int = 5, M: int = 7, hd: int = 4) -> tuple[torch.Tensor, ...]:
    return torch.randn(B, nh, N, hd), torch.randn(B, nh, M, hd), torch.randn(B, nh, M, hd)


@pytest.mark.parametrize("shape", [
    (5, 5),  # [N, N] where [N, M] = [5, 7] is expected
    (2, 5, 7),  # aligned from the right: 2 heads against nh = 3
    (2, 1, 5, 6),  # one key too few
    (4, 3, 5, 7),  # wrong batch
    (2, 2, 5, 7),  # wrong heads
    (1, 2, 3, 5, 7),  # 5-D
    (7,),  # 1-D: the query axis is needed (the fully-masked-row check reads it)
])
@pytest.mark.parametrize("name", ["mask", "bias"])
@pytest.mark.parametrize("weights", [False, True])
def test_bad_mask_shape_names_mask(shape: tuple[int, ...], name: str, weights: bool) -> None:
    q, k, v = _qkv()
    t = torch.ones(shape, dtype=torch.bool if name == "mask" else torch.float32)
    with pytest.raises(ValueError, match=rf"^{name} of shape .* does not broadcast to the attention logits "
                                         r"\[B, nh, N, M\] = \[2, 3, 5, 7\]"):
        scaled_dot_product_attention(q, k, v, **{name: t}, return_weights=weights)


def test_bad_shape_with_leading_batch_dims_names_the_argument() -> None:
    q, k, v = (t.view(1, 2, 3, *t.shape[-2:]) for t in _qkv())
    with pytest.raises(ValueError, match=r"^bias of shape \(4, 5, 7\) does not broadcast to the attention "
                                         r"logits \[\*b, nh, N, M\] = \[1, 2, 3, 5, 7\]"):
        scaled_dot_product_attention(q, k, v, bias=torch.zeros(4, 5, 7))


@pytest.mark.parametrize("shape", [(5, 7), (1, 5, 7), (3, 5, 7), (2, 1, 1, 7), (1, 3, 5, 7), (2, 3, 5, 7),
                                   (1, 1, 1, 1)])
@pytest.mark.parametrize("fused", [True, False])
def test_every_broadcastable_mask_is_accepted(shape: tuple[int, ...], fused: bool) -> None:
    q, k, v = _qkv()
    mask = torch.rand(shape) > 0.3
    out = scaled_dot_product_attention(q, k, v, mask=mask, fused=fused)
    biased = scaled_dot_product_attention(q, k, v, bias=torch.randn(shape), fused=fused)
    assert out.shape == biased.shape == (2, 3, 5, 4)


def test_module_masks_reach_the_check_with_the_name() -> None:
    attn = create_attention("mhsa", 12, 3).eval()
    with pytest.raises(ValueError, match=r"^mask of shape \(4, 4\) does not broadcast"):
        attn(torch.randn(2, 5, 12), AttentionCall(mask=torch.ones(4, 4, dtype=torch.bool)))


class _Masked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = create_attention("mhsa", 12, 3)
        self.register_buffer("mask", torch.ones(1, 1, 5, 5, dtype=torch.bool))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, AttentionCall(mask=self.mask))


@pytest.mark.compile
def test_mask_check_adds_no_tracer_warnings() -> None:
    model, x = _Masked().eval(), torch.randn(2, 5, 12)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(model, x)
    lines, start = inspect.getsourcelines(attention_module._check_broadcast)
    inside = [w for w in caught if w.filename == inspect.getsourcefile(attention_module)
              and start <= w.lineno < start + len(lines)]
    assert not inside, [str(w.message) for w in inside]
    torch.testing.assert_close(traced(x), model(x))
