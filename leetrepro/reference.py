"""The float64 oracle every test compares against."""
from __future__ import annotations

import inspect
import math
import sys
import types

import torch

from ._inputs import check_qkv

from ._groups import expand_groups
from ._state import add_initial_state, check_state, final_state
from .decay.per_head import causal_mask, log_gamma, normalize_gamma
from .decay.per_token import check_gates, fold_gates, gate_mask


def reference(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma=None, *,
              row_block: int = 2048, initial_state: torch.Tensor | None = None,
              output_final_state: bool = False, g: torch.Tensor | None = None,
              cu_seqlens: torch.Tensor | None = None):
    """``O = (B Cᵀ ⊙ M) V`` by the quadratic formula, in float64.

    Shapes: B, C ``(batch, heads, N, r)`` (or ``(batch, groups, N, r)``, :mod:`leetrepro._groups`),
    V ``(batch, heads, N, d)``; returns ``(batch, heads, N, d)``
    float64 on the inputs' device. ``gamma``: see :mod:`leetrepro.decay.per_head`; M[i, j] = γ^(i-j) for
    i ≥ j. Cost O(N²(r+d)) time; rows are processed ``row_block`` at a time so memory stays
    O(row_block·N) and long sequences can be checked on a GPU.

    ``initial_state`` ``(batch, heads, r, d)`` / ``output_final_state``: the recurrent state of
    :mod:`leetrepro._state`; with ``output_final_state`` the result is ``(O, S_N)``, both float64.
    Differentiable (plain float64 autograd): the oracle of the gradients too.

    ``g``: per-token log gates ``(batch, heads, N)`` (:func:`leetrepro.decay.per_token.check_gates`):
    M[i, j] = γ^(i-j) exp(G_i − G_j), G the running sum of g (in float64), and the state's
    convention S_t = γ e^(g_t) S_(t-1) + c_tᵀ v_t; differentiable in g too.

    ``cu_seqlens``: sequences packed along N of a batch of one, each through the oracle on its
    own from its row of ``initial_state`` (``(sequences, heads, r, d)``; zeros without one), the
    final states one per sequence.
    """
    if cu_seqlens is not None:
        return _packed(B, C, V, gamma, row_block, initial_state, output_final_state, g,
                       cu_seqlens)
    check_qkv(B, C, V)
    check_state(initial_state, B, V)
    check_gates(g, V)
    gam = normalize_gamma(gamma, V.shape[1], B.device)
    B, C = (expand_groups(t, V.shape[1]) for t in (B, C))  # (groups: a head each)
    gate = fold_gates(g, gam, torch.float64)
    G, run = _runs(gate)
    lg = None if G is not None else log_gamma(gam, torch.float64)
    B, C, V = (t.to(torch.float64) for t in (B, C, V))
    C, V, bad_out, bad_state = _nonfinite(C, V)
    n = B.shape[2]
    out = torch.empty(*V.shape, dtype=torch.float64, device=V.device)
    for s in range(0, n, row_block):
        e = min(n, s + row_block)
        # rows s..e-1 see columns 0..e-1; mask row i, col j -> λ^(i-j)
        if G is None:
            mask = causal_mask(e - s, lg, dtype=torch.float64, device=V.device, m=e,
                               row_offset=s)
        else:
            mask = gate_mask(G[..., s:e], G_cols=G[..., :e], dtype=torch.float64, row_offset=s)
            if run is not None:  # nothing reaches across a hard reset
                mask = mask * (run[..., s:e, None] == run[..., None, :e])
        out[:, :, s:e] = ((B[:, :, s:e] @ C[:, :, :e].transpose(-1, -2)) * mask) @ V[:, :, :e]
    S0 = None if initial_state is None else initial_state.to(torch.float64)
    G0 = G if run is None else torch.where(run > 0, -torch.inf, G)  # S0 is gone after a reset
    out = add_initial_state(out, B, S0, lg, G0)
    out = torch.where(bad_out, torch.nan, out)
    if not output_final_state:
        return out
    if run is not None:  # S_N: the rows of the last run, S0 only where no reset came
        last = run == run[..., -1:]
        C = C * last[..., None]
        S0 = None if S0 is None else S0 * (run[..., -1] == 0)[..., None, None]
    return out, torch.where(bad_state, torch.nan, final_state(C, V, lg, S0, G))


