"""The one place where a model block calls the operator: a registered method by name, or the
float64 oracle (``"reference"``, for the equivalence table). ``"original"`` is each model's own."""
from __future__ import annotations

import torch

from ..api import causal_linear_decoder
from ..reference import reference


def linear_attention(B, C, V, gamma, method: str) -> torch.Tensor:
    """``(B Cᵀ ⊙ M) V`` with M the per-head decay mask of ``gamma`` ``(H,)``, by ``method``."""
    if method == "reference":
        return reference(B, C, V, gamma).to(V.dtype)
    return causal_linear_decoder(B, C, V, gamma, method=method)
