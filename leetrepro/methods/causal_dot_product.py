"""causal-dot-product (Cdotp): the row-based Algorithm 1 (Appendix B.1; Vyas et al., 2020;
Choromanski et al., 2020, Eq. 11), with decay: U_i = λ U_{i-1} + c_iᵀ v_i, o_i = b_i U_i.

O(N·r·d) time, O(r·d) state per (batch, head). The PyTorch twin steps through the tokens in Python
(vectorised over batch and heads); the CUDA kernel (``Cdotp``) keeps the state on chip.
"""
from __future__ import annotations

import torch

from ..registry import register
from ._common import prepare


@register("causal-dot-product_torch", "Cdotp_torch", complexity="O(N·r·d)", language="torch",
          summary="Algorithm 1: one r×d state update and one row of output per token")
def causal_dot_product_torch(B, C, V, gamma):
    """Shapes and gamma as in :func:`leetrepro.causal_linear_decoder`."""
    b, c, v, lg = prepare(B, C, V, gamma)
    batch, heads, n, r = b.shape
    decay = None if lg is None else torch.exp(lg).view(1, heads, 1, 1)
    state = torch.zeros(batch, heads, r, v.shape[-1], dtype=b.dtype, device=b.device)
    out = torch.empty(batch, heads, n, v.shape[-1], dtype=b.dtype, device=b.device)
    for i in range(n):
        if decay is not None:
            state.mul_(decay)
        state.add_(c[:, :, i, :, None] * v[:, :, i, None, :])
        out[:, :, i] = (b[:, :, i, None, :] @ state).squeeze(-2)
    return out.to(V.dtype)
