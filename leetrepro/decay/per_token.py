"""Per-token gates ``g`` (log a_t per row and head, the decay of simple GLA and Mamba-2): their
checks and the mask M[i, j] = exp(G_i − G_j), G the running sum of the gates; a per-head λ as well
folds into them (:func:`fold_gates`: g_t + log λ).

The helpers take G as running sums *local* to a block (:func:`local_cumsum`) and only ever form
exp of a difference G_i − G_j with i ≥ j, so no exp(+G) appears and a long sequence's running sum
never loses the gates' small differences.
"""
from __future__ import annotations

import torch


def positive_where_free(t: torch.Tensor) -> float | None:
    """The largest entry of ``t`` if it is positive and reading it costs no synchronisation (a
    CPU tensor, outside a compiled graph's tracing); else None (fine, or not read)."""
    if t.device.type != "cpu" or not t.numel() or torch.compiler.is_compiling():
        return None
    top = t.detach().max().item()
    return top if top > 0 else None


def check_gates(g, B: torch.Tensor) -> None:
    """Raise a TypeError/ValueError naming ``g`` unless it is None or the per-token log gates of
    B's rows: a floating tensor ``(batch, heads, N)`` on B's device, any strides (a time-major
    ``(batch, N, heads)`` tensor passed as ``g.transpose(1, 2)`` is read in place). Gate values
    are log decays, ≤ 0 in every model that uses them (``log a_t``, a_t in (0, 1]; −inf a hard
    reset). On the CPU they are read (no synchronisation to pay) and a positive gate, most often
    a decay passed without its log, is refused; on a GPU they are not read (a host
    synchronisation per call): a positive gate there is a growth computed as given, whose rows
    turn non-finite once the growth passes the dtype's range (e^(3·40) at g = +3 over 40 rows
    already overflows float32)."""
    if g is None:
        return
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"g (the per-token log gates) must be a torch.Tensor, got "
                        f"{type(g).__name__}")
    want = tuple(B.shape[:3])
    if tuple(g.shape) != want:
        raise ValueError(f"g (the per-token log gates) must have shape (batch, heads, N) = "
                         f"{want}, got {tuple(g.shape)}"
                         + ("; it looks time-major (batch, N, heads): pass g.transpose(1, 2)"
                            if g.dim() == 3 and tuple(g.shape) == (want[0], want[2], want[1])
                            else ""))
    if not g.is_floating_point():
        raise TypeError(f"g (the per-token log gates) must be floating point, got {g.dtype}")
    if g.device != B.device:
        raise ValueError(f"g is on {g.device}, the inputs on {B.device}")
    top = positive_where_free(g)
    if top is not None:
        raise ValueError(f"g (the per-token log gates) must be ≤ 0 (log decays, log a_t with "
                         f"a_t in (0, 1]); its largest is {top:g}: pass torch.log(a) if these "
                         f"are the decays a_t themselves")


def gate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype gates are computed in: float32 whatever the inputs' (float64 for float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


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


def first_decay(gate: torch.Tensor, cu_seqlens) -> torch.Tensor:
    """e^(g_0) per (batch or sequence, head) as ``(·, heads, 1, 1)``: the decay of the initial
    state into each sequence's first row."""
    if cu_seqlens is None:
        return torch.exp(gate[..., 0])[..., None, None]
    starts = cu_seqlens[:-1].long()
    first = gate[0][:, starts.clamp_max(max(gate.shape[-1] - 1, 0))].T
    # (an empty sequence passes its state through: no decay)
    first = torch.where((cu_seqlens[1:] > cu_seqlens[:-1])[:, None], first, 0.0)
    return torch.exp(first)[..., None, None]


def final_pairs(dS: torch.Tensor | None, SN: torch.Tensor | None) -> torch.Tensor | None:
    """⟨dS_N, S_N⟩ in float64 per (batch or sequence, head): the pairs of the final state's
    gradient with every row, which straddle each row's gate; None without a final state's
    gradient."""
    if dS is None or SN is None or not SN.numel():
        return None
    return (dS.to(torch.float64) * SN.to(torch.float64)).sum((-1, -2))


def gate_gradient_from_dots(B, dB, C, dC, cu_seqlens=None, dS=None, SN=None) -> torch.Tensor:
    """dg ``(batch, heads, N)`` (float64) from the gradients of B and C (``leetrepro.ops``'
    docstring), where the straddle kernel cannot run: dG_i = b_i·db_i − c_i·dc_i (+ ⟨dS_N, S_N⟩ at each
    sequence's last row), then its reverse running sum, restarted at each packed sequence's end.
    dB and dC as stored: in fp16/bf16 their rounding, amplified by the difference and the running
    sum, would miss the contract (the caller computes them in fp32)."""
    dt = torch.float64  # (a difference of dot products, then a long sum: both cancel)
    dG = (B.to(dt) * dB.to(dt)).sum(-1) - (C.to(dt) * dC.to(dt)).sum(-1)
    n = dG.shape[-1]
    tail = final_pairs(dS, SN)
    if tail is not None and n:
        if cu_seqlens is None:
            dG[..., -1] += tail
        else:
            ends = cu_seqlens[1:].long() - 1
            keep = cu_seqlens[1:] > cu_seqlens[:-1]  # (an empty sequence has no last row)
            dG[0].index_add_(1, ends.clamp_min(0), (tail * keep[:, None]).T.contiguous())
    rc = dG.flip(-1).cumsum(-1).flip(-1)  # Σ_(i ≥ t)
    if cu_seqlens is None or cu_seqlens.numel() <= 2:
        return rc
    # per sequence: minus the sum over the rows after its end
    cu = cu_seqlens.long()
    rows = torch.arange(n, device=dG.device)
    end = cu[torch.searchsorted(cu, rows, right=True).clamp_max(cu.numel() - 1)]
    after = torch.nn.functional.pad(rc, (0, 1))[..., end]
    return rc - after