def _runs(gate: torch.Tensor | None):
    """``(G, run)``: the gates' running sums and, where a gate is −inf (log 0: a hard reset, the
    state emptied before the token's own key enters it), which run of rows between resets each
    row is in (None without one). G sums within a run (a reset counts 0 there), so a weight
    exp(G_i − G_j) is never −inf − (−inf); rows of different runs do not see each other."""
    if gate is None:
        return None, None
    reset = torch.isneginf(gate)
    if not reset.any():
        return gate.cumsum(-1), None
    return torch.where(reset, 0.0, gate).cumsum(-1), reset.cumsum(-1)


def ssd_reference(x, dt, A, B, C, D=None, z=None, dt_bias=None, initial_states=None,
                  seq_idx=None, dt_softplus: bool = False, dt_limit=(0.0, float("inf"))):
    """Mamba-2's state-space dual in float64, from its definition by the recurrence (row by row,
    written apart from the operator it checks):

        dt ← clamp(softplus(dt + dt_bias)), h_t = exp(dt_t A) h_(t−1) + dt_t x_t ⊗ B_t,
        y_t = (h_t C_t + D x_t) · silu(z_t),

    per head, B and C of group ``head // (heads / ngroups)``, h ``(headdim, dstate)`` from
    ``initial_states`` (zeros by default), reset to zero where ``seq_idx`` changes. Shapes as
    :func:`leetrepro.compat.mamba_chunk_scan_combined`; A and dt_bias may also be given a row
    each, ``(batch, seqlen, heads)``, whose gradients are then each row's term of A's and
    dt_bias's (:func:`leetrepro.bench.gpu_check.check_mamba` reports those sums' errors
    against them).
    Returns ``(y, h_final)`` in float64; differentiable. O(seqlen) Python steps: for tests."""
    x, dt, A, B, C = (t.to(torch.float64) for t in (x, dt, A, B, C))
    batch, length, heads, headdim = x.shape
    if dt_bias is not None:
        dt = dt + dt_bias.to(torch.float64)
    if dt_softplus:
        dt = torch.nn.functional.softplus(dt)
    if tuple(dt_limit) != (0.0, float("inf")):
        dt = dt.clamp(dt_limit[0], dt_limit[1])
    rep = heads // B.shape[2]
    Bh, Ch = B.repeat_interleave(rep, 2), C.repeat_interleave(rep, 2)
    h = x.new_zeros(batch, heads, headdim, B.shape[3]) if initial_states is None else \
        initial_states.to(torch.float64)
    ys = []
    for t in range(length):
        if seq_idx is not None and t > 0:
            h = h * (seq_idx[:, t] == seq_idx[:, t - 1]).to(torch.float64).view(batch, 1, 1, 1)
        h = h * torch.exp(dt[:, t] * (A if A.dim() == 1 else A[:, t]))[..., None, None] \
            + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        y = (h * Ch[:, t, :, None, :]).sum(-1)
        if D is not None:
            Dd = D.to(torch.float64)
            y = y + (Dd[:, None] if Dd.dim() == 1 else Dd) * x[:, t]
        if z is not None:
            y = y * torch.nn.functional.silu(z[:, t].to(torch.float64))
        ys.append(y)
    return torch.stack(ys, 1) if ys else x.new_zeros(x.shape), h


