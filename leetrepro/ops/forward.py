"""One run of a resolved method (:func:`run`): groups expanded where the method reads none, the
gates folded and shifted for reverse time, packed sequences one by one where the method takes
none, time flipped where it has no reverse mode, outputs placed in their layouts
(:func:`output_like`, :func:`_into`).
"""
from __future__ import annotations

import functools

import torch

from .._groups import expand_groups, lane_heads
from ..decay.per_token import fold_gates, gate_dtype, shift_gates
from ..methods import chunk
from ..registry import Method


from . import resolution


def run(m: Method, opts: dict, B, C, V, gamma, initial_state, reverse: bool,
        output_final_state: bool, dual: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None, scale: float = 1.0,
        out: torch.Tensor | None = None, out2: torch.Tensor | None = None,
        g: torch.Tensor | None = None, folded: bool = False, gate_pieces: tuple | None = None,
        rows: tuple | None = None):
    """Run method ``m`` (already resolved, options checked): ``(O, S_N or an empty tensor)``;
    with ``dual`` (a method with ``Method.dual``, N ≥ 1), O is the pair (O, op(dual, V, C)).
    ``cu_seqlens``: sequences packed along N (batch 1), each with its own state; a method without
    ``Method.varlen`` runs them one by one. ``scale`` multiplies O (not S_N).

    Layout: O is dense in V's dimension order (:func:`output_like`: a time-major V gives a
    time-major O, whose ``transpose(1, 2).reshape(b, N, h·d)`` is a view), the dual output in
    B's, or written into ``out``/``out2`` (any strides) when given: a method with ``Method.out``
    writes there itself, others' results are copied in.

    ``g``: per-token log gates ``(batch, heads, N)`` (a method with ``Method.gates``); a γ folds
    into them here (``folded``: the caller did, once for its several sweeps). In reverse time the
    method gets them shifted (:func:`shift_gates`; ``folded="reversed"``: the caller shifted them
    too, once for a backward's reverse sweeps).
    Operands of fewer heads than the call (groups, :mod:`leetrepro._groups`) go to a method with
    ``Method.groups`` as they are (its outputs a head each, dense where their like is grouped),
    to others expanded. ``gate_pieces``: Chunk's gated backward sweeps' (:func:`_gradients`);
    ``rows``: Chunk's gated forward sweep's V row weights and skip (``chunk_scan``'s, the SSD's
    rows in the sweep: ``compat``)."""
    # (plain comparisons, no call: the host path of every call runs them)
    if B.shape[1] != V.shape[1] or C.shape[1] != V.shape[1] or \
            (dual is not None and dual.shape[1] != V.shape[1]):
        heads = lane_heads(B, C, V, dual)
        if not m.groups or 0 in B.shape or 0 in V.shape:
            B, C, V, dual = (expand_groups(x, heads) for x in (B, C, V, dual))
    if g is not None and not folded:
        g, gamma = folded_gates(g, gamma, gate_dtype(V.dtype))[0], None
    if cu_seqlens is not None and not m.varlen:
        res = _run_each(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state,
                        dual, cu_seqlens, scale, g, "reversed" if folded == "reversed" else True)
        return _placed(res, B, V, dual, out, out2)
    batch, _, n, r = B.shape
    d = V.shape[-1]
    sdtype = resolution.state_dtype(V.dtype)
    no_state = V.new_empty(0, dtype=sdtype)
    if n == 0 or batch == 0 or V.shape[1] == 0 or d == 0 or r == 0:
        # N = 0 passes the initial state through; r = 0 leaves it empty
        count = batch if cu_seqlens is None else cu_seqlens.numel() - 1
        o, s = _empty_sequences(V, r, initial_state, output_final_state, count)
        return _placed((o if dual is None else (o, torch.zeros_like(B)), s), B, V, dual, out,
                       out2)
    kw = dict(opts)
    if initial_state is not None or output_final_state:
        kw.update(initial_state=initial_state, output_final_state=output_final_state)
    flip = reverse and not m.reverse
    if reverse and m.reverse:
        kw["reverse"] = True
    if dual is not None:
        kw["dual"] = dual
    if gate_pieces is not None:
        kw["gate_pieces"] = gate_pieces
    if rows is not None:
        kw["rows"] = rows
    if cu_seqlens is not None:
        kw["cu_seqlens"] = cu_seqlens
    if g is not None:
        if "per_token" not in m.decays:
            resolution._refuse_rule(m, "per_token")
        g = shift_gates(g, cu_seqlens) if reverse and folded != "reversed" else g
        kw["g"] = g.flip(-1) if flip else g
    if scale != 1.0 and m.scale:
        kw["scale"] = scale
    if m.out and not flip:
        kw.update(out=out, out2=out2)
    if flip:
        B, C, V = B.flip(2), C.flip(2), V.flip(2)
        dual = None if dual is None else dual.flip(2)
    res = m.fn(B, C, V, gamma, **kw)
    o, s = res if output_final_state else (res, no_state)
    if scale != 1.0 and not m.scale:
        o = tuple(x * scale for x in o) if dual is not None else o * scale
    if flip:
        o = tuple(x.flip(2) for x in o) if dual is not None else o.flip(2)
    return _placed((o, s), B, V, dual, out, out2)


