"""The decay mask M[i, j] = λ^(i-j) (i ≥ j) and the pieces of it the methods need.

Every helper takes ``lg = log λ`` of shape ``(H, 1, 1)`` (or None for the 0-1 mask) and only ever
evaluates λ^k with k ≥ 0, so nothing overflows however small λ is (λ^k underflows to 0, which is
its correct value in floating point).
"""
from __future__ import annotations

import torch


def causal_mask(n: int, lg: torch.Tensor | None, *, dtype: torch.dtype, device,
                m: int | None = None, row_offset: int = 0) -> torch.Tensor:
    """``(H or 1, n, m)`` mask of rows ``row_offset .. row_offset+n-1`` and columns ``0 .. m-1``:
    λ^(i-j) for i ≥ j, else 0 (square, offset 0, by default)."""
    m = n if m is None else m
    diff = (torch.arange(row_offset, row_offset + n, device=device)[:, None]
            - torch.arange(m, device=device)[None, :])
    lower = diff >= 0
    if lg is None:
        return lower.to(dtype).unsqueeze(0)
    w = torch.exp(diff.clamp_min(0).to(lg.dtype) * lg)  # (H, n, m), exponent ≤ 0
    return torch.where(lower, w, torch.zeros((), dtype=w.dtype, device=device)).to(dtype)


def powers(lg: torch.Tensor | None, n: int, *, start: int = 0, reverse: bool = False,
           dtype: torch.dtype, device) -> torch.Tensor | None:
    """``(H, n, 1)`` column λ^(start + k), k = 0..n-1 (k = n-1..0 with ``reverse``); None for 0-1."""
    if lg is None:
        return None
    k = torch.arange(n, device=device, dtype=lg.dtype)
    if reverse:
        k = k.flip(0)
    return torch.exp((k + start).view(1, n, 1) * lg).to(dtype)


def scale_rows(x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """x * w with x ``(batch, H, n, k)`` and w ``(H, n, 1)``; identity when w is None."""
    return x if w is None else x * w


def discounted_cumsum(x: torch.Tensor, lg: torch.Tensor | None, chunk: int = 64) -> torch.Tensor:
    """λ-cumsum of Appendix C.1 along dim -2: y_i = x_i + λ y_{i-1}, for x ``(batch, H, N, d)``.

    Evaluated in chunks of ``chunk`` rows (a small lower-triangular matrix product each), the chunk
    ends combined by the same operator with λ^chunk, recursively: O(N·chunk·d) work, log_chunk(N)
    levels, and no negative power of λ anywhere (the textbook λ^i·cumsum(λ^-i x) overflows).
    """
    if lg is None:
        return x.cumsum(-2)
    n = x.shape[-2]
    if n <= chunk:
        return causal_mask(n, lg, dtype=x.dtype, device=x.device) @ x
    pad = (-n) % chunk
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad))
    *lead, total, d = xp.shape
    xr = xp.reshape(*lead, total // chunk, chunk, d)
    mask = causal_mask(chunk, lg, dtype=x.dtype, device=x.device).unsqueeze(1)  # (H, 1, L, L)
    y = mask @ xr
    ends = discounted_cumsum(y[..., -1, :], lg * chunk, chunk)  # inclusive scan of chunk ends
    carry = torch.nn.functional.pad(ends[..., :-1, :], (0, 0, 1, 0))  # the one before each chunk
    lead_in = powers(lg, chunk, start=1, dtype=x.dtype, device=x.device).unsqueeze(1)  # (H,1,L,1)
    y = y + lead_in * carry.unsqueeze(-2)
    return y.reshape(*lead, total, d)[..., :n, :]