def mamba3_reference(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None,
                     Input_States=None, cu_seqlens=None):
    """Mamba-3's SISO recurrence in float64, from its definition (mamba_ssm's
    ``mamba3_siso_combined``'s shapes; written step by step, apart from the operator it checks).
    Per head h (q and k of q/k head ``h // (nheads / nheads_qk)``), per sequence:

        θ_t = θ_(t−1) + tanh(Angles_t)·π·dt_t,  q̃_t = R(θ_t)(q_t + Q_bias_h),
        k̃_t = R(θ_t)(k_t + K_bias_h),  λ_t = sigmoid(Trap_t),  α_t = exp(ADT_t),
        S_t = α_t S_(t−1) + (1 − λ_t) dt_t α_t · ṽ_(t−1) k̃_(t−1)ᵀ + λ_t dt_t · v_t k̃_tᵀ,
        y_t = (S_t q̃_t + D_h v_t) · silu(z_t),

    R(θ) rotating each consecutive pair (2i, 2i + 1) of the first ``2·headdim_angles`` dims by θ_i
    (the rest unrotated; θ not reduced mod 2π: the same rotation). The previous (k̃, v) and S, θ
    come from ``Input_States`` ``(angle, ssm (heads, headdim_v, headdim_qk), k, v)`` per sequence,
    zeros without. Returns ``(y, (θ_N, S_N, k̃_N, v_N))`` in float64, y ``(batch, seqlen, nheads,
    headdim_v)``, the states per sequence (``cu_seqlens``: packed along seqlen of a batch of one);
    differentiable. O(seqlen) Python steps: for tests."""
    f = torch.float64
    Q, K, V, ADT, DT, Trap, Angles = (t.to(f) for t in (Q, K, V, ADT, DT, Trap, Angles))
    batch, length, heads_qk, p = Q.shape
    heads, dv, da = V.shape[2], V.shape[3], Angles.shape[3]
    rep = heads // heads_qk
    q = Q.repeat_interleave(rep, 2) + Q_bias.to(f)          # (batch, seqlen, heads, p)
    k = K.repeat_interleave(rep, 2) + K_bias.to(f)
    bounds = [(b, 0, length) for b in range(batch)] if cu_seqlens is None else \
        [(0, int(a), int(e)) for a, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())]
    ys = torch.zeros(batch, length, heads, dv, dtype=f)
    finals = []
    for i, (b, start, end) in enumerate(bounds):
        if Input_States is None:
            theta, S = Q.new_zeros(heads, da), Q.new_zeros(heads, dv, p)
            k_prev, v_prev = Q.new_zeros(heads, p), Q.new_zeros(heads, dv)
        else:
            theta, S, k_prev, v_prev = (t[i].to(f) for t in Input_States)
        for t in range(start, end):
            dt = DT[b, :, t]
            theta = theta + torch.tanh(Angles[b, t]) * math.pi * dt[:, None]
            cos, sin = torch.cos(theta), torch.sin(theta)

            def rotate(x):
                even, odd = x[:, 0:2 * da:2], x[:, 1:2 * da:2]
                turned = torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1)
                return torch.cat([turned.flatten(-2), x[:, 2 * da:]], -1)
            qt, kt, vt = rotate(q[b, t]), rotate(k[b, t]), V[b, t]
            lam, alpha = torch.sigmoid(Trap[b, :, t]), torch.exp(ADT[b, :, t])
            S = alpha[:, None, None] * S \
                + ((1 - lam) * dt * alpha)[:, None, None] * v_prev[:, :, None] * k_prev[:, None, :] \
                + (lam * dt)[:, None, None] * vt[:, :, None] * kt[:, None, :]
            y = (S * qt[:, None, :]).sum(-1)
            if D is not None:
                y = y + D.to(f)[:, None] * vt
            if Z is not None:
                y = y * torch.nn.functional.silu(Z[b, t].to(f))
            ys[b, t] = y
            k_prev, v_prev = kt, vt
        finals.append((theta, S, k_prev, v_prev))
    return ys, tuple(torch.stack(x) for x in zip(*finals))


