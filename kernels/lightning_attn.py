"""lightningAttention-2 forward in Triton: intra-block quadratic part plus an inter-block state kept
on chip, one sequential sweep over N per (batch·head, value-column block).

For rows i of block [s, s+L) and the state H = Σ_{j<s} λ^(s-1-j) c_jᵀ v_j (r × BLOCK_D, fp32):
    O_i = Σ_{s≤j≤i} λ^(i-j) (b_i·c_j) v_j + λ^(i-s+1) b_i H
    H  ← λ^L H + Σ_j λ^(s+L-1-j) c_jᵀ v_j
Only non-negative powers of λ appear. Launcher: ``leetrepro.methods.lightning``.
"""
import triton
import triton.language as tl


@triton.jit
def la_fwd_kernel(B, C, V, O, LOG_GAMMA, N, R, D, H,
                  HAS_DECAY: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(0)
    d0 = tl.program_id(1) * BLOCK_D
    # int64 offsets: batch 16 × 32 heads × N 100000 × 128 overflows int32
    bc_base = bh.to(tl.int64) * N * R
    vo_base = bh.to(tl.int64) * N * D
    rows = tl.arange(0, BLOCK_N)
    cols_r = tl.arange(0, BLOCK_R)
    cols_d = d0 + tl.arange(0, BLOCK_D)
    r_ok = cols_r < R
    d_ok = cols_d < D
    if HAS_DECAY:
        lg = tl.load(LOG_GAMMA + bh % H).to(tl.float32)
        diff = rows[:, None] - rows[None, :]
        intra = tl.where(diff >= 0, tl.exp(tl.maximum(diff, 0).to(tl.float32) * lg), 0.0)
        w_in = tl.exp((rows + 1).to(tl.float32) * lg)               # λ^(i-s+1)
        w_out = tl.exp((BLOCK_N - 1 - rows).to(tl.float32) * lg)    # λ^(s+L-1-j)
        block_decay = tl.exp(BLOCK_N * lg)
    else:
        intra = tl.where(rows[:, None] >= rows[None, :], 1.0, 0.0)
    state = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    for s in range(0, N, BLOCK_N):
        n_ok = (s + rows) < N
        bc_off = bc_base + (s + rows)[:, None].to(tl.int64) * R + cols_r[None, :]
        b = tl.load(B + bc_off, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        c = tl.load(C + bc_off, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        vo_off = vo_base + (s + rows)[:, None].to(tl.int64) * D + cols_d[None, :]
        v = tl.load(V + vo_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        scores = tl.dot(b, tl.trans(c), input_precision=PRECISION) * intra
        if HAS_DECAY:
            # a partial last block: zero rows of c/v add nothing, so λ^(L-1-j) is still right
            b_in = (b.to(tl.float32) * w_in[:, None])
            c_out = (c.to(tl.float32) * w_out[:, None])
        else:
            b_in = b.to(tl.float32)
            c_out = c.to(tl.float32)
        out = tl.dot(scores.to(v.dtype), v, input_precision=PRECISION)
        out += tl.dot(b_in, state, input_precision=PRECISION)
        if HAS_DECAY:
            state = state * block_decay
        state += tl.dot(tl.trans(c_out), v.to(tl.float32), input_precision=PRECISION)
        tl.store(O + vo_off, out.to(O.dtype.element_ty), mask=n_ok[:, None] & d_ok[None, :])
