"""Every PyTorch method against the float64 oracle: both masks, per-head γ, odd N, r ≠ d, batch > 1,
all dtypes the CPU has; hypothesis draws shapes nobody picked by hand."""
import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from leetrepro import causal_linear_decoder
from leetrepro.methods import methods

from conftest import (assert_close_to_reference, interpreted_once, make_inputs, method_params, quick_lane,
                      random_gammas, tolerance)

TORCH_METHODS = [m.name for m in methods() if m.language == "torch"]
# small blocks so that short test sequences still cross many block boundaries
SMALL_BLOCKS = {"block-based": {"block_size": 16}, "lightningAttention-2_torch": {"block_size": 16},
                "recursion": {"base": 4}}
SHAPES = [(1, 1, 1, 4, 4), (2, 3, 37, 8, 5), (1, 2, 64, 3, 9), (3, 2, 100, 16, 16), (2, 1, 129, 7, 12)]
GAMMAS = {"mask01": None, "per_head": "random", "one": 1.0, "tiny": 1e-6, "float": 0.9}


def _gamma(kind, heads):
    g = GAMMAS[kind]
    return random_gammas(heads) if g == "random" else g


def test_all_six_families_are_registered():
    abbrs = {m.abbr for m in methods()}
    assert {"Vanilla", "Bb", "Cdotp_torch", "Recur", "LA_torch", "FA_torch"} <= abbrs


@pytest.mark.parametrize("method", TORCH_METHODS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}h{}n{}r{}d{}".format(*s))
@pytest.mark.parametrize("gamma", list(GAMMAS))
def test_fp32_matches_reference(method, shape, gamma):
    B, C, V = make_inputs(*shape, seed=zlib.crc32(f"{method}{shape}{gamma}".encode()) % 1000)
    g = _gamma(gamma, shape[1])
    for opts in ({}, SMALL_BLOCKS.get(method, {})):
        out = causal_linear_decoder(B, C, V, g, method=method, **opts)
        assert_close_to_reference(out, B, C, V, g)


@pytest.mark.parametrize("method", TORCH_METHODS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gamma", ["mask01", "per_head"])
def test_other_dtypes(method, dtype, gamma):
    B, C, V = make_inputs(2, 3, 77, 12, 10, dtype=dtype, seed=3)
    g = _gamma(gamma, 3)
    out = causal_linear_decoder(B, C, V, g, method=method, **SMALL_BLOCKS.get(method, {}))
    assert_close_to_reference(out, B, C, V, g)


@pytest.mark.parametrize("method", TORCH_METHODS)
def test_inputs_of_any_sign_and_size_stay_finite(method):
    # the original FleetAttention_torch took logs of the inputs and returned NaN with decay
    B, C, V = make_inputs(1, 2, 300, 6, 6, seed=5, scale=30.0)
    out = causal_linear_decoder(B, C, V, torch.tensor([0.999, 0.01]), method=method)
    assert torch.isfinite(out).all()
    assert_close_to_reference(out, B, C, V, torch.tensor([0.999, 0.01]))


@pytest.mark.parametrize("method", TORCH_METHODS)
@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 3), heads=st.integers(1, 3), n=st.integers(1, 150),
       r=st.integers(1, 20), d=st.integers(1, 20), seed=st.integers(0, 10_000),
       decay=st.sampled_from(["none", "per_head", "near_zero", "near_one"]))
def test_random_shapes(method, batch, heads, n, r, d, seed, decay):
    B, C, V = make_inputs(batch, heads, n, r, d, seed=seed)
    g = {"none": None, "per_head": random_gammas(heads, seed, low=0.0001),
         "near_zero": torch.full((heads, 1), 1e-3), "near_one": 1 - 1e-7}[decay]
    out = causal_linear_decoder(B, C, V, g, method=method, **SMALL_BLOCKS.get(method, {}))
    assert_close_to_reference(out, B, C, V, g)


def _runnable_methods():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return [m.abbr for m in methods() if not m.unsafe and m.supports(torch.float32, device)]


@pytest.mark.parametrize("method", method_params(_runnable_methods()))
@pytest.mark.parametrize("where", ["C", "V"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_row_never_reaches_earlier_rows(method, where, value):
    """Padding with uninitialised memory is common: rows before the first non-finite row of C or V
    equal the reference on the rows before it; every later row is non-finite, as the formula says."""
    interpreted_once(method, (where, value != value) in (("C", True), ("V", False)))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, C, V = make_inputs(2, 2, 150, 8, 5, device=device, seed=4)
    bad = {"C": C.clone(), "V": V.clone()}
    bad[where][:, :, 100, 1] = value
    opts = {"segment": 64} if method == "Chunk" else {}  # the chained segments carry it too
    out = causal_linear_decoder(B, bad["C"], bad["V"], 0.9, method=method, **opts)
    head = (slice(None), slice(None), slice(0, 100))
    tol = tolerance(B.dtype, tf32=device == "cuda" and method in ("LA", "Chunk"))
    assert_close_to_reference(out[head], B[head], C[head], V[head], 0.9, tol=tol)
    assert (~torch.isfinite(out[:, :, 100:])).any(-1).all()


# the quick lane: Chunk, the default kernel (each method's drift in the full lane)
@pytest.mark.parametrize("method", quick_lane(
    method_params(_runnable_methods()),
    keep=tuple(i for i, m in enumerate(_runnable_methods()) if m == "Chunk")))
def test_decay_just_below_one_does_not_drift(method):
    # λ = 1 − 1.5·2⁻²⁴ sits halfway between two float32 numbers: a state multiplied by λ rounded to
    # fp32 once per token drifts by 3e-8 a token, 6e-5 over these 4000 (the fp32 contract is 1e-5),
    # and even with λ's remainder folded back once a chunk, the product's own rounding (the same
    # way every token, λ within an ulp of 1) left Cdotp's CUDA kernel at 1.35e-5 (H200)
    # (on a GPU the Triton kernels' exact fp32 products: tf32's own 1.4e-3 would hide the drift)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, C, V = make_inputs(1, 1, 4000, 8, 8, seed=11, device=device)
    out = causal_linear_decoder(B, C, V, 1 - 1.5 * 2 ** -24, method=method, fp32_precision="ieee")
    assert_close_to_reference(out, B, C, V, 1 - 1.5 * 2 ** -24)
