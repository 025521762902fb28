"""ECA (Exact Causal Attention): its identities in exact integer arithmetic, its operation counts
against the paper's formulas, forward and backward against the float64 oracle."""
import itertools
from fractions import Fraction

import pytest
import torch

from leetrepro import causal_linear_decoder
from leetrepro.methods import eca
from leetrepro.reference import reference, rel_error

from conftest import assert_close_to_reference, make_inputs, random_gammas, tolerance


def _ints(*shape, seed):
    return torch.randint(-7, 8, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n,k,depth", [(4, 4, 0), (16, 8, 0), (64, 12, 0), (256, 8, 0),
                                       (16, 16, 1), (64, 32, 1), (256, 64, 2)])
def test_identities_exact_in_integers(n, k, depth):
    # int64 arithmetic has no rounding: equal means the identities hold
    x, y, w = _ints(2, n, k, seed=n), _ints(2, n, k, seed=n + 1), _ints(2, n, k, seed=n + 2)
    p = torch.tril(_ints(2, n, n, seed=n + 3))
    assert torch.equal(eca.stage1(x, y, depth), torch.tril(x @ y.transpose(-1, -2)))
    assert torch.equal(eca.stage2(p, w, depth), p @ w)
    assert torch.equal(eca.upper_times(p.transpose(-1, -2), w, depth), p.transpose(-1, -2) @ w)
    # the standard algorithm the counts are measured against: exact too
    assert torch.equal(eca.tri_scores(x, y), torch.tril(x @ y.transpose(-1, -2)))
    assert torch.equal(eca.tri_times(p, w), p @ w)


def test_every_block_of_the_algorithms_is_used_and_in_range():
    for full, half, out, left, right in ((eca.STAGE1_FULL, eca.STAGE1_HALF, eca.STAGE1_OUT, "X", "Y"),
                                         (eca.STAGE2_FULL, eca.STAGE2_HALF, eca.STAGE2_OUT, "P", "W")):
        assert (len(full), len(half)) == (24, 10)
        seen = {name for a, b in full + half for _, name in eca.terms(a) + eca.terms(b)}
        blocks = 10 if left == "P" else 16
        assert seen == {f"{left}{i}" for i in range(1, blocks + 1)} | \
            {f"{right}{i}" for i in range(1, 17)}
        used = {name for e in out for _, name in eca.terms(e)}
        assert used == {f"m{i}" for i in range(1, 25)} | {f"h{i}" for i in range(1, 11)}
    with pytest.raises(ValueError, match="signed sum"):
        eca.terms("X1*X2")


@pytest.mark.parametrize("n,r,depth", [(64, 16, 0), (1024, 128, 0), (4096, 64, 0), (64, 16, 1),
                                       pytest.param(1024, 128, 1, marks=pytest.mark.slow),
                                       pytest.param(16384, 128, 1, marks=pytest.mark.slow)])
def test_counts_equal_the_papers_formula(n, r, depth):
    for stage in ("1", "2"):
        c = eca.operation_count(n, r, stage=stage, depth=depth)
        # the paper counts a half product as half a full one: 29/64 N²r, then 24/64 + 10/64 · ...
        assert c.paper == eca.paper_fraction(depth) * n * n * r
        # counting the half products' diagonals too: below the standard N(N+1)/2 · r
        standard = n * (n + 1) // 2 * r
        assert c.exact < standard
        assert abs(c.exact / standard - 2 * float(eca.paper_fraction(depth))) < 4 / n + 1e-9
    assert eca.paper_fraction(0) == Fraction(29, 64)
    assert abs(float(eca.paper_fraction(60)) - 4 / 9) < 1e-15


def test_full_products_grow_by_the_recursion():
    # each level replaces every half product by 24 full and 10 half ones
    for depth in range(2):
        c = eca.operation_count(256, 64, stage="1", depth=depth)
        assert c.products["half"] == 10 ** (depth + 1)
        assert c.products["full"] == 24 * sum(10 ** i for i in range(depth + 1))


