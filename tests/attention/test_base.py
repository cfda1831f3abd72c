"""The mechanism contract in code: :class:`AttentionModule` declares every member with its default, the registry
refuses a class that lacks one it needs, and the shared tools read the members without probing."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import Tensor, nn

from vit_attention import create_attention, list_attention
from vit_attention.analysis.flops import flops
from vit_attention.attention import AttentionCall, get_attention_spec, register_attention, registry
from vit_attention.attention.base import AttentionModule
from vit_attention.attention.transfer import carry_attention, describe_transfer
from vit_attention.layers.layout_adapter import apply_attention

NAMES = list_attention()
METHODS = ("flops", "transfer_init", "get_offset_bias", "set_offset_bias", "set_window_size", "attend_prefix")


class _Tokens(AttentionModule):
    """A minimal token mechanism: one linear map, nothing else declared (every other member is the base's)."""

    def __init__(self, dim: int, num_heads: int = 1) -> None:
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, call: AttentionCall = AttentionCall()) -> Tensor:
        """``[B, N, C] -> [B, N, C]``."""
        return self.proj(x)


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations in a test leave the library's registry as it was."""
    monkeypatch.setattr(registry, "_ATTENTION", dict(registry._ATTENTION))


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_mechanism_subclasses_the_base(name: str) -> None:
    spec = get_attention_spec(name)
    assert issubclass(spec.cls, AttentionModule)
    attn, _ = spec.example()
    assert get_attention_spec(attn.attention_name) is spec and attn.layout == spec.layout


def test_every_member_of_the_base_has_a_one_line_docstring() -> None:
    for member in METHODS + ("provides",):
        doc = inspect.getdoc(getattr(AttentionModule, member))
        assert doc and doc.strip(), member


def test_the_defaults_are_neutral(scratch_registry: None) -> None:
    attn = register_attention("scratch_tokens", layout="tokens")(_Tokens)(8)
    assert attn.flops((1, 4, 8)) is None
    assert attn.transfer_init() == []
    assert attn.get_offset_bias() is None and attn.set_offset_bias(torch.zeros(1, 3, 3)) is False
    assert dict(attn.transfer_slots) == {} and attn.offset_bias_params == ()
    assert attn.accepts == frozenset()  # reads no optional AttentionCall field
    with pytest.raises(TypeError, match="scratch_tokens.*no window to resize"):
        attn.set_window_size(4)
    with pytest.raises(ValueError, match="without attend_prefix"):
        attn.attend_prefix(torch.randn(1, 1, 8), torch.randn(1, 5, 8))
    assert not any(_Tokens.provides(m) for m in METHODS)
    with pytest.raises(AttributeError, match="member must be one of"):
        _Tokens.provides("no_such_member")


