"""What every PyTorch method does first: upcast to the accumulation dtype and take log λ."""
from __future__ import annotations

import torch

from .._inputs import compute_dtype, log_gamma


def prepare(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma):
    """Return B, C, V in the accumulation dtype (float32, or float64 for float64 inputs) and
    ``lg = log λ`` as ``(H, 1, 1)`` (None for the 0-1 mask)."""
    cd = compute_dtype(V.dtype)
    return B.to(cd), C.to(cd), V.to(cd), log_gamma(gamma, cd)


def gamma_pow(lg: torch.Tensor | None, k: int):
    """λ^k as ``(H, 1, 1)`` (1 for the 0-1 mask)."""
    return 1.0 if lg is None else torch.exp(lg * k)
