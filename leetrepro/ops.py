"""The operator as one PyTorch custom op, ``torch.ops.leetrepro.causal_linear``, with its backward.

Every method (Triton, CUDA, PyTorch) runs behind this op, so autograd, ``torch.compile``
(``fullgraph=True``) and CUDA graphs see one node with a shape-only (fake) implementation,
whichever method computes it, and every method gets the same backward. Eager calls that need
gradients take :class:`Eager` instead, an ``autograd.Function`` with the same forward and backward
that skips the op's dispatch (host time on every call).

**Backward** (derived and checked numerically in ``notebooks/derivations.py``). With M the decay
mask and ``op`` the operator itself, O = (B Cᵀ ⊙ M) V gives

    dB = (dO Vᵀ ⊙ M) C   = op(dO, V, C)          forward in time, over the forward's state
    dV = (C Bᵀ ⊙ Mᵀ) dO  = op_rev(C, B, dO)      reverse in time
    dC = (V dOᵀ ⊙ Mᵀ) B  = op_rev(V, dO, B)      reverse in time, the transposed state of dV's

where ``op_rev`` is the operator on time-reversed rows (Mᵀ is the causal mask read backwards).
So each gradient is one more call of the same method, in reverse time where the method has a
reverse mode (``Method.reverse``: the Triton kernel walks the rows backwards, no copies), else on
flipped copies. dV's state is Σ_s λ^(s-t) b_sᵀ dO_s and dC's is its transpose, so a method that
takes ``dual=`` (Chunk) computes both in one reverse sweep: the backward reads B, C, V, dO and
writes dC, dV, then reads dO, V, C and writes dB (10 tensor passes; forward + backward 14, against
the 11 that a single fused sweep could reach). Only the gradients asked for are computed (a frozen
input costs nothing): dB alone is one forward sweep, dV alone or dC alone one reverse sweep, and
dS0 comes from the final state of whichever reverse sweep runs. Nothing is saved but the inputs:
no per-chunk states (O(N·r·d) memory in the public kernels) are kept; the backward recomputes. The backward
is one custom op too (``leetrepro::causal_linear_backward``), first-order only.

With a state (``initial_state`` S0, final state S_N, gradient dS_N), using X = dS_N / λ:

    dB = op(dO, V, C, initial_state=S0ᵀ)
    dV, R = op_rev(C, B, dO, initial_state=X, output_final_state=True)
    dC = op_rev(V, dO, B, initial_state=Xᵀ)
    dS0 = λ R

(the reverse pass adds λ^(N-t) c_t X = λ^(N-1-t) c_t dS_N to row t, and ends in
R = λ^N X + Σ_t λ^t b_tᵀ dO_t). The decays are fixed: no gradient flows to ``gamma``.

**Per-token gates** ``g`` (M[i, j] = exp(G_i − G_j), G the running sum; a γ folds into them as
g + log λ, :func:`leetrepro.decay.per_token.fold_gates`). The transposed mask is the operator on reversed
rows whose gates are shifted by one (row t carries g_(t+1), each sequence's last row 0:
:func:`leetrepro.decay.per_token.shift_gates`), so the same three sweeps give dB, dC, dV, with
X = dS_N and dS0 = e^(g_0) R. The gates' gradient needs no sweep of its own: G_i enters row i's output
and −G_j column j's, so

    dG_i = b_i·db_i − c_i·dc_i  (+ ⟨dS_N, S_N⟩ at the last row),   dg_t = Σ_(i ≥ t) dG_i,

a row dot of each input with its gradient and a reverse running sum per head (per sequence when
packed; :func:`leetrepro.decay.per_token.gate_gradient_from_dots`). Gradients flow to ``g``, never
to ``gamma``. That running sum is small against its terms, so rounding inside the sweeps' products
(fp16/bf16 operands, tf32) adds up along it. The same dg is the sum of the terms A_ij = M_ij
(b_i·c_j)(dO_i·v_j) over the pairs j < t ≤ i that straddle row t (the initial state a column before
the first row, dS_N a row after the last), each term with its own sign: the straddle kernel
(:func:`leetrepro.methods.chunk.gate_gradient`, ``kernels/gate_straddle.py``) sums them by segments
from the forward and backward states at the segments' ends, in the inputs' dtype, and asks for no
sweep (frozen B and C cost nothing). Chunk's backward sweeps hold the same pairs as pieces, and
where they run (by default fp16 and bf16, r and d up to 128; fp32 keeps the straddle kernel:
:func:`_in_sweeps`; on the Hopper kernel where it takes them, :func:`_piece_sweeps`) dg comes from
them instead, with no kernel of its own (:func:`leetrepro.methods.chunk.gate_gradient_from_pieces`).
Where neither runs (float64; PyTorch methods on a CPU), the row dots are taken, from sweeps on
float64 copies (the PyTorch methods; fp32 copies at fp32-exact dots for a method without
float64) and S_N taken again (``reference.GATE_GRAD_TOLERANCE``).

**Groups**: B and C may have fewer heads than V (each shared by a group of heads, Mamba-2's
B and C): a method with ``Method.groups`` (Chunk) reads a group's rows for each head in place and
writes each head's dB, dC, then summed over the group's heads; other methods get them expanded.
"""
from __future__ import annotations

import functools
import inspect
import json
import os

import torch

from . import dispatch, registry
from ._direct import outside_transforms, unwrapped, wrapped
from ._groups import expand_groups, lane_heads, sum_groups
from .decay.per_head import check_gamma_values, decayed_by, normalize_gamma
from .decay.per_token import (final_pairs, first_decay, fold_gates, gate_dtype,
                              gate_gradient_from_dots, shift_gates)
from .registry import OPTION_RULES, UNIVERSAL_OPTIONS, Method


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The final state's dtype: float32 (float64 for float64 inputs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def is_auto(method) -> bool:
    return isinstance(method, str) and method.lower() == "auto"


