"""lightningAttention-2 forward in Triton: intra-block quadratic part plus an inter-block state kept
on chip, one sequential sweep per (batch·head, value-column block, segment of N).

For rows i of block [s, s+L) and the state H = Σ_{j<s} λ^(s-1-j) c_jᵀ v_j (r × BLOCK_D, fp32):
    O_i = Σ_{s≤j≤i} λ^(i-j) (b_i·c_j) v_j + λ^(i-s+1) b_i H
    H  ← λ^L H + Σ_j λ^(s+L-1-j) c_jᵀ v_j
Only non-negative powers of λ appear.

When batch·heads is too small to fill the GPU, N is cut into segments of SEG rows (a multiple of
BLOCK_N): ``la_state_kernel`` computes every segment's own end state from C and V, and
``la_fwd_kernel`` starts segment k from Σ_{j<k} λ^(SEG·(k-1-j)) S_j. One segment = no split.
Launcher: ``leetrepro.methods.lightning``.
"""
import triton
import triton.language as tl


@triton.jit
def _decay_terms(lg, BLOCK_N: tl.constexpr, HAS_DECAY: tl.constexpr):
    rows = tl.arange(0, BLOCK_N)
    if HAS_DECAY:
        diff = rows[:, None] - rows[None, :]
        intra = tl.where(diff >= 0, tl.exp(tl.maximum(diff, 0).to(tl.float32) * lg), 0.0)
        w_in = tl.exp((rows + 1).to(tl.float32) * lg)               # λ^(i-s+1)
        w_out = tl.exp((BLOCK_N - 1 - rows).to(tl.float32) * lg)    # λ^(s+L-1-j)
        block_decay = tl.exp(BLOCK_N * lg)
    else:
        intra = tl.where(rows[:, None] >= rows[None, :], 1.0, 0.0)
        w_in = tl.full((BLOCK_N,), 1.0, tl.float32)
        w_out = w_in
        block_decay = 1.0
    return intra, w_in, w_out, block_decay


@triton.jit
def _state_update(state, c, v, w_out, block_decay, HAS_DECAY: tl.constexpr, PRECISION: tl.constexpr):
    # a partial last block: zero rows of c/v add nothing, so λ^(L-1-j) is still right
    if HAS_DECAY:
        state = state * block_decay
        c = c.to(tl.float32) * w_out[:, None]
    return state + tl.dot(tl.trans(c.to(tl.float32)), v.to(tl.float32), input_precision=PRECISION)


@triton.jit
def la_state_kernel(C, V, S, LOG_GAMMA, N, R, D, H, SEG,
                    HAS_DECAY: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """S[bh, k] = Σ_{j in segment k} λ^(end_k - 1 - j) c_jᵀ v_j (fp32, r × d per segment)."""
    bh = tl.program_id(0)
    d0 = tl.program_id(1) * BLOCK_D
    seg = tl.program_id(2)
    rows = tl.arange(0, BLOCK_N)
    cols_r = tl.arange(0, BLOCK_R)
    cols_d = d0 + tl.arange(0, BLOCK_D)
    lg = tl.load(LOG_GAMMA + bh % H).to(tl.float32) if HAS_DECAY else 0.0
    intra, w_in, w_out, block_decay = _decay_terms(lg, BLOCK_N, HAS_DECAY)
    state = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    start = seg * SEG
    for s in range(start, tl.minimum(start + SEG, N), BLOCK_N):
        n_ok = (s + rows) < N
        c = tl.load(C + bh.to(tl.int64) * N * R + (s + rows)[:, None].to(tl.int64) * R + cols_r[None, :],
                    mask=n_ok[:, None] & (cols_r < R)[None, :], other=0.0)
        v = tl.load(V + bh.to(tl.int64) * N * D + (s + rows)[:, None].to(tl.int64) * D + cols_d[None, :],
                    mask=n_ok[:, None] & (cols_d < D)[None, :], other=0.0)
        state = _state_update(state, c, v, w_out, block_decay, HAS_DECAY, PRECISION)
    n_seg = tl.num_programs(2)
    s_off = ((bh.to(tl.int64) * n_seg + seg) * BLOCK_R + cols_r[:, None]) * D + cols_d[None, :]
    tl.store(S + s_off, state, mask=(cols_d < D)[None, :])


@triton.jit
def la_fwd_kernel(B, C, V, O, S, LOG_GAMMA, N, R, D, H, SEG,
                  HAS_DECAY: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(0)
    d0 = tl.program_id(1) * BLOCK_D
    seg = tl.program_id(2)
    # int64 offsets: batch 16 × 32 heads × N 100000 × 128 overflows int32
    bc_base = bh.to(tl.int64) * N * R
    vo_base = bh.to(tl.int64) * N * D
    rows = tl.arange(0, BLOCK_N)
    cols_r = tl.arange(0, BLOCK_R)
    cols_d = d0 + tl.arange(0, BLOCK_D)
    r_ok = cols_r < R
    d_ok = cols_d < D
    lg = tl.load(LOG_GAMMA + bh % H).to(tl.float32) if HAS_DECAY else 0.0
    intra, w_in, w_out, block_decay = _decay_terms(lg, BLOCK_N, HAS_DECAY)
    # the state entering this segment: the earlier segments' own states, decayed to its start
    state = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    n_seg = tl.num_programs(2)
    seg_decay = tl.exp(SEG.to(tl.float32) * lg) if HAS_DECAY else 1.0
    for k in range(0, seg):
        s_off = ((bh.to(tl.int64) * n_seg + k) * BLOCK_R + cols_r[:, None]) * D + cols_d[None, :]
        state = state * seg_decay + tl.load(S + s_off, mask=d_ok[None, :], other=0.0)
    start = seg * SEG
    for s in range(start, tl.minimum(start + SEG, N), BLOCK_N):
        n_ok = (s + rows) < N
        bc_off = bc_base + (s + rows)[:, None].to(tl.int64) * R + cols_r[None, :]
        b = tl.load(B + bc_off, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        c = tl.load(C + bc_off, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        vo_off = vo_base + (s + rows)[:, None].to(tl.int64) * D + cols_d[None, :]
        v = tl.load(V + vo_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        scores = tl.dot(b, tl.trans(c), input_precision=PRECISION) * intra
        out = tl.dot(scores.to(v.dtype), v, input_precision=PRECISION)
        b_in = b.to(tl.float32) * w_in[:, None] if HAS_DECAY else b.to(tl.float32)
        out += tl.dot(b_in, state, input_precision=PRECISION)
        state = _state_update(state, c, v, w_out, block_decay, HAS_DECAY, PRECISION)
        tl.store(O + vo_off, out.to(O.dtype.element_ty), mask=n_ok[:, None] & d_ok[None, :])
