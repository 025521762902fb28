"""The recurrent state in and out (leetrepro._state): the oracle's formulas, the two halves
property for every method with state support, and the API's errors."""
import pytest
import torch

from leetrepro import causal_linear_decoder, reference, rel_error
from leetrepro.methods import get, methods

from conftest import make_inputs, random_gammas, shape_id, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
STATE_METHODS = [m.abbr for m in methods() if m.state]
# (batch, heads, N, r, d): odd N, r ≠ d, batch > 1; the second crosses Chunk's segment split
SHAPES = [(2, 3, 37, 8, 5), (1, 2, 200, 16, 12)]


def _tol(dtype):
    return tolerance(dtype, tf32=DEVICE == "cuda")


def test_the_oracle_state_is_the_recurrence():
    """S_t = λ S_{t-1} + c_tᵀ v_t, o_t = b_t S_t, step by step, in float64."""
    B, C, V = make_inputs(2, 3, 9, 4, 5, dtype=torch.float64, seed=3)
    g = random_gammas(3, low=0.6)
    S = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    out, sn = reference(B, C, V, g, initial_state=S, output_final_state=True)
    lam = g.view(1, 3, 1, 1)
    for t in range(9):
        S = lam * S + C[:, :, t, :, None] * V[:, :, t, None, :]
        assert torch.allclose(out[:, :, t], (B[:, :, t, None, :] @ S)[:, :, 0], atol=1e-12)
    assert torch.allclose(sn, S, atol=1e-12)


def test_state_methods_are_listed():
    assert {"Chunk", "LA_torch"} <= set(STATE_METHODS)


@pytest.mark.parametrize("method", STATE_METHODS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_two_halves_with_the_state_equal_the_whole(method, shape, decay, dtype):
    m = get(method)
    if not m.supports(dtype, torch.device(DEVICE)):
        pytest.skip(f"{method} does not run {dtype} on {DEVICE}")
    opts = {"segment": 64} if method == "Chunk" else {}
    B, C, V = make_inputs(*shape, dtype=dtype, device=DEVICE, seed=sum(shape))
    g = random_gammas(shape[1], low=0.8).to(DEVICE) if decay else None
    S0 = torch.randn(shape[0], shape[1], shape[3], shape[4], device=DEVICE)
    ref_o, ref_s = reference(B, C, V, g, initial_state=S0, output_final_state=True)
    whole_o, whole_s = causal_linear_decoder(B, C, V, g, method=method, initial_state=S0,
                                             output_final_state=True, **opts)
    h = shape[2] // 2 + 3
    o1, s1 = causal_linear_decoder(B[:, :, :h], C[:, :, :h], V[:, :, :h], g, method=method,
                                   initial_state=S0, output_final_state=True, **opts)
    o2, s2 = causal_linear_decoder(B[:, :, h:], C[:, :, h:], V[:, :, h:], g, method=method,
                                   initial_state=s1, output_final_state=True, **opts)
    assert whole_o.dtype == dtype and whole_s.dtype == torch.float32
    tol = _tol(dtype)
    assert rel_error(whole_o, ref_o) <= tol and rel_error(whole_s, ref_s) <= tol
    assert rel_error(torch.cat([o1, o2], dim=2), ref_o) <= tol
    assert rel_error(s2, ref_s) <= tol


def test_state_errors_are_clear():
    B, C, V = make_inputs(1, 2, 10, 4, 3)
    with pytest.raises(ValueError, match="does not take or return a state.*Chunk"):
        causal_linear_decoder(B, C, V, method="Vanilla", output_final_state=True)
    with pytest.raises(ValueError, match=r"\(batch, heads, r, d\) = \(1, 2, 4, 3\)"):
        causal_linear_decoder(B, C, V, method="LA_torch", initial_state=torch.zeros(1, 2, 3, 4))
    out, s = causal_linear_decoder(B, C, V, 0.9, initial_state=torch.ones(1, 2, 4, 3),
                                   output_final_state=True)  # auto picks a method with state
    assert s.shape == (1, 2, 4, 3)
    # N = 0 passes the state through unchanged
    e = B[:, :, :0]
    out, s = causal_linear_decoder(e, e, V[:, :, :0], 0.9, method="LA_torch",
                                   initial_state=torch.ones(1, 2, 4, 3), output_final_state=True)
    assert out.shape == (1, 2, 0, 3) and torch.equal(s, torch.ones(1, 2, 4, 3))
