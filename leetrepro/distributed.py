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
Only non-negative powers of λ appear. The collectives are ``torch.distributed``'s (NCCL on GPUs,
gloo on the CPU); the group is an argument, so this composes with data parallelism over the others.

Launch with ``torchrun --nproc-per-node=G script.py`` (README, "Sequences longer than one GPU");
``python -m leetrepro.bench.sp`` is the scaling benchmark (``make bench-sp``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import ops
from ._inputs import check_qkv, log_gamma, normalize_gamma
from ._state import check_state, final_state
from .api import _autocast
from .registry import GPU_DTYPES


def causal_linear_decoder_sp(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma=None, *,
                             group=None, initial_state: torch.Tensor | None = None,
                             output_final_state: bool = False, method: str = "auto", **options):
    """``O = (B Cᵀ ⊙ M) V`` over a sequence cut across the ranks of ``group``; differentiable.

    A collective call: every rank of ``group`` calls it with its own contiguous slice of the
    sequence, rank order = sequence order, and the same batch, heads, r, d, dtype, ``gamma`` and
    ``output_final_state`` (the slices' lengths may differ, 0 included).

    Args:
        B, C: ``(batch, heads, L_k, r)``; V: ``(batch, heads, L_k, d)``: this rank's rows.
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
    g = normalize_gamma(gamma, B.shape[1], B.device)
    m, opts = ops.prepare(method, options, B, g, True)
    out, final = _SequenceParallel.apply(B, C, V, initial_state, g, group, m, opts,
                                         bool(output_final_state))
    return (out, final) if output_final_state else out


def local_state(C: torch.Tensor, V: torch.Tensor, gamma: torch.Tensor | None, *,
                reverse: bool = False, fp32_precision: str | None = None) -> torch.Tensor:
    """``Σ_j λ^(L-1-j) c_jᵀ v_j`` (``reverse``: ``Σ_j λ^j c_jᵀ v_j``), ``(batch, heads, r, d)`` in the
    state dtype: one pass over C and V (the Triton kernel ``chunk_state`` on a GPU, a matrix
    product elsewhere)."""
    if C.is_cuda and V.dtype in GPU_DTYPES:
        from .methods.chunk import chunk_state
        return chunk_state(C, V, gamma, reverse=reverse, fp32_precision=fp32_precision)
    sd = ops.state_dtype(V.dtype)
    if reverse:
        C, V = C.flip(2), V.flip(2)
    return final_state(C.to(sd), V.to(sd), log_gamma(gamma, sd))


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
    """``Σ_q λ^(steps_q) states_q`` over the first dim, per head; steps ≥ 0 (int64, on device)."""
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
    def forward(ctx, B, C, V, S0, g, group, m, opts, want_final):
        rank, world = _rank_world(group)
        batch, heads, n, r = B.shape
        d = V.shape[-1]
        sd = ops.state_dtype(V.dtype)
        size = batch * heads * r * d
        own = local_state(C, V, g, fp32_precision=opts.get("fp32_precision"))
        if S0 is not None:
            own = own + ops._per_head(S0.to(sd), g, n)
        gathered = _all_gather(_pack([own], n), group)
        states = gathered[:, :size].reshape(world, batch, heads, r, d)
        lengths = gathered[:, size:].contiguous().view(torch.int64).reshape(world)
        ends = lengths.cumsum(0)
        starts = ends - lengths
        if rank == 0:
            s_in = S0
        else:
            s_in = _decayed_sum(states[:rank], starts[rank] - ends[:rank], g)
        out, _ = ops.run(m, opts, B, C, V, g, s_in, False, False)
        final = (_decayed_sum(states, ends[-1] - ends, g) if want_final
                 else V.new_empty(0, dtype=sd))
        ctx.save_for_backward(B, C, V, g, s_in, starts, ends)
        ctx.args = (group, m, opts, want_final, S0 is not None)
        return out, final

    @staticmethod
    def backward(ctx, dO, dfinal):
        B, C, V, g, s_in, starts, ends = ctx.saved_tensors
        group, m, opts, want_final, has_s0 = ctx.args
        rank, world = _rank_world(group)
        batch, heads, n, r = B.shape
        d = V.shape[-1]
        sd = ops.state_dtype(V.dtype)
        dO = torch.zeros_like(V) if dO is None else dO.to(V.dtype)
        own = ops._per_head(local_state(B, dO, g, reverse=True,
                                        fp32_precision=opts.get("fp32_precision")), g, 1)
        parts = [own]
        if want_final:
            parts.append(torch.zeros(batch, heads, r, d, dtype=sd, device=V.device)
                         if dfinal is None else dfinal.to(sd))
        gathered = _all_gather(_pack(parts), group).view(world, len(parts), batch, heads, r, d)
        # the gradient of this rank's outgoing state: later ranks' own parts, then S_N's
        dS = None
        if rank < world - 1:
            dS = _decayed_sum(gathered[rank + 1:, 0], starts[rank + 1:] - ends[rank], g)
        if want_final:  # every rank's copy of S_N fed its own loss: their gradients add
            tail = _decayed_sum(gathered[:, 1].sum(0)[None], (ends[-1] - ends[rank]).view(1), g)
            dS = tail if dS is None else dS + tail
        need_b, need_c, need_v, need_s0 = ctx.needs_input_grad[:4]
        need_s0 = bool(need_s0 and has_s0)
        dB, dC, dV, dS0 = ops.causal_linear_backward(
            dO, B, C, V, g, s_in, dS, m.name, ops.encode_options(opts), False,
            need_b, need_c, need_v, need_s0)
        return (dB if need_b else None, dC if need_c else None, dV if need_v else None,
                dS0 if need_s0 else None, None, None, None, None, None)
