"""The decay mask M[i, j] = λ^(i-j) (i ≥ j) and the pieces of it the methods need.

Every helper takes ``lg = log λ`` of shape ``(H, 1, 1)`` (or None for the 0-1 mask) and only ever
evaluates λ^k with k ≥ 0, so nothing overflows however small λ is (λ^k underflows to 0, which is
its correct value in floating point).

Per-token gates (``g``, log a_t per row and head, the decay of simple GLA and Mamba-2) make the
mask M[i, j] = exp(G_i − G_j), G the running sum of the gates; a per-head λ as well folds into
them (:func:`fold_gates`: g_t + log λ). The helpers here take G as running sums *local* to a
block (:func:`local_cumsum`) and only ever form exp of a difference G_i − G_j with i ≥ j, so no
exp(+G) appears and a long sequence's running sum never loses the gates' small differences.
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


#: the lowest gate float32 computes with: e^-104 is 0 in float32 (below half its least subnormal),
#: so a stronger gate (a hard reset of −1e4, say) decays exactly as much, and the running sums
#: within a chunk stay small enough (|G| ≲ 104 past a reset) that their differences keep float32's
#: precision (a −1e4 in a running sum leaves 1e-3 of it)
GATE_FLOOR = -104.0


def fold_gates(g: torch.Tensor | None, gamma: torch.Tensor | None,
               dtype: torch.dtype) -> torch.Tensor | None:
    """The gates the methods compute with: g ``(batch, H, N)`` in ``dtype`` (float32, or float64
    for float64 inputs) plus log λ per head where a γ is given too (the decays multiply), in
    float32 no lower than :data:`GATE_FLOOR` (the same decay: 0); None without gates."""
    if g is None:
        return None
    out = g.to(dtype)
    if gamma is not None:
        out = out + torch.log(gamma.to(torch.float64)).to(dtype).view(1, -1, 1)
    if dtype != torch.float64:
        out = out.clamp_min(GATE_FLOOR)
    return out


def local_cumsum(g: torch.Tensor, size: int) -> torch.Tensor:
    """Running sums of the gates ``(…, N)`` restarted every ``size`` rows (inclusive)."""
    n = g.shape[-1]
    pad = (-n) % size
    gp = torch.nn.functional.pad(g, (0, pad))
    return gp.view(*g.shape[:-1], -1, size).cumsum(-1).view(*g.shape[:-1], n + pad)[..., :n]


def gate_mask(G: torch.Tensor, *, dtype: torch.dtype, G_cols: torch.Tensor | None = None,
              row_offset: int = 0) -> torch.Tensor:
    """``(…, n, m)`` mask exp(G_i − G_j) for i ≥ j, else 0, from running sums G ``(…, n)`` of the
    rows and ``G_cols`` ``(…, m)`` of the columns (G itself by default); row i is logical row
    ``row_offset + i``, column j row j. The exponent is formed only where i ≥ j."""
    cols = G if G_cols is None else G_cols
    n, m = G.shape[-1], cols.shape[-1]
    lower = (torch.arange(row_offset, row_offset + n, device=G.device)[:, None]
             >= torch.arange(m, device=G.device)[None, :])
    diff = G[..., :, None] - cols[..., None, :]
    return torch.exp(torch.where(lower, diff, torch.full((), -torch.inf, dtype=diff.dtype,
                                                         device=G.device))).to(dtype)


def shift_gates(g: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """The gates of the operator in reverse time, at the rows they are read: row t carries
    g_(t+1), the decay between rows t and t+1, and each sequence's last row 0 (nothing enters
    it). Reading the rows backwards from N-1, the running sum of these is the reversed
    sequence's: exp(G'_i − G'_j) = exp(G_j − G_i) for the transposed mask."""
    out = torch.nn.functional.pad(g[..., 1:], (0, 1))
    if cu_seqlens is not None and cu_seqlens.numel() > 2:
        rows = torch.arange(g.shape[-1], device=g.device)
        last = torch.isin(rows, cu_seqlens[1:-1].to(torch.long) - 1)  # (no host read)
        out = torch.where(last, torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out


def running_gates(g: torch.Tensor) -> torch.Tensor:
    """The running sum G of the gates ``(…, N)`` in float64: for the state's weights
    exp(G_i) and exp(G_(N-1) − G_j), where a whole sequence's sum is needed and float32's would
    lose the small differences of a long one."""
    return g.to(torch.float64).cumsum(-1)
