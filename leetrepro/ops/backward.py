"""The backward's algebra (the package's docstring derives it): one sweep per gradient asked
for, dV's and dC's in one where the method has a dual mode, each gradient written in its
input's layout (:func:`gradient_buffers`), the gates' gradient from the sweeps' pieces, the
straddle kernel or the row dots (:func:`_gradients`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .._groups import expand_groups, sum_groups
from ..decay.per_head import decayed_by
from ..decay.per_token import first_decay, gate_dtype, gate_gradient_from_dots, shift_gates
from ..registry import Method


from . import forward, gate_sweeps


class _Backward(NamedTuple):
    """One backward's call as its sweeps share it: the method and its options, dO, B, C, V (a
    head each, or in groups for a method that reads them), the per-head decay (None with gates,
    which are folded into ``gate``), the gates as the forward sweeps read them and ``shifted``
    as the reverse sweeps do (None: shifted where a reverse sweep needs them), the states, the
    direction of time, packed sequences and the output's scale."""
    m: Method
    opts: dict
    dO: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    V: torch.Tensor
    gamma: torch.Tensor | None
    gate: torch.Tensor | None
    shifted: torch.Tensor | None
    initial_state: torch.Tensor | None
    dS: torch.Tensor | None
    reverse: bool
    cu_seqlens: torch.Tensor | None
    scale: float


def _gradients(m: Method, opts: dict, dO, B, C, V, gamma, initial_state, dS, reverse: bool,
               need_b: bool, need_c: bool, need_v: bool, need_s0: bool, cu_seqlens,
               scale: float, shared: bool = False, g: torch.Tensor | None = None,
               SN: torch.Tensor | None = None, need_g: bool = False,
               rows: tuple | None = None) -> tuple:
    """:func:`causal_linear_backward` by a resolved method and its options. Each gradient comes
    in its input's layout (:func:`gradient_buffers`; ``shared``: as views of one buffer where
    B, C, V are the slices of one projection), written there by the kernel itself (Chunk), so
    that neither autograd nor the projection's backward copies it.

    ``rows = (x, w, D)``: V is w·x (Mamba-2's V' = dt·x, D its skip). Where the reverse sweep
    with the dual output carries the gates' pieces (:func:`_row_dots`),
    it reads x (``chunk_scan``'s ``rows`` with the row dots) and writes dx = w·dV + D·dO in
    dV's place; the result is then ``(gradients, RD)`` with RD the float32 row dots ``(2, 1,
    batch·heads, N)`` (x·dV, x·dO), else ``(gradients, None)``."""
    def done(res):  # (the paths that never take the rows: their gradients as they are)
        return res if rows is None else (res, None)
    heads, groups = V.shape[1], B.shape[1]
    if groups != heads and (not m.groups or 0 in B.shape or 0 in V.shape):
        # a method that reads no groups: its gradients for B and C expanded, then summed over
        # each group's heads into B's and C's layouts (as the fake has them: a time-major B's
        # gradient summed head-major once failed torch.compile's check of a Mamba-2 block)
        res = _gradients(m, opts, dO, expand_groups(B, heads), expand_groups(C, heads), V, gamma,
                         initial_state, dS, reverse, need_b, need_c, need_v, need_s0, cu_seqlens,
                         scale, False, g, SN, need_g)
        return done(tuple(_group_sums(x, groups, like) if i < 2 and x.numel() else x
                          for i, (x, like) in enumerate(zip(res, (B, C, V, V, V)))))
    gate = shifted = None
    if g is not None:
        if reverse:
            raise ValueError("the operator in reverse time with gates has no backward here")
        # (the reverse sweeps' gates with them: one launch where the Hopper sweeps' tile sums
        # come with both)
        (gate, shifted), gamma = forward.folded_gates(g, gamma, gate_dtype(V.dtype), cu_seqlens,
                                                      twin=True), None
    wanted = (need_b, need_c, need_v, need_s0, need_g)
    opts, pieces, straddle, (need_b, need_c, need_v) = _route(
        m, opts, dO, B, C, V, cu_seqlens, (need_b, need_c, need_v), need_g, rows is not None)
    call = _Backward(m, opts, dO, B, C, V, gamma, gate, shifted, initial_state, dS, reverse,
                     cu_seqlens, scale)
    if need_g and not straddle and pieces is None and _rounds_into_dg(m, opts, B.dtype):
        return done(_on_wide_copies(call, wanted, SN, g))
    if m.gradients is not None and initial_state is None and dS is None and cu_seqlens is None \
            and not reverse and gate is None and (need_b or need_c or need_v):
        grads = m.gradients(dO * scale if scale != 1.0 else dO, B, C, V, gamma, **opts)
        return done(tuple(forward._into(g, x, None) if k else V.new_empty(0)
                          for g, x, k in zip(grads, (B, C, V), (need_b, need_c, need_v))) +
                    (V.new_empty(0), V.new_empty(0)))
    if groups != heads:  # (a head each: summed over each group's heads at the end)
        dB, dC = (B.new_empty(B.shape[0], heads, *B.shape[2:]) if need else None
                  for need in (need_b, need_c))
        dV = forward.output_like(V) if need_v else None
    else:
        dB, dC, dV = gradient_buffers(B, C, V, need_b, need_c, need_v, shared)
    dB, dC, dV, dS0, SN, rd = _sweeps(call, (dB, dC, dV), (need_b, need_c, need_v, need_s0),
                                      pieces, rows, SN)
    dg = None
    if pieces is not None:
        # (the folded gates and their tile sums let go before dg is made: with every gradient
        # buffer alive, this is a gated backward's peak)
        del call
        gate = shifted = None
        dg = gate_sweeps.gradient_from_pieces(pieces, dS, SN, cu_seqlens, scale, g)
    elif straddle:
        dg = gate_sweeps._straddle_gradient(dO, B, C, V, gate, initial_state, dS, cu_seqlens,
                                            scale, opts.get("gate_grad_precision"))
    elif need_g:
        dg = gate_gradient_from_dots(expand_groups(B, heads), dB, expand_groups(C, heads), dC,
                                     cu_seqlens, dS, SN)
    if dg is not None:  # (in g's layout, as the fake gives it: time-major g, time-major dg)
        dg = forward._into(dg.to(g.dtype), g, None)
    if groups != heads:
        dB, dC = (None if x is None else _group_sums(x, groups, like)
                  for x, like in ((dB, B), (dC, C)))
    # a gradient not asked for is an empty tensor of its own: outputs of a custom op may not alias
    # one another (one shared empty tensor made every partial backward raise)
    res = tuple(x if k else V.new_empty(0) for x, k in zip((dB, dC, dV, dS0, dg), wanted))
    return res if rows is None else (res, rd)


