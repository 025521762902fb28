"""Drop-in entry points for users of flash-linear-attention and of mamba_ssm: swapping the import
is the whole change.

    from fla.ops.simple_gla import chunk_simple_gla      # before
    from leetrepro import chunk_simple_gla               # after

Same signature, layout and conventions as flash-linear-attention's ``chunk_simple_gla`` and
``fused_recurrent_simple_gla``: a per-head ``g_gamma``, per-token gates ``g`` (log decays
``(batch, T, heads)``, their running sums taken inside, as there), or both; computed by
:func:`leetrepro.causal_linear_decoder` (``method="auto"``: Chunk on a GPU), differentiable in
q, k, v, g and the initial state. Mamba-2's state-space dual, mamba_ssm's
``mamba_chunk_scan_combined``, is the same operator with Mamba-2's conventions around it
(:func:`mamba_chunk_scan_combined`); its decode step, mamba_ssm's ``selective_state_update``
(the state ``(headdim, dstate)`` stepped in place), is :func:`selective_state_update`.
"""
from __future__ import annotations

import json
import math
import weakref

import torch

from ._direct import apply as direct_apply, plain_backward, refuse_transforms
from ._inputs import check_4d
from .decay.per_head import check_gamma_values, mark_checked
from .decay.per_token import positive_where_free
from .decay.trapezoid import key_weights, pending_state, rotate_pairs
from .api import causal_linear_decoder, prepared
from .methods import chunk
from .methods.ssd_rows import (scale_and_skip_gradients, scale_rows, scale_rows_and_skip,
                               scaled, step_sizes_and_gates)
from . import ops
from .methods.mamba3_rows import (angle_sums, gated_output, pair_sums, pair_sums_on_kernel,
                                  rotate as _rotate, rotate_backward as _rotate_backward,
                                  suffix_differences, turned_rows)
from .methods.state_update import selective_state_update  # noqa: F401  (a drop-in, re-exported)

#: exp(g_gamma) per g_gamma tensor (and version), so that a model calling every layer with the
#: same g_gamma hands the operator the same gamma tensor (its checks are then cached: no host sync)
_DECAYS: dict = {}
#: the ``g_gamma`` tensors whose values :func:`decays_from_log` has checked (object and version)
_LOGS_CHECKED: dict = {}


def memo_by_tensor(cache: dict, t: torch.Tensor, make):
    """``make(t)``, cached per tensor object and version (keyed by id, confirmed by a weak
    reference; at most 256 entries): what a model computes from the same decay tensor every layer.
    Not traceable (a tensor's version breaks a ``torch.compile`` graph): call it where the graph
    runs (inside a custom op), not where it is traced."""
    key = (id(t), t._version)
    hit = cache.get(key)
    if hit is not None and hit[0]() is t:
        return hit[1]
    value = make(t)
    if len(cache) >= 256:
        cache.clear()
    cache[key] = (weakref.ref(t), value)
    return value


def chunk_simple_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     g: torch.Tensor | None = None, g_gamma: torch.Tensor | None = None,
                     scale: float | None = None, initial_state: torch.Tensor | None = None,
                     output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                     head_first: bool = False, *, cu_seqlens_cpu: torch.Tensor | None = None,
                     chunk_size: int | None = None, state_v_first: bool = False, **options):
    """flash-linear-attention's ``chunk_simple_gla``, computed by this project.

    Args:
        q, k: ``(batch, T, heads, K)``; v: ``(batch, T, heads, V)`` (``head_first=True``:
            ``(batch, heads, T, K)``). Read in place, whatever the layout, by the Chunk kernel.
        g: per-token log gates ``(batch, T, heads)`` (``head_first=True``: ``(batch, heads, T)``),
            ≤ 0: row t decays the state by exp(g_t) (simple GLA; Mamba-2's ``dt·A``). Raw gates,
            not their running sums (taken inside, in float32, as flash-linear-attention does);
            any float dtype, read in place; differentiable. None: no per-token decay.
        g_gamma: ``(heads,)`` log decay per head (λ = exp(g_gamma) in (0, 1]); None: no decay.
            With ``g`` too, the decays multiply.
        scale: multiplies q·kᵀ; default ``K ** -0.5``. Applied as O is written (free).
        initial_state: ``(N, heads, K, V)`` (``state_v_first=True``: ``(N, heads, V, K)``), N the
            batch or the number of packed sequences.
        output_final_state: also return the final state (float32), in initial_state's layout.
        cu_seqlens: int32 offsets of sequences packed along T of a batch of one.
        cu_seqlens_cpu: the same offsets on the host: their checks read these instead of copying
            ``cu_seqlens`` from the GPU (no host synchronisation).
        chunk_size: flash-linear-attention's tile length. The result does not depend on it, and
            Chunk takes its tile length from its tuned launch table, so it is checked (a positive
            integer) and otherwise not used.
        state_v_first: the states are ``(…, V, K)``, the transpose of this project's ``(…, K, V)``.
        **options: passed to :func:`leetrepro.causal_linear_decoder` (``method=``, …).

    Returns:
        ``(o, final_state)``: o in q's layout and v's dtype, final_state None unless asked for.

    Errors name flash-linear-attention's arguments (q, k, v, g_gamma, T, K, V).
    """
    if chunk_size is not None:
        check_chunk_size(chunk_size)
    _check_fla(q, k, v, g_gamma, initial_state, head_first, state_v_first, g)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    gamma = None if g_gamma is None else _decay(g_gamma)
    if head_first:
        B, C, V = q, k, v
    else:
        B, C, V = (x.transpose(1, 2) for x in (q, k, v))
        g = None if g is None else g.transpose(1, 2)
    if state_v_first and initial_state is not None:
        initial_state = initial_state.transpose(-1, -2)
    res = causal_linear_decoder(B, C, V, gamma, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                cu_seqlens_cpu=cu_seqlens_cpu, scale=scale, g=g, **options)
    o, final = res if output_final_state else (res, None)
    if state_v_first and final is not None:
        final = final.transpose(-1, -2).contiguous()
    return (o if head_first else o.transpose(1, 2)), final