def test_the_complexity_table_gives_the_counted_products():
    from leetrepro import complexity
    for n, r, d in ((64, 16, 8), (130, 12, 20)):
        counted = eca.operation_count(n, r, d)
        assert complexity.flops("ECA", n, r, d) == 2 * int(counted.paper) + n * n


def test_backward_is_five_products():
    fwd = eca.operation_count(512, 64, 32)
    bwd = eca.operation_count(512, 64, 32, backward=True)
    assert fwd.paper == Fraction(29, 64) * 512 ** 2 * (64 + 32)
    # S again (r), dV = Pᵀ dO (d), dP (d), dB = dS C (r), dC = dSᵀ B (r)
    assert bwd.paper == Fraction(29, 64) * 512 ** 2 * (3 * 64 + 2 * 32)


@pytest.mark.parametrize("gamma", ["mask01", "per_head"])
@pytest.mark.parametrize("depth", [0, 1])
@pytest.mark.parametrize("shape", [(2, 3, 37, 8, 5), (1, 2, 130, 12, 20), (2, 1, 5, 3, 4)])
def test_float64_forward_and_backward(shape, depth, gamma):
    g = None if gamma == "mask01" else random_gammas(shape[1])
    B, C, V = (t.requires_grad_() for t in make_inputs(*shape, dtype=torch.float64, seed=7))
    out = causal_linear_decoder(B, C, V, g, method="ECA", depth=depth)
    assert rel_error(out, reference(B, C, V, g)) < 1e-12
    dO = torch.randn_like(out)
    got = torch.autograd.grad(out, (B, C, V), dO)
    want = torch.autograd.grad(reference(B, C, V, g), (B, C, V), dO)
    for a, b in zip(got, want):
        assert rel_error(a, b) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_accuracy_contract(dtype):
    B, C, V = (t.requires_grad_() for t in make_inputs(2, 2, 67, 16, 24, dtype=dtype, seed=2))
    g = random_gammas(2)
    out = causal_linear_decoder(B, C, V, g, method="ECA")
    assert_close_to_reference(out, B, C, V, g)
    dO = torch.randn_like(out)
    got = torch.autograd.grad(out, (B, C, V), dO)
    B64, C64, V64 = (t.detach().double().requires_grad_() for t in (B, C, V))
    want = torch.autograd.grad(reference(B64, C64, V64, g), (B64, C64, V64), dO.double())
    for a, b in zip(got, want):
        assert a.dtype == dtype and rel_error(a, b) <= tolerance(dtype)


def test_backward_takes_the_papers_products_for_any_subset(monkeypatch):
    calls = []
    real = eca.gradients
    monkeypatch.setattr(eca, "gradients", lambda *a, **k: calls.append(1) or real(*a, **k))
    B, C, V = make_inputs(2, 2, 33, 8, 6, dtype=torch.float64, seed=4)
    for need in itertools.product([False, True], repeat=3):
        if not any(need):
            continue
        ins = [t.clone().requires_grad_(n) for t, n in zip((B, C, V), need)]
        out = causal_linear_decoder(*ins, 0.9, method="ECA", scale=0.5)
        dO = torch.randn_like(out)
        got = torch.autograd.grad(out, [t for t in ins if t.requires_grad], dO)
        ref = reference(*ins, 0.9) * 0.5
        want = torch.autograd.grad(ref, [t for t in ins if t.requires_grad], dO)
        for a, b in zip(got, want):
            assert rel_error(a, b) < 1e-12
    assert len(calls) == 7


def test_depth_option_is_checked():
    B, C, V = make_inputs(1, 1, 8, 4, 4)
    with pytest.raises(ValueError, match="depth"):
        causal_linear_decoder(B, C, V, method="ECA", depth=-1)


def test_padding_is_exact_and_said():
    assert eca.padded(37, 0) == 40 and eca.padded(37, 1) == 48 and eca.padded(64, 2) == 64
    assert "padded" in eca.__doc__
