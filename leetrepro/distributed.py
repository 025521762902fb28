"""Sequence parallelism: one sequence cut into contiguous slices over the ranks of a
``torch.distributed`` process group, forward and backward (:func:`causal_linear_decoder_sp`).

What one slice passes to the next is a state (heads × r × d per sequence) and a decay λ^L, whatever
the length (:mod:`leetrepro._state`). So the ranks exchange states, never keys and values: one
all-gather of a fixed size in the forward and one in the backward, whatever N is (the LASP-2
scheme). Rank k holds rows [s_k, e_k) of the sequence, L_k = e_k - s_k rows.

**Forward** (6 tensor passes per rank, against 4 on one GPU):
  1. its own state from zero, U_k = Σ_{j in slice} λ^(e_k-1-j) c_jᵀ v_j (reads C, V; rank 0 adds
     λ^(L_0) S0);
  2. all-gather (U_k, L_k);
  3. its incoming state P_k = Σ_{q<k} λ^(s_k - e_q) U_q (S0 on rank 0) and the usual single-GPU
     pass from it (reads B, C, V, writes O). The final state Σ_q λ^(N - e_q) U_q comes from the
     gathered states on every rank, at no cost.
**Backward**: with G_k = Σ_{t in slice} λ^(t-s_k+1) b_tᵀ dO_t the gradient that rank k's own
outputs send to its incoming state (reads B, dO in reverse time),
  1. all-gather G_k (and each rank's gradient of the final state, when it was returned);
  2. the gradient of rank k's outgoing state, D_k = Σ_{q>k} λ^(s_q - e_k) G_q + λ^(N - e_k) dS_N;
  3. the single-GPU backward of the slice with P_k as its initial state and D_k as the gradient
     of its final state (:mod:`leetrepro.ops`): dB, dC, dV, and dS0 on rank 0.
Only non-negative powers of λ appear. **Per-token gates** (``g``, this rank's rows of them): a
slice passes its state and its total gate T_k (the sum of its gates, γ folded in), and every
λ^(distance) above becomes exp of the totals of the slices in between; the gates' gradient
comes from the slice's own backward, whose ⟨D_k, S_out⟩ term carries what the later slices send
back. The collectives are ``torch.distributed``'s (NCCL on GPUs,
gloo on the CPU); the group is an argument, so this composes with data parallelism over the others.

Launch with ``torchrun --nproc-per-node=G script.py`` (README, "Sequences longer than one GPU");
``python -m leetrepro.bench.sp`` is the scaling benchmark (``make bench-sp``).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import ops
from ._direct import refuse_transforms
from ._inputs import check_qkv
from ._groups import expand_groups
from ._state import check_state, final_state
from .api import _autocast
from .compat import check_chunk_size, check_dt_limit, check_mamba, ssd_operands, ssd_output
from .decay.per_head import decayed_by, log_gamma, normalize_gamma
from .decay.per_token import check_gates, fold_gates, gate_dtype, running_gates, shift_gates
from .registry import GPU_DTYPES


def causal_linear_decoder_sp(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma=None, *,
                             group=None, initial_state: torch.Tensor | None = None,
                             output_final_state: bool = False, method: str = "auto",
                             g: torch.Tensor | None = None, **options):
    """``O = (B Cᵀ ⊙ M) V`` over a sequence cut across the ranks of ``group``; differentiable.

    A collective call: every rank of ``group`` calls it with its own contiguous slice of the
    sequence, rank order = sequence order, and the same batch, heads, r, d, dtype, ``gamma`` and
    ``output_final_state`` (the slices' lengths may differ, 0 included).

    Args:
        B, C: ``(batch, heads, L_k, r)``, or groups of heads as
            :func:`leetrepro.causal_linear_decoder` takes them (read in place); V: ``(batch,
            heads, L_k, d)``: this rank's rows.
        gamma: per-head decay in (0, 1] as in :func:`leetrepro.causal_linear_decoder`; None: 0-1 mask.
        group: a ``torch.distributed`` process group (None: the default group; without an
            initialised default group, the call runs on this process alone).
        initial_state: ``(batch, heads, r, d)``, the state the whole sequence starts from; rank 0
            only (it is the start of the sequence): an error on other ranks.
        output_final_state: also return S_N, the whole sequence's final state, on every rank
            (float32; float64 for float64 inputs). Its gradient is the sum over the ranks' copies.
        method, **options: the method that runs each slice and its options, as in
            :func:`leetrepro.causal_linear_decoder` (it must take a state: Chunk, LA_torch;
            ``"auto"`` picks one per rank).
        g: this rank's rows of the per-token log gates, ``(batch, heads, L_k)``, as
            :func:`leetrepro.causal_linear_decoder` takes them (every rank passes gates, or
            none does); differentiable.

    Returns:
        This rank's rows of O, ``(batch, heads, L_k, d)``; ``(O_k, S_N)`` with ``output_final_state``.
        Equal to the single-process result. Gradients flow to B, C, V and ``initial_state``.

    Cost per rank: the single-GPU method on its slice plus one pass over C, V (forward) and over
    B, dO (backward); two all-gathers of batch·heads·r·d states (fp32), independent of N.
    """
    B, C, V = _autocast(B, C, V)
    check_qkv(B, C, V)
    rank, world = _rank_world(group)
    if initial_state is not None and rank != 0:
        raise ValueError(f"initial_state is the state the sequence starts from: it belongs to "
                         f"rank 0 of the group, got one on rank {rank}")
    check_state(initial_state, B, V)
    check_gates(g, V)
    lam = normalize_gamma(gamma, V.shape[1], B.device)
    m, opts = ops.prepare(method, options, B, lam, True, V, gates=g is not None)
    refuse_transforms("causal_linear_decoder_sp")
    out, final = _SequenceParallel.apply(B, C, V, initial_state, lam, group, m, opts,
                                         bool(output_final_state), g)
    return (out, final) if output_final_state else out


def mamba_chunk_scan_combined_sp(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                                 B: torch.Tensor, C: torch.Tensor, chunk_size: int,
                                 D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                                 dt_bias: torch.Tensor | None = None,
                                 initial_states: torch.Tensor | None = None, *, group=None,
                                 seq_idx: torch.Tensor | None = None,
                                 dt_softplus: bool = False, dt_limit: tuple = (0.0, math.inf),
                                 return_final_states: bool = False, **options):
    """Mamba-2's SSD (:func:`leetrepro.compat.mamba_chunk_scan_combined`, mamba_ssm's arguments)
    over a sequence cut across the ranks of ``group``, as :func:`causal_linear_decoder_sp` cuts
    the operator: each rank passes its own contiguous rows of x, dt, B, C and z (``(batch, L_k,
    …)``, rank order = sequence order), the same A, D, dt_bias and options; ``initial_states``
    on rank 0 only. The per-row passes (step sizes, V' = dt·x, the skip and the gate) are each
    rank's own; the operator passes one state and the slice's total gate each way. Returns this
    rank's rows of y (and the whole sequence's final state, on every rank, with
    ``return_final_states``). Differentiable as the single-process call; equal to it. Packed
    sequences by ``seq_idx`` (this rank's rows of it, ``(batch, L_k)``): a sequence may run
    across ranks, and one may start at a rank's first row (each rank reads the last row's
    ``seq_idx`` of the ranks before it: one all-gather of a row). ``cu_seqlens`` is not taken
    across ranks. B's and C's groups are read in place, as on one process."""
    check_chunk_size(chunk_size)
    if "cu_seqlens" in options:
        raise ValueError("cu_seqlens: sequences packed by offsets are not taken across ranks "
                         "(pass seq_idx, this rank's rows of it, or run them on one process)")
    check_dt_limit(dt_limit)
    check_mamba(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, None)
    first_cut = None
    if seq_idx is not None:  # (the row before this slice, 0 where none: ids shifted by one)
        before = halo_rows((seq_idx.long() + 1)[..., None], 1, group)[:, 0, 0]
        if seq_idx.shape[1]:
            first_cut = (before != 0) & (before != seq_idx[:, 0].long() + 1)
    (q, k, v, g), skip, s0 = ssd_operands(x, dt, A, B, C, D, dt_bias, initial_states, seq_idx,
                                          (dt_softplus, dt_limit), first_cut)
    res = causal_linear_decoder_sp(q, k, v, group=group, initial_state=s0,
                                   output_final_state=return_final_states, g=g, **options)
    o, final = res if return_final_states else (res, None)
    y = ssd_output(o, skip, z, x.dtype)
    return (y, final.transpose(-1, -2)) if return_final_states else y


def halo_rows(x: torch.Tensor, rows: int, group=None) -> torch.Tensor:
    """The ``rows`` rows of the whole sequence just before this rank's first, ``(batch, rows,
    C)`` from x ``(batch, L_k, C)`` (each rank its contiguous slice, rank order = sequence
    order), zeros before the sequence's start: what a causal convolution K = rows + 1 wide reads
    across a rank boundary. They may come from several earlier ranks (a slice shorter than
    ``rows``). A collective call; differentiable: their gradients go back to the ranks that
    hold them (every rank takes part in the backward's gather too). One all-gather of ``rows``
    rows a rank (and one of the slices' lengths) each way."""
    rank, world = _rank_world(group)
    if world == 1 or rows == 0:
        return x.new_zeros(x.shape[0], rows, x.shape[2])
    refuse_transforms("halo_rows")
    return _Halo.apply(x, rows, group)


def _halo_sources(lengths: list, rows: int, q: int) -> list:
    """For each row h of rank q's halo: ``(rank, row of that rank's tail)`` or None (before the
    sequence), the tails being each rank's last ``lengths[j]`` (≤ rows) rows."""
    starts = [sum(lengths[:j]) for j in range(q)]
    total = sum(lengths[:q])
    out = []
    for h in range(rows):
        at = total - rows + h
        src = None
        for j in range(q):
            if starts[j] <= at < starts[j] + lengths[j]:
                src = (j, at - starts[j])
        out.append(src)
    return out


class _Halo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, rows, group):
        rank, world = _rank_world(group)
        batch, n, width = x.shape
        kept = min(n, rows)
        lengths = _all_gather(torch.tensor([kept], device=x.device), group).view(-1).tolist()
        tail = torch.nn.functional.pad(x[:, n - kept:], (0, 0, 0, rows - kept))  # (first rows)
        tails = _all_gather(tail, group)                       # (world, batch, rows, width)
        halo = x.new_zeros(batch, rows, width)
        for h, src in enumerate(_halo_sources(lengths, rows, rank)):
            if src is not None:
                halo[:, h] = tails[src[0], :, src[1]]
        ctx.args = (group, rows, n, lengths)
        return halo

    @staticmethod
    def backward(ctx, dhalo):
        group, rows, n, lengths = ctx.args
        rank, world = _rank_world(group)
        grads = _all_gather(dhalo.contiguous(), group)         # every rank's halo gradient
        dx = dhalo.new_zeros(dhalo.shape[0], n, dhalo.shape[2])
        kept = lengths[rank]
        for q in range(rank + 1, world):
            for h, src in enumerate(_halo_sources(lengths, rows, q)):
                if src is not None and src[0] == rank:
                    dx[:, n - kept + src[1]] += grads[q, :, h]
        return dx, None, None


def local_state(C: torch.Tensor, V: torch.Tensor, gamma: torch.Tensor | None, *,
                reverse: bool = False, fp32_precision: str | None = None,
                g: torch.Tensor | None = None) -> torch.Tensor:
    """``Σ_j λ^(L-1-j) c_jᵀ v_j`` (``reverse``: ``Σ_j λ^j c_jᵀ v_j``), ``(batch, heads, r, d)`` in the
    state dtype (C may hold groups of V's heads, read in place on a GPU): one pass over C and V (the
    Triton kernel ``chunk_state`` on a GPU, a matrix product elsewhere). ``g``: per-token gates with
    γ folded in (gamma None), read at each row (in reverse, the caller passes them shifted:
    :func:`leetrepro.decay.per_token.shift_gates`)."""
    if C.is_cuda and V.dtype in GPU_DTYPES:
        from .methods.chunk import chunk_state
        return chunk_state(C, V, gamma, reverse=reverse, fp32_precision=fp32_precision, g=g)
    sd = ops.state_dtype(V.dtype)
    C = expand_groups(C, V.shape[1])  # (a matrix product takes a head each)
    if reverse:
        C, V = C.flip(2), V.flip(2)
        g = None if g is None else g.flip(-1)
    G = None if g is None else running_gates(g)
    return final_state(C.to(sd), V.to(sd), log_gamma(gamma, sd), G=G)


def _rank_world(group) -> tuple[int, int]:
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_gather(x: torch.Tensor, group) -> torch.Tensor:
    """``(world, *x.shape)``: every rank's x (one collective)."""
    _, world = _rank_world(group)
    if world == 1:
        return x[None]
    out = x.new_empty(world * x.numel())  # flat: the layout every backend accepts
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x.contiguous().view(-1), group=group)
    return out.view(world, *x.shape)


