"""The one model base: every family is a Backbone, and what the base owns behaves the same in all of them."""

from __future__ import annotations

import inspect

import pytest
import torch
from model_outputs import first_preset_per_family, small_overrides

from vit_attention import create_model
from vit_attention.models import get_model_entry
from vit_attention.models.backbone import Backbone, IsotropicBackbone, StagedBackbone
from vit_attention.models.families import builtin_families
from vit_attention.models.layer_groups import layer_ids
from vit_attention.weights.load import _input_conv

FAMILIES = sorted(first_preset_per_family().items())
# What the base writes once; a family that defines one of these again must have a reason (listed here).
BASE_ONLY = ("default_config", "resolve_config", "set_grad_checkpointing", "no_weight_decay", "forward")


@pytest.mark.registry
@pytest.mark.parametrize("family,name", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_every_family_is_a_backbone_and_declares_its_reduced_config(family: str, name: str) -> None:
    entry = get_model_entry(name)
    assert issubclass(entry.model_cls, Backbone)
    assert entry.model_cls.config_cls is not None and isinstance(entry.config(), entry.model_cls.config_cls)
    for attr in BASE_ONLY:
        owner = next(c for c in entry.model_cls.__mro__ if attr in vars(c))
        assert owner is Backbone or (entry.family == "igpt" and attr == "forward"), \
            f"{entry.model_cls.__name__}.{attr} is written again in {owner.__name__}"
    assert entry.reduced is not None, f"family {family!r} declares no reduced test config (register_family reduced=)"
    over = entry.reduced_overrides()
    assert over and set(over) <= {f for f in entry.config().__dataclass_fields__}


@pytest.mark.parametrize("family,name", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_every_family_takes_one_shape_base_and_its_levels(family: str, name: str) -> None:
    """A family derives from exactly one of the two shape bases, which says what its levels and blocks are: the
    stages of a StagedBackbone (``stages_attr``), the ``blocks`` of an IsotropicBackbone; the shared Backbone
    holds neither (no structure attribute, no stage loop, no token-merging or layer-grouping machinery)."""
    cls = get_model_entry(name).model_cls
    assert issubclass(cls, IsotropicBackbone) != issubclass(cls, StagedBackbone)
    for member in ("stages_attr", "_embed", "_stages", "layer_ids", "_run_blocks_merging", "_merging_obstacle",
                   "_record_patch_embed_size"):
        assert not hasattr(Backbone, member), member
    with torch.device("meta"):
        model = create_model(name, **small_overrides(name))
    blocks = model.block_names()
    assert blocks and all(isinstance(model.get_submodule(b), torch.nn.Module) for b in blocks)
    if isinstance(model, StagedBackbone):
        stages = getattr(model, type(model).stages_attr)
        assert isinstance(stages, torch.nn.Sequential) and not hasattr(model, "blocks")
        assert all(b.startswith(f"{type(model).stages_attr}.") for b in blocks)
    else:
        assert blocks[:len(model.blocks)] == [f"blocks.{j}" for j in range(len(model.blocks))]
        if not getattr(model, "pyramid_levels", None):  # ViTDet's pyramid: its levels are the pyramid's
            assert model._num_levels() == len(model.blocks)


def test_every_family_module_registers_backbones_only() -> None:
    from vit_attention.models import list_models

    classes = {get_model_entry(n).model_cls for n in list_models()}
    assert all(issubclass(c, Backbone) for c in classes)
    assert len(builtin_families()) >= 16


@pytest.mark.registry
@pytest.mark.parametrize("family,name", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_config_resolution_is_the_base_s(family: str, name: str) -> None:
    entry = get_model_entry(name)
    cls = entry.model_cls
    cfg = entry.config(**small_overrides(name))
    model = cls(cfg)
    assert model.cfg == cfg and model.cfg is not cfg  # a copy: reset_classifier never edits the caller's config
    assert cls(cfg, num_classes=3).num_classes == 3 and cfg.num_classes == 10
    with pytest.raises(TypeError, match=f"cfg must be a {cls.config_cls.__name__}"):
        cls(object())
    with pytest.raises(TypeError, match="num_classes"):
        cls(cfg, num_classes="ten")


@pytest.mark.registry
@pytest.mark.parametrize("family,name", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_reset_classifier_and_pools_are_the_base_s(family: str, name: str) -> None:
    model = create_model(name, **small_overrides(name)).eval()
    cls = type(model)
    with pytest.raises(ValueError, match="global_pool must be one of"):
        model.reset_classifier(5, global_pool="nope")
    if "token" in cls.pools and not model.num_prefix_tokens:
        with pytest.raises(ValueError, match="class token"):
            model.reset_classifier(5, global_pool="token")
    model.reset_classifier(0)
    assert model.num_classes == 0 and model.cfg.num_classes == 0
    x = torch.randn(2, *_input_shape(model))
    with torch.no_grad():
        pooled = model(x)
    assert pooled.shape == (2, model.num_features)
    model.reset_classifier(4)
    with torch.no_grad():
        assert model(x).shape == (2, 4)
    model.set_grad_checkpointing(True)
    flags = [m.grad_checkpointing for m in model.modules() if hasattr(m, "grad_checkpointing")]
    assert flags and all(flags)
    nwd = model.no_weight_decay()
    names = dict(model.named_parameters())
    assert nwd <= set(names) and all(any(k in n for k in cls.no_weight_decay_keys) for n in nwd)


def _input_shape(model: Backbone) -> tuple[int, ...]:
    cfg = model.cfg
    size = getattr(cfg, "img_size", 32)
    h, w = (size, size) if isinstance(size, int) else size
    return (getattr(cfg, "in_chans", 3), h, w)


def test_backbone_docstrings_name_shapes() -> None:
    # Backbone's own public methods (vars, not getmembers: transformers patches nn.Module itself with
    # undocumented helpers such as smart_apply once an HF model was built in this process)
    own = {n: f for n, f in vars(Backbone).items() if inspect.isfunction(f) and not n.startswith("_")}
    assert {"forward", "forward_head", "pool", "set_input_size", "reset_classifier"} <= set(own)
    for name, fn in own.items():
        assert fn.__doc__, f"Backbone.{name} has no docstring"


POOL_SWITCH_CASES = sorted({*(n for _, n in FAMILIES), "vit_base_patch16_224", "eva02_base_patch14_224",
                            "vit_base_patch16_siglip_224"})


@pytest.mark.registry
@pytest.mark.parametrize("name", POOL_SWITCH_CASES)
def test_a_model_with_another_pool_saves_and_loads_back_as_it_is(name: str, tmp_path) -> None:
    """``reset_classifier(n, global_pool=p)`` then ``save_weights`` / ``load_model``: the same keys and logits for
    every pool the model can switch to (ViT derives fc_norm / norm and the attention-pool head from the pooling
    it was built with: those must not change on the rebuild)."""
    from vit_attention import load_model, save_weights

    base = create_model(name, **small_overrides(name)).eval()
    x = torch.randn(2, *_input_shape(base), generator=torch.Generator().manual_seed(0))
    pools = [p for p in type(base).pools if p != base.global_pool and not (p == "token" and not base.num_prefix_tokens)
             and p != "map"]
    for pool in pools:
        model = create_model(name, **small_overrides(name)).eval()
        if pool == "token" and not getattr(model.cfg, "class_token", True):  # prefix tokens, but registers only
            with pytest.raises(ValueError, match="global_pool='token'.*class_token"):
                model.reset_classifier(3, global_pool=pool)
            assert model.global_pool == base.global_pool and model.num_classes == base.num_classes
            continue
        model.reset_classifier(3, global_pool=pool)
        back = load_model(save_weights(model, tmp_path / f"{pool or 'none'}.safetensors")).eval()
        assert back.global_pool == pool and back.state_dict().keys() == model.state_dict().keys()
        with torch.no_grad():
            torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)
    if getattr(base, "attn_pool", None) is not None:  # leaving "map" removes the attention-pool head (timm)
        base.reset_classifier(3, global_pool="avg")
        assert base.attn_pool is None and not any(k.startswith("attn_pool.") for k in base.state_dict())


def test_reset_classifier_checks_every_argument_before_changing_anything() -> None:
    name = first_preset_per_family()["vit"]
    model = create_model(name, **small_overrides(name))
    pool = model.global_pool
    with pytest.raises(TypeError, match="num_classes"):
        model.reset_classifier("3", global_pool="avg" if pool != "avg" else "token")
    assert model.global_pool == pool and model.cfg.global_pool == pool


@pytest.mark.registry
@pytest.mark.parametrize("name", ["cvt_13_224", "cait_xxs24_224", "igpt_small"])
def test_bare_linear_heads_use_the_base_forward_head(name: str) -> None:
    """CvT, CaiT and iGPT keep a bare ``Linear`` head (the originals' key ``head``): the base's forward_head pools,
    drops and classifies for them, and pre_logits is the pooled features."""
    model = create_model(name, **small_overrides(name)).eval()
    assert type(model).head_fc is None
    assert next(c for c in type(model).__mro__ if "forward_head" in vars(c)) is Backbone
    size = model.cfg.img_size if isinstance(model.cfg.img_size, int) else model.cfg.img_size[0]
    x = torch.randn(2, model.cfg.in_chans, size, size)
    with torch.no_grad():
        feats = model.forward_features(x)
        pooled = model.forward_head(feats, pre_logits=True)
        torch.testing.assert_close(pooled, model.pool(feats))
        torch.testing.assert_close(model.forward_head(feats), model.head(pooled))


def _timm_grouping(matcher: dict, names: list[str]) -> dict[str, tuple[int, ...]]:
    """What timm's ``group_with_matcher`` makes of a ``group_matcher`` dict: the ordinal of each name (its first
    matching rule in order: the stem's, then the blocks'), written here from timm's documented format."""
    import re

    rules = [(re.compile(matcher["stem"]), (0,), ())]
    rules += [(re.compile(rx), (1,), suffix) for rx, suffix in matcher["blocks"]]
    out = {}
    for name in names:
        hit = next(((prefix + tuple(suffix)) for rx, prefix, suffix in rules if rx.match(name)), None)
        assert hit is not None, f"{name} matches no rule"
        out[name] = hit
    return out


@pytest.mark.registry
@pytest.mark.parametrize("family,name", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_layer_ids_and_group_matcher(family: str, name: str) -> None:
    with torch.device("meta"):
        model = create_model(name, num_classes=10)
    ids, depth = layer_ids(model)
    blocks = model.block_names()
    params = [n for n, _ in model.named_parameters()]
    assert depth == len(blocks) > 0 and set(ids) == set(params)
    for i, block in enumerate(blocks, 1):  # every block's parameters are its layer, in forward order
        inside = [n for n in params if n.startswith(block + ".")]
        assert inside and all(ids[n] == i for n in inside), block
    assert set(ids.values()) == set(range(depth + 2))  # a stem, every block, a head
    head = model.get_classifier()
    assert isinstance(head, torch.nn.Linear) and head.out_features == 10
    assert all(ids[n] == depth + 1 for n in params if n in {f"{k}.weight" for k, m in model.named_modules()
                                                              if m is head})
    # the image is read in the stem: the convolution that reads it (the loader's, weights/load.py) is layer 0;
    # iGPT and NaFlexViT read it through an embedding table / a Linear, registered first or as late stem
    conv = _input_conv(model)
    first = f"{conv[0]}.weight" if conv else next(n for n in params if "embed" in n)
    assert ids[first] == 0, first
    # timm's group_with_matcher reading our group_matcher gives the same grouping as layer_ids (checked against
    # timm 1.0.31's param_groups_layer_decay itself on every family, docs/training.md); no rule uses timm's
    # (99999,), "join the previous group", which would fold the head into the last block's rate
    matcher = model.group_matcher()
    assert all(suffix != (99999,) for _, suffix in matcher["blocks"])
    grouping = _timm_grouping(matcher, params)
    order = sorted(set(grouping.values()))
    assert [order.index(grouping[n]) for n in params] == [ids[n] for n in params]
    coarse = _timm_grouping(model.group_matcher(coarse=True), params)
    assert len(set(coarse.values())) <= len(order)
    assert model.default_cfg is model.pretrained_cfg


def test_get_classifier_and_reset() -> None:
    model = create_model("swin_tiny_patch4_window7_224", num_classes=5, depths=(1, 1, 1, 1), embed_dim=32,
                         num_heads=(1, 1, 1, 1))
    assert model.get_classifier() is model.head.fc and model.get_classifier().out_features == 5
    model.reset_classifier(0)
    assert isinstance(model.get_classifier(), torch.nn.Identity)


def _count_module_calls(model: torch.nn.Module, fn) -> int:
    """How many submodule forwards ``fn()`` runs."""
    calls = [0]
    hooks = [m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1)) for m in model.modules()]
    try:
        with torch.no_grad():
            fn()
    finally:
        for h in hooks:
            h.remove()
    return calls[0]


@pytest.mark.registry
@pytest.mark.parametrize("family,name", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_intermediates_only_stops_at_the_last_level_and_pruning_keeps_the_maps(family: str, name: str) -> None:
    """``forward_intermediates(..., intermediates_only=True)`` runs nothing after the last chosen level, and
    ``prune_intermediate_layers`` (timm's API) removes it for good: the chosen maps stay the same."""
    import copy

    from model_outputs import build

    model, x = build(name, small_overrides(name))
    levels = len(model.feature_info)
    first = model.forward_intermediates(x, [0], intermediates_only=True)
    full = _count_module_calls(model, lambda: model.forward_intermediates(x, [0]))
    only = _count_module_calls(model, lambda: model.forward_intermediates(x, [0], intermediates_only=True))
    if getattr(model, "pyramid_levels", None):  # ViTDet's pyramid: every level from the last block; only the
        full = _count_module_calls(model, lambda: model.forward_intermediates(x))  # chosen levels' convs run
    assert only < full
    for indices in ([0], [levels - 2] if levels > 1 else [0]):
        pruned = copy.deepcopy(model)
        take = pruned.prune_intermediate_layers(indices)
        assert take == indices and pruned.num_classes == 0
        assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())
        with torch.no_grad():
            got = pruned.forward_intermediates(x, take, intermediates_only=True)
            want = model.forward_intermediates(x, take, intermediates_only=True)
            final, _ = pruned.forward_intermediates(x, take)  # the final output still computes
        assert len(got) == len(want) == 1
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        if isinstance(pruned, IsotropicBackbone) and final.ndim == 3:  # its prefix tokens, then the tapped grid
            assert final.shape[1] == pruned.num_prefix_tokens + got[0].shape[-2] * got[0].shape[-1]
    torch.testing.assert_close(first[0], model.forward_intermediates(x, [0])[1][0], rtol=0, atol=0)
    assert model.head_hidden_size == (getattr(model.cfg, "representation_size", None) or model.num_features)


def test_head_hidden_size_is_the_representation_layer_where_there_is_one() -> None:
    model = create_model("vit_base_patch16_224_in21k", depth=1, embed_dim=32, num_heads=2, representation_size=48)
    assert model.head_hidden_size == 48 == model.get_classifier().in_features
    plain = create_model("vit_base_patch16_224", depth=1, embed_dim=32, num_heads=2)
    assert plain.head_hidden_size == 32 == plain.get_classifier().in_features
