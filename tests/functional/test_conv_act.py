"""``channels_last_on_cpu``: images in channels-last memory on the CPU with the fast paths on, the same values."""

import torch

from vit_attention.functional.conv_act import channels_last_on_cpu
from vit_attention.functional.fast_paths import use_fast_paths


def test_channels_last_on_cpu_keeps_values_and_shape_and_follows_the_switch() -> None:
    x = torch.randn(2, 3, 5, 4)
    y = channels_last_on_cpu(x)
    assert y.shape == x.shape and torch.equal(y, x) and y.is_contiguous(memory_format=torch.channels_last)
    assert channels_last_on_cpu(y) is y  # already channels-last: no copy
    with use_fast_paths(False):  # the fast paths off: the tensor as it is
        assert channels_last_on_cpu(x) is x
    tokens = torch.randn(2, 6, 8)
    assert channels_last_on_cpu(tokens) is tokens  # not a map
