"""BatchNorm folded into its convolution at inference gives the same numbers; training keeps the two steps."""

from __future__ import annotations

import torch
from torch import nn

from vit_attention.functional.batch_norm import can_fold_batch_norm, conv_bn
from vit_attention.layers.mbconv import ConvNormAct


def _pair(groups: int, bias: bool) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    torch.manual_seed(groups)
    conv = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=groups, bias=bias)
    bn = nn.BatchNorm2d(8)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
        bn.bias.normal_()
    return conv.eval(), bn.eval()


def test_folded_equals_conv_then_bn() -> None:
    x = torch.randn(2, 8, 9, 11)
    for groups, bias in ((1, False), (8, False), (2, True)):
        conv, bn = _pair(groups, bias)
        assert can_fold_batch_norm(conv, bn)
        torch.testing.assert_close(conv_bn(conv, bn, x), bn(conv(x)), atol=1e-5, rtol=1e-5)


def test_not_folded_in_training_or_with_hooks() -> None:
    conv, bn = _pair(1, False)
    bn.train()
    assert not can_fold_batch_norm(conv, bn)
    bn.eval()
    handle = conv.register_forward_hook(lambda *a: None)
    assert not can_fold_batch_norm(conv, bn)
    handle.remove()
    assert can_fold_batch_norm(conv, bn)


def test_conv_norm_act_inference_equals_its_modules() -> None:
    for act in (nn.SiLU, nn.ReLU, None):
        m = ConvNormAct(8, 16, 3, stride=2, act_layer=act).eval()
        _, bn = _pair(1, False)
        m.bn.load_state_dict({k: torch.cat([v, v]) if v.dim() else v for k, v in bn.state_dict().items()})
        x = torch.randn(2, 8, 10, 10)
        ref = m.act(m.bn(m.conv(x)))
        with torch.no_grad():
            torch.testing.assert_close(m(x), ref, atol=1e-5, rtol=1e-5)
        m.train()
        out = m(x.requires_grad_())
        out.sum().backward()  # the training path keeps autograd (no in-place activation)
        assert x.grad is not None