def fused_recurrent_simple_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               g: torch.Tensor | None = None, g_gamma: torch.Tensor | None = None,
                               scale: float | None = None,
                               initial_state: torch.Tensor | None = None,
                               output_final_state: bool = False, reverse: bool = False,
                               cu_seqlens: torch.Tensor | None = None, head_first: bool = False,
                               **options):
    """flash-linear-attention's ``fused_recurrent_simple_gla`` (its token-by-token kernel, for
    decoding and for checking), computed by this project: the same operator as
    :func:`chunk_simple_gla`, whose arguments it takes, by the chunked kernel (exact to the
    same tolerance; a step-by-step loop has no advantage here at any length).

    ``reverse``: the recurrence runs from the last token back (h_t = exp(g_t) h_(t+1) +
    k_tᵀ v_t, o_t = q_t h_t), the operator on the time-reversed rows and gates; not with
    ``cu_seqlens`` (flash-linear-attention reverses each packed sequence; pass them one by one)."""
    if not reverse:
        return chunk_simple_gla(q, k, v, g=g, g_gamma=g_gamma, scale=scale,
                                initial_state=initial_state, output_final_state=output_final_state,
                                cu_seqlens=cu_seqlens, head_first=head_first, **options)
    if cu_seqlens is not None:
        raise ValueError("fused_recurrent_simple_gla: reverse=True with cu_seqlens is not "
                         "supported here; reverse each sequence in its own call")
    t = 2 if head_first else 1
    o, final = chunk_simple_gla(q.flip(t), k.flip(t), v.flip(t),
                                g=None if g is None else g.flip(t), g_gamma=g_gamma, scale=scale,
                                initial_state=initial_state,
                                output_final_state=output_final_state, head_first=head_first,
                                **options)
    return o.flip(t), final