def _decayed_sum(states: torch.Tensor, steps: torch.Tensor, gamma: torch.Tensor | None):
    """``Σ_q λ^(steps_q) states_q`` over the first dim, per head; steps ≥ 0 (int64, on device).
    With gates, ``steps`` is the log decay itself, ``(q, batch, heads)`` (gamma None)."""
    if steps.is_floating_point():
        return (states * torch.exp(steps).to(states.dtype)[..., None, None]).sum(0)
    if gamma is None:
        return states.sum(0)
    w = torch.exp(steps.to(torch.float64)[:, None] * torch.log(gamma.to(torch.float64))[None, :])
    return torch.einsum("qbhrd,qh->bhrd", states, w.to(states.dtype))


def _pack(parts: list[torch.Tensor], length: int | None = None) -> torch.Tensor:
    """States (and a row count, its int64 bits carried in the states' dtype) as one flat buffer."""
    flat = [p.reshape(-1) for p in parts]
    if length is not None:
        n = torch.tensor([length], dtype=torch.int64).view(parts[0].dtype)
        flat.append(n.to(parts[0].device))
    return torch.cat(flat)


class _SequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, B, C, V, S0, g, group, m, opts, want_final, gates=None):
        rank, world = _rank_world(group)
        batch, _, n, r = B.shape  # (B and C may hold groups: the states are a head each)
        heads, d = V.shape[1], V.shape[-1]
        sd = ops.state_dtype(V.dtype)
        size = batch * heads * r * d
        gate = fold_gates(gates, g, gate_dtype(V.dtype))
        own = local_state(C, V, None if gate is not None else g,
                          fp32_precision=opts.get("fp32_precision"), g=gate)
        total = None
        if gate is not None:  # the slice's total gate rides with its state
            total = gate.to(sd).sum(-1)
            if S0 is not None:
                own = own + S0.to(sd) * torch.exp(total)[..., None, None]
            gathered = _all_gather(_pack([own, total.to(sd)], n), group)
        else:
            if S0 is not None:
                own = own + decayed_by(S0.to(sd), g, n)
            gathered = _all_gather(_pack([own], n), group)
        states = gathered[:, :size].reshape(world, batch, heads, r, d)
        lengths = gathered[:, -(8 // gathered.element_size()):].contiguous().view(
            torch.int64).reshape(world)
        ends = lengths.cumsum(0)
        starts = ends - lengths
        steps = starts, ends
        if gate is not None:  # the log decays between slices from their totals
            totals = gathered[:, size:size + batch * heads].reshape(world, batch, heads)
            steps = _gate_steps(totals)
        if rank == 0:
            s_in = S0
        else:
            s_in = _decayed_sum(states[:rank], _between(steps, rank, slice(0, rank)), g)
        out, _ = ops.run(m, opts, B, C, V, g, s_in, False, False, g=gates)
        final = (_decayed_sum(states, _after(steps, slice(0, world)), g) if want_final
                 else V.new_empty(0, dtype=sd))
        s_out = None
        if gate is not None:  # (the slice's outgoing state: dg's ⟨D_k, S_out⟩ term)
            s_out = own if rank == 0 or s_in is None else \
                own + s_in.to(sd) * torch.exp(total)[..., None, None]
        ctx.save_for_backward(B, C, V, g, s_in, *steps, gates, s_out)
        ctx.args = (group, m, opts, want_final, S0 is not None)
        return out, final

    @staticmethod
    def backward(ctx, dO, dfinal):
        B, C, V, g, s_in, first, second, gates, s_out = ctx.saved_tensors
        steps = (first, second)
        group, m, opts, want_final, has_s0 = ctx.args
        rank, world = _rank_world(group)
        batch, _, n, r = B.shape  # (B and C may hold groups: the states are a head each)
        heads, d = V.shape[1], V.shape[-1]
        sd = ops.state_dtype(V.dtype)
        dO = torch.zeros_like(V) if dO is None else dO.to(V.dtype)
        precision = opts.get("fp32_precision")
        if gates is not None:  # Σ_t e^(G_t) b_tᵀ dO_t: reverse time on shifted gates, × e^(g_0)
            gate = fold_gates(gates, g, gate_dtype(V.dtype))
            own = local_state(B, dO, None, reverse=True, fp32_precision=precision,
                              g=shift_gates(gate))
            if n:
                own = own * torch.exp(gate[..., 0].to(sd))[..., None, None]
        else:
            own = decayed_by(local_state(B, dO, g, reverse=True, fp32_precision=precision),
                                g, 1)
        parts = [own]
        if want_final:
            parts.append(torch.zeros(batch, heads, r, d, dtype=sd, device=V.device)
                         if dfinal is None else dfinal.to(sd))
        gathered = _all_gather(_pack(parts), group).view(world, len(parts), batch, heads, r, d)
        # the gradient of this rank's outgoing state: later ranks' own parts, then S_N's
        dS = None
        if rank < world - 1:
            dS = _decayed_sum(gathered[rank + 1:, 0],
                              _between(steps, slice(rank + 1, world), rank), g)
        if want_final:  # every rank's copy of S_N fed its own loss: their gradients add
            tail = _decayed_sum(gathered[:, 1].sum(0)[None], _after(steps, rank, True), g)
            dS = tail if dS is None else dS + tail
        need_b, need_c, need_v, need_s0 = ctx.needs_input_grad[:4]
        need_g = gates is not None and ctx.needs_input_grad[9]
        need_s0 = bool(need_s0 and has_s0)
        dB, dC, dV, dS0, dg = ops.causal_linear_backward(
            dO, B, C, V, g, s_in, dS, m.name, ops.encode_options(opts), False,
            need_b, need_c, need_v, need_s0, g=gates, SN=s_out if dS is not None else None,
            need_g=bool(need_g))
        return (dB if need_b else None, dC if need_c else None, dV if need_v else None,
                dS0 if need_s0 else None, None, None, None, None, None,
                dg if need_g else None)


def _gate_steps(totals: torch.Tensor) -> tuple:
    """``(before, totals)``: each slice's total gate ``(world, batch, heads)`` and the sum of the
    totals of the slices before it (exclusive prefix), for :func:`_between` and :func:`_after`."""
    prefix = totals.cumsum(0)
    return prefix - totals, totals


def _between(steps: tuple, to, frm):
    """The decay (as :func:`_decayed_sum` takes it) from the end of slice(s) ``frm`` to the start
    of slice(s) ``to``: λ^(s_to − e_frm) in steps of rows, or with gates the log decay
    Σ_(frm < p < to) T_p, one of ``to``/``frm`` an index and the other a slice of ranks."""
    first, second = steps
    if first.is_floating_point():  # (before, totals): before[to] − before[frm] − T_frm
        return first[to] - first[frm] - second[frm]
    return first[to] - second[frm]  # starts[to] − ends[frm]


def _after(steps: tuple, frm, single: bool = False):
    """The decay from the end of slice(s) ``frm`` to the end of the sequence (``single``: one
    index, as a one-entry stack)."""
    first, second = steps
    if first.is_floating_point():
        out = first[-1] + second[-1] - first[frm] - second[frm]
    else:
        out = second[-1] - second[frm]
    return out[None] if single else out
