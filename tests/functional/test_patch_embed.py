"""resample_patch_embed (functional/patch_embed.py): timm parity, the defining identity, caching, errors."""

import json

import pytest
import torch
import torch.nn.functional as F
from fixture_utils import FIXTURES, assert_parity
from safetensors import safe_open

from vit_attention.functional import patch_embed as pe
from vit_attention.functional import resample_patch_embed
from vit_attention.functional.patch_embed import patch_resize_matrix


def _kernel_fixture() -> tuple[dict, dict]:
    with safe_open(str(FIXTURES / "timm_resample_patch_embed.safetensors"), framework="pt") as f:
        cases = json.loads(f.metadata()["cases"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return cases, tensors


_CASES, _TENSORS = _kernel_fixture()


def test_fixture_covers_up_down_rect_and_both_modes():
    kinds = {(n[2] * n[3] >= n[0] * n[1], n[0] != n[1], n[4]) for n in _CASES.values()}
    assert {(True, False, "bicubic"), (False, False, "bicubic"), (True, True, "bicubic"), (False, True, "bicubic"),
            (True, False, "bilinear"), (False, False, "bilinear"), (True, True, "bilinear")} <= kinds


@pytest.mark.parametrize("name", sorted(_CASES))
def test_matches_timm(name):
    oh, ow, nh, nw, mode, aa = _CASES[name]
    w, ref = _TENSORS[f"kernel.{name}"], _TENSORS[f"resampled.{name}"]
    out = resample_patch_embed(w, (nh, nw), interpolation=mode, antialias=aa)
    assert out.shape == (6, 3, nh, nw) == ref.shape and out.dtype == w.dtype
    assert_parity(out, ref, rel=1e-5)  # measured <= 1.3e-6 relative (timm: pinv in fp32, ours in fp64)


def _resize(x, size, mode="bicubic", aa=True):
    return F.interpolate(x, size=size, mode=mode, antialias=aa, align_corners=False)


@pytest.mark.parametrize("old,new,mode,aa", [
    ((8, 8), (16, 16), "bicubic", True), ((8, 8), (12, 12), "bicubic", True), ((6, 4), (9, 10), "bicubic", True),
    ((16, 16), (30, 30), "bilinear", False), ((7, 5), (7, 11), "bilinear", False)])
def test_upsampling_preserves_tokens(old, new, mode, aa):
    """<x, w> = <resize(x), w'> for every patch x: exact up to fp32 rounding when upsampling."""
    torch.manual_seed(0)
    w = torch.randn(8, 3, *old)
    w2 = resample_patch_embed(w, new, interpolation=mode, antialias=aa)
    x = torch.randn(16, 3, *old)
    tok = F.conv2d(x, w).flatten(1)  # [16, 8]
    tok2 = F.conv2d(_resize(x, new, mode, aa), w2).flatten(1)
    assert_parity(tok2, tok, rel=1e-5)


def test_downsampling_is_least_squares():
    """Downsampling cannot keep every token: w' is the least-squares solution of B^T w' = w."""
    torch.manual_seed(0)
    w = torch.randn(4, 2, 8, 8)
    w2 = resample_patch_embed(w, (4, 4))
    B = patch_resize_matrix((8, 8), (4, 4))  # [16, 64]
    flat = w.reshape(8, 64).double()
    lstsq = torch.linalg.lstsq(B.T, flat.T).solution.T  # argmin |B^T v - w|, min-norm: [8, 16]
    torch.testing.assert_close(w2.reshape(8, 16).double(), lstsq, atol=1e-5, rtol=1e-5)
    x = torch.randn(32, 2, 8, 8)
    err = (F.conv2d(_resize(x, (4, 4)), w2) - F.conv2d(x, w)).abs().max()
    assert err > 0.1  # information is lost: no identity here


def test_resize_matrix_is_the_resize():
    torch.manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64)
    B = patch_resize_matrix((5, 7), (8, 3))
    ref = _resize(x[None, None], (8, 3))[0, 0].flatten()
    torch.testing.assert_close(B @ x.flatten(), ref)
    # nearest: each new pixel copies one old pixel
    Bn = patch_resize_matrix((4, 4), (8, 8), interpolation="nearest")
    assert torch.equal(Bn.sum(1), torch.ones(64, dtype=torch.float64))


def test_identity_dtype_device_and_cache():
    w = torch.randn(4, 3, 8, 8)
    assert resample_patch_embed(w, 8) is w and resample_patch_embed(w, (8, 8)) is w
    pe._pinv_f64.cache_clear()
    h = resample_patch_embed(w.half(), (12, 12))
    assert h.dtype == torch.float16 and h.shape == (4, 3, 12, 12)
    resample_patch_embed(w, (12, 12))
    resample_patch_embed(w, (12, 12), antialias=False)
    info = pe._pinv_f64.cache_info()
    assert info.hits == 1 and info.misses == 2  # one pinv per (old, new, mode, antialias)
    torch.testing.assert_close(h.float(), resample_patch_embed(w, 12), atol=2e-3, rtol=2e-3)
    # the returned resize matrix is a copy: editing it leaves the cache intact
    patch_resize_matrix((8, 8), (12, 12)).zero_()
    assert patch_resize_matrix((8, 8), (12, 12)).abs().sum() > 0


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="weight"):
        resample_patch_embed(torch.randn(3, 8, 8), (4, 4))
    with pytest.raises(ValueError, match="new_size"):
        resample_patch_embed(torch.randn(2, 3, 8, 8), (0, 4))
    with pytest.raises(ValueError, match="new_size"):
        resample_patch_embed(torch.randn(2, 3, 8, 8), (4, 4, 4))
    with pytest.raises(ValueError, match="interpolation"):
        resample_patch_embed(torch.randn(2, 3, 8, 8), (4, 4), interpolation="lanczos")
