"""One place builds a registered model: ``ModelEntry.build`` (the class, or its features class, from a config);
``create_model``, ``load_model`` and the check of a file's config against its tensors all come through it, and a
features model is constructed as its features class (no class swap on a built model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from vit_attention import create_model, load_model, save_weights
from vit_attention.models.features import features_class
from vit_attention.models.registry import ModelEntry, get_model_entry

NAME = "vit_digits_patch2_8"


def _spy_builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool, type]]:
    """Record every ``ModelEntry.build`` call as ``(entry name, features?, class built)``."""
    built: list[tuple[str, bool, type]] = []
    real = ModelEntry.build

    def spy(self: ModelEntry, cfg: Any = None, *, features: Any = None) -> nn.Module:
        model = real(self, cfg, features=features)
        built.append((self.name, features is not None, type(model)))
        return model

    monkeypatch.setattr(ModelEntry, "build", spy)
    return built


def test_create_model_and_load_model_build_through_the_registry_entry(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    built = _spy_builds(monkeypatch)
    cls = get_model_entry(NAME).model_cls
    plain = create_model(NAME)
    feats = create_model(NAME, features_only=True, out_indices=(-1, 0))
    assert built == [(NAME, False, cls), (NAME, True, features_class(cls))]
    assert type(plain) is cls and plain.registry_name == feats.registry_name == NAME
    built.clear()
    back = load_model(save_weights(feats, tmp_path / "features.safetensors"))
    # the header check (the recorded config on the meta device), then the model itself
    assert built == [(NAME, False, cls), (NAME, True, features_class(cls))]
    assert type(back) is type(feats) and back.out_indices == feats.out_indices
    built.clear()
    create_model(NAME, features_only=True, pretrained=tmp_path / "features.safetensors")
    assert [b[:2] for b in built] == [(NAME, True)]


def test_a_features_model_is_never_a_swapped_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``model.__class__ = ...`` anywhere on the way: the features class is constructed directly, and its
    ``__init__`` builds the backbone, then removes the head and what the maps do not need."""
    assigned: list[str] = []
    real = nn.Module.__setattr__

    def spy(self: nn.Module, name: str, value: Any) -> None:
        assigned.append(name)
        real(self, name, value)

    monkeypatch.setattr(nn.Module, "__setattr__", spy)
    model = create_model(NAME, features_only=True, out_indices=(1,))
    monkeypatch.undo()
    assert "__class__" not in assigned and "blocks" in assigned
    assert len(model.blocks) == 2 and model.num_classes == 0 and isinstance(model.head, nn.Identity)
    with torch.no_grad():
        (fmap,) = model(torch.randn(1, model.cfg.in_chans, 8, 8))
    assert fmap.shape[:2] == (1, model.feature_info.channels()[0])


def test_a_features_class_refuses_a_bad_output_fmt_before_building(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = get_model_entry(NAME).model_cls
    inits: list[type] = []
    real = cls.__init__

    def spy(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        inits.append(type(self))
        real(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", spy)
    with pytest.raises(ValueError, match="output_fmt must be one of"):
        features_class(cls)(get_model_entry(NAME).config(), output_fmt="NHWC")
    assert not inits


def test_load_or_create_model_one_dispatch_for_the_commands(tmp_path: Path) -> None:
    """A file of ours rebuilds its own model (options may repeat, never contradict, it; another img_size resamples);
    a foreign file needs the model's name; messages name the arguments as the caller spells them."""
    from vit_attention.factory import load_or_create_model

    model = create_model(NAME, num_classes=7)
    ours = save_weights(model, tmp_path / "run" / "model.safetensors")
    back, saved = load_or_create_model(None, tmp_path / "run", options={"num_classes": 7})
    assert saved is not None and saved.path == ours and back.num_classes == 7 and not back.training
    big, _ = load_or_create_model(NAME, ours, img_size=16)
    assert big.cfg.img_size == 16 and big.num_classes == 7
    cli = {"model": "--model", "checkpoint": "--checkpoint", "num_classes": "--num-classes"}
    with pytest.raises(ValueError, match="--num-classes 5 contradicts the checkpoint"):
        load_or_create_model(None, ours, options={"num_classes": 5}, spelling=cli)
    with pytest.raises(ValueError, match="--model 'deit_digits_distilled_patch2_8' contradicts the checkpoint"):
        load_or_create_model("deit_digits_distilled_patch2_8", ours, spelling=cli)
    foreign = tmp_path / "bare.pth"
    torch.save(model.state_dict(), foreign)
    with pytest.raises(ValueError, match="does not record which model it holds.*give --model NAME"):
        load_or_create_model(None, foreign, spelling=cli)
    built, saved = load_or_create_model(NAME, foreign, options={"num_classes": 7})
    assert saved is None and all(torch.equal(a, b) for a, b in zip(built.state_dict().values(),
                                                                      model.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="pretrained=True and checkpoint .* both give weights"):
        load_or_create_model(NAME, foreign, pretrained=True)


def test_every_command_declares_model_arg_through_one_helper() -> None:
    """``--model-arg KEY=VALUE`` is declared in one place (``add_model_arg_option``): on a parser or an argument
    group, with the command's own help or the default one, it parses repeatable JSON pairs."""
    import argparse

    from vit_attention.factory import add_model_arg_option

    parser = argparse.ArgumentParser()
    add_model_arg_option(parser.add_argument_group("model"), help="overrides for every MODEL")
    args = parser.parse_args(["--model-arg", "depth=2", "--model-arg", 'attn_layer="neighborhood"'])
    assert args.model_arg == [("depth", 2), ("attn_layer", "neighborhood")]
    assert parser._actions[-1].help == "overrides for every MODEL"
    assert parser.parse_args([]).model_arg is None
    plain = argparse.ArgumentParser()
    add_model_arg_option(plain)
    assert plain._actions[-1].help.endswith("(default: the preset's)")
