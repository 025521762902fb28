"""vanilla (Vanilla): materialise the masked N×N attention matrix. O(N²(r+d)) time, O(N²) memory."""
from __future__ import annotations

from .._decay import causal_mask
from ..registry import register
from ._common import torch_method


@register("vanilla", "Vanilla", complexity="O(N²(r+d))", language="torch",
          summary="B Cᵀ ⊙ M materialised, then times V")
@torch_method
def vanilla(b, c, v, lg):
    """``(B Cᵀ ⊙ M) V``. B, C ``(batch, H, N, r)``, V ``(batch, H, N, d)``; gamma None or ``(H,)``.

    The mask is built in one vectorised expression (the original built it row by row in Python).
    """
    mask = causal_mask(b.shape[2], lg, dtype=b.dtype, device=b.device)
    return ((b @ c.transpose(-1, -2)) * mask) @ v