def _packed(B, C, V, gamma, row_block, initial_state, output_final_state, g, cu_seqlens):
    """:func:`reference` over each sequence that ``cu_seqlens`` packs, concatenated."""
    outs, states = [], []
    bounds = cu_seqlens.tolist()
    for i in range(len(bounds) - 1):
        rows = slice(bounds[i], bounds[i + 1])
        o, s = reference(B[:, :, rows], C[:, :, rows], V[:, :, rows], gamma, row_block=row_block,
                         initial_state=None if initial_state is None else initial_state[i:i + 1],
                         output_final_state=True, g=None if g is None else g[:, :, rows])
        outs.append(o)
        states.append(s)
    out = torch.cat(outs, 2)
    return (out, torch.cat(states, 0)) if output_final_state else out


def _nonfinite(C: torch.Tensor, V: torch.Tensor):
    """The oracle's own account of NaN/Inf in C and V (written apart from the methods' code, so
    that their handling is judged, not copied): ``(C, V with those entries 0, where O is
    non-finite, where S_N is)``. By the formula term by term, a non-finite c_j makes every column
    of every row i ≥ j non-finite (b_i·c_j reaches all of them), a non-finite v_j[k] column k of
    the rows i ≥ j, and S_N[r, d] is non-finite wherever a c_j[r] or a v_j[d] is. The masked
    products (j > i) are zeros, not 0 × NaN: a later row never reaches an earlier one."""
    c_ok, v_ok = torch.isfinite(C), torch.isfinite(V)
    first_on = ((~c_ok).any(-1, keepdim=True) | ~v_ok).to(torch.int8).cummax(-2).values.bool()
    bad_state = (~c_ok).any(-2)[..., :, None] | (~v_ok).any(-2)[..., None, :]
    return torch.where(c_ok, C, 0.0), torch.where(v_ok, V, 0.0), first_on, bad_state


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖_F / ‖ref‖_F in float64; NaN/inf in ``out`` give inf (never passes a bound)."""
    out = out.to(torch.float64)
    if not torch.isfinite(out).all():
        return float("inf")
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else num


#: The accuracy contract: ‖out − ref‖/‖ref‖ per input dtype. Kernels that use
#: tf32 dots for float32 on purpose are held to ``TF32_TOLERANCE`` instead.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TF32_TOLERANCE = 5e-3
#: The gates' gradient dg (per-token gates): dg_t = Σ_(i ≥ t) (b_i·db_i − c_i·dc_i), a running
#: sum to the end of the sequence of terms whose exact sum is small (only the pairs of rows on
#: either side of t count, the decay cuts the rest), so rounding inside the products would add
#: up along that sum (and again where a parameter sums dg over the rows: Mamba-2's A and
#: dt_bias). The backward sums the straddling pairs themselves instead (:mod:`leetrepro.ops`):
#: each dg_t carries only its own terms' rounding, in the inputs' dtype. fp16/bf16 are held to
#: the contract; fp32 (fp32-exact dots in that kernel) to 5e-5.
GATE_GRAD_TOLERANCE = {torch.float64: 1e-10, torch.float32: 5e-5, torch.float16: 1e-2,
                       torch.bfloat16: 1e-2}
#: dg of a float32 call whose sweeps run through tf32 dots (the kernels' default): dg itself is
#: summed at fp32-exact dots, the other gradients at tf32; 5e-4 leaves room for strong gates
GATE_GRAD_TF32_TOLERANCE = 5e-4


class _Oracle(types.ModuleType):
    """This module, callable as its function: ``leetrepro.reference(B, C, V, …)`` is
    :func:`reference`, and ``leetrepro.reference.ssd_reference``, ``.TOLERANCE``,
    ``import leetrepro.reference as R`` reach the module (the package exports one name for both,
    where a function would shadow its own module)."""

    def __call__(self, *args, **kwargs):
        return reference(*args, **kwargs)


sys.modules[__name__].__class__ = _Oracle
__signature__ = inspect.signature(reference)