def _route(m: Method, opts: dict, dO, B, C, V, cu_seqlens, need: tuple, need_g: bool,
           rows: bool = False) -> tuple:
    """Where a backward's gates' gradient comes from, and the sweeps that then run:
    ``(opts, pieces, straddle, (need_b, need_c, need_v))``. With B, C or V asked for, from
    pieces Chunk's dB and dV sweeps carry (``pieces``: :func:`gate_sweeps._piece_sweeps`' plan,
    both sweeps run, ``opts`` theirs); dg alone (B, C and V frozen) from the straddle kernel,
    which writes no gradient it drops; else from dB's and dC's row dots (both run). ``rows``:
    Mamba-2's row weights come with the call (:func:`_gradients`)."""
    need_b, need_c, need_v = need
    in_sweeps = need_g and (need_b or need_c or need_v) and \
        gate_sweeps._in_sweeps(m, opts, dO, B, C, V, cu_seqlens)
    straddle = need_g and not in_sweeps and gate_sweeps._straddles(m, V)
    pieces = None
    if in_sweeps:  # (the dB sweep and dV's, alone or with dC's, carry dg's pieces: both run)
        need_b, need_v = True, True
        opts, pieces = gate_sweeps._piece_sweeps(opts, dO, B, C, V, need_c and m.dual and m.reverse,
                                                 cu_seqlens, rows)
    elif need_g and not straddle:
        need_b, need_c = True, True  # (dg is read off dB and dC)
    return opts, pieces, straddle, (need_b, need_c, need_v)


def _rounds_into_dg(m: Method, opts: dict, dtype: torch.dtype) -> bool:
    """Whether dg from the row dots would carry the sweeps' rounding (:func:`_on_wide_copies`):
    16-bit operands, tf32, or fp32's own in the PyTorch methods (float64 inputs never)."""
    if dtype == torch.float64:
        return False
    return torch.float64 in m.dtypes or not gate_sweeps._exact_dots(m, opts, dtype) and \
        (dtype != torch.float32 or "fp32_precision" in m.options)