def test_the_registry_refuses_a_class_that_is_not_a_mechanism(scratch_registry: None) -> None:
    class Plain(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x

    with pytest.raises(TypeError, match=r"'scratch_plain'.*'Plain' lacks the base class AttentionModule"):
        register_attention("scratch_plain", layout="tokens")(Plain)
    assert "scratch_plain" not in list_attention()


def test_the_registry_names_the_members_a_class_lacks(scratch_registry: None) -> None:
    class NoForward(AttentionModule):
        pass

    with pytest.raises(TypeError, match="'NoForward' lacks forward, attend_prefix"):
        register_attention("scratch_noforward", layout="spatial")(NoForward)
    # a spatial mechanism whose prefix tokens are refused rather than attended needs no attend_prefix
    register_attention("scratch_spatial", layout="spatial", prefix_tokens="attend")(type("Ok", (_Tokens,), {}))
    assert "scratch_spatial" in list_attention()


def test_a_mechanism_with_the_defaults_runs_through_the_shared_tools(scratch_registry: None) -> None:
    """Adapter (residual added outside), FLOP counting (no closed form: its layers counted) and weight
    transfer (no slots: only what matches by name and shape) all take a mechanism that declares nothing beyond
    ``forward``."""
    cls = register_attention("scratch_tools", layout="tokens")(_Tokens)
    torch.manual_seed(0)
    attn = cls(8).eval()
    x, r = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    torch.testing.assert_close(apply_attention(attn, x, AttentionCall(residual=r)), r + attn.proj(x))
    with pytest.raises(ValueError, match=r"_Tokens \('scratch_tools'\) takes no tome"):
        apply_attention(attn, x, AttentionCall(tome=object()))
    assert flops(attn, (2, 5, 8)).total == 2 * 5 * 8 * 8  # the Linear's multiply-adds
    source = create_attention("mhsa", 8, 2)
    carried, notes = carry_attention(source, attn)
    assert carried == ["proj"] and "q, k, v, o: no counterpart here, not carried" in notes
    torch.testing.assert_close(attn.proj.weight, source.proj.weight)
    assert describe_transfer(attn)[0] == "* no projection is carried in"


@pytest.mark.parametrize("name", NAMES)
def test_provides_matches_what_each_mechanism_defines(name: str) -> None:
    """``provides`` tells an override from the base's default: window resizing only where the mechanism keeps a
    window, offset biases in pairs, and every registered mechanism has a closed-form FLOP count."""
    cls = get_attention_spec(name).cls
    assert cls.provides("flops")
    assert cls.provides("set_offset_bias") == cls.provides("get_offset_bias") == bool(cls.offset_bias_params)
    assert cls.provides("set_window_size") == any("set_window_size" in vars(c) for c in cls.__mro__[:-3])
    if get_attention_spec(name).prefix_tokens == "global":
        assert cls.provides("attend_prefix")


def test_a_swin_without_windows_refuses_set_input_size() -> None:
    """Every mechanism has ``set_window_size`` now (the base's raises): Swin asks ``provides`` before changing."""
    from vit_attention import create_model

    model = create_model("swin_tiny_patch4_window7_224", pretrained=False, depths=(1, 1, 1, 1), embed_dim=32,
                         num_heads=(1, 2, 4, 8), attn_layer="neighborhood", img_size=64, window_size=2)
    with pytest.raises(TypeError, match="has no window to resize"):
        model.set_input_size(96)


@pytest.mark.parametrize("name", NAMES)
def test_the_constructor_preamble_sets_the_shared_members(name: str) -> None:
    """``init_attention``: every mechanism has the captured switches, ``dim`` / ``num_heads`` and a dropout
    probability for the core; a bad dropout is refused by name before anything is built."""
    spec = get_attention_spec(name)
    attn, shape = spec.example()
    assert isinstance(attn.fused_attention, bool) and attn.attention_backend in ("auto", "sdpa", "explicit", "flex")
    assert attn.dim == shape[-1] and attn.num_heads == spec.example_heads and isinstance(attn.attn_drop, float)
    if "attn_drop" in spec.init_kwargs:
        with pytest.raises(ValueError, match=r"attn_drop must be in \[0, 1\)"):
            spec.cls(shape[-1], spec.example_heads, **{**spec.example_kwargs, "attn_drop": 1.5})


def test_the_preamble_creates_no_parameter_and_draws_no_random_number() -> None:
    module = AttentionModule()
    state = torch.get_rng_state()
    assert module.init_attention(12, 3, attn_drop=0.1, proj_drop=0.2) == 4
    assert torch.equal(state, torch.get_rng_state()) and list(module.parameters()) == []
    assert (module.dim, module.num_heads, module.head_dim, module.attn_drop) == (12, 3, 4, 0.1)
    assert module.proj_drop.p == 0.2
    with pytest.raises(ValueError, match="dim=12 must be divisible by num_heads=5"):
        AttentionModule().init_attention(12, 5)
    with pytest.raises(ValueError, match=r"proj_drop must be in \[0, 1\)"):
        AttentionModule().init_attention(12, 3, proj_drop=1.0)


@pytest.mark.parametrize("training,p", [(False, 0.5), (True, 0.0), (True, 0.5)])
def test_the_output_tail_is_residual_plus_dropped_projection(training: bool, p: float) -> None:
    """``project_out``: ``residual + proj_drop(proj(out))`` (the add fused into the projection where the dropout
    does nothing), with the module's ``proj`` or another projection."""
    module = AttentionModule()
    module.init_attention(8, 2, proj_drop=p)
    module.proj, other = nn.Linear(8, 8), nn.Linear(8, 8)
    module.train(training)
    out, res = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    for proj in (None, other):
        layer = module.proj if proj is None else other
        torch.manual_seed(1)
        got = module.project_out(out, res, proj=proj)
        torch.manual_seed(1)
        want = res + module.proj_drop(layer(out))
        torch.testing.assert_close(got, want)
        torch.manual_seed(1)
        got = module.project_out(out, proj=proj)
        torch.manual_seed(1)
        torch.testing.assert_close(got, module.proj_drop(layer(out)))


@pytest.mark.parametrize("training", [False, True])
def test_attend_runs_the_core_with_the_modules_dropout_and_switches(training: bool) -> None:
    """``attend``: the one attention function with the module's attention dropout while training (none in eval)
    and its captured ``fused`` / ``backend`` (``core_options``, which the functional helpers take too); the
    core's other keywords pass through."""
    from vit_attention.functional import scaled_dot_product_attention

    module = AttentionModule()
    module.init_attention(8, 2, attn_drop=0.5)
    module.fused_attention, module.attention_backend = False, "explicit"
    module.train(training)
    q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)
    bias = torch.randn(2, 1, 5, 5)
    torch.manual_seed(0)
    got = module.attend(q, k, v, scale=0.3, bias=bias)
    torch.manual_seed(0)
    want = scaled_dot_product_attention(q, k, v, scale=0.3, bias=bias, dropout_p=0.5 if training else 0.0,
                                        fused=False, backend="explicit")
    torch.testing.assert_close(got, want)
    no_drop = scaled_dot_product_attention(q, k, v, scale=0.3, bias=bias, fused=False, backend="explicit")
    assert torch.allclose(got, no_drop) is not training  # the dropout acts while training only
    out, weights = module.attend(q, k, v, scale=0.3, return_weights=True)
    assert out.shape == (2, 2, 5, 4) and weights.shape == (2, 2, 5, 5)
    assert module.core_options() == {"dropout_p": 0.5 if training else 0.0, "fused": False, "backend": "explicit"}


