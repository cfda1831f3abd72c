"""Live parity with Hugging Face transformers ViT / DeiT (random small configs)."""

import pytest
import torch
from fixture_utils import add_noise, assert_parity
from hf_utils import assert_hf_logits_parity
from transformers import (
    DeiTConfig,
    DeiTForImageClassificationWithTeacher,
    ViTConfig,
    ViTForImageClassification,
    ViTModel,
)

from vit_attention.models import VisionTransformer, VisionTransformerConfig
from vit_attention.weights import load_weights

pytestmark = pytest.mark.parity  # every test here compares with a reference implementation

_SMALL = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=256)


def _perturb(model):
    torch.manual_seed(0)
    add_noise(model, 0.05)
    return model.eval()


def _ours(**kw):
    return VisionTransformer(VisionTransformerConfig(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                                     norm_eps=1e-12, **kw)).eval()


def test_hf_vit_classification():
    ref = _perturb(ViTForImageClassification(ViTConfig(**_SMALL, num_labels=10)))
    model = _ours(num_classes=10)
    assert_hf_logits_parity(model, ref, 32)


def test_hf_vit_model_with_pooler_from_folder(tmp_path):
    ref = _perturb(ViTModel(ViTConfig(**_SMALL), add_pooling_layer=True))
    ref.save_pretrained(tmp_path)
    model = _ours(num_classes=0, representation_size=64)
    report = load_weights(model, tmp_path)  # a Hugging Face model folder
    assert report.ok, str(report)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = ref(pixel_values=x)
        assert_parity(model.forward_features(x), out.last_hidden_state)
        assert_parity(model(x), out.pooler_output)


def test_hf_deit_distilled_with_teacher():
    ref = _perturb(DeiTForImageClassificationWithTeacher(DeiTConfig(**_SMALL, num_labels=10)))
    model = _ours(num_classes=10, distilled=True)
    report = load_weights(model, ref.state_dict())
    assert report.ok, str(report)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = ref(pixel_values=x)
        assert_parity(model(x), out.logits)
        model.train()
        cls, dist = model(x)
    assert_parity(cls, out.cls_logits)
    assert_parity(dist, out.distillation_logits)


@pytest.mark.parametrize("size", [48])
def test_hf_vit_interpolated_checkpoint_into_larger_model(size):
    ref = _perturb(ViTForImageClassification(ViTConfig(**_SMALL, num_labels=10)))
    model = VisionTransformer(VisionTransformerConfig(img_size=size, patch_size=8, embed_dim=64, depth=2,
                                                      num_heads=4, num_classes=10, norm_eps=1e-12)).eval()
    report = load_weights(model, ref.state_dict())
    assert any("resampled from 4x4 to 6x6" in n for n in report.notes)
    assert model(torch.randn(1, 3, size, size)).shape == (1, 10)
