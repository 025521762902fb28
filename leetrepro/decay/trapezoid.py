"""Mamba-3's trapezoidal rule folded into the operator with per-token gates.

Mamba-3's SISO recurrence per head (mamba_ssm 2.3's ``mamba3_siso_combined``; derived against the
operator in ``notebooks/derivations.py``):

    S_t = α_t S_(t−1) + (1 − λ_t) dt_t α_t · v_(t−1) k̃_(t−1)ᵀ + λ_t dt_t · v_t k̃_tᵀ,   y_t = S_t q̃_t,

α_t = exp(ADT_t), λ_t = sigmoid(Trap_t), and q̃, k̃ the queries and keys rotated by the running
angles θ_t = θ_(t−1) + tanh(Angles_t)·π·dt_t (each consecutive pair of dims by its own angle).
Key s enters the state at row s with λ_s dt_s and again at row s + 1 with (1 − λ_(s+1)) dt_(s+1),
decayed by α_(s+1) as everything entering at s is, so with the gates g = ADT the operator
O = (B Cᵀ ⊙ M) V computes it with

* the keys weighted by ``w_s = λ_s dt_s + (1 − λ_(s+1)) dt_(s+1)`` (the second term 0 at each
  sequence's last row: it belongs to the next call's first row), :func:`key_weights`;
* row t's own pair corrected by ``−(1 − λ_(t+1)) dt_(t+1) (q̃_t·k̃_t) v_t`` (at row t only the
  first term has entered);
* the previous call's last key and value entering the initial state:
  ``S0 + (1 − λ_0) dt_0 · k̃_prev v_prevᵀ`` (:func:`pending_state`);
* the rotation applied to q and k before the call, so that each pair's product is
  ``q_tᵀ R(θ_s − θ_t) k_s`` (:func:`running_angles`, :func:`rotate_pairs`).

All O(N) a head besides the operator. Rows ``(batch, seqlen, heads, ·)`` (mamba_ssm's layout),
per-row scalars ``(batch, heads, seqlen)``; ``cu_seqlens``: sequences packed along seqlen of a
batch of one.
"""
from __future__ import annotations

import math

import torch

from .per_token import shift_gates


def sequence_starts(n: int, cu_seqlens: torch.Tensor | None, device) -> tuple:
    """``(row's sequence, its sequence's first row)``, each int64 ``(n,)``, for rows packed by
    ``cu_seqlens`` (None: one sequence, every row's start 0). Read on the device."""
    rows = torch.arange(n, device=device)
    if cu_seqlens is None:
        return torch.zeros_like(rows), torch.zeros_like(rows)
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:], rows, right=True).clamp_max(cu.numel() - 2)
    return seq, cu[seq]


def running_angles(Angles: torch.Tensor, DT: torch.Tensor, theta0: torch.Tensor | None = None,
                   cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """θ ``(batch, seqlen, heads, headdim_angles)``, reduced mod 2π: each sequence's running sum
    of ``tanh(Angles)·π·dt`` from ``theta0`` ``(sequences, heads, headdim_angles)`` (zeros by
    default). Summed in float64 (a long sequence's angle reaches thousands of radians, whose
    float32 cosine would keep three digits), returned in float32 (float64 for float64 inputs)."""
    out = torch.float64 if Angles.dtype == torch.float64 else torch.float32
    # summed along the last dimension of (batch, heads, A, seqlen): torch's scan along an outer
    # dimension took 0.6 ms in float64 at 2345 rows × 32 heads × 16 angles (H200), 18× the
    # operator's own forward there
    inc = torch.tanh(Angles.to(torch.float64).permute(0, 2, 3, 1)) * math.pi * \
        DT.to(torch.float64)[:, :, None, :]
    total = inc.cumsum(-1)                                       # (batch, heads, A, seqlen)
    if cu_seqlens is not None:  # (each sequence's sum from its own first row)
        seq, start = sequence_starts(Angles.shape[1], cu_seqlens, Angles.device)
        before = torch.nn.functional.pad(total, (1, 0))[..., start]
        total = total - before
        if theta0 is not None:
            total = total + theta0.to(torch.float64)[seq].permute(1, 2, 0)[None]
    elif theta0 is not None:
        total = total + theta0.to(torch.float64)[..., None]
    total = total.permute(0, 3, 1, 2)                           # (batch, seqlen, heads, A)
    return torch.remainder(total, 2 * math.pi).to(out)


def rotate_pairs(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """x ``(…, headdim)`` with each consecutive pair (2i, 2i + 1) of its first ``2·A`` dims
    rotated by θ_i (theta ``(…, A)``), the rest as they are; in theta's dtype."""
    a = theta.shape[-1]
    x = x.to(theta.dtype)
    even, odd = x[..., 0:2 * a:2], x[..., 1:2 * a:2]
    cos, sin = torch.cos(theta), torch.sin(theta)
    out = torch.empty_like(x)  # (each part written in place: no stacked copy, no concatenation)
    out[..., 0:2 * a:2] = even * cos - odd * sin
    out[..., 1:2 * a:2] = even * sin + odd * cos
    out[..., 2 * a:] = x[..., 2 * a:]
    return out


def key_weights(DT: torch.Tensor, Trap: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                dtype: torch.dtype = torch.float32) -> tuple:
    """``(w, later)``, each ``(batch, heads, seqlen)`` in ``dtype``: the keys' weights ``w_s =
    λ_s dt_s + later_s`` and the part of them that enters a row later, ``later_s = (1 −
    λ_(s+1)) dt_(s+1)`` (0 at each sequence's last row), λ = sigmoid(Trap). Formed in float64:
    the diagonal correction takes ``later`` back from a row's own pair, and a sum rounded before
    that would leave its rounding in the output."""
    lam, dt = torch.sigmoid(Trap.to(torch.float64)), DT.to(torch.float64)
    later = shift_gates((1 - lam) * dt, cu_seqlens)  # (row s carries row s + 1's, 0 at ends)
    return (lam * dt + later).to(dtype), later.to(dtype)


def pending_state(S0: torch.Tensor | None, k_prev: torch.Tensor | None,
                  v_prev: torch.Tensor | None, DT: torch.Tensor, Trap: torch.Tensor,
                  cu_seqlens: torch.Tensor | None = None) -> torch.Tensor | None:
    """The operator's initial state ``(sequences, heads, headdim_qk, headdim_v)`` (its layout,
    float32): mamba_ssm's SSM state S0 ``(sequences, heads, headdim_v, headdim_qk)`` transposed,
    plus the previous call's last key and value, which enter each sequence's first row with
    ``(1 − λ_0) dt_0`` (a sequence with no rows keeps S0). None without states."""
    if S0 is None:
        return None
    acc = torch.float64 if S0.dtype == torch.float64 else torch.float32
    state = S0.to(acc).transpose(-1, -2)
    n = DT.shape[-1]
    if n == 0:
        return state
    lam, dt = torch.sigmoid(Trap.to(acc)), DT.to(acc)
    if cu_seqlens is None:
        scale = (1 - lam[:, :, 0]) * dt[:, :, 0]                    # (batch, heads)
    else:
        cu = cu_seqlens.to(device=DT.device, dtype=torch.int64)
        first = cu[:-1].clamp_max(n - 1)
        scale = ((1 - lam[0][:, first]) * dt[0][:, first]).T         # (sequences, heads)
        scale = torch.where((cu[1:] > cu[:-1])[:, None], scale, 0.0)
    return state + scale[..., None, None] * k_prev.to(acc)[..., :, None] * \
        v_prev.to(acc)[..., None, :]