def _check_fla(q, k, v, g_gamma, initial_state, head_first: bool, state_v_first: bool,
               g=None) -> None:
    """The drop-in's inputs checked in flash-linear-attention's terms (q, k, v, g, T, K, V), with
    the layout named where a shape says the data is in the other one."""
    layout = "(batch, heads, T, K)" if head_first else "(batch, T, heads, K)"
    check_4d((("q", q, layout), ("k", k, layout), ("v", v, layout.replace("K", "V"))))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.shape != k.shape or q.shape[:3] != v.shape[:3]:
        raise ValueError(f"q and k must have one shape {layout} and v the same but its last dim "
                         f"(V); got {shapes}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    heads_dim, time_dim = (1, 2) if head_first else (2, 1)
    heads = q.shape[heads_dim]
    other = "head_first=False (batch, T, heads, K)" if head_first else \
        "head_first=True (batch, heads, T, K)"
    if isinstance(g_gamma, torch.Tensor) and g_gamma.numel() != heads:
        hint = (f"; it matches dim {time_dim} ({q.shape[time_dim]}), so the inputs look laid out "
                f"as {other}: pass that" if g_gamma.numel() == q.shape[time_dim] else "")
        raise ValueError(f"g_gamma has {g_gamma.numel()} entries but q {tuple(q.shape)} read as "
                         f"{layout} has {heads} heads{hint}")
    if g is not None:
        want = (q.shape[0], heads, q.shape[2]) if head_first else tuple(q.shape[:3])
        if not isinstance(g, torch.Tensor) or not g.is_floating_point():
            raise TypeError(f"g must be a floating tensor {layout[:-4]}), got "
                            f"{getattr(g, 'dtype', type(g).__name__)}")
        if tuple(g.shape) != want:
            raise ValueError(f"g must have shape {layout[:-4]}) = {want} (one log gate per token "
                             f"and head), got {tuple(g.shape)}")
        if g.device != q.device:
            raise ValueError(f"g is on {g.device}, q on {q.device}")
    if isinstance(initial_state, torch.Tensor):
        K, Vd = q.shape[-1], v.shape[-1]
        want = (heads, Vd, K) if state_v_first else (heads, K, Vd)
        if initial_state.dim() != 4 or tuple(initial_state.shape[1:]) != want:
            names = "(N, heads, V, K)" if state_v_first else "(N, heads, K, V)"
            hint = "" if initial_state.dim() != 4 or initial_state.shape[1] == heads else \
                (f"; its heads ({initial_state.shape[1]}) match dim {time_dim} of q, so the inputs "
                 f"look laid out as {other}: pass that"
                 if initial_state.shape[1] == q.shape[time_dim] else "")
            raise ValueError(f"initial_state must be {names} = (N, {', '.join(map(str, want))}), "
                             f"got {tuple(initial_state.shape)}{hint}")


def _decay(g_gamma: torch.Tensor) -> torch.Tensor:
    if not isinstance(g_gamma, torch.Tensor):
        return _checked_decays(torch.as_tensor(g_gamma, dtype=torch.float64))
    if g_gamma.requires_grad:
        raise ValueError("g_gamma requires grad: the decays are fixed here (no gradient flows to "
                         "them); pass g_gamma.detach() or a buffer")
    if torch.compiler.is_compiling():
        # (traced, exp(g_gamma) would be a new tensor at every run of the graph, and the operator,
        # which checks a gamma it has not seen, would copy it to the host each time: a sync per
        # layer. The op computes it when the graph runs and marks it checked, each g_gamma
        # checked once.)
        return decays_from_log(g_gamma)
    return memo_by_tensor(_DECAYS, g_gamma, _checked_decays)


def _checked_decays(g_gamma: torch.Tensor) -> torch.Tensor:
    gamma = torch.exp(g_gamma.detach().to(torch.float64))
    _check_log_decays(g_gamma, gamma)  # (once per g_gamma: the operator then finds it checked)
    return gamma


def _check_log_decays(g_gamma: torch.Tensor, gamma: torch.Tensor) -> None:
    """The operator's check of λ = exp(g_gamma), its error in g_gamma's own terms."""
    try:
        check_gamma_values(gamma)
    except ValueError:
        values = g_gamma.detach().flatten()[:8].tolist()
        hint = ("; these look like the decays themselves: pass torch.log(decays)"
                if all(0 < v <= 1 for v in values) else "")
        raise ValueError(f"g_gamma is the log decay per head, each ≤ 0 (λ = exp(g_gamma) in "
                         f"(0, 1]) and finite; got g_gamma = "
                         f"{[round(v, 6) for v in values]}{' …' if g_gamma.numel() > 8 else ''}"
                         f"{hint}") from None


@torch.library.custom_op("leetrepro::decays_from_log", mutates_args=())
def decays_from_log(g_gamma: torch.Tensor) -> torch.Tensor:
    """``exp(g_gamma)`` in float64, its values checked in (0, 1] the first time a ``g_gamma``
    (object and version) is seen, which a model passes to every layer. A new tensor each call: a
    compiled graph saves it for the backward, and under CUDA graphs (``mode="reduce-overhead"``)
    what a graph saves must be its own, not a cache's."""
    gamma = torch.exp(g_gamma.detach().to(torch.float64))
    memo_by_tensor(_LOGS_CHECKED, g_gamma, lambda _: _check_log_decays(g_gamma, gamma))
    mark_checked(gamma)  # (the operator then reads nothing back to the host)
    return gamma


@decays_from_log.register_fake
def _(g_gamma):
    return torch.empty(g_gamma.shape, dtype=torch.float64, device=g_gamma.device)


def mamba_chunk_scan_combined(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                              C: torch.Tensor, chunk_size: int, D: torch.Tensor | None = None,
                              z: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                              initial_states: torch.Tensor | None = None,
                              seq_idx: torch.Tensor | None = None,
                              cu_seqlens: torch.Tensor | None = None, dt_softplus: bool = False,
                              dt_limit: tuple = (0.0, math.inf), return_final_states: bool = False,
                              return_varlen_states: bool = False, **options):
    """mamba_ssm's ``mamba_chunk_scan_combined`` (Mamba-2's state-space dual, SSD), computed by this
    project's operator with per-token gates.

    The SSD per head: ``h_t = exp(dt_t A) h_(t−1) + dt_t x_t ⊗ B_t`` (state ``(headdim, dstate)``),
    ``y_t = h_t C_t + D x_t``, times ``silu(z_t)`` with ``z``. It is the operator
    ``O = (B' C'ᵀ ⊙ M) V'`` with the query ``B' = C``, the key ``C' = B`` (each of ``ngroups``
    groups shared by ``heads / ngroups`` heads), ``V' = dt·x``, the gates ``g = dt·A`` (M[i, j] =
    exp(Σ_(j<t≤i) dt_t A)) and scale 1.

    Args (mamba_ssm's shapes):
        x: ``(batch, seqlen, heads, headdim)``; dt: ``(batch, seqlen, heads)`` (raw: ``dt_bias``
            added, then softplus with ``dt_softplus``, then clamped to ``dt_limit`` where it is
            not (0, inf), whose gradient is zero where the clamp acts, as mamba_ssm's);
            A: ``(heads,)``, negative; B, C: ``(batch, seqlen, ngroups, dstate)``.
        chunk_size: mamba_ssm's tile length: checked (a positive integer), not used (the kernels
            take theirs from their tuned tables; the result does not depend on it).
        D: ``(heads,)`` or ``(heads, headdim)``, the skip ``D·x``; z: like x, the gate silu(z).
        initial_states: ``(batch, heads, headdim, dstate)`` (with ``cu_seqlens``: one per
            sequence).
        seq_idx: ``(batch, seqlen)`` int, the sequence each row belongs to: the state does not
            cross from one to the next (a gate of −1e4 at each change: exactly 0 in every dtype).
        cu_seqlens: the offsets of sequences packed along seqlen of a batch of one, each from
            its own initial state; with ``return_varlen_states``, each one's final state.
        return_final_states, return_varlen_states: as mamba_ssm: ``y``, ``(y, final)``,
            ``(y, varlen)`` or ``(y, final, varlen)``.
        **options: passed to :func:`leetrepro.causal_linear_decoder` (``method=``, …).

    Returns y ``(batch, seqlen, heads, headdim)`` in x's dtype (and the states, float32).
    Differentiable in x, dt, A, B, C, D, z, dt_bias and initial_states.

    The groups' B and C are read in place (each head reads its group's rows; their gradients
    are summed over the group's heads). Where Chunk runs it in eager mode with D per head and
    no ``cu_seqlens`` (:data:`SSD_ROWS_IN_SWEEP`), V' = dt·x and ``D·x`` are taken inside the
    forward sweep and y is written once; elsewhere V' is one more tensor like x (one pass, the
    product in float32 rounded once to x's dtype) and ``D·x`` one more pass. The backward
    writes V' once.
    """
    check_chunk_size(chunk_size)
    check_dt_limit(dt_limit)
    check_mamba(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens)
    want_state = return_final_states or return_varlen_states
    grad = _wants_grad(x, dt, A, B, C, D, dt_bias, initial_states)
    resolved = _rows_in_sweep(x, B, C, D, cu_seqlens, want_state or initial_states is not None,
                              grad, options)
    if resolved is not None:  # (V' = dt·x and D·x inside the sweep: neither pass over x)
        steps, g = ssd_gates(dt, A, dt_bias, seq_idx, (dt_softplus, dt_limit))
        s0 = None if initial_states is None else initial_states.float().transpose(-1, -2)
        o, states = direct_apply(_SSDRowsInSweep, x, steps, g, C, B, D, s0,
                                  (resolved, want_state))
        y = ssd_output(o, None, z, x.dtype)
        states = states if want_state else None
    else:
        operands, skip, s0 = ssd_operands(x, dt, A, B, C, D, dt_bias, initial_states, seq_idx,
                                          (dt_softplus, dt_limit))
        res = causal_linear_decoder(*operands[:3], g=operands[3], initial_state=s0,
                                    output_final_state=want_state, cu_seqlens=cu_seqlens,
                                    **options)
        o, states = res if want_state else (res, None)
        y = ssd_output(o, skip, z, x.dtype)
    if not want_state:
        return y
    states = states.transpose(-1, -2)  # (…, headdim, dstate): Mamba-2's layout
    final = states[-1:] if cu_seqlens is not None else states
    if not return_varlen_states:
        return y, final
    return (y, states) if not return_final_states else (y, final, states)


def ssd_operands(x, dt, A, B, C, D, dt_bias, initial_states, seq_idx, dt_rule,
                 first_cut: torch.Tensor | None = None) -> tuple:
    """The SSD as the operator's call: ``((query C, key B, V' = dt·x, g = dt·A), skip,
    initial state)``, the first four head-major views of mamba_ssm's time-major tensors (the
    groups' B and C read in place), the gates −1e4 where ``seq_idx`` changes, ``skip(o)`` the
    ``D·x`` term's pass (None without D), the initial state in the operator's layout.
    ``dt_rule``: ``(dt_softplus, dt_limit)``. ``first_cut`` ``(batch,)`` bool: whether row 0
    starts a sequence after rows that are not here (a rank's slice: the rank before holds them)."""
    dt, g = ssd_gates(dt, A, dt_bias, seq_idx, dt_rule, first_cut)
    # (one pass over x, dt·x rounded once to x's dtype; with the skip, its backward is
    # the backward pass of dt·dV': dt·dV' + D·dy, with dt's and D's gradients)
    V, skip = scale_rows_and_skip(x, dt, D) if D is not None else (scale_rows(x, dt), None)
    s0 = None if initial_states is None else initial_states.float().transpose(-1, -2)
    return (C.transpose(1, 2), B.transpose(1, 2), V.transpose(1, 2), g.transpose(1, 2)), skip, s0


def ssd_gates(dt, A, dt_bias, seq_idx, dt_rule, first_cut: torch.Tensor | None = None) -> tuple:
    """The SSD's step sizes and log decays ``(dt, g)``, float32 ``(batch, seqlen, heads)``, one
    pass (:func:`step_sizes_and_gates`), g −1e4 where ``seq_idx`` changes (:func:`ssd_operands`'
    arguments)."""
    dt, g = step_sizes_and_gates(dt, A, dt_bias, *dt_rule)
    if seq_idx is not None and dt.shape[1]:  # (a change of sequence: nothing crosses it)
        cut = torch.nn.functional.pad(seq_idx[:, 1:] != seq_idx[:, :-1], (1, 0))
        if first_cut is not None:
            cut = torch.cat([first_cut[:, None], cut[:, 1:]], 1)
        g = torch.where(cut[..., None], torch.full_like(g, -1e4), g)
    return dt, g


#: whether :class:`_SSDRowsInSweep`'s backward reads x in its reverse sweep where that sweep
#: takes the dual output and the gates' pieces (``ops.backward._gradients``' ``rows``; on the Hopper
#: kernel at r = d = 64, ``chunk.tables.HOPPER_ROW_DOTS``): dx = dt·dV' + D·dy and the rows' dots for
#: dt's and D's gradients written by the sweep, no pass of its own (Zamba2's shape on the
#: H200, notes/gates.md). Off: that pass after the sweep
SSD_ROW_DOTS = True


def row_dot_gradients(rd: torch.Tensor, shape, dtype: torch.dtype) -> tuple:
    """``(ddt, dD)`` from the reverse sweep's row dots ``rd`` (float32 ``(2, blocks,
    batch·heads, N)``: x·dV', x·dy) for x of ``shape`` ``(batch, seqlen, heads, headdim)``: dt's
    gradient float32 ``(batch, seqlen, heads)`` and D's ``(heads,)`` in ``dtype``, each summed in
    a fixed order."""
    batch, n, heads, _ = shape
    ddt = rd[0].sum(0).view(batch, heads, n).transpose(1, 2)
    dD = rd[1].sum(0).view(batch, heads, n).sum((0, 2)).to(dtype)
    return ddt, dD


#: whether :func:`mamba_chunk_scan_combined` takes V' = dt·x and the skip D·x inside Chunk's
#: forward sweep (:class:`_SSDRowsInSweep`) where it can: then neither is a pass over x of its
#: own, and O is written once as y; False: the composition (V' written, the operator, the skip's
#: pass), which float64, PyTorch's methods, ``torch.compile``, packed sequences and a
#: ``(heads, headdim)`` D always take
SSD_ROWS_IN_SWEEP = True


def _rows_in_sweep(x, B, C, D, cu_seqlens, with_state: bool, grad: bool, options: dict):
    """The resolved ``(method, options)`` (:func:`leetrepro.api.prepared`) where the SSD's rows
    go into the sweep (:data:`SSD_ROWS_IN_SWEEP`): Chunk chosen, D per head, no packed sequences,
    eager, a GPU or Triton's interpreter, and on the kernel the call would run anyway
    (:func:`leetrepro.methods.chunk.rows_unfit`); else None."""
    if not SSD_ROWS_IN_SWEEP or D is None or D.dim() != 1 or cu_seqlens is not None or \
            x.dtype == torch.float64 or torch.compiler.is_compiling():
        return None
    q, k, v = C.transpose(1, 2), B.transpose(1, 2), x.transpose(1, 2)
    if chunk.rows_unfit(q, k, v) is not None:
        return None
    rest = {key: value for key, value in options.items() if key != "method"}
    resolved = prepared(q, k, v, options.get("method", "auto"), rest, with_state, grad, True)
    return resolved if resolved[0].fn is chunk.chunk_scan else None


class _SSDRowsInSweep(torch.autograd.Function):
    """The SSD's operator with V' = dt·x and the skip D·x inside Chunk's forward sweep
    (``chunk_scan``'s ``rows``): y' = op(C, B, dt·x) + D·x, head-major ``(batch, heads, seqlen,
    headdim)`` in x's layout (time-major), and the final state (empty unless asked for). Its
    backward writes V' once (the sweeps of the operator's backward read it) and takes dx = dt·dV'
    + D·dy, dt's and D's gradients in one pass over x-sized tensors, as the composition's.

    Inputs: x ``(batch, seqlen, heads, headdim)``; dt and g float32 ``(batch, seqlen, heads)``
    (:func:`ssd_gates`); C, B ``(batch, seqlen, groups, dstate)``; D ``(heads,)``; the initial
    state in the operator's layout or None; ``spec = ((method, options), final state wanted)``."""

    @staticmethod
    def forward(x, dt, g, C, B, D, s0, spec):
        (m, opts), final = spec
        rows = C.transpose(1, 2), B.transpose(1, 2), x.transpose(1, 2)
        return ops.run(m, opts, *rows, None, s0, False, final, g=g.transpose(1, 2),
                       rows=(dt.transpose(1, 2), D.float()))

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dt, g, C, B, D, s0, (resolved, final) = inputs
        ctx.save_for_backward(x, dt, g, C, B, D, s0, output[1] if final else None)
        ctx.resolved = resolved

    @staticmethod
    @plain_backward
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, dsn):
        x, dt, g, C, B, D, s0, sn = ctx.saved_tensors
        need = ctx.needs_input_grad
        v = scaled(x, dt)  # V' again (time-major)
        dy = torch.zeros_like(v).transpose(1, 2) if dy is None else dy.to(x.dtype)
        dS = dsn if sn is not None and dsn is not None and dsn.numel() else None
        rows = C.transpose(1, 2), B.transpose(1, 2), v.transpose(1, 2)
        dots = (x.transpose(1, 2), dt.transpose(1, 2), D.float()) if SSD_ROW_DOTS else None
        res = ops.resolved_gradients(
            ctx.resolved, dy, *rows, None, s0, dS, False, need[3], need[4], True,
            s0 is not None and need[6], None, 1.0, g=g.transpose(1, 2), SN=sn,
            need_g=need[2], rows=dots)
        (dq, dk, dv, ds0, dg), rd = res if dots is not None else (res, None)
        if rd is None:
            dx, ddt, dD = scale_and_skip_gradients(x, dt, D, dv.transpose(1, 2),
                                                   dy.transpose(1, 2), need[1], need[5])
        else:  # (the reverse sweep wrote dx and the rows' dots x·dV', x·dy)
            dx = dv.transpose(1, 2)
            ddt, dD = row_dot_gradients(rd, x.shape, D.dtype)
            dD = dD if need[5] else None
        return (dx if need[0] else None, ddt if need[1] else None,
                dg.transpose(1, 2) if need[2] else None, dq.transpose(1, 2) if need[3] else None,
                dk.transpose(1, 2) if need[4] else None, dD,
                ds0 if s0 is not None and need[6] else None, None)