def _on_wide_copies(call: _Backward, wanted: tuple, SN, g) -> tuple:
    """The backward on copies of the widest dtype the method takes (float64 for the PyTorch
    methods, else fp32 with fp32-exact dots), its gradients rounded back. Without the straddle
    kernel or the sweeps' pieces (PyTorch methods on a CPU), dg is the row dots' running sum to
    the end of the sequence, of terms whose exact sum is small, and a parameter that sums dg over
    the rows (Mamba-2's A and dt_bias) sums that running sum again: any rounding inside the
    sweeps' products (fp16/bf16 operands, tf32, and fp32's own: dA 5e-4 relative at 200 rows
    through LA_torch in fp32, 3e-3 through Bb) adds up to a wrong direction there (dA 0.2-3
    relative in bf16, NOTES.md)."""
    m, opts = call.m, call.opts
    wide_dtype = torch.float64 if torch.float64 in m.dtypes else torch.float32
    wide = [x.to(wide_dtype) for x in (call.dO, call.B, call.C, call.V)]
    gate = call.gate.to(wide_dtype)  # (as folded: γ is in them)
    exact = dict(opts, fp32_precision="tf32x3") if "fp32_precision" in m.options else opts
    if call.dS is not None and SN is not None and SN.numel():
        # the forward's final state enters every row's dg through ⟨dS_N, S_N⟩ (and A's
        # gradient that sum times all of dt): its own rounding would too, so it is taken
        # again here, exact
        SN = forward.run(m, exact, *wide[1:], None, call.initial_state, call.reverse, True,
                         cu_seqlens=call.cu_seqlens, g=gate, folded=True)[1]
    res = _gradients(m, exact, *wide, None, call.initial_state, call.dS, call.reverse,
                     *wanted[:4], call.cu_seqlens, call.scale, g=gate, SN=SN, need_g=True)
    return tuple(x.to(ref.dtype) if k and i < 3 else
                 (forward._into(x.to(g.dtype), g, None) if k and i == 4 else x)
                 for i, (x, ref, k) in enumerate(zip(res, (call.B, call.C, call.V, call.V, call.V),
                                                     wanted)))


def _sweeps(call: _Backward, buffers: tuple, need: tuple, pieces: dict | None,
            rows: tuple | None, SN) -> tuple:
    """The backward's sweeps into ``buffers`` (dB, dC, dV, None where not asked for):
    ``(dB, dC, dV, dS0, SN, row dots)``, one sweep per gradient asked for (dB's forward in time;
    dV's and dC's in reverse, in one dual sweep where the method has one and both are wanted),
    the gates' pieces where ``pieces`` plans them (SN then the dB sweep's own, exact)."""
    m, opts, dO, B, C, V, gamma, gate = call[:8]
    (dB, dC, dV), (need_b, need_c, need_v, need_s0) = buffers, need
    dS0 = R = rd = None
    fwd = dict(cu_seqlens=call.cu_seqlens, scale=call.scale, g=gate, folded=True)
    # (the reverse sweeps' gates shifted once for them all: dV's and dC's sweeps run apart)
    rev_call = fwd if gate is None or not (need_v or need_c or need_s0) else \
        dict(fwd, g=shift_gates(gate, call.cu_seqlens) if call.shifted is None else call.shifted,
             folded="reversed")
    # (the three sweeps' gates summed within tiles once for them all, both directions in one
    # launch, where Chunk's Hopper sweeps take them)
    with gate_sweeps.shared_sums(m, gate, rev_call["g"]):
        if need_b:
            s0t = None if call.initial_state is None else call.initial_state.transpose(-1, -2)
            # (with the pieces, the dB sweep's final state is S_Nᵀ, carried with its rounding
            # taken back: the forward's S_N, rounded as 16-bit sweeps round it, would put that
            # rounding into ⟨dS_N, S_N⟩, which joins every row's dg)
            exact_sn = pieces is not None and call.dS is not None
            b_opts = opts if pieces is None else gate_sweeps._piece_opts(opts, pieces, 0)
            b_pieces = None if pieces is None else (B, *pieces["forward"])
            dB, SNt = forward.run(m, b_opts, dO, V, C, gamma, s0t, call.reverse, exact_sn,
                                  out=dB, gate_pieces=b_pieces, **fwd)
            if exact_sn:
                SN = SNt.transpose(-1, -2)
        rev, rev_opts = None, opts
        if pieces is not None:
            rev = (V if not pieces["dual"] else None, *pieces["reverse"])
            rev_opts = gate_sweeps._piece_opts(opts, pieces, 1)
        # with O = scale·op(…): dV = scale·op_rev(C, B, dO) + the final state's part, so the
        # reverse sweeps start from X/scale and scale what they write; R comes out divided by
        # scale too
        X = None if call.dS is None else decayed_by(call.dS, gamma, -1) / call.scale
        back = not call.reverse
        # one sweep per gradient asked for, and none for the rest: dV's and dC's reverse sweeps
        # share their state (transposed), so a method with a dual mode does both in one sweep
        # only when both are wanted (dS0 comes from either sweep's final state, R or Rᵀ)
        if need_c and (need_v or need_s0) and m.dual and m.reverse and \
                forward._dual_fits(B, V) and (pieces is None or pieces["dual"]):
            # dV's buffer stands in for a dV not asked for (dS0 alone with dC): written, then
            # dropped
            dv_out = dV if dV is not None else forward.output_like(V)
            rd = gate_sweeps._row_dots(m, rows, pieces, B, V)
            # (with the row dots x is read in place of V = w·x, and dx written in dV's place)
            (dV, dC), R = forward.run(m, rev_opts, C, B, dO, gamma, X, back, need_s0,
                                      dual=V if rd is None else rows[0], out=dv_out, out2=dC,
                                      gate_pieces=rev,
                                      rows=None if rd is None else (*rows[1:], rd), **rev_call)
        else:
            if need_v or (need_s0 and not need_c):
                dV, R = forward.run(m, rev_opts, C, B, dO, gamma, X, back, need_s0, out=dV,
                                    gate_pieces=rev, **rev_call)
            if need_c:
                xt = None if X is None else X.transpose(-1, -2)
                dC, Rt = forward.run(m, opts, V, dO, B, gamma, xt, back, need_s0 and R is None,
                                     out=dC, **rev_call)
                R = Rt.transpose(-1, -2) if need_s0 and R is None else R
        if need_s0:  # (in initial_state's layout: R may be a transposed state)
            R = decayed_by(R, gamma, 1) if gate is None else \
                R * first_decay(gate, call.cu_seqlens)
            dS0 = forward._into((R * call.scale).to(call.initial_state.dtype), call.initial_state,
                                None)
    return dB, dC, dV, dS0, SN, rd


