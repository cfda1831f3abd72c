"""Window attention (Swin W-MSA / SW-MSA, SwinV2 cosine, Twins LSA, ViTDet windows) on the flex backend.

The flex path runs ONE FlexAttention call over the window-major sequence of the whole (padded,
shifted) map with the pattern of ``functional.window_attention.window_pattern``; it must give the
explicit path's output and gradients (inputs, the relative-position table, the CPB MLP, ViTDet's
tables) for every option: shift on / off, both pad orders, odd sizes, masked padding, rectangular
windows, and windows spaced apart in the sequence (the stride that fits them to the blocks).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import torch
from flex_utils import (
    assert_compiled_flex_matches_explicit,
    assert_flex_matches_explicit,
    recorded_patterns,
    run_backend,
)
from model_outputs import build, small_overrides

from vit_attention import create_attention
from vit_attention.attention import set_attention_backend
from vit_attention.attention.window import WindowAttentionBase
from vit_attention.functional import flex
from vit_attention.functional.window import (
    shift_window_mask,
    window_sequence_gather_index,
    window_sequence_stride,
    window_sequence_tables,
)
from vit_attention.functional.window_attention import window_geometry, window_pattern

pytestmark = pytest.mark.compile

wa = importlib.import_module("vit_attention.functional.window_attention")  # the module, not the function


@contextlib.contextmanager
def spaced_windows(extra: int) -> Iterator[None]:
    """Inside: every window takes ``N + extra`` positions of the sequence (small maps would keep ``N``)."""
    with mock.patch.object(wa, "window_sequence_stride", lambda nW, N: N + extra):
        yield


def _geometry(module: torch.nn.Module, hw: tuple[int, int]) -> tuple[int, int]:
    """``(nW, N)`` of the module's windows on an ``hw`` map (the window clamped to a smaller map)."""
    fitted = module.fitted_window(*hw)
    window, shift = fitted if isinstance(fitted[0], tuple) else (fitted, 0)  # window attention | rel_pos
    (Hp, Wp), _ = window_geometry(*hw, window, shift, pad_first=getattr(module, "pad_first", True))
    wh, ww = window
    return (Hp // wh) * (Wp // ww), wh * ww


def _check(name: str, hw: tuple[int, int], extra: int, dim: int = 8, heads: int = 2, pad_mask: bool = False,
           **kwargs: Any) -> None:
    torch.manual_seed(0)
    module = create_attention(name, dim, heads, **kwargs).eval()
    if pad_mask:
        module.pad_mask = True  # Swin / SwinV2: the class default False, set per instance
    x = torch.randn(2, *hw, dim, generator=torch.Generator().manual_seed(1))
    nW, N = _geometry(module, hw)
    with spaced_windows(extra) if extra else contextlib.nullcontext(), recorded_patterns() as patterns:
        assert_flex_matches_explicit(module, lambda: [x])
        stride = wa.window_sequence_stride(nW, N)
    # the pattern path ran: one pattern per attention call, over the whole sequence, with a cache key
    assert len(patterns) == 1
    (pattern,) = patterns
    assert pattern.num_queries == pattern.num_keys == nW * stride
    assert pattern.cache_key is not None and pattern.cache_key[:3] == ("window", N, stride)


ODD = (7, 10)  # padded to 8 x 12 by a window of 4: both axes padded


@pytest.mark.parametrize("extra", [0, 5], ids=["stride=N", "spaced"])
@pytest.mark.parametrize(("hw", "shift", "pad_first", "pad_mask"), [
    ((8, 8), 0, True, False),
    ((8, 8), 2, True, False),
    (ODD, 0, True, False),
    (ODD, 0, True, True),
    (ODD, 2, True, False),
    (ODD, 2, False, False),
    (ODD, 2, True, True),
    (ODD, 2, False, True),
    ((3, 10), 2, True, False),  # pad first: the padded height fits one window, that axis is not shifted
    ((3, 10), 2, False, True),
])
def test_swin_window_flex_equals_explicit(hw: tuple[int, int], shift: int, pad_first: bool, pad_mask: bool,
                                          extra: int) -> None:
    _check("window", hw, extra, window_size=4, shift_size=shift, pad_first=pad_first, pad_mask=pad_mask)


@pytest.mark.parametrize("extra", [0, 3], ids=["stride=N", "spaced"])
@pytest.mark.parametrize(("hw", "shift", "pad_first"), [((6, 8), (0, 0), True), (ODD, (1, 2), True),
                                                         (ODD, (1, 2), False), ((5, 9), (2, 0), True)])
def test_rectangular_windows(hw: tuple[int, int], shift: tuple[int, int], pad_first: bool, extra: int) -> None:
    """``(Wh, Ww) = (3, 4)``: the table is read by (Δrow, Δcol) of a non-square window."""
    _check("window", hw, extra, window_size=(3, 4), shift_size=shift, pad_first=pad_first)


@pytest.mark.parametrize("extra", [0, 5], ids=["stride=N", "spaced"])
@pytest.mark.parametrize(("hw", "shift", "pad_first", "pad_mask"), [
    ((8, 8), 0, True, False),
    ((8, 8), 2, True, False),
    (ODD, 2, True, False),
    (ODD, 2, False, False),
    (ODD, 2, False, True),
])
def test_cosine_window_flex_equals_explicit(hw: tuple[int, int], shift: int, pad_first: bool, pad_mask: bool,
                                            extra: int) -> None:
    """SwinV2: q, k normalised and the temperature folded into q before the call; the CPB MLP's bias in
    score_mod (the MLP and logit_scale get their gradients)."""
    _check("cosine_window", hw, extra, window_size=4, shift_size=shift, pad_first=pad_first, pad_mask=pad_mask,
           cpb_hidden=16)


@pytest.mark.parametrize("extra", [0, 5], ids=["stride=N", "spaced"])
@pytest.mark.parametrize(("hw", "pad_mask"), [((8, 8), False), (ODD, False), (ODD, True)])
def test_lsa_flex_equals_explicit(hw: tuple[int, int], pad_mask: bool, extra: int) -> None:
    """Twins LSA: windows, no bias, no shift (no score_mod), padded keys masked or taking part."""
    _check("lsa", hw, extra, window_size=4, pad_mask=pad_mask)


@pytest.mark.parametrize("extra", [0, 5], ids=["stride=N", "spaced"])
@pytest.mark.parametrize("hw", [(8, 8), ODD])
def test_vitdet_windows_flex_equals_explicit(hw: tuple[int, int], extra: int) -> None:
    """ViTDet's query-dependent decomposed bias (``query_bias``) read per query and window slot in score_mod."""
    _check("rel_pos", hw, extra, window_size=4, rel_pos_zero_init=False)


@pytest.mark.parametrize(("name", "hw", "kwargs"), [
    ("window", (14, 14), dict(shift_size=3)),
    ("window", (13, 15), dict(shift_size=3, pad_first=False)),
    ("cosine_window", (13, 15), dict(shift_size=3, cpb_hidden=16)),
    ("lsa", (13, 15), dict(pad_mask=True)),
    ("rel_pos", (13, 15), dict(rel_pos_zero_init=False)),
])
def test_swin_window_of_7_spaces_windows_to_64(name: str, hw: tuple[int, int], kwargs: dict[str, Any]) -> None:
    """Window 7 (N = 49) on a map of 4 or 6 windows: the chosen stride is 64 (2 windows per 128-block)."""
    module = create_attention(name, 8, 2, window_size=7, **kwargs)
    assert window_sequence_stride(*_geometry(module, hw)) == 64
    _check(name, hw, 0, window_size=7, **kwargs)


def test_auto_and_explicit_never_build_a_pattern() -> None:
    """"auto" keeps its paths (no pattern, no block mask); "flex" builds one."""
    module = create_attention("window", 8, 2, window_size=4, shift_size=2).eval()
    x = torch.randn(1, 7, 10, 8)
    for backend in ("auto", "explicit", "sdpa"):
        with recorded_patterns() as patterns:
            run_backend(module, backend, lambda: [x], backward=True)
        assert patterns == []
    with recorded_patterns() as patterns, torch.no_grad():
        set_attention_backend(module, "flex")
        module(x)
    assert len(patterns) == 1


def test_block_masks_are_reused_and_shared_by_shifted_and_plain_blocks() -> None:
    """A second call builds no block mask; W-MSA and SW-MSA blocks of one size share theirs (same key)."""
    flex.clear_block_mask_cache()
    x = torch.randn(1, 8, 12, 8)
    plain = create_attention("window", 8, 2, window_size=4, backend="flex").eval()
    shifted = create_attention("window", 8, 2, window_size=4, shift_size=2, backend="flex").eval()
    with torch.no_grad():
        plain(x)
        size = len(flex._BLOCK_MASKS)
        plain(x)
        shifted(x)
        assert len(flex._BLOCK_MASKS) == size == 1
        masked = create_attention("lsa", 8, 2, window_size=4, pad_mask=True, backend="flex").eval()
        masked(x[:, :7, :10])
        masked(x[:, :7, :10])
        assert len(flex._BLOCK_MASKS) == 2  # masked padding: its own key (the map geometry)


def test_flex_forward_in_any_grad_mode_and_cpu_training_refused() -> None:
    module = create_attention("window", 8, 2, window_size=4, shift_size=2, backend="flex")
    x = torch.randn(1, 7, 10, 8)
    with torch.no_grad():
        out = module(x)
    set_attention_backend(module, "explicit")
    with torch.no_grad():
        torch.testing.assert_close(out, module(x))
    set_attention_backend(module, "flex")
    y = module(x)  # grad mode: the forward runs, the backward raises
    torch.testing.assert_close(y.detach(), out)
    with pytest.raises(NotImplementedError, match="no backward on CPU"):
        y.sum().backward()


@pytest.mark.parametrize(("name", "hw"), [("window", (8, 8)), ("window", ODD), ("rel_pos", ODD), ("lsa", (8, 8))])
def test_empty_batch_on_flex(name: str, hw: tuple[int, int]) -> None:
    module = create_attention(name, 8, 2, window_size=4, backend="flex")
    assert module(torch.randn(0, *hw, 8)).shape == (0, *hw, 8)


@pytest.mark.parametrize(("hw", "shift", "pad_first"), [((8, 8), 2, True), (ODD, 2, True), (ODD, 2, False),
                                                        ((3, 10), 2, True)])
def test_pattern_dense_bias_is_the_explicit_bias(hw: tuple[int, int], shift: int, pad_first: bool) -> None:
    """The pattern evaluated densely, read back at each window's block, is position bias + Swin's shift mask."""
    nh, ws = 2, 4
    (Hp, Wp), applied = window_geometry(*hw, ws, shift, pad_first=pad_first)
    N, nW = ws * ws, (Hp // ws) * (Wp // ws)
    position_bias = torch.randn(nh, N, N)
    stride = N + 3
    pattern = window_pattern(hw, ws, applied, pad_first=pad_first, stride=stride, position_bias=position_bias)
    bias = pattern.dense_bias(1, nh)[0]  # [nh, L, L]
    mask = pattern.dense_mask()[0, 0]  # [L, L]
    expected = position_bias[None] + shift_window_mask(Hp, Wp, ws, applied)[:, None]  # [nW, nh, N, N]
    for w in range(nW):
        block = slice(w * stride, w * stride + N)
        torch.testing.assert_close(bias[:, block, block], expected[w], rtol=0, atol=0)
        assert mask[block, block].all()
    # every query (spacing slots too: their rows are discarded) sees its window's N keys and nothing else
    assert int(mask.sum()) == nW * stride * N
    spacing = torch.arange(mask.shape[-1]) % stride >= N
    assert not mask[:, spacing].any()


def test_sequence_gather_round_trip() -> None:
    """Tokens gathered into the spaced window-major sequence and back are the tokens (every option)."""
    for hw, shift, pad_first in [((8, 8), 0, True), (ODD, 2, True), (ODD, 2, False), ((3, 10), (2, 1), True)]:
        H, W = hw
        (Hp, Wp), applied = window_geometry(H, W, 4, shift, pad_first=pad_first)
        nh, stride = 3, 21
        x = torch.randn(2, H * W + 1, 3, nh, 1)  # + the zero token's slot
        x[:, -1] = 0
        rows, out_rows = window_sequence_gather_index(H, W, 4, applied, nh, pad_first=pad_first, stride=stride)
        seq = x.reshape(2, -1, 1).index_select(1, rows).view(2, 3, nh, -1)  # [B, 3, nh, L]
        back = seq[:, 0].reshape(2, -1, 1).index_select(1, out_rows).view(2, H * W, nh)
        torch.testing.assert_close(back, x[:, : H * W, 0, :, 0])
        region, valid = window_sequence_tables(H, W, 4, applied, pad_first=pad_first, stride=stride,
                                               mask_padding=True)
        assert region.numel() == valid.numel() == seq.shape[-1] == (Hp * Wp // 16) * stride
        assert int(valid.sum()) == H * W  # map tokens only: no padded slot, no spacing slot


def _computed_blocks(block_mask: Any) -> int:
    return int(block_mask.kv_num_blocks.sum()) + int(0 if block_mask.full_kv_num_blocks is None
                                                       else block_mask.full_kv_num_blocks.sum())


@pytest.mark.parametrize(("hw", "computed", "total"), [((56, 56), 32, 32 * 32), ((14, 14), 2, 4)])
def test_block_mask_skips_blocks_at_swin_t_sizes(hw: tuple[int, int], computed: int, total: int) -> None:
    """Swin-T stage 1 (56x56) and stage 3 (14x14), window 7, shift 3: the windows spaced to 64 positions make the
    block mask block-diagonal (2 windows per 128-block): 32 of 1024 blocks computed (96.9 % skipped) and
    2 of 4; without spacing 73 of 625 and 4 of 4, row-major 121 of 625 and 4 of 4 (docs/swin.md)."""
    nW, N = (hw[0] // 7) * (hw[1] // 7), 49
    stride = window_sequence_stride(nW, N)
    assert stride == 64
    pattern = window_pattern(hw, 7, (3, 3), stride=stride)
    block_mask = flex.block_mask_for(pattern, torch.device("cpu"))
    assert _computed_blocks(block_mask) == computed
    assert block_mask.kv_num_blocks.shape[-1] ** 2 == total
    assert block_mask.sparsity() > 0
    print(f"\n{hw[0]}x{hw[1]}: block sparsity {block_mask.sparsity():.1f} % ({computed} of {total} blocks)")


@pytest.mark.registry
@pytest.mark.parametrize("name", ["twins_svt_small", "swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256"])
def test_reduced_models_on_flex(name: str) -> None:
    """Twins-SVT (LSA + global sub-sampled attention), Swin and SwinV2 with shifted windows at reduced size."""
    model, x = build(name, small_overrides(name))
    assert_flex_matches_explicit(model, lambda: [x[:1]])
    set_attention_backend(model, "flex")
    with recorded_patterns() as patterns, torch.no_grad():
        model(x[:1].double())  # the comparison left the model in float64
    windowed = [m for m in model.modules() if isinstance(m, WindowAttentionBase)]
    assert windowed and len([p for p in patterns if (p.cache_key or ("",))[0] == "window"]) == len(windowed)


@pytest.mark.parametrize(("name", "hw", "kwargs"), [
    ("window", (13, 15), dict(window_size=7, shift_size=3)),  # spaced windows (S = 64), shift, padding
    ("cosine_window", (8, 8), dict(window_size=4, shift_size=2, cpb_hidden=16)),
    ("lsa", (7, 10), dict(window_size=4, pad_mask=True)),
    ("rel_pos", (7, 10), dict(window_size=4)),
])
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")  # cached index tables
def test_flex_path_traces_without_graph_breaks(name: str, hw: tuple[int, int], kwargs: dict[str, Any]) -> None:
    """torch.compile sees one graph: geometry, stride and index tables come from sizes, never from tensor values."""
    import torch._dynamo as dynamo

    module = create_attention(name, 8, 2, backend="flex", **kwargs).eval()
    dynamo.reset()
    with torch.no_grad():
        explained = dynamo.explain(module)(torch.randn(1, *hw, 8))
    dynamo.reset()
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.slow  # inductor codegen (about 10 s)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_compiled_flex_shifted_cosine_window_on_a_window_multiple() -> None:
    # SwinV2 shifted windows on an 8 x 8 map (no padding) through inductor's CPU FlexAttention kernel: the CPB
    # the graph computes lowers, v at the shifted gather's offset is read where it sits
    torch.manual_seed(0)
    module = create_attention("cosine_window", 32, 4, window_size=4, shift_size=2).eval()
    x = torch.randn((1, 8, 8, 32), generator=torch.Generator().manual_seed(4))
    assert_compiled_flex_matches_explicit(module, x)