def ssd_output(o: torch.Tensor, skip, z: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """y ``(batch, seqlen, heads, headdim)`` in ``dtype`` from the operator's head-major output:
    the skip ``D·x`` (:func:`ssd_operands`' ``skip``) and the gate ``silu(z)`` where given."""
    y = o.transpose(1, 2)
    if skip is not None:  # (one pass, in x's dtype)
        y = skip(y)
    if z is not None:
        y = y * torch.nn.functional.silu(z)
    return y.to(dtype)


#: the float32 operator's dot precision in :func:`mamba3_siso_combined` unless the caller names
#: one: fp32's contract. Where the angles' gradient is taken as running sums of dθ (without the
#: straddle kernel, :data:`MAMBA3_PAIR_SUMS`), it is also what keeps them: their terms cancel
#: (turning every row by one angle changes nothing), so each row's rounding in the operator's
#: gradients adds up along the sequence: through tf32 products bf16 Angles' gradient was 3.8e-3
#: from float64 at 4096 rows, 9.9e-3 at 16384 and 1.3e-2 at 65536 (H200, NOTES.md); with
#: "tf32x3" 2.5e-3 and 2.3e-3 (the inputs' own rounding).
MAMBA3_FP32_PRECISION = "tf32x3"
#: the straddle kernel's fp32 products (ADT's gradient and the angles' sums) in
#: :func:`mamba3_siso_combined` for 16-bit inputs unless the caller names one
#: (``gate_grad_precision``): its operands hold 16-bit values and the contract is 16-bit's,
#: which tf32 keeps, where "tf32x3" took 8 of a 24 ms forward + backward (4 × 4096 rows × 64
#: heads, H200, NOTES.md)
MAMBA3_GATE_GRAD_PRECISION = "tf32"
#: whether :func:`mamba3_siso_combined`'s gradient takes the angles' and the gates' gradients
#: from the pairs straddling each row (:class:`_TurnedOperator`) where the kernel runs, the
#: operator then in the inputs' dtype; False: the running sums of dθ from a float32 operator
#: (the A/B switch of the measurements, and the path float64 and PyTorch's methods take)
MAMBA3_PAIR_SUMS = True


class _TurnedOperator(torch.autograd.Function):
    """The turned rows (:func:`leetrepro.methods.mamba3_rows.mamba3_rotate`, in Q's dtype) and
    the operator with the gates ADT on them, as one node: its backward takes the angles' and
    the gates' gradients from the pairs that straddle each row
    (:func:`leetrepro.methods.mamba3_rows.mamba3_pair_sums`), so the operator runs in the
    inputs' dtype both ways (its gradients of q̃ and w·k̃ give dQ, dK, the biases' and w's
    alone). The angles' gradient leaves as the differences of the suffix sums S_t − S_(t+1)
    in float64, which the angles' own backward sums again (exact in float64: S is float32).

    Inputs: Q, K, Q_bias, K_bias; θ float64 ``(batch, seqlen, heads, A)``; w ``(batch, seqlen,
    heads)`` float32; V ``(batch, seqlen, heads, headdim_v)`` in Q's dtype; the gates float32
    ``(batch, heads, seqlen)``; the initial state (or None), ``cu_seqlens``; then ``spec =
    (method, options, final state wanted, pair sums' precision)``. Returns the operator's
    output ``(batch, heads, seqlen, headdim_v)``, each row's own pair ``(batch, seqlen, heads)``
    float32 and the final state (empty unless wanted)."""

    @staticmethod
    def forward(ctx, Q, K, Q_bias, K_bias, theta, w, V, g, s0, cu_seqlens, spec):
        method, options, final, _ = spec
        angles = theta.float()
        q, key, own = _rotate(Q, K, Q_bias, K_bias, angles, w, True)
        rows = q.transpose(1, 2), key.transpose(1, 2), V.transpose(1, 2)
        # (eager: the method resolved once per signature, as the API's calls are, and run
        # without the op's dispatch)
        ctx.resolved = None if torch.compiler.is_compiling() else prepared(
            *rows, method, json.loads(options) if options else {}, s0 is not None or final,
            True, True)
        if ctx.resolved is None:
            o, sn = ops.causal_linear(*rows, None, s0, method, options, False, final, cu_seqlens,
                                      1.0, True, g)
        else:
            o, sn = ops.run(*ctx.resolved, *rows, None, s0, False, final, cu_seqlens=cu_seqlens,
                            scale=1.0, g=g)
        ctx.save_for_backward(K, K_bias, angles, w, V, g, s0, cu_seqlens, q, key,
                              sn if final else None)
        ctx.spec = spec
        ctx.dtypes = (Q_bias.dtype, K_bias.dtype)
        return o, own, sn

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, down, dsn):
        K, K_bias, angles, w, V, g, s0, cu, q, key, sn = ctx.saved_tensors
        method, options, final, precision = ctx.spec
        need = ctx.needs_input_grad
        rows = q.transpose(1, 2), key.transpose(1, 2), V.transpose(1, 2)
        do = torch.zeros_like(rows[2]) if do is None else do.to(V.dtype)
        dS = dsn if final and dsn is not None and dsn.numel() else None
        need_q, need_k = need[0] or need[2], need[1] or need[3] or need[5]
        flags = (False, need_q, need_k, need[6], s0 is not None and need[8], cu, 1.0)
        if ctx.resolved is None:
            dq, dkey, dv, ds0, _ = ops.causal_linear_backward(do, *rows, None, s0, dS, method,
                                                              options, *flags, g, None, False)
        else:
            dq, dkey, dv, ds0, _ = ops.resolved_gradients(ctx.resolved, do, *rows, None, s0, dS,
                                                          *flags, g=g)
        grads = [None] * 11
        if need_q or need_k:
            zero = (lambda x, want: x.transpose(1, 2) if want else torch.zeros_like(q))
            down = torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device) \
                if down is None else down
            dQ, dK, dqb, dkb, _, dw = _rotate_backward(
                zero(dq, need_q), zero(dkey, need_k), down, q, key, K, K_bias, angles, w, False)
            grads[:4] = dQ, dK, dqb.to(ctx.dtypes[0]), dkb.to(ctx.dtypes[1])
            grads[5] = dw
        if need[4] or need[7]:
            dg, sums = pair_sums(*rows, do, g, s0, dS, sn if dS is not None else None, cu,
                                 angles.shape[-1], precision)
            grads[4] = suffix_differences(sums.transpose(1, 2), cu)
            grads[7] = dg
        grads[6] = dv.transpose(1, 2) if need[6] else None
        grads[8] = ds0 if s0 is not None and need[8] else None
        return tuple(x if n else None for x, n in zip(grads, need))