#: why a method of the paper takes no per-token gates, where there is more to say than that
NO_GATES = {
    "FA": "FleetAttention factorises the mask per head as γ^i · γ^-j (rank one); with gates the "
          "factors become exp(G_i) and exp(−G_j), and exp(−G_j) overflows float32 once the "
          "running gate sum G_j falls below −88 (a few hundred tokens of a typical gate, one "
          "document boundary of a hard reset)",
    "FA_modify": "FleetAttention's factorisation (as FA)",
    "Cdotp": "the causal dot product's kernel is the 0-1 mask's prefix sum; a gate per token "
             "is a decay it has no place for",
    "LA": "LA's Triton kernel takes one γ per head; Chunk is its kernel with gates",
}


def _refuse_rule(m: Method, rule: str) -> None:
    """A ValueError naming the method, the decay rule it does not take, why, and the methods
    that take it."""
    why = NO_GATES.get(m.abbr, "it has no per-token decay rule") if rule == "per_token" else \
        f"it has no {rule} decay rule"
    raise ValueError(f"method {m.name} ({m.abbr}) does not take {registry.DECAY_RULES[rule]} "
                     f"(the {rule} decay rule): {why}; methods that do: "
                     f"{', '.join(x.abbr for x in registry.methods() if rule in x.decays)}")


def resolve(method, B: torch.Tensor, gamma, with_state: bool, V: torch.Tensor | None = None,
            grad: bool = False, gates: bool = False) -> Method:
    """The registered method that will run these inputs (``"auto"`` chosen by
    :func:`leetrepro.dispatch.auto_method` from B's and V's signature, ``grad``, whether
    autograd will take this call's gradient, and ``gates``, per-token gates), or a ValueError
    saying why none can."""
    if is_auto(method):
        call = dispatch.call_of(B, B if V is None else V, decay=gamma is not None,
                                state=with_state, grad=grad, gates=gates)
        return dispatch.method_for(B.shape[2], B.dtype, B.device, call)
    m = registry.get(method)
    for rule in ("per_head",) + (("per_token",) if gates else ()):
        if rule not in m.decays:
            _refuse_rule(m, rule)
    if with_state and not m.state:
        raise ValueError(f"method {m.name} ({m.abbr}) does not take or return a state; methods "
                         f"that do: {', '.join(x.abbr for x in registry.methods() if x.state)}")
    runs_here = [x.abbr for x in registry.methods()
                 if x.supports(B.dtype, B.device) and not x.unsafe]
    if B.device.type not in m.device_types():
        on = " or ".join(sorted(m.device_types()))
        hint = ("; or run its Triton kernels on the CPU through Triton's interpreter (slow: for "
                "tests), with TRITON_INTERPRET=1 set before leetrepro is imported"
                if m.language == "triton" and B.device.type == "cpu" else "")
        raise ValueError(f"method {m.name} ({m.abbr}) runs on {on} tensors only, and these are on "
                         f"{B.device.type}: move B, C, V to a GPU{hint}; methods that run "
                         f"{B.dtype} on {B.device.type}: {', '.join(runs_here) or 'none'}")
    if not m.supports(B.dtype, B.device):
        raise ValueError(f"method {m.name} ({m.abbr}) does not take {B.dtype} inputs: it takes "
                         f"{', '.join(sorted(str(d) for d in m.dtypes))}; methods that take "
                         f"{B.dtype} on {B.device.type}: {', '.join(runs_here) or 'none'}")
    return m


def check_options(m: Method | None, options: dict) -> dict:
    """The options ``m`` will get, or an error naming the option and what it accepts.

    ``m`` None stands for ``method="auto"``: it takes only the options every method accepts
    (``fp32_precision``), since which method runs depends on the inputs. Unknown names are a
    TypeError, bad values a ValueError. A universal option a method has no use for (the PyTorch
    methods compute in fp32 anyway) is checked and dropped."""
    if m is None:
        specific = sorted(k for k in options if k not in UNIVERSAL_OPTIONS)
        if specific:
            raise ValueError(f"method='auto' takes no method-specific option ({specific}): which "
                             f"method runs depends on the inputs; name the method "
                             f"(method='Bb', …) to pass them. Accepted with auto: "
                             f"{list(UNIVERSAL_OPTIONS)}")
    accepted = None if m is None else _accepted_options(m.fn)
    out = {}
    for k, v in options.items():
        if accepted is not None and k not in accepted and k not in UNIVERSAL_OPTIONS:
            raise TypeError(f"method {m.name} got unknown option {k!r}; it accepts "
                            f"{sorted(accepted) or 'none'} (and {list(UNIVERSAL_OPTIONS)})")
        rule = OPTION_RULES.get(k)
        if rule is not None and not rule[1](v):
            raise ValueError(f"option {k}={v!r} is invalid: {k} takes {rule[0]}")
        if accepted is None or k in accepted:
            out[k] = v
    return out


def prepare(method, options: dict, B: torch.Tensor, gamma, with_state: bool,
            V: torch.Tensor | None = None, grad: bool = False,
            gates: bool = False) -> tuple[Method, dict]:
    """The method that will run (:func:`resolve`) and the options it gets (:func:`check_options`):
    ``"auto"`` takes only universal options, whichever method it picks."""
    m = resolve(method, B, gamma, with_state, V, grad, gates)
    if is_auto(method):
        options = check_options(None, options)
    return m, check_options(m, options)


@functools.lru_cache(maxsize=None)  # inspect.signature is too slow to run on every call
def _accepted_options(fn) -> frozenset | None:
    """Keyword options of a method's ``fn`` beyond (B, C, V, gamma); None if it takes ``**kwargs``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params[4:]
                     if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                     and p.name not in ("initial_state", "output_final_state", "reverse", "dual",
                                        "cu_seqlens", "scale", "out", "out2", "g", "gate",
                                        "gate_pieces"))


def encode_options(options: dict) -> str:
    """Options as the op's string argument (a custom op takes no dict): a JSON object."""
    if not options:
        return ""
    return _encode(tuple(sorted(options.items())))