def test_observed_layout_and_merged_frame_follow_the_observers_and_the_merge() -> None:
    """``observed_layout``: None while nothing observes, the call's token layout while something does, None again
    once token merging merged rows; ``merged_frame`` opens the merge's frame only then."""
    from vit_attention.attention.base import merged_frame, observed_layout
    from vit_attention.functional.layout import token_layout
    from vit_attention.functional.observers import current_frames, register_attention_hook
    from vit_attention.functional.tome import TokenMergeState

    x = torch.randn(2, 1 + 16, 8)
    call = AttentionCall(feat_size=(4, 4), num_prefix_tokens=1)
    assert observed_layout(x, call) is None
    with merged_frame(call):
        assert current_frames() == ()
    handle = register_attention_hook(lambda *a: None, weights=False)
    try:
        assert observed_layout(x, call) == token_layout(17, (4, 4), 1)
        assert observed_layout(x, call, num_context=5) == token_layout(17, (4, 4), 1, num_context=5)
        tome = TokenMergeState(x, 1, [4], grid=(4, 4))
        tome.read_keys(torch.randn(2, 2, 17, 4))
        x = tome.merge(x)  # [2, 13, 8]: rows no longer one per grid cell
        merged = AttentionCall(feat_size=(4, 4), num_prefix_tokens=1, tome=tome)
        assert observed_layout(x, merged) is None
        with merged_frame(merged):
            (frame,) = current_frames()
            assert frame["token_map"] is tome.token_map and frame["token_size"] is tome.size
    finally:
        handle.remove()


@pytest.mark.parametrize("prop_attn", [True, False])
def test_token_merging_reads_the_keys_averaged_over_heads(prop_attn: bool) -> None:
    """``TokenMergeState.read_keys``: the keys ``[B, nh, T, hd]`` averaged over heads become the merge metric, and
    the proportional-attention bias (``log(size)``, None without ``prop_attn``) comes back."""
    from vit_attention.functional.tome import TokenMergeState

    tome = TokenMergeState(torch.randn(2, 9, 8), 1, [2], prop_attn=prop_attn)
    k = torch.randn(2, 4, 9, 2)
    bias = tome.read_keys(k)
    torch.testing.assert_close(tome.metric, k.mean(dim=1))
    assert (bias is None) is not prop_attn
    if bias is not None:
        torch.testing.assert_close(bias, torch.zeros(2, 1, 1, 9))  # every token covers one patch


@pytest.mark.parametrize("name", NAMES)
def test_no_mechanism_gives_the_core_call_another_meaning(name: str) -> None:
    """``attend(q, k, v, **options)`` is the base's call of the core for every mechanism: none defines its own
    ``attend`` (a mechanism's own helper takes another name, e.g. neighborhood's ``attend_packed(qkv)``)."""
    assert get_attention_spec(name).cls.attend is AttentionModule.attend


def test_version_cache_keeps_a_value_while_its_tensors_are_unchanged() -> None:
    import copy

    from vit_attention.attention.base import VersionCache

    cache, calls = VersionCache(), []
    w = nn.Parameter(torch.randn(3))

    def compute() -> Tensor:
        calls.append(1)
        return w.detach() * 2

    with torch.no_grad():
        first = cache.get([w], compute)
        assert cache.get([w], compute) is first and len(calls) == 1
        w.mul_(3)  # an in-place change: recomputed
        torch.testing.assert_close(cache.get([w], compute), w * 2)
        assert len(calls) == 2
        with torch.inference_mode():  # entering inference mode: recomputed
            cache.get([w], compute)
        assert len(calls) == 3
        other = nn.Parameter(w.detach().clone())  # another tensor with the same values: recomputed
        cache.get([other], compute)
        assert len(calls) == 4
        assert copy.deepcopy(cache).value is None  # a copy starts empty
    cache.get([w], compute), cache.get([w], compute)  # autograd records through w: never cached
    assert len(calls) == 6 and cache.value is None