def mamba3_siso_combined(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, ADT: torch.Tensor,
                         DT: torch.Tensor, Trap: torch.Tensor, Q_bias: torch.Tensor,
                         K_bias: torch.Tensor, Angles: torch.Tensor, D: torch.Tensor | None = None,
                         Z: torch.Tensor | None = None, Input_States: tuple | None = None,
                         chunk_size: int = 64, return_final_states: bool = False,
                         cu_seqlens: torch.Tensor | None = None, **options):
    """mamba_ssm's ``mamba3_siso_combined`` (Mamba-3, single input single output) on this
    project's operator with per-token gates (:mod:`leetrepro.decay.trapezoid` folds the
    trapezoidal rule and the rotation into it; :func:`leetrepro.reference.mamba3_reference` is
    the recurrence it is checked against).

    Args (mamba_ssm's shapes):
        Q, K: ``(batch, seqlen, nheads_qk, headdim_qk)``, headdim_qk even; V, Z:
            ``(batch, seqlen, nheads, headdim_v)``, nheads_qk dividing nheads (head h reads q/k
            head ``h // (nheads / nheads_qk)``).
        ADT: ``(batch, nheads, seqlen)``, the log decays A·dt ≤ 0; DT: the step sizes dt;
            Trap: the raw trapezoid mix (λ = sigmoid(Trap)); all three ``(batch, nheads,
            seqlen)``.
        Q_bias, K_bias: ``(nheads, headdim_qk)``; Angles: ``(batch, seqlen, nheads,
            headdim_angles)``, headdim_angles ≤ headdim_qk / 2 (θ_t = θ_(t−1) +
            tanh(Angles_t)·π·dt_t rotates the first 2·headdim_angles dims of q + Q_bias and k +
            K_bias by pairs); D: ``(nheads,)``, the skip ``D·v``; Z: the gate ``silu(Z)``.
        Input_States: ``(angle (S, nheads, headdim_angles), ssm (S, nheads, headdim_v,
            headdim_qk), k (S, nheads, headdim_qk), v (S, nheads, headdim_v))``, S the batch or
            the packed sequences: the states a previous call returned.
        chunk_size: mamba_ssm's tile length: checked, not used (the kernels take their own).
        cu_seqlens: offsets of sequences packed along seqlen of a batch of one.
        **options: passed to :func:`leetrepro.causal_linear_decoder` (``method=``, …);
            ``fp32_precision`` defaults to :data:`MAMBA3_FP32_PRECISION`, and for 16-bit
            inputs ``gate_grad_precision`` to :data:`MAMBA3_GATE_GRAD_PRECISION`.

    Returns the output ``(batch, seqlen, nheads, headdim_v)`` in V's dtype; with
    ``return_final_states`` also the angle (float32, mod 2π), ssm (float32), k (the last rotated
    key, Q's dtype) and v states, mamba_ssm's order. Differentiable in every tensor input.
    Exact to the operator's contract: the angles are summed in float64 and the sines and
    cosines are torch's, where mamba_ssm's kernels use fast approximations. Besides the
    operator, O(seqlen·nheads·(headdim_qk + headdim_v)) of passes: the running angles, the
    turned rows and the gated output one Triton pass each way on a GPU
    (:mod:`leetrepro.methods.mamba3_rows`), the keys' weights' per-row passes PyTorch's. The
    operator runs in the inputs' dtype. With a gradient wanted, the Angles' and ADT's gradients
    come from the pairs of rows that straddle each row (:class:`_TurnedOperator`; the straddle
    kernel, about as long as the operator's three sweeps), never from running sums of each
    row's rounded gradient, which add that rounding up along the sequence. Where that kernel
    does not run (float64, a CPU), the operator runs on float32 rows holding Q's dtype's values
    and the running sums are taken of its unrounded gradients
    (:data:`MAMBA3_PAIR_SUMS`).
    """
    refuse_transforms("mamba3_siso_combined")
    _check_mamba3(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, Input_States, chunk_size,
                  cu_seqlens)
    acc = torch.float64 if V.dtype == torch.float64 else torch.float32
    theta0, S0, k_prev, v_prev = Input_States if Input_States is not None else (None,) * 4
    theta = angle_sums(Angles, DT, theta0, cu_seqlens)              # (batch, seqlen, heads, A)
    w, later = key_weights(DT, Trap, cu_seqlens, acc)                # (batch, heads, seqlen)
    # (without the straddle kernel, the turned rows are each rounded once to Q's dtype and held
    # in float32 (float64), so that the operator's gradients of them come unrounded and the
    # angles' gradient is taken at those values: leetrepro.methods.mamba3_rows)
    narrow = Q.dtype == V.dtype and not _wants_grad(
        Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, *(Input_States or ()))
    s0 = pending_state(S0, k_prev, v_prev, DT, Trap, cu_seqlens)
    want = return_final_states
    options = _mamba3_options(options, Q.dtype)
    o, own, states = _mamba3_operator((Q, K, Q_bias, K_bias, theta, w.transpose(1, 2)), V,
                                      ADT.to(acc), s0, cu_seqlens, want, narrow, options)
    # row t's own pair holds w_t but only λ_t dt_t of it has entered at t
    weight = -own * later.transpose(1, 2)                # (batch, seqlen, heads)
    if D is not None:
        weight = weight + D.to(weight.dtype)
    y = gated_output(o.transpose(1, 2), V, Z, weight)
    if not want:
        return y
    return (y, *_mamba3_final_states(Q, K, V, K_bias, theta, states, Input_States, cu_seqlens))