def _encode(items: tuple) -> str:
    return json.dumps(dict(items), sort_keys=True)


# traced once as a constant (the options are Python values): the mark that
# torch.compiler.assume_constant_result sets, set here without importing torch._dynamo, which
# took 2 of `import leetrepro`'s 5 seconds (tests/test_package.py holds the two marks equal)
_encode._dynamo_marked_constant = True


@functools.lru_cache(maxsize=1024)
def _decode(options: str) -> tuple:
    return tuple(sorted(json.loads(options).items())) if options else ()


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
    method gets them shifted (:func:`shift_gates`).
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
        g = fold_gates(g, gamma, gate_dtype(V.dtype))
        gamma = None
    if cu_seqlens is not None and not m.varlen:
        res = _run_each(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state,
                        dual, cu_seqlens, scale, g)
        return _placed(res, B, V, dual, out, out2)
    batch, _, n, r = B.shape
    d = V.shape[-1]
    sdtype = state_dtype(V.dtype)
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
            _refuse_rule(m, "per_token")
        g = shift_gates(g, cu_seqlens) if reverse else g
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
    sdtype = state_dtype(V.dtype)
    out = torch.zeros_like(V)
    if not output_final_state:
        return out, V.new_empty(0, dtype=sdtype)
    s = V.new_zeros(count, V.shape[1], r, V.shape[-1], dtype=sdtype)
    return out, s if initial_state is None else s + initial_state.to(sdtype)


def _run_each(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state, dual, cu,
              scale, g=None):
    """Packed sequences one call each (methods without a packed mode; one host read of cu)."""
    bounds = cu.tolist()
    outs, outs2, states = [], [], []
    for i in range(len(bounds) - 1):
        rows = slice(bounds[i], bounds[i + 1])
        s0 = None if initial_state is None else initial_state[i:i + 1]
        o, s = run(m, opts, B[:, :, rows], C[:, :, rows], V[:, :, rows], gamma, s0, reverse,
                   output_final_state, None if dual is None else dual[:, :, rows], scale=scale,
                   g=None if g is None else g[:, :, rows], folded=True)
        if dual is not None:
            o, o2 = o
            outs2.append(o2)
        outs.append(o)
        states.append(s)
    out = torch.cat(outs, 2) if outs else V.new_zeros(V.shape)
    if dual is not None:
        out = (out, torch.cat(outs2, 2) if outs2 else B.new_zeros(B.shape))
    if not output_final_state:
        return out, V.new_empty(0, dtype=state_dtype(V.dtype))
    return out, torch.cat(states, 0) if states else _empty_sequences(
        V, B.shape[-1], initial_state, True, 0)[1]


