import pytest
import torch
from torch import nn

from vit_attention import create_model
from vit_attention.functional import register_attention_hook
from vit_attention.functional.chunking import (
    batch_chunk_size,
    chunk_elements,
    run_in_batch_chunks,
    set_chunk_elements,
)
from vit_attention.layers import Block


@pytest.fixture
def small_chunks():
    prev = chunk_elements()
    set_chunk_elements(1000)
    yield
    set_chunk_elements(prev)


def test_run_in_batch_chunks_equals_whole_batch():
    x = torch.randn(7, 3, 5)
    fn = lambda t: t.cumsum(-1) * 2  # noqa: E731  per-image
    assert torch.equal(run_in_batch_chunks(fn, x, 3), fn(x))
    with pytest.raises(ValueError, match="shape"):
        run_in_batch_chunks(lambda t: t.sum(-1), x, 3)


def test_chunk_size_only_where_nobody_can_tell(small_chunks):
    lin = nn.Linear(5, 5)
    x = torch.randn(8, 10, 20)  # 200 elements per image -> 5 per chunk
    with torch.no_grad():
        assert batch_chunk_size(x, [lin]) == 5
        assert batch_chunk_size(x.to("meta"), [lin]) == 8  # other devices: whole batch
        assert batch_chunk_size(x[:1], [lin]) == 1
        h = lin.register_forward_hook(lambda *a: None)
        assert batch_chunk_size(x, [lin]) == 8  # a hook must see the whole batch
        h.remove()
        h = register_attention_hook(lambda w, info: None)
        assert batch_chunk_size(x, [lin]) == 8
        h.remove()
        assert batch_chunk_size(x, [lin], max_elements=0) == 8
        assert batch_chunk_size(x, [lin], max_elements=10) == 1  # at least one image
    assert batch_chunk_size(x, [lin]) == 8  # autograd recording: whole batch
    with pytest.raises(ValueError, match="chunk elements"):
        set_chunk_elements(-1)


@pytest.mark.registry
@pytest.mark.parametrize("name", ["swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256"])
def test_swin_stage_chunks_at_inference_with_same_result(name, small_chunks, monkeypatch):
    torch.manual_seed(0)
    model = create_model(name, img_size=64, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4,
                         num_classes=5, **({"pretrained_window_sizes": (0, 0)} if "v2" in name else {})).eval()
    for m in model.modules():  # SwinV2 zero-inits its post-norms: give every branch a say
        if isinstance(m, nn.LayerNorm):
            nn.init.normal_(m.weight, 1.0, 0.2)
    x = torch.randn(6, 3, 64, 64)
    seen: list[int] = []
    orig = Block.forward

    def spy(self, t):
        seen.append(t.shape[0])
        return orig(self, t)

    monkeypatch.setattr(Block, "forward", spy)
    with torch.inference_mode():
        chunked = model(x)
        assert max(seen) < 6  # stage 1 (16x16x16 = 4096 elements per image) ran in pieces
        set_chunk_elements(0)
        seen.clear()
        whole = model(x)
        assert set(seen) == {6}
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
