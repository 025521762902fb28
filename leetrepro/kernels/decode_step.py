"""One decode step (a few tokens per sequence) over a pool of recurrent states, updated in place.

Grid (sequence·head, value-column block). The program reads state ``POOL[SLOTS[seq], head]``
(r × BLOCK_D, fp32), and for each of the K new tokens
    S ← λ e^(g_t) S + c_tᵀ v_t,   o_t = SCALE · b_t S,
(g_t the token's gate with ``HAS_GATE``) then writes S back to its slot. The state read and
write are the whole memory traffic (the tokens are a few hundred bytes): the floor is
2·|state| per sequence. λ enters as the pair (λ rounded to fp32, λ/that − 1) so that the
per-token product does not drift over many steps
(λ near 1 rounded to fp32 is off by up to 3e-8 a token). No host synchronisation: the slot ids
are read on the device, so a step can be captured in a CUDA graph. They are checked there too, at
the cost of one read of the batch's slot ids per program (L2-resident; BATCH·4 bytes): a slot
outside ``[0, NUM_SLOTS)`` is neither read nor written, a slot another sequence of the step also
names has its row poisoned (the update one of them would lose), and the outputs of both kinds of
bad sequence are NaN.
"""
import triton
import triton.language as tl

from ._tiles import and_flag


@triton.jit
def decode_step_kernel(B, C, V, O, POOL, SLOTS, DECAY, SIZE, SCALE, HAS_DECAY: tl.constexpr,
                       HAS_GATE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_S: tl.constexpr):
    """B, C, V, O: ``(pointer, batch stride, head stride, row stride)`` each (elements); POOL:
    float32 (slots, H, R, D); SLOTS: int (batch,); ``DECAY = (GAMMA, G)``: float64 λ per head or
    None, the new tokens' gates (float32 (batch, heads, K) as ``(pointer, strides)``) or None;
    ``SIZE = (K, R, D, H, BATCH, NUM_SLOTS)``: K new tokens per sequence."""
    K, R, D, H, BATCH, NUM_SLOTS = SIZE
    GAMMA, G = DECAY
    pid = tl.program_id(0)
    seq = (pid // H).to(tl.int64)
    head = (pid % H).to(tl.int64)
    cols_r = tl.arange(0, BLOCK_R)
    cols_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    r_ok = cols_r < R
    d_ok = cols_d < D
    slot = tl.load(SLOTS + seq).to(tl.int64)
    shared = 0
    for first in range(0, BATCH, BLOCK_S):
        other = first + tl.arange(0, BLOCK_S)
        named = tl.load(SLOTS + other, mask=other < BATCH, other=-1).to(tl.int64)
        shared += tl.sum(((named == slot) & (other != seq)).to(tl.int32), axis=0)
    in_pool = (slot >= 0) & (slot < NUM_SLOTS)
    state_ok = and_flag(r_ok[:, None] & d_ok[None, :], in_pool)
    state_ptr = POOL + ((slot * H + head) * R + cols_r[:, None]) * D + cols_d[None, :]
    state = tl.load(state_ptr, mask=state_ok, other=0.0)
    if HAS_DECAY:
        g64 = tl.load(GAMMA + head)  # float64 λ: rounded to fp32, and what the rounding lost
        lam = g64.to(tl.float32)
        lam_err = (g64 / lam.to(tl.float64) - 1.0).to(tl.float32)
    for t in range(K):
        b = tl.load(_row(B, seq, head, t) + cols_r, mask=r_ok, other=0.0)  # [BLOCK_R]
        c = tl.load(_row(C, seq, head, t) + cols_r, mask=r_ok, other=0.0)  # [BLOCK_R]
        v = tl.load(_row(V, seq, head, t) + cols_d, mask=d_ok, other=0.0)  # [BLOCK_D]
        if HAS_DECAY:
            state = state * lam
            state = state + state * lam_err
        if HAS_GATE:
            state = state * tl.exp(tl.load(_row(G, seq, head, t)).to(tl.float32))
        state += c.to(tl.float32)[:, None] * v.to(tl.float32)[None, :]
        o = tl.sum(b.to(tl.float32)[:, None] * state, axis=0) * SCALE
        o = tl.where((shared > 0) | (slot < 0) | (slot >= NUM_SLOTS), float("nan"), o)
        tl.store(_row(O, seq, head, t) + cols_d, o.to(O[0].dtype.element_ty), mask=d_ok)
    state = tl.where(shared > 0, float("nan"), state)
    tl.store(state_ptr, state, mask=state_ok)


@triton.jit
def _row(X, seq, head, t):
    """Pointer to row t of (batch ``seq``, head ``head``) of ``X = (pointer, strides…)``."""
    ptr, s_b, s_h, s_t = X
    return ptr + seq * s_b + head * s_h + t * s_t