def folded_gates(g: torch.Tensor, gamma, dtype: torch.dtype, cu_seqlens=None,
                 twin: bool = False) -> tuple:
    """``(gate, reverse_gate)``: the gates a call's sweeps read, ``fold_gates(g, gamma, dtype)``,
    and with ``twin`` the reverse sweeps' (``shift_gates`` of them) where they come from the
    same launch, else None (the caller shifts them if a reverse sweep runs). Without a γ, in
    float32, and one sequence a row where shifted, that launch also sums them within the Hopper
    kernel's tiles (:func:`leetrepro.methods.chunk.hopper_launch.folded_gate_sums`,
    :data:`leetrepro.methods.chunk.tables.GATE_FOLD_FUSED`): the same values."""
    if gamma is None and dtype == torch.float32 and not (twin and cu_seqlens is not None):
        made = chunk.hopper_launch.folded_gate_sums(g, twin=twin)
        if made is not None:
            return made
    return fold_gates(g, gamma, dtype), None


def output_like(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised output shaped like x, dense in x's dimension order: the layout every
    method's O (like V) and gradient (like its input) comes in. The same rule for real and fake
    tensors, so a compiled graph's strides are the kernels' (``torch.empty_like`` of a view keeps
    its order: a time-major view of ``(b, N, h, d)`` gives a time-major O)."""
    return torch.empty_like(x)


def _placed(res, B, V, dual, out, out2):
    """``(O, S)`` with O (and the dual output) in the documented layouts: written into
    ``out``/``out2`` where given, else dense in V's (B's) dimension order; a copy only where the
    method returned another layout (methods without ``Method.out``)."""
    o, s = res
    if dual is not None:
        return (_into(o[0], V, out), _into(o[1], B, out2)), s
    return _into(o, V, out), s


def _into(x: torch.Tensor, like: torch.Tensor, dest: torch.Tensor | None) -> torch.Tensor:
    if dest is not None:
        if x.data_ptr() != dest.data_ptr() or x.stride() != dest.stride():
            dest.copy_(x)
        return dest
    if x.shape != like.shape:  # (a head each where ``like`` holds groups: as the method gave it)
        return x
    if x.stride() == _dense_strides(like.shape, like.stride()):
        return x
    return output_like(like).copy_(x)


@functools.lru_cache(maxsize=1024)
def _dense_strides(shape, stride) -> tuple:
    """The strides of :func:`output_like` for a tensor of this shape and these strides."""
    return torch.empty_like(torch.empty_strided(shape, stride, device="meta")).stride()


def _empty_sequences(V, r, initial_state, output_final_state, count):
    """Zero outputs shaped like V and ``count`` final states: zeros, or the initial states."""
    sdtype = resolution.state_dtype(V.dtype)
    out = torch.zeros_like(V)
    if not output_final_state:
        return out, V.new_empty(0, dtype=sdtype)
    s = V.new_zeros(count, V.shape[1], r, V.shape[-1], dtype=sdtype)
    return out, s if initial_state is None else s + initial_state.to(sdtype)


def _run_each(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state, dual, cu,
              scale, g=None, folded=True):
    """Packed sequences one call each (methods without a packed mode; one host read of cu)."""
    bounds = cu.tolist()
    outs, outs2, states = [], [], []
    for i in range(len(bounds) - 1):
        rows = slice(bounds[i], bounds[i + 1])
        s0 = None if initial_state is None else initial_state[i:i + 1]
        o, s = run(m, opts, B[:, :, rows], C[:, :, rows], V[:, :, rows], gamma, s0, reverse,
                   output_final_state, None if dual is None else dual[:, :, rows], scale=scale,
                   g=None if g is None else g[:, :, rows], folded=folded)
        if dual is not None:
            o, o2 = o
            outs2.append(o2)
        outs.append(o)
        states.append(s)
    out = torch.cat(outs, 2) if outs else V.new_zeros(V.shape)
    if dual is not None:
        out = (out, torch.cat(outs2, 2) if outs2 else B.new_zeros(B.shape))
    if not output_final_state:
        return out, V.new_empty(0, dtype=resolution.state_dtype(V.dtype))
    return out, torch.cat(states, 0) if states else _empty_sequences(
        V, B.shape[-1], initial_state, True, 0)[1]


def _dual_fits(B: torch.Tensor, V: torch.Tensor) -> bool:
    """Whether the fused dV/dC sweep applies: the whole r × d state in one lane (r, d ≤ 128),
    nothing empty (``run`` handles empty shapes apart)."""
    return B.numel() > 0 and V.numel() > 0 and B.shape[-1] <= 128 and V.shape[-1] <= 128
