"""The recurrent state S_t (r × d per head) that lets a sequence be processed in pieces.

Convention (RetNet's recurrent form, flash-linear-attention's ``initial_state``/``final_state``):
    S_t = λ S_{t-1} + c_tᵀ v_t,   o_t = b_t S_t.
A call on N rows that starts from S0 therefore adds λ^(i+1) b_i S0 to row i and ends in
    S_N = λ^N S0 + Σ_j λ^(N-1-j) c_jᵀ v_j,
so two halves with the first half's S_N passed on give the same O as the whole. Shared by the
oracle and the PyTorch methods; the Triton kernels implement the same formulas.
"""
from __future__ import annotations

import torch

from .decay.per_head import powers, scale_rows


def check_state(state: torch.Tensor | None, B: torch.Tensor, V: torch.Tensor,
                sequences: int | None = None) -> None:
    """Raise a ValueError/TypeError unless ``state`` is None or ``(batch, heads, r, d)`` on B's
    device (``(sequences, heads, r, d)`` for packed sequences)."""
    if state is None:
        return
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"initial_state must be a torch.Tensor, got {type(state).__name__}")
    lead = "batch" if sequences is None else "sequences"
    want = (B.shape[0] if sequences is None else sequences, V.shape[1], B.shape[3], V.shape[3])
    if tuple(state.shape) != want:
        raise ValueError(f"initial_state must have shape ({lead}, heads, r, d) = {want}, "
                         f"got {tuple(state.shape)}")
    if not state.is_floating_point():
        raise TypeError(f"initial_state must be floating point, got {state.dtype}")
    if state.device != B.device:
        raise ValueError(f"initial_state is on {state.device}, the inputs on {B.device}")


def add_initial_state(out: torch.Tensor, B: torch.Tensor, S0: torch.Tensor | None,
                      lg: torch.Tensor | None, G: torch.Tensor | None = None) -> torch.Tensor:
    """``out + diag(λ^1..λ^N) B S0`` (out unchanged for S0 None); lg ``(H, 1, 1)`` or None.
    ``G``: with per-token gates, their running sums ``(batch, H, N)`` (γ folded in, lg None):
    the weights exp(G_i) instead."""
    if S0 is None:
        return out
    w = torch.exp(G).to(B.dtype)[..., None] if G is not None else \
        powers(lg, B.shape[-2], start=1, dtype=B.dtype, device=B.device)
    return out + scale_rows(B, w) @ S0.to(B.dtype)


def final_state(C: torch.Tensor, V: torch.Tensor, lg: torch.Tensor | None,
                S0: torch.Tensor | None = None, G: torch.Tensor | None = None) -> torch.Tensor:
    """``S_N = λ^N S0 + (diag(λ^(N-1)..λ^0) C)ᵀ V``, ``(batch, heads, r, d)`` in C's dtype.
    ``G``: with per-token gates, their running sums (γ folded in, lg None): the weights
    exp(G_(N-1) − G_j) and exp(G_(N-1)) instead."""
    n = C.shape[-2]
    if G is not None:
        if n == 0:
            return torch.zeros_like(C.transpose(-1, -2) @ V) + (0 if S0 is None else S0.to(C.dtype))
        w = torch.exp(G[..., -1:] - G).to(C.dtype)[..., None]
        s = (C * w).transpose(-1, -2) @ V
        if S0 is not None:
            s = s + S0.to(C.dtype) * torch.exp(G[..., -1]).to(C.dtype)[..., None, None]
        return s
    s = scale_rows(C, powers(lg, n, reverse=True, dtype=C.dtype, device=C.device)).transpose(-1, -2) @ V
    if S0 is not None:
        s = s + (S0.to(C.dtype) if lg is None else S0.to(C.dtype) * torch.exp(lg * n).to(C.dtype))
    return s