@torch.library.custom_op("leetrepro::causal_linear", mutates_args=())
def causal_linear(B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma: torch.Tensor | None,
                  initial_state: torch.Tensor | None, method: str, options: str, reverse: bool,
                  output_final_state: bool, cu_seqlens: torch.Tensor | None = None,
                  scale: float = 1.0, differentiable: bool = False,
                  g: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``O = (B Cᵀ ⊙ M) V`` (``reverse``: on time-reversed rows) by ``method`` (a registered name
    or ``"auto"``), ``options`` a JSON object of method options; ``gamma`` None or a float64
    ``(H,)`` tensor of decays in (0, 1]; ``cu_seqlens`` None or the offsets of sequences packed
    along N; ``scale`` multiplies O (not S_N); ``differentiable``: autograd will take this call's
    gradient (what ``"auto"`` chooses for: the op's forward cannot see it); ``g`` None or the
    per-token log gates ``(batch, heads, N)``. Returns ``(O, S_N)``,
    S_N an empty tensor unless ``output_final_state``. Use
    :func:`leetrepro.causal_linear_decoder`, which checks the inputs."""
    check_gamma_values(gamma)
    m, opts = prepare(method, dict(_decode(options)), B, gamma,
                      initial_state is not None or output_final_state, V, differentiable,
                      g is not None)
    return run(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state,
               cu_seqlens=cu_seqlens, scale=scale, g=g)


@causal_linear.register_fake
def _(B, C, V, gamma, initial_state, method, options, reverse, output_final_state, cu_seqlens=None,
      scale=1.0, differentiable=False, g=None):
    batch, _, _, r = B.shape
    heads = V.shape[1]
    batch = batch if cu_seqlens is None else cu_seqlens.shape[0] - 1
    sdtype = state_dtype(V.dtype)
    s = V.new_empty((batch, heads, r, V.shape[-1]) if output_final_state else (0,), dtype=sdtype)
    return output_like(V), s


@torch.library.custom_op("leetrepro::causal_linear_backward", mutates_args=())
def causal_linear_backward(dO: torch.Tensor, B: torch.Tensor, C: torch.Tensor, V: torch.Tensor,
                           gamma: torch.Tensor | None, initial_state: torch.Tensor | None,
                           dS: torch.Tensor | None, method: str, options: str, reverse: bool,
                           need_b: bool, need_c: bool, need_v: bool, need_s0: bool,
                           cu_seqlens: torch.Tensor | None = None, scale: float = 1.0,
                           g: torch.Tensor | None = None, SN: torch.Tensor | None = None,
                           need_g: bool = False,
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor]:
    """Gradients ``(dB, dC, dV, dS0, dg)`` of :func:`causal_linear` for output gradients dO and
    dS (dS None: the final state was not asked for), by the forward's method; an empty tensor
    stands for a gradient not asked for. ``g``: the forward's gates, ``SN`` its final state (for
    dg's ⟨dS_N, S_N⟩ term; None without dS). See the module docstring for the formulas. A method
    that takes ``dual=`` (Chunk) computes dV and dC in one reverse sweep."""
    check_gamma_values(gamma)
    m, opts = prepare(method, dict(_decode(options)), B, gamma,
                      initial_state is not None or dS is not None, V, True, g is not None)
    return _gradients(m, opts, dO, B, C, V, gamma, initial_state, dS, reverse, need_b, need_c,
                      need_v, need_s0, cu_seqlens, scale, g=g, SN=SN, need_g=need_g)


def gradients(dO: torch.Tensor, B: torch.Tensor, C: torch.Tensor, V: torch.Tensor, gamma=None, *,
              method: str = "auto", need: tuple = (True, True, True), g=None, **options) -> tuple:
    """``(dB, dC, dV)`` of ``O = (B Cᵀ ⊙ M) V`` for the output gradient dO ``(batch, heads, N, d)``
    (``gamma`` and the gates ``g`` as :func:`leetrepro.causal_linear_decoder` takes them): what a
    layer built on the operator calls from its own backward, with nothing saved but the inputs
    and no forward run again. ``need``: which of the three to compute (an empty tensor stands
    for the others); with ``g`` a fourth entry asks for dg, returned fourth.
    Under ``torch.compile`` it is the backward's custom op, which the graph can hold."""
    gam = normalize_gamma(gamma, V.shape[1], B.device)
    need_g = len(need) > 3 and bool(need[3])
    keep = (0, 1, 2, 4) if need_g else (0, 1, 2)
    if torch.compiler.is_compiling():
        res = causal_linear_backward(dO, B, C, V, gam, None, None, method, encode_options(options),
                                     False, *need[:3], False, None, 1.0, g, None, need_g)
        return tuple(res[i] for i in keep)
    m, opts = prepare(method, options, B, gam, False, V, True, g is not None)
    res = _gradients(m, opts, dO, B, C, V, gam, None, None, False, *need[:3], False, None, 1.0,
                     g=g, need_g=need_g)
    return tuple(res[i] for i in keep)


def resolved_gradients(resolved: tuple, *args, **kwargs) -> tuple:
    """:func:`causal_linear_backward`'s ``(dB, dC, dV, dS0, dg)`` (its arguments after
    ``options``, the same keywords) by a method and options already resolved (:func:`prepare`),
    without the custom op's dispatch: what an ``autograd.Function`` built on the operator calls
    from its eager backward, as :class:`Eager` does."""
    return _gradients(*resolved, *args, **kwargs)


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
    gate = None
    if g is not None:
        if reverse:
            raise ValueError("the operator in reverse time with gates has no backward here")
        gate, gamma = fold_gates(g, gamma, gate_dtype(V.dtype)), None
    wanted = (need_b, need_c, need_v, need_s0, need_g)
    # (dg alone, B, C and V frozen: the straddle kernel, which writes no gradient it drops)
    in_sweeps = need_g and (need_b or need_c or need_v) and _in_sweeps(m, opts, dO, B, C, V,
                                                                     cu_seqlens)
    straddle = need_g and not in_sweeps and _straddles(m, V)
    pieces = None
    if in_sweeps:  # (the dB sweep and dV's, alone or with dC's, carry dg's pieces: both run)
        need_b, need_v = True, True
        opts, pieces = _piece_sweeps(opts, dO, B, C, V, need_c and m.dual and m.reverse,
                                     cu_seqlens)
    elif need_g and not straddle:
        need_b, need_c = True, True  # (dg is read off dB and dC)
    wide_dtype = torch.float64 if torch.float64 in m.dtypes else torch.float32
    if need_g and not straddle and not in_sweeps and B.dtype != torch.float64 and (
            wide_dtype == torch.float64 or not _exact_dots(m, opts, B.dtype) and
            (B.dtype != torch.float32 or "fp32_precision" in m.options)):
        # without the straddle kernel (PyTorch methods on a CPU), dg is the row dots'
        # running sum to the end of the sequence, of terms whose exact sum is small, and a
        # parameter that sums dg over the rows (Mamba-2's A and dt_bias) sums that running sum
        # again: any rounding inside the sweeps' products (fp16/bf16 operands, tf32, and fp32's
        # own: dA 5e-4 relative at 200 rows through LA_torch in fp32, 3e-3 through Bb) adds up
        # to a wrong direction there (dA 0.2-3 relative in bf16, NOTES.md). So that backward
        # runs on copies of the widest dtype the method takes (float64 for the PyTorch methods,
        # else fp32 with fp32-exact dots), its gradients rounded back
        wide = [x.to(wide_dtype) for x in (dO, B, C, V)]
        gate = gate.to(wide_dtype)
        exact = dict(opts, fp32_precision="tf32x3") if "fp32_precision" in m.options else opts
        if dS is not None and SN is not None and SN.numel():
            # the forward's final state enters every row's dg through ⟨dS_N, S_N⟩ (and A's
            # gradient that sum times all of dt): its own rounding would too, so it is taken
            # again here, exact
            SN = run(m, exact, *wide[1:], None, initial_state, reverse, True,
                     cu_seqlens=cu_seqlens, g=gate, folded=True)[1]
        # (the gates as folded above: γ is in them)
        res = _gradients(m, exact, *wide, None, initial_state, dS, reverse, *wanted[:4],
                         cu_seqlens, scale, g=gate, SN=SN, need_g=True)
        return done(tuple(x.to(ref.dtype) if k and i < 3 else
                          (_into(x.to(g.dtype), g, None) if k and i == 4 else x)
                          for i, (x, ref, k) in enumerate(zip(res, (B, C, V, V, V), wanted))))
    if m.gradients is not None and initial_state is None and dS is None and cu_seqlens is None \
            and not reverse and gate is None and (need_b or need_c or need_v):
        grads = m.gradients(dO * scale if scale != 1.0 else dO, B, C, V, gamma, **opts)
        return done(tuple(_into(g, x, None) if k else V.new_empty(0)
                          for g, x, k in zip(grads, (B, C, V), (need_b, need_c, need_v))) +
                    (V.new_empty(0), V.new_empty(0)))
    if groups != heads:  # (a head each: summed over each group's heads at the end)
        dB, dC = (B.new_empty(B.shape[0], heads, *B.shape[2:]) if need else None
                  for need in (need_b, need_c))
        dV = output_like(V) if need_v else None
    else:
        dB, dC, dV = gradient_buffers(B, C, V, need_b, need_c, need_v, shared)
    dS0 = R = rd = None
    call = dict(cu_seqlens=cu_seqlens, scale=scale, g=gate, folded=True)
    rev = None
    if need_b:
        s0t = None if initial_state is None else initial_state.transpose(-1, -2)
        # (with the pieces, the dB sweep's final state is S_Nᵀ, carried with its rounding taken
        # back: the forward's S_N, rounded as 16-bit sweeps round it, would put that rounding
        # into ⟨dS_N, S_N⟩, which joins every row's dg)
        exact_sn = pieces is not None and dS is not None
        dB, SNt = run(m, opts if pieces is None else _piece_opts(opts, pieces, 0),
                      dO, V, C, gamma, s0t, reverse, exact_sn, out=dB,
                      gate_pieces=None if pieces is None else (B, *pieces["forward"]), **call)
        if exact_sn:
            SN = SNt.transpose(-1, -2)
    rev_opts = opts
    if pieces is not None:
        rev = (V if not pieces["dual"] else None, *pieces["reverse"])
        rev_opts = _piece_opts(opts, pieces, 1)
    # with O = scale·op(…): dV = scale·op_rev(C, B, dO) + the final state's part, so the reverse
    # sweeps start from X/scale and scale what they write; R comes out divided by scale too
    X = None if dS is None else decayed_by(dS, gamma, -1) / scale
    # one sweep per gradient asked for, and none for the rest: dV's and dC's reverse sweeps share
    # their state (transposed), so a method with a dual mode does both in one sweep only when
    # both are wanted (dS0 comes from either sweep's final state, R or Rᵀ)
    if need_c and (need_v or need_s0) and m.dual and m.reverse and _dual_fits(B, V) and \
            (pieces is None or pieces["dual"]):
        # dV's buffer stands in for a dV not asked for (dS0 alone with dC): written, then dropped
        dv_out = dV if dV is not None else output_like(V)
        rd = _row_dots(m, rows, pieces, B, V)
        # (with the row dots x is read in place of V = w·x, and dx written in dV's place)
        (dV, dC), R = run(m, rev_opts, C, B, dO, gamma, X, not reverse, need_s0,
                          dual=V if rd is None else rows[0], out=dv_out, out2=dC,
                          gate_pieces=rev, rows=None if rd is None else (*rows[1:], rd), **call)
    else:
        if need_v or (need_s0 and not need_c):
            dV, R = run(m, rev_opts, C, B, dO, gamma, X, not reverse, need_s0, out=dV,
                        gate_pieces=rev, **call)
        if need_c:
            xt = None if X is None else X.transpose(-1, -2)
            dC, Rt = run(m, opts, V, dO, B, gamma, xt, not reverse, need_s0 and R is None,
                         out=dC, **call)
            R = Rt.transpose(-1, -2) if need_s0 and R is None else R
    if need_s0:  # (in initial_state's layout: R may be a transposed state)
        R = decayed_by(R, gamma, 1) if gate is None else R * first_decay(gate, cu_seqlens)
        dS0 = _into((R * scale).to(initial_state.dtype), initial_state, None)
    dg = None
    if pieces is not None:
        from .methods import chunk
        tail = final_pairs(dS, SN)
        tail = None if tail is None else tail / scale
        if all(pieces["hopper"]) and cu_seqlens is None:  # (both sweeps' rows: one pass)
            dg = chunk.gate_gradient_from_rows(pieces["forward"][0], pieces["reverse"][0],
                                               pieces["block"], tail, scale)
        else:
            for i, name in enumerate(("forward", "reverse")):  # (the Hopper kernel's rows:
                # their sums within each chunk taken here)
                if pieces["hopper"][i]:
                    pieces[name] = chunk.hopper_row_pieces(pieces[name][0], pieces["block"],
                                                           i == 1)
            dg = chunk.gate_gradient_from_pieces(pieces["forward"], pieces["reverse"],
                                                 pieces["block"], cu_seqlens, tail, scale)
        dg = _into(dg.to(g.dtype), g, None)
    elif straddle:
        dg = _into(_straddle_gradient(dO, B, C, V, gate, initial_state, dS, cu_seqlens, scale,
                                      opts.get("gate_grad_precision")).to(g.dtype), g, None)
    elif need_g:
        # (in g's layout, as the fake gives it: a time-major g's gradient is time-major)
        dg = _into(gate_gradient_from_dots(expand_groups(B, heads), dB, expand_groups(C, heads),
                                           dC, cu_seqlens, dS, SN).to(g.dtype), g, None)
    if groups != heads:
        dB, dC = (None if x is None else _group_sums(x, groups, like)
                  for x, like in ((dB, B), (dC, C)))
    # a gradient not asked for is an empty tensor of its own: outputs of a custom op may not alias
    # one another (one shared empty tensor made every partial backward raise)
    res = tuple(x if k else V.new_empty(0) for x, k in zip((dB, dC, dV, dS0, dg), wanted))
    return res if rows is None else (res, rd)


def _row_dots(m: Method, rows, pieces, B: torch.Tensor, V: torch.Tensor) -> torch.Tensor | None:
    """The row dots' buffer (float32 ``(2, blocks, batch·heads, N)``, summed over its blocks
    after the sweep) where the reverse sweep with the dual output takes ``rows``
    (:func:`_gradients`): Chunk's, carrying the gates' pieces (on the Hopper kernel where it
    takes them, ``chunk.HOPPER_ROW_DOTS``: a block per consumer's DC/2 columns); else None."""
    if rows is None or pieces is None or not pieces["dual"]:
        return None
    from .methods import chunk
    if m.fn is not chunk.chunk_scan:
        return None
    dc = pieces["hopper"][1]
    if dc and chunk._hopper_rows_unfit(B, V, 2):
        return None
    blocks = 2 * V.shape[-1] // dc if dc else 1
    return torch.empty(2, blocks, V.shape[0] * V.shape[1], V.shape[2], dtype=torch.float32,
                       device=V.device)


def _group_sums(x: torch.Tensor, groups: int, like: torch.Tensor) -> torch.Tensor:
    """Each head's gradient x summed over each group's heads, in ``like``'s layout: one kernel
    launch on a GPU (:func:`leetrepro.methods.ssd_rows.sum_groups_like`), else
    :func:`leetrepro._groups.sum_groups` then a copy into that layout where it differs."""
    from .methods.ssd_rows import sum_groups_like
    out = sum_groups_like(x, groups, like)
    return _into(sum_groups(x, groups), like, None) if out is None else out


def _straddles(m: Method, V: torch.Tensor) -> bool:
    """Whether the gates' gradient is taken by its straddle kernel
    (:func:`leetrepro.methods.chunk.gate_gradient`): fp16/bf16/fp32 on a GPU, or under Triton's
    interpreter beside a Triton method (a PyTorch method on the CPU keeps to PyTorch: the
    interpreter is the tests' stand-in for a GPU, not a CPU's way to run); float64 and the rest
    take the row dots (:func:`gate_gradient`)."""
    from .methods import chunk
    return V.dtype in (torch.float16, torch.bfloat16, torch.float32) and chunk.HAS_TRITON and \
        (V.is_cuda or (m.language == "triton" and os.environ.get("TRITON_INTERPRET") == "1"))


#: the widest r or d at which ``gate_grad="auto"`` takes dg from the sweeps' pieces: past it
#: Falcon-H1's SSD forward + backward (d_state 256) ran 2.1× slower than with the straddle kernel
#: beside sweeps the Hopper kernel may take (the pieces' sweeps are the portable kernel's, at
#: 32-row chunks there; 4.5× before each took at most ``chunk.PIECE_COLS`` value columns, H200,
#: NOTES.md); past it only the Hopper kernel's pieces, with ``chunk.HOPPER_PIECES_WIDE``
PIECES_MAX_WIDTH = 128


def _in_sweeps(m: Method, opts: dict, dO: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               V: torch.Tensor, cu_seqlens=None) -> bool:
    """Whether the gates' gradient comes from Chunk's backward sweeps (their pieces,
    :func:`leetrepro.methods.chunk.gate_gradient_from_pieces`) rather than the straddle kernel:
    Chunk (not with ``kernel="hopper"`` named: its sweeps may take the pieces on either kernel,
    :func:`_piece_sweeps`) on a GPU or under Triton's interpreter, where its option
    ``gate_grad`` says so: ``"sweeps"``, or ``"auto"`` with fp16/bf16 inputs (fp32 inputs keep
    the straddle kernel at every ``fp32_precision``: see the end of the function). The pairs
    that span a whole chunk come from a running sum of the chunks' totals, which adds up any
    rounding of the states the totals are taken from: the state as a 16-bit dot operand and its
    update's weighted rows rounded to 16 bits put bf16 dg 1.4e-2 from float64 at 64 chunks
    (H100, NOTES.md). The sweeps carrying the pieces in fp16/bf16 therefore take each of those two
    products twice, the rounding's remainder as a second operand (``kernels/_tiles.py``:
    ``state_remainder``,
    ``accumulate_state``'s ``EXACT``): bf16 and fp16 dg then within 1.3× of the straddle
    kernel's error, up to N = 32768 with strong gates (H100, NOTES.md). ``"auto"`` keeps the
    straddle kernel for fp32 and where r or d exceeds :data:`PIECES_MAX_WIDTH`, unless
    ``chunk.HOPPER_PIECES_WIDE`` and the Hopper kernel takes both sweeps' pieces there."""
    from .methods import chunk
    source = opts.get("gate_grad", "auto")
    # (where the straddle kernel could run: the sweeps' pieces are the alternative there)
    if m.fn is not chunk.chunk_scan or opts.get("kernel") == "hopper" or source == "straddle" \
            or not _straddles(m, V):
        return False
    if source == "sweeps":
        return True
    if max(B.shape[-1], V.shape[-1]) > PIECES_MAX_WIDTH:
        return chunk.HOPPER_PIECES_WIDE and not opts.get("config") and \
            opts.get("kernel", "auto") != "portable" and \
            all(chunk.hopper_pieces(*sweep, reverse=rev, cu_seqlens=cu_seqlens)
                for sweep, rev in zip(_piece_operands(dO, B, C, V), (False, True)))
    # fp32 keeps the straddle kernel at every precision: with exact dots ("ieee", "tf32x3") the
    # pieces' dg put A's and dt_bias's gradients of Mamba-2's SSD 1.9e-3 and 2.7e-3 from float64
    # at 2 × 8192 rows (H200), the straddle kernel 4.8e-6 and 3.6e-6 (NOTES.md)
    return V.dtype != torch.float32


def _piece_operands(dO, B, C, V) -> tuple:
    """The two sweeps carrying dg's pieces as ``(B', C', V', E)``: op(B', C', V') with the pieces'
    row vectors E: the dB sweep forward in time, op(dO, V, C) beside B, and the dV sweep in
    reverse, op(C, B, dO) beside V."""
    return (dO, V, C, B), (C, B, dO, V)


def _piece_sweeps(opts: dict, dO, B, C, V, dual: bool, cu_seqlens) -> tuple:
    """``(opts, pieces)`` of a gated backward whose sweeps carry dg's pieces: the options with
    the row block both sweeps take (:func:`leetrepro.methods.chunk.gate_grad_block`), and
    ``pieces``: the dB sweep's buffers (``forward``: r value columns beside d-wide rows), the
    reverse sweep's (dV's d columns beside r-wide rows; ``dual``: with dC's, where the dual
    sweep can take them), the ``block`` and each sweep's launch ``configs`` (the row block, and
    a plain sweep's value columns at most :data:`leetrepro.methods.chunk.PIECE_COLS`).
    ``hopper``: the value columns a program holds (DC, 0 for the portable kernel) of the dB
    sweep and of the reverse sweep where each takes its pieces on the Hopper kernel
    (:func:`leetrepro.methods.chunk.hopper_pieces`; not with the caller's config): then dV's
    sweep apart from dC's, a portable sweep beside it at that kernel's row block (where its own
    holds as many rows), its buffer the kernel's rows (a block per consumer; no totals:
    :func:`leetrepro.methods.chunk.hopper_row_pieces` takes them, or with both sweeps there
    :func:`leetrepro.methods.chunk.gate_gradient_from_rows` dg itself)."""
    from .methods import chunk
    from .methods._gpu import dot_precision
    r, d = B.shape[-1], V.shape[-1]
    batch, heads, n = V.shape[0], V.shape[1], V.shape[2]
    precision = dot_precision(V.dtype, opts.get("fp32_precision", "tf32"))
    hopper = [0, 0]  # (the dB sweep's DC, the reverse sweep's)
    dual = dual and _dual_fits(B, V)
    hopper_dual = False
    if not opts.get("config") and opts.get("kernel", "auto") != "portable":
        hopper = [chunk.hopper_pieces(*sweep, reverse=rev, cu_seqlens=cu_seqlens) or 0
                  for sweep, rev in zip(_piece_operands(dO, B, C, V), (False, True))]
        if dual:  # (the reverse sweep with dC's dual output, where the Hopper kernel takes it)
            both = chunk.hopper_pieces(C, B, dO, V, reverse=True, dual=True,
                                       cu_seqlens=cu_seqlens)
            hopper_dual = bool(both)
            hopper[1] = both or hopper[1]
    if any(hopper) and not all(hopper):  # (the portable sweep beside it at 64-row chunks)
        row, width, with_dc = (d, r, False) if not hopper[0] else (r, d, dual)
        if chunk.chunk_config(row, width, V.dtype, precision, True, dual=with_dc,
                              device=V.device)["BLOCK_N"] < chunk.HOPPER["BLOCK_N"]:
            hopper, hopper_dual = [0, 0], False
    dual = dual and (not hopper[1] or hopper_dual)
    # (a row block the caller's config names serves both; each plain sweep its own value
    # columns, at most chunk.PIECE_COLS, unless the caller's config names them: the dual sweep
    # holds its whole state)
    block = chunk.HOPPER["BLOCK_N"] if any(hopper) else \
        chunk.gate_grad_block(r, d, V.dtype, precision, dual, V.device)
    config = dict(BLOCK_N=block) | (opts.get("config") or {})
    block = config["BLOCK_N"]
    seqs = batch if cu_seqlens is None else cu_seqlens.numel() - 1
    configs = tuple((dict(BLOCK_D=chunk.piece_cols(row, width)) if capped else {}) | config
                    for row, width, capped in ((d, r, True), (r, d, not dual)))

    def buffers(width, row, cfg, with_dc=False):
        return chunk.gate_piece_buffers(width, row, batch, seqs, heads, n, dtype=V.dtype,
                                        precision=precision, dual=with_dc, device=V.device,
                                        config=cfg)

    def rows(width, dc):  # (the Hopper kernel's: a block per consumer's DC/2 columns)
        return torch.empty(2 * width // dc, batch, heads, n, dtype=torch.float32,
                           device=V.device), None
    return dict(opts, config=config), dict(
        forward=rows(r, hopper[0]) if hopper[0] else buffers(r, d, configs[0]),
        reverse=rows(d, hopper[1]) if hopper[1] else buffers(d, r, configs[1], dual),
        block=block, dual=dual, configs=configs, hopper=hopper)


def _piece_opts(opts: dict, pieces: dict, i: int) -> dict:
    """The options of the dB sweep (``i`` 0) or the reverse sweep (1) carrying the pieces: its
    launch config on the portable kernel, or the Hopper kernel asked for by name with its DC."""
    if pieces["hopper"][i]:
        return dict(opts, config=dict(DC=pieces["hopper"][i]), kernel="hopper")
    return dict(opts, config=pieces["configs"][i])


def _straddle_gradient(dO, B, C, V, gate, initial_state, dS, cu_seqlens, scale, precision=None):
    from .methods import chunk
    return chunk.gate_gradient(B, C, V, dO, gate, initial_state=initial_state, dS=dS,
                               cu_seqlens=cu_seqlens, scale=scale, precision=precision)


def _exact_dots(m: Method, opts: dict, dtype: torch.dtype) -> bool:
    """Whether method ``m`` with ``opts`` computes its products to float32's accuracy or better
    on inputs of ``dtype``: float64; float32 in the PyTorch methods, or in the kernels with
    ``fp32_precision`` "ieee" or "tf32x3" (their default, tf32, rounds the operands to 10 bits)."""
    if dtype == torch.float64:
        return True
    if dtype != torch.float32:
        return False
    return m.language == "torch" or \
        opts.get("fp32_precision", m.options.get("fp32_precision")) in ("ieee", "tf32x3")


def gradient_buffers(B, C, V, need_b: bool, need_c: bool, need_v: bool, shared: bool = False):
    """Uninitialised dB, dC, dV (None where not asked for), each in its input's layout
    (:func:`output_like`). ``shared`` and all three asked for, with B, C, V disjoint views of one
    storage (the slices of one fused projection, :func:`leetrepro.split_projection`): views of one
    buffer laid out as that storage, at the inputs' own offsets and strides, so that the
    projection's gradient is that buffer itself, with no concatenation."""
    if shared and need_b and need_c and need_v and one_buffer(B, C, V):
        flat = torch.empty(B.numel() + C.numel() + V.numel(), dtype=B.dtype, device=B.device)
        return tuple(flat.as_strided(t.shape, t.stride(), t.storage_offset()) for t in (B, C, V))
    return tuple(output_like(t) if need else None
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


def _dual_fits(B: torch.Tensor, V: torch.Tensor) -> bool:
    """Whether the fused dV/dC sweep applies: the whole r × d state in one lane (r, d ≤ 128),
    nothing empty (``run`` handles empty shapes apart)."""
    return B.numel() > 0 and V.numel() > 0 and B.shape[-1] <= 128 and V.shape[-1] <= 128


@causal_linear_backward.register_fake
def _(dO, B, C, V, gamma, initial_state, dS, method, options, reverse, need_b, need_c, need_v,
      need_s0, cu_seqlens=None, scale=1.0, g=None, SN=None, need_g=False):
    def grad(x, need):
        return output_like(x) if need else V.new_empty(0)
    return (grad(B, need_b), grad(C, need_c), grad(V, need_v), grad(initial_state, need_s0),
            grad(g, need_g))


def _setup_context(ctx, inputs, output):
    (B, C, V, gamma, initial_state, method, options, reverse, output_final_state, cu_seqlens,
     scale, _, *rest) = inputs
    g = rest[0] if rest else None
    ctx.save_for_backward(B, C, V, gamma, initial_state, cu_seqlens, g,
                          output[1] if g is not None and output_final_state else None)
    ctx.args = (method, options, reverse, output_final_state, scale)
    ctx.g_index = 12


def _backward(ctx, dO, dS):
    """The gradients of (B, C, V, gamma, initial_state) and of the gates (at ``ctx.g_index``),
    None for every other input of the custom op (``ctx.args``: :func:`_setup_context`) or of
    :class:`Eager` (``ctx.resolved``)."""
    B, C, V, gamma, S0, cu_seqlens, g, SN = ctx.saved_tensors
    if any(map(wrapped, (dO, B, C, V))):  # (torch.func.grad, vjp: wrappers without storage)
        with outside_transforms():
            return _backward_of(ctx, *map(unwrapped, (B, C, V, gamma, S0, cu_seqlens, g, SN,
                                                       dO, dS)))
    return _backward_of(ctx, B, C, V, gamma, S0, cu_seqlens, g, SN, dO, dS)


def _backward_of(ctx, B, C, V, gamma, S0, cu_seqlens, g, SN, dO, dS):
    method, options, reverse, final, scale = ctx.args
    need_b, need_c, need_v, _, need_s0 = ctx.needs_input_grad[:5]
    need_g = g is not None and ctx.needs_input_grad[ctx.g_index]
    dO = torch.zeros_like(V) if dO is None else dO.to(V.dtype)
    dS = dS if final and dS is not None and dS.numel() else None
    grad = (dO, B, C, V, gamma, S0, dS)
    flags = (reverse, need_b, need_c, need_v, bool(need_s0), cu_seqlens, scale)
    gates = dict(g=g, SN=SN if dS is not None else None, need_g=bool(need_g))
    resolved = getattr(ctx, "resolved", None)
    if resolved is None:
        dB, dC, dV, dS0, dg = causal_linear_backward(*grad, method, options, *flags, **gates)
    else:  # (eager: the gradients may share one buffer; a custom op's outputs may not alias)
        dB, dC, dV, dS0, dg = _gradients(*resolved, *grad, *flags, shared=True, **gates)
    out = [dB if need_b else None, dC if need_c else None, dV if need_v else None, None,
           dS0 if need_s0 else None] + [None] * (len(ctx.needs_input_grad) - 5)
    if need_g:
        out[ctx.g_index] = dg
    return tuple(out)


causal_linear.register_autograd(_backward, setup_context=_setup_context)


class Eager(torch.autograd.Function):
    """:func:`causal_linear` in eager mode: the same forward (:func:`run`) and backward
    (:func:`_gradients`) by a method and options already resolved (:func:`prepare`), without the
    custom op's dispatch, which costs host time on every call (its schema's defaults,
    aliasing checks and the method resolved again; NOTES.md). ``torch.compile`` traces the custom
    op instead (:func:`leetrepro.causal_linear_decoder` chooses). First-order only, as the op."""

    @staticmethod
    def forward(B, C, V, gamma, initial_state, resolved, reverse, output_final_state, cu_seqlens,
                scale, g=None):
        m, opts = resolved
        return run(m, opts, B, C, V, gamma, initial_state, reverse, output_final_state,
                   cu_seqlens=cu_seqlens, scale=scale, g=g)

    @staticmethod
    def setup_context(ctx, inputs, output):
        # (the forward apart from its context: what torch.func's transforms ask of a Function)
        B, C, V, gamma, initial_state, resolved, reverse, output_final_state, cu_seqlens, \
            scale, *rest = inputs
        g = rest[0] if rest else None
        ctx.save_for_backward(B, C, V, gamma, initial_state, cu_seqlens, g,
                              output[1] if g is not None and output_final_state else None)
        ctx.args = (None, None, reverse, output_final_state, scale)
        ctx.resolved = resolved
        ctx.g_index = 10

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dO, dS):
        return _backward(ctx, dO, dS)