def _mamba3_operator(rows: tuple, V, log_decay, s0, cu_seqlens, want: bool, narrow: bool,
                     options: dict) -> tuple:
    """``(o, Σ_d q̃·k̃, final state or None)`` of :func:`mamba3_siso_combined`'s operator on its
    turned rows, ``rows = (Q, K, Q_bias, K_bias, θ, w)``: through :class:`_TurnedOperator` (the
    angles' gradient from the straddling pairs) where its kernel runs, else on the turned rows
    made first (:func:`leetrepro.methods.mamba3_rows.turned_rows`)."""
    Q, theta = rows[0], rows[4]
    if MAMBA3_PAIR_SUMS and not narrow and pair_sums_on_kernel(V, Q.shape[-1], theta.shape[-1]):
        # (the operator in the inputs' dtype)
        opts = dict(options)
        method = opts.pop("method", "auto")
        precision = opts.pop("gate_grad_precision", None)  # (None: the kernel's default)
        return direct_apply(_TurnedOperator, *rows, V.to(Q.dtype), log_decay, s0, cu_seqlens,
                            (method, ops.encode_options(opts), want, precision))
    q, key, own = turned_rows(*rows[:4], theta.to(log_decay.dtype), rows[5], narrow)
    res = causal_linear_decoder(q.transpose(1, 2), key.transpose(1, 2),
                                V.to(q.dtype).transpose(1, 2), g=log_decay, initial_state=s0,
                                output_final_state=want, cu_seqlens=cu_seqlens, scale=1.0,
                                **options)
    o, states = res if want else (res, None)
    return o, own, states


