"""Image GPT: palette and tokens, the generative API, cached generation, configuration errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from vit_attention import create_model
from vit_attention.models.igpt import ImageGPT, dequantize, load_palette, make_palette, quantize


def _small(**kw) -> ImageGPT:
    torch.manual_seed(0)
    over = dict(embed_dim=32, depth=2, num_heads=2, img_size=4, num_classes=5)
    return create_model("igpt_small", **{**over, **kw}).eval()  # type: ignore[return-value]


def test_uniform_palette_is_an_even_grid_and_quantize_round_trips() -> None:
    pal = make_palette("uniform", 512, 3)
    assert pal.shape == (512, 3) and pal.min() > -1 and pal.max() < 1
    assert len({tuple(c) for c in pal.tolist()}) == 512
    images = pal[torch.randperm(512)[:32]].T.reshape(1, 3, 4, 8)  # every pixel is a palette colour
    tokens = quantize(images, pal)
    assert tokens.shape == (1, 32)
    torch.testing.assert_close(dequantize(tokens, pal, (4, 8)), images)
    noisy = images + 0.01 * torch.randn_like(images)  # well inside each bin (width 0.25)
    assert torch.equal(quantize(noisy, pal), tokens)


def test_quantize_is_the_nearest_colour_in_raster_order() -> None:
    pal = torch.randn(20, 3)
    images = torch.randn(2, 3, 3, 5)
    pixels = images.flatten(2).transpose(1, 2)  # [B, N, 3], raster order
    want = torch.cdist(pixels, pal.expand(2, -1, -1)).argmin(-1)
    assert torch.equal(quantize(images, pal), want)
    with pytest.raises(ValueError, match="quantize expects images"):
        quantize(torch.randn(2, 1, 3, 5), pal)


@pytest.mark.parametrize("suffix", [".npy", ".json", ".txt", ".safetensors"])
def test_palette_files(tmp_path, suffix: str) -> None:
    pal = torch.rand(8, 3) * 2 - 1
    path = tmp_path / f"clusters{suffix}"
    if suffix == ".npy":
        np.save(path, pal.numpy())
    elif suffix == ".json":  # a Hugging Face preprocessor_config.json
        path.write_text(json.dumps({"clusters": pal.tolist(), "do_color_quantize": True}))
    elif suffix == ".txt":
        path.write_text("\n".join(" ".join(repr(v) for v in row) for row in pal.tolist()))
    else:
        from safetensors.torch import save_file

        save_file({"clusters": pal}, str(path))
    torch.testing.assert_close(load_palette(path), pal)
    model = _small(vocab_size=8, palette=str(path))
    torch.testing.assert_close(model.palette, pal)
    with pytest.raises(ValueError, match="vocab_size"):
        _small(vocab_size=9, palette=str(path))
    with pytest.raises(FileNotFoundError, match="palette file"):
        load_palette(tmp_path / "missing.npy")


def test_generative_api_shapes_and_loss() -> None:
    model = _small()
    images = torch.rand(2, 3, 4, 4) * 2 - 1
    targets = model.quantize(images)
    assert targets.shape == (2, 16) and targets.dtype == torch.long
    inp = model.shift_right(targets)
    assert (inp[:, 0] == 512).all() and torch.equal(inp[:, 1:], targets[:, :-1])
    logits = model.forward_logits(inp)
    assert logits.shape == (2, 16, 512)
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(model.loss(images), nll)
    torch.testing.assert_close(model.loss(targets), nll)
    assert model.loss(images, reduction="none").shape == (2,)
    assert abs(nll.item() - math.log(512)) < 0.5  # near uniform at initialisation
    assert model(images).shape == (2, 5)
    assert torch.equal(model.forward_features(images), model.forward_tokens(inp))


def test_logits_at_a_position_ignore_later_tokens() -> None:
    model = _small()
    ids = torch.randint(0, 512, (1, 16))
    other = ids.clone()
    other[0, 9:] = (other[0, 9:] + 1) % 512
    with torch.no_grad():
        a, b = model.forward_logits(ids), model.forward_logits(other)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("top_k", [None, 5])
def test_cached_and_uncached_sampling_give_the_same_tokens(top_k: int | None) -> None:
    model = _small()
    cached = model.generate(3, seed=7, top_k=top_k, temperature=0.9, use_cache=True)
    uncached = model.generate(3, seed=7, top_k=top_k, temperature=0.9, use_cache=False)
    assert cached.shape == (3, 16) and cached.dtype == torch.long and cached.max() < 512
    assert torch.equal(cached, uncached)
    assert torch.equal(model.generate(3, seed=7, top_k=top_k, temperature=0.9), cached)  # seeded: repeatable
    assert not torch.equal(model.generate(3, seed=8, top_k=top_k, temperature=0.9), cached)
    assert model.dequantize(cached).shape == (3, 3, 4, 4)


@pytest.mark.parametrize("prompt_len", [0, 3])
def test_static_cache_sampling_gives_the_dynamic_caches_tokens(prompt_len: int) -> None:
    model = _small()
    prompt = torch.randint(0, 512, (3, prompt_len)) if prompt_len else None
    for kw in (dict(top_k=1), dict(temperature=0.9, seed=7)):
        dynamic = model.generate(3, prompt=prompt, **kw)
        static = model.generate(3, prompt=prompt, static_cache=True, **kw)
        assert torch.equal(static, dynamic), kw
    cache = model.new_static_cache(3)
    assert cache.max_len == 16 and cache._k[0].shape == (3, 2, 16, 16) and len(cache._k) == 2
    ids = torch.cat([torch.full((3, 1), 512), dynamic[:, :-1]], dim=1)
    with torch.no_grad():
        stepped = torch.cat([model.forward_logits(ids[:, :6], cache=cache),
                             model.forward_logits(ids[:, 6:], cache=cache)], dim=1)
        torch.testing.assert_close(stepped, model.forward_logits(ids), atol=1e-5, rtol=1e-4)
        with pytest.raises(ValueError, match="do not fit: the StaticKVCache holds 16 of 16"):
            model.forward_logits(ids[:, :1], cache=cache)
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        model.generate(1, compile_mode="fast")
    with pytest.raises(ValueError, match="need the key/value cache"):
        model.generate(1, static_cache=True, use_cache=False)


@pytest.mark.slow  # compiles (about 15 s on 2 cores)
def test_compiled_sampling_is_one_graph_and_gives_the_eager_tokens() -> None:
    from torch._dynamo.utils import counters

    model = _small()
    torch._dynamo.reset()
    counters.clear()
    eager = model.generate(2, top_k=1)
    compiled = model.generate(2, top_k=1, compile_mode="default")
    assert torch.equal(compiled, eager)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 1  # every one-token step after the prompt: one graph
    again = model.generate(2, temperature=0.9, seed=3, compile_mode="default")  # a new cache: no recompilation
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(again, model.generate(2, temperature=0.9, seed=3, static_cache=True))
    torch._dynamo.reset()


def test_generate_top_k_1_is_greedy_and_prompt_is_kept() -> None:
    model = _small()
    greedy = model.generate(2, top_k=1, seed=0)
    ids = torch.cat([torch.full((2, 1), 512), greedy[:, :-1]], dim=1)
    with torch.no_grad():
        assert torch.equal(model.forward_logits(ids).argmax(-1), greedy)
    prompt = greedy[:, :5].flip(0)
    completed = model.generate(2, prompt=prompt, seed=0)
    assert torch.equal(completed[:, :5], prompt)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(1, temperature=0.0)
    with pytest.raises(ValueError, match="prompt"):
        model.generate(2, prompt=torch.zeros(2, 16, dtype=torch.long))


def test_intermediates_are_pixel_maps_and_bad_inputs_are_named() -> None:
    model = _small()
    x = torch.rand(2, 3, 4, 4) * 2 - 1
    final, maps = model.forward_intermediates(x, indices=[0, -1])
    assert [m.shape for m in maps] == [(2, 32, 4, 4)] * 2 and final.shape == (2, 16, 32)
    torch.testing.assert_close(final, model.forward_features(x))
    with pytest.raises(ValueError, match="expected images"):
        model(torch.rand(2, 3, 5, 5))
    with pytest.raises(ValueError, match="positions"):
        model.forward_logits(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="palette='uniform'"):
        create_model("igpt_small", vocab_size=100)
    with pytest.raises(ValueError, match="tokens"):
        create_model("igpt_small", attn_layer="window")
    with pytest.raises(ValueError, match="not causal"):
        create_model("igpt_small", attn_layer="mhsa")


def test_block_parts_are_ours_with_rms_norm_and_quick_gelu() -> None:
    model = _small()
    blk = model.blocks[0]
    assert blk.attn.attention_name == "causal"
    x = torch.randn(2, 3, 32)
    torch.testing.assert_close(blk.norm1(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * blk.norm1.weight)
    torch.testing.assert_close(blk.mlp.act(x), x * torch.sigmoid(1.702 * x))
    assert "quantizer.palette" in model.state_dict() and "lm_head.bias" not in model.state_dict()


def test_quick_gelu_is_the_shared_one_and_the_mlp_fuses_it_in_eval(monkeypatch) -> None:
    """iGPT builds its MLPs with layers.activation.QuickGELU (the class layers.Mlp recognises), so CPU inference
    takes the fused silu path (fc1 scaled by 1.702); models.igpt exports no activation of its own."""
    from vit_attention.functional.linear import can_fuse
    from vit_attention.functional.runtime import FAST_PATHS
    from vit_attention.layers import mlp as mlp_module
    from vit_attention.layers.activation import QuickGELU
    from vit_attention.models import igpt

    assert "QuickGELU" not in igpt.__all__
    model = _small()
    assert all(type(blk.mlp.act) is QuickGELU for blk in model.blocks)
    mlp = model.blocks[0].mlp
    x = torch.randn(2, 16, 32)
    acts: list = []
    real = mlp_module.linear
    monkeypatch.setattr(mlp_module, "linear", lambda *a, **k: acts.append(k.get("act")) or real(*a, **k))
    with torch.no_grad():
        out = mlp(x)
        # fc1 + silu in one kernel, then fc2, where this CPU's oneDNN fuses; else the eager path (no fused call)
        assert acts == (["silu", None] if can_fuse(x, mlp.fc1.weight) else [])
        acts.clear()
        with FAST_PATHS.override(False):  # the fallback, on any machine
            plain = mlp(x)
        assert acts == []
        eager = mlp.fc2(QuickGELU()(mlp.fc1(x)))
    torch.testing.assert_close(out, eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain, eager)


def test_generate_cli_writes_a_grid_and_benches(tmp_path, capsys) -> None:
    from PIL import Image

    import vit_attention as va
    from vit_attention.cli import main

    model = _small(in_chans=1, vocab_size=8, palette="grey", num_classes=0)
    path = va.save_weights(model, tmp_path / "run" / "model.safetensors")
    out = tmp_path / "grid.png"
    assert main(["generate", str(path.parent), "--num", "5", "--seed", "3", "--output", str(out), "--bench"]) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "tokens/s with the key/value cache" in text
    img = Image.open(out)
    first = np.asarray(img).copy()
    assert img.mode == "L" and img.size == (3 * (4 * 16 + 2) + 2, 2 * (4 * 16 + 2) + 2)  # 3 per row, 2 rows
    expected = model.dequantize(model.generate(5, seed=3))  # the same seed draws the same images
    cell = np.asarray(img)[2:2 + 64:16, 2:2 + 64:16] / 255.0 * 2 - 1  # first image, one pixel per cell
    np.testing.assert_allclose(cell, expected[0, 0].numpy(), atol=1 / 255 * 2 + 1e-6)
    va.save_weights(va.create_model("vit_digits_patch2_8", depth=1), tmp_path / "vit.safetensors")
    assert main(["generate", str(tmp_path / "vit.safetensors"), "--output", str(out)]) == 2
    assert "not a generative model" in capsys.readouterr().err
    assert main(["generate", "igpt_small", "--num", "0"]) == 2
    assert "--num" in capsys.readouterr().err
    assert main(["generate", str(path.parent), "--num", "5", "--seed", "3", "--output", str(out),
                 "--static-cache"]) == 0
    assert "static cache" in capsys.readouterr().out
    assert np.array_equal(np.asarray(Image.open(out)), first)  # the same images as the growing cache
    assert main(["generate", str(path.parent), "--no-cache", "--compile", "default", "--output", str(out)]) == 2
    assert "--no-cache cannot go with --static-cache / --compile" in capsys.readouterr().err


@pytest.mark.slow
def test_generative_training_on_the_digits(tmp_path, capsys) -> None:
    """`train --model igpt_digits`: next-pixel loss, bits/dim per epoch, a linear probe at the end."""
    import vit_attention as va
    from vit_attention.train import TrainConfig, train
    from vit_attention.train.generative import NextPixelObjective

    tiny = {"depth": 2, "embed_dim": 16, "num_heads": 2, "drop_path_rate": 0.0}
    cfg = TrainConfig(model="igpt_digits", model_kwargs=tiny, epochs=2, batch_size=128, lr=3e-3, warmup_epochs=0,
                      output=str(tmp_path / "run"), plot=False, progress=False)
    result = train(cfg)
    text = capsys.readouterr().out
    assert "bits/dim" in text and "linear probe of block 1" in text
    lines = text.strip().splitlines()  # the accuracy of a generative run is of the next pixel: named so
    assert lines[-1] == f"test next-pixel accuracy: {result['test_acc']:.4f}"
    assert not any(line.startswith("test accuracy:") for line in lines)
    assert "epoch 2/2:" in text and " next-pixel acc " in text
    hist = result["history"]
    assert [h["test_bpd"] for h in hist] == [pytest.approx(h["test_loss"] / math.log(2)) for h in hist]
    assert hist[-1]["test_bpd"] < math.log2(17)  # better than a uniform guess over the 17 grey levels
    assert hist[-1]["test_loss"] < hist[0]["test_loss"]
    assert 0.0 <= result["test_acc"] <= 1.0 and result["probe_layer"] == 1
    assert 0.2 < result["probe_acc"] <= 1.0  # 10 classes: well above chance from 2 epochs of pixels
    model = va.load_model(tmp_path / "run" / "model.safetensors")
    assert model.cfg.in_chans == 1 and model.cfg.vocab_size == 17
    x = torch.rand(4, 1, 8, 8) * 2 - 1
    objective = NextPixelObjective(model)
    with torch.no_grad():
        torch.testing.assert_close(objective(x, model(x, objective="generative")), model.loss(x, reduction="none"))
    assert model.generate(2, seed=0).shape == (2, 64)
    with pytest.raises(ValueError, match="mixup"):
        train(TrainConfig(model="igpt_digits", model_kwargs=tiny, epochs=1, mixup=0.2, output=str(tmp_path / "m")))


def test_token_ids_outside_the_vocabulary_are_named_up_front() -> None:
    """Ids outside the vocabulary raise ``ValueError`` naming the argument and the valid range, not
    torch's bare ``IndexError`` (embedding) or a late failure in the cross-entropy (targets)."""
    model = _small()  # 512 colours; 512 is the start token
    good = torch.randint(0, 512, (2, 16))
    for bad in (600, -1):
        ids = good.clone()
        ids[1, 3] = bad
        for call in (model, model.forward_features, model.forward_tokens, model.forward_logits,
                     model.forward_intermediates):
            with pytest.raises(ValueError, match=r"must lie in 0\.\.512 .*512 = the start-of-image token.*got " +
                               str(bad)):
                call(ids)
        with pytest.raises(ValueError, match=r"x \(target ids\) must lie in 0\.\.511.*got " + str(bad)):
            model.loss(ids)
        with pytest.raises(ValueError, match=r"prompt must lie in 0\.\.511"):
            model.generate(2, prompt=ids[:, :4])
        with pytest.raises(ValueError, match=r"tokens must lie in 0\.\.511"):
            model.dequantize(ids)
    sos = good.clone()
    sos[:, 0] = 512  # the start token is a valid input id, but not a target
    assert model.forward_logits(sos).shape == (2, 16, 512)
    with pytest.raises(ValueError, match=r"x \(target ids\) must lie in 0\.\.511 .*, got 512"):
        model.loss(sos)
    with pytest.raises(ValueError, match="integer token ids"):
        model.forward_tokens(good.float())
    assert model.loss(good).isfinite()  # the valid range passes


@pytest.mark.compile
def test_token_id_check_stays_out_of_exported_graphs() -> None:
    """The check is data-dependent (a host sync on the ids): while torch records a graph (``torch.export``,
    compile, ONNX) it is skipped, so the ids path still exports and the program replays on any ids."""

    class Logits(torch.nn.Module):
        def __init__(self, model: ImageGPT) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model.forward_logits(ids)

    model = _small()
    ids = torch.randint(0, 512, (1, 16))
    program = torch.export.export(Logits(model), (ids,))
    torch.testing.assert_close(program.module()(ids), model.forward_logits(ids))
