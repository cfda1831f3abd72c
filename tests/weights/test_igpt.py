"""Live parity with Hugging Face ImageGPT (random small configs) and the original openai/image-gpt layout."""

from __future__ import annotations

import pytest
import torch
from fixture_utils import add_noise, assert_parity
from transformers import ImageGPTConfig as HFConfig
from transformers import ImageGPTForCausalImageModeling, ImageGPTForImageClassification, ImageGPTModel

from vit_attention.functional import switched
from vit_attention.models.igpt import ImageGPT, ImageGPTConfig, quantize
from vit_attention.weights import load_weights

pytestmark = pytest.mark.parity  # every test here compares with a reference implementation

SIDE, K = 5, 16  # a 5x5 image: 25 tokens (+ SOS), 16 colours
_HF = dict(vocab_size=K + 1, n_positions=SIDE * SIDE, n_embd=32, n_layer=2, n_head=4, tie_word_embeddings=False)


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    add_noise(model, 0.05)
    return model.eval()


def _ours(**kw) -> ImageGPT:
    return ImageGPT(ImageGPTConfig(img_size=SIDE, vocab_size=K, palette="grey", embed_dim=32, depth=2, num_heads=4,
                                   **kw)).eval()


def _ids(n: int = SIDE * SIDE) -> torch.Tensor:
    ids = torch.randint(0, K, (3, n), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = K  # SOS first, as the user passes it to Hugging Face
    return ids


@pytest.mark.parametrize("fused", [True, False])
def test_hf_causal_image_modeling_logits(fused: bool) -> None:
    ref = _perturb(ImageGPTForCausalImageModeling(HFConfig(**_HF)))
    model = _ours(num_classes=0)
    report = load_weights(model, ref.state_dict())
    assert report.layout == "huggingface" and report.ok, str(report)
    ids = _ids()
    with torch.no_grad(), switched(model, fused_attention=fused):
        out = model.forward_logits(ids)
        want = ref(input_ids=ids).logits
    assert out.shape == want.shape == (3, SIDE * SIDE, K)
    assert_parity(out, want)
    with torch.no_grad():  # a shorter prefix too (generation feeds growing prefixes)
        assert_parity(model.forward_logits(ids[:, :7]), ref(input_ids=ids[:, :7]).logits)


def test_hf_model_hidden_states() -> None:
    ref = _perturb(ImageGPTModel(HFConfig(**_HF)))
    model = _ours(num_classes=0)
    report = load_weights(model, ref.state_dict(), strict=False)
    assert report.missing == ["lm_head.weight"] and not report.unexpected and not report.mismatched, str(report)
    ids = _ids()
    with torch.no_grad():
        assert_parity(model.forward_tokens(ids), ref(input_ids=ids).last_hidden_state)


def test_hf_image_classification_on_quantized_images() -> None:
    """Images in: ours quantises and shifts behind SOS; HF gets the same ids and mean-pools into ``score``."""
    ref = _perturb(ImageGPTForImageClassification(HFConfig(**_HF, num_labels=7)))
    model = _ours(num_classes=7)
    report = load_weights(model, ref.state_dict(), strict=False)
    assert report.missing == ["lm_head.weight"] and not report.unexpected, str(report)
    images = torch.rand(3, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(2)) * 2 - 1
    ids = model.shift_right(quantize(images, model.palette))
    with torch.no_grad():
        assert_parity(model(images), ref(input_ids=ids).logits)


def test_hf_config_json_reads_into_our_config() -> None:
    from vit_attention.weights.hub import hf_config_overrides

    cfg = HFConfig(**_HF, architectures=["ImageGPTForImageClassification"], num_labels=7).to_dict()
    over = hf_config_overrides(cfg, ImageGPTConfig)
    assert over["embed_dim"] == 32 and over["depth"] == 2 and over["num_heads"] == 4
    assert over["vocab_size"] == K and over["img_size"] == SIDE and over["num_classes"] == 7


def _to_original(hf_state: dict[str, torch.Tensor], C: int) -> dict[str, torch.Tensor]:
    """An original-layout dict ("model/..." TF names) holding the weights of a HF state dict.

    The inverse of Hugging Face's ``load_tf_weights_in_imagegpt``: ``wte`` without its SOS row + ``sos``,
    ``wtet`` = lm_head, q/k/v as separate ``(out, in)`` matrices (the original has no qkv bias).
    """
    out: dict[str, torch.Tensor] = {}
    for k, v in hf_state.items():
        k = k.removeprefix("transformer.")
        if k == "wte.weight":
            out["model/wte"], out["model/sos"] = v[:-1], v[-1]
        elif k == "wpe.weight":
            out["model/wpe"] = v
        elif k == "lm_head.weight":
            out["model/wtet"] = v
        elif k == "ln_f.weight":
            out["model/ln_f/g"] = v
        elif k.endswith("attn.c_attn.weight"):
            i = k.split(".")[1]
            for j, name in enumerate("qkv"):
                out[f"model/h{i}/attn/{name}_proj/w"] = v[:, j * C:(j + 1) * C].T.reshape(1, C, C)
        elif k.endswith("attn.c_attn.bias") or k.endswith((".attn.bias", ".masked_bias")):
            continue
        else:
            _, i, *rest = k.split(".")
            leaf = {"weight": "w", "bias": "b"}[rest[-1]] if rest[0].startswith(("attn", "mlp")) else "g"
            out[f"model/h{i}/{'/'.join(rest[:-1])}/{leaf}"] = v.unsqueeze(0) if leaf == "w" else v
    out["model/global_step"] = torch.tensor(7)  # optimiser state is skipped
    return out


def test_original_openai_layout_matches_hf() -> None:
    ref = _perturb(ImageGPTForCausalImageModeling(HFConfig(**_HF)))
    with torch.no_grad():
        for blk in ref.transformer.h:
            blk.attn.c_attn.bias.zero_()  # the original's q / k / v have no bias
    model = _ours(num_classes=0)
    report = load_weights(model, _to_original(ref.state_dict(), 32))
    assert report.layout == "openai" and report.ok, str(report)
    ids = _ids()
    with torch.no_grad():
        assert_parity(model.forward_logits(ids), ref(input_ids=ids).logits)


def test_palette_is_kept_from_the_model() -> None:
    model = _ours(num_classes=0)
    before = model.palette.clone()
    load_weights(model, _perturb(ImageGPTForCausalImageModeling(HFConfig(**_HF))).state_dict())
    assert torch.equal(model.palette, before)