def _group_sums(x: torch.Tensor, groups: int, like: torch.Tensor) -> torch.Tensor:
    """Each head's gradient x summed over each group's heads, in ``like``'s layout: one kernel
    launch on a GPU (:func:`leetrepro.methods.ssd_rows.sum_groups_like`), else
    :func:`leetrepro._groups.sum_groups` then a copy into that layout where it differs."""
    from ..methods.ssd_rows import sum_groups_like
    out = sum_groups_like(x, groups, like)
    return forward._into(sum_groups(x, groups), like, None) if out is None else out


def gradient_buffers(B, C, V, need_b: bool, need_c: bool, need_v: bool, shared: bool = False):
    """Uninitialised dB, dC, dV (None where not asked for), each in its input's layout
    (:func:`output_like`). ``shared`` and all three asked for, with B, C, V disjoint views of one
    storage (the slices of one fused projection, :func:`leetrepro.split_projection`): views of one
    buffer laid out as that storage, at the inputs' own offsets and strides, so that the
    projection's gradient is that buffer itself, with no concatenation."""
    if shared and need_b and need_c and need_v and one_buffer(B, C, V):
        flat = torch.empty(B.numel() + C.numel() + V.numel(), dtype=B.dtype, device=B.device)
        return tuple(flat.as_strided(t.shape, t.stride(), t.storage_offset()) for t in (B, C, V))
    return tuple(forward.output_like(t) if need else None
                 for t, need in ((B, need_b), (C, need_c), (V, need_v)))


def one_buffer(B, C, V) -> bool:
    """Whether B, C, V are disjoint views of one storage that cover it exactly
    (:func:`_one_storage`), so that a buffer laid out as that storage, every element written,
    holds their three gradients at their own offsets and strides."""
    return _one_storage(B, C, V) and \
        B.untyped_storage().nbytes() == (B.numel() + C.numel() + V.numel()) * B.element_size()


def _one_storage(B, C, V) -> bool:
    """Whether B, C, V are views of one storage that interleave within its rows without sharing
    an element: one dtype, device and storage, the same batch and row strides, and the columns
    each takes of a row (heads × its last dimension, from its offset) disjoint from the others'
    and from themselves, all within one row stride; rows, and batches, apart."""
    if B.device.type == "meta" or not (B.dtype == C.dtype == V.dtype):
        return False
    ptr = B.untyped_storage().data_ptr()
    if C.untyped_storage().data_ptr() != ptr or V.untyped_storage().data_ptr() != ptr:
        return False
    return _interleaved_rows(*((tuple(t.shape), t.stride(), t.storage_offset()) for t in (B, C, V)))


@functools.lru_cache(maxsize=256)
def _interleaved_rows(*views) -> bool:
    """:func:`_one_storage` on ``(shape, strides, offset)`` of each view (4-D, last stride 1)."""
    (batch, heads, n, _), (sb, _, st, _), _ = views[0]
    if any(v[1][0] != sb and batch > 1 or v[1][2] != st or v[1][3] != 1 or
           v[0][:3] != (batch, heads, n) for v in views):
        return False
    spans = sorted((off + h * stride[1], off + h * stride[1] + shape[3])
                   for shape, stride, off in views for h in range(heads))
    first, last = spans[0][0], max(e for _, e in spans)
    apart = all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    return apart and (n <= 1 or last - first <= st) and (batch <= 1 or sb >= n * st)