def _wants_grad(*tensors) -> bool:
    """Whether autograd will record a call on ``tensors`` (None and non-tensors among them)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _mamba3_options(options: dict, dtype: torch.dtype) -> dict:
    """:func:`mamba3_siso_combined`'s options to the operator, with its defaults."""
    options = dict(options)
    options.setdefault("fp32_precision", MAMBA3_FP32_PRECISION)
    if dtype in (torch.float16, torch.bfloat16):  # (the gates' gradient to 16-bit's contract)
        options.setdefault("gate_grad_precision", MAMBA3_GATE_GRAD_PRECISION)
    return options


def _mamba3_final_states(Q, K, V, K_bias, theta, states, Input_States, cu_seqlens) -> tuple:
    """:func:`mamba3_siso_combined`'s final states (angle mod 2π, ssm, k, v) from the running
    angles ``theta`` and the operator's final ``states``; a sequence without rows keeps the
    states it was given (``Input_States``)."""
    theta0, _, k_prev, v_prev = Input_States if Input_States is not None else (None,) * 4
    acc = torch.float64 if V.dtype == torch.float64 else torch.float32
    if cu_seqlens is None:  # (each sequence's last row)
        rows, at = torch.arange(Q.shape[0], device=Q.device), Q.shape[1] - 1
        has = torch.full((Q.shape[0],), Q.shape[1] > 0, device=Q.device)
    else:
        cu = cu_seqlens.to(device=Q.device, dtype=torch.int64)
        rows, at, has = torch.zeros_like(cu[1:]), (cu[1:] - 1).clamp_min(0), cu[1:] > cu[:-1]

    def last(x, before, got=None):
        if got is None:
            got = x[rows, at] if Q.shape[1] else x.new_zeros(has.shape[0], *x.shape[2:])
        keep = has.view(-1, *[1] * (got.dim() - 1))
        return torch.where(keep, got, 0.0 if before is None else before.to(got.dtype))
    final_theta = last(theta, theta0)
    # the last row's turned key (the operator's rows hold it weighted only)
    k_last = rotate_pairs(last(K, None).repeat_interleave(V.shape[2] // Q.shape[2], 1).to(acc) +
                          K_bias.to(acc), final_theta.to(acc)).to(Q.dtype)
    return (torch.remainder(final_theta, 2 * math.pi), states.transpose(-1, -2),
            last(None, k_prev, k_last), last(V, v_prev))


def mamba3_rows(inputs: dict, index) -> dict:
    """:func:`mamba3_siso_combined`'s inputs (by name) at rows ``index`` of the sequence: a slice
    keeps the seqlen dimension, an int drops it (one token, as the decode step takes them); the
    per-head parameters and states as they are."""
    return {k: (v[:, index] if k in ("Q", "K", "V", "Angles", "Z") else
                v[..., index] if k in ("ADT", "DT", "Trap") else v) for k, v in inputs.items()}


def _check_mamba3(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, Input_States, chunk_size,
                  cu_seqlens) -> None:
    """mamba3_siso_combined's inputs checked in its own terms (Q, K, V, ADT, …)."""
    check_chunk_size(chunk_size)
    named = (("Q", Q, 4), ("K", K, 4), ("V", V, 4), ("ADT", ADT, 3), ("DT", DT, 3),
             ("Trap", Trap, 3), ("Q_bias", Q_bias, 2), ("K_bias", K_bias, 2), ("Angles", Angles, 4))
    for name, t, dims in named + (("D", D, 1), ("Z", Z, 4)):
        if t is None and name in ("D", "Z"):
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dims or not t.is_floating_point():
            raise ValueError(f"{name} must be a {dims}-D floating tensor, got shape "
                             f"{tuple(t.shape)} {t.dtype}")
        if t.device != V.device:
            raise ValueError(f"{name} is on {t.device}, V on {V.device}: every input on one device")
    batch, n, hqk, p = Q.shape
    heads, dv = V.shape[2], V.shape[3]
    if K.shape != Q.shape or V.shape[:2] != Q.shape[:2] or heads % hqk or p % 2:
        raise ValueError(f"Q and K must be (batch, seqlen, nheads_qk, headdim_qk), headdim_qk "
                         f"even, V (batch, seqlen, nheads, headdim_v), nheads_qk dividing "
                         f"nheads: Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}")
    if Q.dtype != K.dtype:
        raise TypeError(f"Q and K must share one dtype, got {Q.dtype} and {K.dtype}")
    for name, t in (("ADT", ADT), ("DT", DT), ("Trap", Trap)):
        if tuple(t.shape) != (batch, heads, n):
            raise ValueError(f"{name} must be (batch, nheads, seqlen) = {(batch, heads, n)}, got "
                             f"{tuple(t.shape)}")
    for name, t in (("Q_bias", Q_bias), ("K_bias", K_bias)):
        if tuple(t.shape) != (heads, p):
            raise ValueError(f"{name} must be (nheads, headdim_qk) = {(heads, p)}, got "
                             f"{tuple(t.shape)}")
    if Angles.shape[:3] != (batch, n, heads) or not 0 < Angles.shape[3] <= p // 2:
        raise ValueError(f"Angles must be (batch, seqlen, nheads, headdim_angles) with 0 < "
                         f"headdim_angles ≤ headdim_qk / 2 = {p // 2}, got {tuple(Angles.shape)}")
    if D is not None and tuple(D.shape) != (heads,):
        raise ValueError(f"D must be (nheads,) = ({heads},), got {tuple(D.shape)}")
    if Z is not None and Z.shape != V.shape:
        raise ValueError(f"Z must be shaped like V {tuple(V.shape)}, got {tuple(Z.shape)}")
    top = positive_where_free(ADT)
    if top is not None:
        raise ValueError(f"ADT must be ≤ 0 (A·dt, the log decay; α = exp(ADT) ≤ 1), got {top:g} "
                         f"among its entries")
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or \
                cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.numel() < 2:
            raise TypeError("cu_seqlens must be a 1-D int32 (or int64) tensor of offsets "
                            "[0, len_0, len_0 + len_1, ..., seqlen]")
        if batch != 1:
            raise ValueError(f"with cu_seqlens the sequences are packed along seqlen of a batch "
                             f"of one; got batch {batch}")
    if Input_States is None:
        return
    count = batch if cu_seqlens is None else cu_seqlens.numel() - 1
    if not isinstance(Input_States, (tuple, list)) or len(Input_States) != 4 or \
            any(not isinstance(t, torch.Tensor) for t in Input_States):
        raise TypeError("Input_States must be the four tensors (angle, ssm, k, v), all given")
    want = {"angle": (count, heads, Angles.shape[3]), "ssm": (count, heads, dv, p),
            "k": (count, heads, p), "v": (count, heads, dv)}
    for (name, shape), t in zip(want.items(), Input_States):
        if tuple(t.shape) != shape:
            raise ValueError(f"Input_States' {name} state must be {shape}, got {tuple(t.shape)}")


def check_chunk_size(chunk_size) -> None:
    """A ValueError unless ``chunk_size`` (mamba_ssm's and fla's tile length, which this project
    checks and does not use: its kernels take their own) is a positive integer."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")


def check_dt_limit(dt_limit) -> None:
    """A ValueError unless ``dt_limit`` is a pair ``(low, high)`` with 0 ≤ low ≤ high."""
    try:
        low, high = (float(v) for v in dt_limit)
    except (TypeError, ValueError):
        raise ValueError(f"dt_limit must be a pair (low, high), got {dt_limit!r}") from None
    if not 0 <= low <= high:
        raise ValueError(f"dt_limit = {tuple(dt_limit)} must satisfy 0 ≤ low ≤ high (dt is "
                         f"clamped to [low, high])" + ("; reversed?" if high < low else ""))


def check_mamba(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens) -> None:
    """mamba_chunk_scan_combined's inputs checked in its own terms (x, dt, A, B, C, …)."""
    for name, t, dims in (("x", x, 4), ("dt", dt, 3), ("A", A, 1), ("B", B, 4), ("C", C, 4)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    optional = (("D", D), ("z", z), ("dt_bias", dt_bias), ("initial_states", initial_states),
                ("seq_idx", seq_idx), ("cu_seqlens", cu_seqlens))
    for name, t in optional:
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    for name, t in (("dt", dt), ("A", A), ("B", B), ("C", C)) + optional:
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}: every input on one device")
    if not x.dtype == B.dtype == C.dtype:
        raise TypeError(f"x, B and C must share one dtype (the operator's rows are dt·x, B and "
                        f"C), got x {x.dtype}, B {B.dtype}, C {C.dtype}")
    for name, t in (("seq_idx", seq_idx), ("cu_seqlens", cu_seqlens)):
        if t is not None and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
            raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
    top = positive_where_free(A)  # (read where it is free, as the operator reads g)
    if top is not None:
        raise ValueError(f"A must be negative (A = −exp(A_log): the decay exp(dt·A) ≤ 1), got "
                         f"{top:g} among its entries")
    batch, seqlen, heads, headdim = x.shape
    shapes = f"x {tuple(x.shape)}, dt {tuple(dt.shape)}, A {tuple(A.shape)}, B {tuple(B.shape)}"
    if tuple(dt.shape) != (batch, seqlen, heads) or tuple(A.shape) != (heads,):
        raise ValueError(f"dt must be (batch, seqlen, heads) and A (heads,) for x (batch, seqlen, "
                         f"heads, headdim): {shapes}")
    if B.shape != C.shape or B.shape[:2] != x.shape[:2] or heads % B.shape[2]:
        raise ValueError(f"B and C must be (batch, seqlen, ngroups, dstate) with ngroups dividing "
                         f"heads ({heads}): B {tuple(B.shape)}, C {tuple(C.shape)}")
    if D is not None and tuple(D.shape) not in ((heads,), (heads, headdim)):
        raise ValueError(f"D must be (heads,) or (heads, headdim) = ({heads},) or ({heads}, "
                         f"{headdim}), got {tuple(D.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z must be shaped like x {tuple(x.shape)}, got {tuple(z.shape)}")
    if dt_bias is not None and tuple(dt_bias.shape) != (heads,):
        raise ValueError(f"dt_bias must be (heads,) = ({heads},), got {tuple(dt_bias.shape)}")
    if seq_idx is not None and tuple(seq_idx.shape) != (batch, seqlen):
        raise ValueError(f"seq_idx must be (batch, seqlen) = ({batch}, {seqlen}), got "
                         f"{tuple(seq_idx.shape)}")
    count = batch if cu_seqlens is None else cu_seqlens.numel() - 1
    want = (count, heads, headdim, B.shape[3])
    if initial_states is not None and tuple(initial_states.shape) != want:
        raise ValueError(f"initial_states must be ({'sequences' if cu_seqlens is not None else 'batch'}"
                         f", heads, headdim, dstate) = {want}, got {tuple(initial_states.shape)}")
