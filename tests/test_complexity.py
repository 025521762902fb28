import math

import pytest

from leetrepro import complexity


def test_recursion_count_solves_its_recurrence():
    r, d, base = 16, 8, 4
    leaf = 2 * base * base * (r + d) + base * base

    def T(p):
        return leaf if p == base else 2 * T(p // 2) + 2 * p * r * d

    for k in range(0, 10):
        assert complexity.recursion_flops(base * 2 ** k, r, d, base) == T(base * 2 ** k)


def test_recursion_grows_like_n_log_n_and_the_linear_methods_like_n():
    r = d = 128
    ratios = [complexity.flops("Recur", 2 ** k, r, d) / (2 ** k * k) for k in (14, 16, 18, 20)]
    assert max(ratios) / min(ratios) < 1.4          # Θ(N log N)
    lin = [complexity.flops(m, 2 ** 20, r, d) / complexity.flops(m, 2 ** 10, r, d)
           for m in ("Cdotp", "FA", "LA", "Bb")]
    assert all(x == pytest.approx(1024, rel=1e-6) for x in lin)
    assert complexity.flops("Vanilla", 2 ** 11, r, d) / complexity.flops("Vanilla", 2 ** 10, r, d) \
        == pytest.approx(4, rel=1e-3)


def test_table_and_floor():
    t = complexity.table(8192)
    assert list(t.index) == list(complexity.TABLE1)
    assert t.loc["vanilla", "flops"] > t.loc["FleetAttention", "flops"]
    # paper shapes: heads 32, r = d = 128, fp16, batch 1, N = 100000 -> 1.09 ms on the H100
    floor = complexity.memory_floor_seconds(100000, 128, 128, heads=32, itemsize=2)
    assert floor == pytest.approx(1.09e-3, rel=0.01)
    with pytest.raises(ValueError, match="no complexity model"):
        complexity.flops("nope", 10)
    assert math.isclose(complexity.flops("LA_torch", 100, 4, 4), complexity.flops("LA", 100, 4, 4))
