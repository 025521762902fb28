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

The package's modules, bottom up: :mod:`.resolution` (the method and its options),
:mod:`.forward` (one run of a method), :mod:`.gate_sweeps` (the gates' gradient inside Chunk's
sweeps), :mod:`.backward` (the backward's algebra), :mod:`.custom_op` (the custom ops, their
autograd and :class:`Eager`). The names below are theirs; a test replaces one where it is looked
up (``tests/conftest.patch_package``).
"""
from . import backward, custom_op, forward, gate_sweeps, resolution
from .backward import gradient_buffers, one_buffer
from .custom_op import (Eager, causal_linear, causal_linear_backward, gradients,
                        resolved_gradients)
from .forward import output_like, run
from .gate_sweeps import PIECES_MAX_WIDTH
from .resolution import (NO_GATES, check_options, encode_options, is_auto, prepare,
                         resolve, state_dtype)

__all__ = ["Eager", "NO_GATES", "PIECES_MAX_WIDTH", "backward", "causal_linear",
           "causal_linear_backward", "check_options", "custom_op", "encode_options", "forward",
           "gate_sweeps", "gradient_buffers", "gradients", "is_auto", "one_buffer", "output_like",
           "prepare", "resolution", "resolve", "resolved_gradients", "run", "state_dtype"]
