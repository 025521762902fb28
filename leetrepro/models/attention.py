"""The one place where a model block calls the operator: a registered method by name, the float64
oracle (``"reference"``, for the equivalence table), or any callable ``(B, C, V, gamma) -> O``
(a peer library's kernel, trained through its own backward). ``"original"`` is each model's own."""
from __future__ import annotations

import torch
from torch import nn

from ..api import causal_linear_decoder
from ..reference import reference


def linear_attention(B, C, V, gamma, method) -> torch.Tensor:
    """``(B Cᵀ ⊙ M) V`` with M the per-head decay mask of ``gamma`` ``(H,)``, by ``method``."""
    if callable(method):
        return method(B, C, V, gamma)
    if method == "reference":
        return reference(B, C, V, gamma).to(V.dtype)
    return causal_linear_decoder(B, C, V, gamma, method=method)


class Float64Buffers(nn.Module):
    """A block whose buffers named in ``float64_buffers`` (decay rates, rotation frequencies) stay
    float64 when the model is cast (``model.half()``, ``.to(torch.bfloat16)``); they still move with
    the model's device.

    Cast, they would change the model: RetNet's γ_h = 1 − 2^(−5−h) is 1.0 in fp16 from h = 7 and in
    bf16 from h = 3, and its row normalisation (1 − γ^(i+1)) / (1 − γ) is then 0/0, a NaN that fills
    every hidden state; the other decays round to other decays. The operator takes γ in float64."""

    float64_buffers: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers[name] for name in self.float64_buffers}
        super()._apply(fn, recurse)
        for name, exact in kept.items():
            self._buffers[name] = exact.to(device=self._buffers[name].device)
        return self
