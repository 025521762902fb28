"""One decode step (a few tokens per sequence) over a pool of recurrent states, updated in place.

Grid (sequence·head, value-column block). The program reads state ``POOL[SLOTS[seq], head]``
(r × BLOCK_D, fp32), and for each of the K new tokens
    S ← λ S + c_tᵀ v_t,   o_t = SCALE · b_t S,
then writes S back to its slot. The state read and write are the whole memory traffic (the
tokens are a few hundred bytes): the floor is 2·|state| per sequence. λ enters as the pair
(λ rounded to fp32, λ/that − 1) so that the per-token product does not drift over many steps
(λ near 1 rounded to fp32 is off by up to 3e-8 a token). No host synchronisation: the slot ids
are read on the device, so a step can be captured in a CUDA graph.
"""
import triton
import triton.language as tl


@triton.jit
def decode_step_kernel(B, C, V, O, POOL, SLOTS, GAMMA, K, R, D, H, SCALE,
                       SB_B, SB_H, SB_T, SV_B, SV_H, SV_T, SO_B, SO_H, SO_T,
                       HAS_DECAY: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    seq = (pid // H).to(tl.int64)
    head = (pid % H).to(tl.int64)
    cols_r = tl.arange(0, BLOCK_R)
    cols_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    r_ok = cols_r < R
    d_ok = cols_d < D
    slot = tl.load(SLOTS + seq).to(tl.int64)
    state_ptr = POOL + ((slot * H + head) * R + cols_r[:, None]) * D + cols_d[None, :]
    state_ok = r_ok[:, None] & d_ok[None, :]
    state = tl.load(state_ptr, mask=state_ok, other=0.0)
    if HAS_DECAY:
        lam = tl.load(GAMMA + head)
        lam_err = tl.load(GAMMA + H + head)
    for t in range(K):
        b = tl.load(B + seq * SB_B + head * SB_H + t * SB_T + cols_r, mask=r_ok, other=0.0)
        c = tl.load(C + seq * SB_B + head * SB_H + t * SB_T + cols_r, mask=r_ok, other=0.0)
        v = tl.load(V + seq * SV_B + head * SV_H + t * SV_T + cols_d, mask=d_ok, other=0.0)
        if HAS_DECAY:
            state = state * lam
            state = state + state * lam_err
        state += c.to(tl.float32)[:, None] * v.to(tl.float32)[None, :]
        o = tl.sum(b.to(tl.float32)[:, None] * state, axis=0) * SCALE
        tl.store(O + seq * SO_B + head * SO_H + t * SO_T + cols_d, o.to(O.dtype.element_ty),
                 mask=d_ok)
    tl.store(state_ptr, state, mask=state_ok)
