import pytest
import torch

from leetrepro.decay.per_head import causal_mask, discounted_cumsum, log_gamma


def loop_discounted_cumsum(x, gamma):
    y = torch.empty_like(x)
    acc = torch.zeros_like(x[..., 0, :])
    for i in range(x.shape[-2]):
        acc = x[..., i, :] + gamma.view(-1, 1) * acc
        y[..., i, :] = acc
    return y


@pytest.mark.parametrize("n", [1, 5, 64, 65, 200, 4097])
def test_discounted_cumsum_matches_the_recurrence(n):
    gamma = torch.tensor([1.0, 0.999, 0.5, 1e-30], dtype=torch.float64)
    x = torch.randn(2, 4, n, 3, dtype=torch.float64)
    got = discounted_cumsum(x, log_gamma(gamma, torch.float64), chunk=8)
    torch.testing.assert_close(got, loop_discounted_cumsum(x, gamma), rtol=1e-10, atol=1e-10)


def test_mask_never_overflows_for_tiny_decay():
    m = causal_mask(500, log_gamma(torch.tensor([1e-30]), torch.float32), dtype=torch.float32,
                    device="cpu")
    assert torch.isfinite(m).all()
    assert m[0, 0, 0] == 1 and m[0, 0, 1] == 0 and m[0, 1, 0] == pytest.approx(1e-30)


def test_mask_with_row_offset_is_a_slice_of_the_full_mask():
    lg = log_gamma(torch.tensor([0.7, 0.9]), torch.float64)
    full = causal_mask(10, lg, dtype=torch.float64, device="cpu")
    part = causal_mask(4, lg, dtype=torch.float64, device="cpu", m=9, row_offset=5)
    torch.testing.assert_close(part, full[:, 5:9, :9])
