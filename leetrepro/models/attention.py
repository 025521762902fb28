"""The one place where a model block calls the operator: a registered method by name, the float64
oracle (``"reference"``, for the equivalence table), or any callable ``(B, C, V, gamma) -> O``
(a peer library's kernel, trained through its own backward). ``"original"`` is each model's own."""
from __future__ import annotations

import torch

from ..api import causal_linear_decoder
from ..reference import reference


def linear_attention(B, C, V, gamma, method) -> torch.Tensor:
    """``(B Cᵀ ⊙ M) V`` with M the per-head decay mask of ``gamma`` ``(H,)``, by ``method``."""
    if callable(method):
        return method(B, C, V, gamma)
    if method == "reference":
        return reference(B, C, V, gamma).to(V.dtype)
    return causal_linear_decoder(B, C, V, gamma, method=method)
