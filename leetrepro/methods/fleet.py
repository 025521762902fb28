"""FleetAttention (FA): Eq. (5) and its decayed form (Appendix C.1),

    O = Σ_{i=1..r} diag(b_i) · λ-cumsum(diag(c_i) V),

with b_i, c_i the i-th columns of B and C. O(N·r·d) time, O(N·d) extra memory (one rank at a time).
The λ-cumsum is evaluated without logarithms or negative powers of λ
(:func:`leetrepro._decay.discounted_cumsum`), so inputs of any sign give finite, correct results.
"""
from __future__ import annotations

import torch

from .._decay import discounted_cumsum
from ..registry import register
from ._common import prepare


@register("FleetAttention_torch", "FA_torch", complexity="O(N·r·d)", language="torch",
          summary="Eq. (5): sum over ranks of diag(b_i)·λ-cumsum(diag(c_i) V)")
def fleet_attention_torch(B, C, V, gamma):
    """Shapes and gamma as in :func:`leetrepro.causal_linear_decoder`."""
    b, c, v, lg = prepare(B, C, V, gamma)
    out = torch.zeros_like(v)
    for i in range(b.shape[-1]):
        out += b[..., i:i + 1] * discounted_cumsum(c[..., i:i + 1] * v, lg)
    return out.to(V.dtype)
