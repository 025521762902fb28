"""Chunk-scan forward in Triton: lightningAttention-2's chunked form with the whole r × d state of a
lane on chip. When the lanes fill the GPU, one pass over B, C, V, O. Otherwise (batch 1) N is cut
into segments whose states are chained through a small ring buffer (decoupled look-back, Merrill &
Garland 2016, specialised to a chain), so every SM works, at the price of a second read of C, V.

A *lane* is one (batch·head, value-column block); its N rows are cut into segments of SEG rows.
Programs take tickets in launch order (an atomic counter), ticket t = segment t // LANES of lane
t % LANES, so a program only ever waits on programs that are already running: no deadlock.

Per segment k of a lane (rows [a, e)):
  1. (not the last segment) its own state  S_k = Σ_{a≤j<e} λ^(e-1-j) c_jᵀ v_j  from C, V;
  2. the incoming state P_{k-1} (the initial state for k = 0): wait for segment k-1's flag;
  3. (not the last) publish P_k = λ^(e-a) P_{k-1} + S_k, then raise flag k+1 (release);
  4. sweep chunks of BLOCK_N rows from state H = P_{k-1}:
        O_i = Σ_{s≤j≤i} λ^(i-j) (b_i·c_j) v_j + λ^(i-s+1) b_i H,
        H  ← λ^len H + Σ_j λ^(s+len-1-j) c_jᵀ v_j,
     so the last segment's H is the final state.
Step 4 re-reads the C and V rows of step 1 (from L2 if the segments in flight fit there; the
launcher's measured choice of SEG is longer, see NOTES.md). Two ring slots per lane suffice: P_{k+1} overwrites P_{k-1}
only after segment k+1 has read P_k, which segment k published after reading P_{k-1}.
Only non-negative powers of λ appear. Launcher: ``leetrepro.methods.chunk``.
"""
import triton
import triton.language as tl


@triton.jit
def _chunk_weights(lg, s, N, BLOCK_N: tl.constexpr, HAS_DECAY: tl.constexpr):
    """λ^(i+1) (rows of b, into the chunk), λ^(len-1-j) (rows of c, out of it), λ^len."""
    rows = tl.arange(0, BLOCK_N)
    if HAS_DECAY:
        length = tl.minimum(N - s, BLOCK_N)
        w_in = tl.exp((rows + 1).to(tl.float32) * lg)
        w_out = tl.where(rows < length, tl.exp(tl.maximum(length - 1 - rows, 0).to(tl.float32) * lg), 0.0)
        decay = tl.exp(length.to(tl.float32) * lg)
    else:
        w_in = tl.full((BLOCK_N,), 1.0, tl.float32)
        w_out = w_in
        decay = 1.0
    return w_in, w_out, decay


@triton.jit
def _accumulate(state, c, v, w_out, decay, HAS_DECAY: tl.constexpr, PRECISION: tl.constexpr):
    """state ← λ^len state + (diag(w_out) c)ᵀ v, accumulated on the tensor cores in fp32."""
    if HAS_DECAY:
        state = state * decay
        c = (c.to(tl.float32) * w_out[:, None]).to(c.dtype)
    return tl.dot(tl.trans(c), v, acc=state, input_precision=PRECISION)


@triton.jit
def chunk_scan_kernel(B, C, V, O, S0, SN, WS, SYNC, GAMMA, N, R, D, H, LANES, SEG,
                      HAS_DECAY: tl.constexpr, HAS_S0: tl.constexpr, STORE_SN: tl.constexpr,
                      SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    if SPLIT:
        t = tl.atomic_add(SYNC + LANES, 1)  # ticket, in the order programs actually start
    else:
        t = tl.program_id(0)
    lane = t % LANES
    seg = t // LANES
    n_db = tl.cdiv(D, BLOCK_D)
    bh = lane // n_db
    d0 = (lane % n_db) * BLOCK_D
    # int64 offsets: batch 16 × 32 heads × N 100000 × 128 overflows int32
    bc_base = bh.to(tl.int64) * N * R
    vo_base = bh.to(tl.int64) * N * D
    rows = tl.arange(0, BLOCK_N)
    cols_r = tl.arange(0, BLOCK_R)
    cols_d = d0 + tl.arange(0, BLOCK_D)
    r_ok = cols_r < R
    d_ok = cols_d < D
    if HAS_DECAY:
        lg = tl.log(tl.load(GAMMA + bh % H)).to(tl.float32)  # float64 λ in, log taken in float64
        diff = rows[:, None] - rows[None, :]
        intra = tl.where(diff >= 0, tl.exp(tl.maximum(diff, 0).to(tl.float32) * lg), 0.0)
    else:
        lg = 0.0
        intra = tl.where(rows[:, None] >= rows[None, :], 1.0, 0.0)
    start = seg * SEG
    end = tl.minimum(start + SEG, N)
    last = end >= N
    state_off = (bh.to(tl.int64) * R + cols_r[:, None]) * D + cols_d[None, :]
    state_ok = r_ok[:, None] & d_ok[None, :]
    ws_tile = cols_r[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]

    # 1. this segment's own state (a first read of its C and V rows)
    local = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    if SPLIT:
        if not last:
            for s in range(start, end, BLOCK_N):
                n_ok = (s + rows) < N
                c = tl.load(C + bc_base + (s + rows)[:, None].to(tl.int64) * R + cols_r[None, :],
                            mask=n_ok[:, None] & r_ok[None, :], other=0.0)
                v = tl.load(V + vo_base + (s + rows)[:, None].to(tl.int64) * D + cols_d[None, :],
                            mask=n_ok[:, None] & d_ok[None, :], other=0.0)
                w_in, w_out, decay = _chunk_weights(lg, s, N, BLOCK_N, HAS_DECAY)
                local = _accumulate(local, c, v, w_out, decay, HAS_DECAY, PRECISION)

    # 2. the state entering the segment
    if HAS_S0:
        state = tl.load(S0 + state_off, mask=state_ok, other=0.0).to(tl.float32)
    else:
        state = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    if SPLIT:
        if seg > 0:
            flag = tl.atomic_add(SYNC + lane, 0, sem="acquire")
            while flag < seg:
                flag = tl.atomic_add(SYNC + lane, 0, sem="acquire")
            # .cg: read L2, never a stale L1 line of an earlier use of this ring slot
            state = tl.load(WS + (lane * 2 + (seg - 1) % 2).to(tl.int64) * BLOCK_R * BLOCK_D + ws_tile,
                            cache_modifier=".cg")
        # 3. publish P_k for the next segment
        if not last:
            seg_decay = tl.exp((end - start).to(tl.float32) * lg) if HAS_DECAY else 1.0
            tl.store(WS + (lane * 2 + seg % 2).to(tl.int64) * BLOCK_R * BLOCK_D + ws_tile,
                     state * seg_decay + local)
            tl.debug_barrier()  # every thread's part of P_k is written before the flag rises
            tl.atomic_xchg(SYNC + lane, seg + 1, sem="release")

    # 4. the outputs, chunk by chunk, carrying the state on chip
    for s in range(start, end, BLOCK_N):
        n_ok = (s + rows) < N
        bc_off = bc_base + (s + rows)[:, None].to(tl.int64) * R + cols_r[None, :]
        b = tl.load(B + bc_off, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        c = tl.load(C + bc_off, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        vo_off = vo_base + (s + rows)[:, None].to(tl.int64) * D + cols_d[None, :]
        v = tl.load(V + vo_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        w_in, w_out, decay = _chunk_weights(lg, s, N, BLOCK_N, HAS_DECAY)
        # half inputs: the fp32 state is rounded to the inputs' dtype for this product (as in
        # lightning attention and flash-linear-attention); fp32 inputs keep it in fp32.
        # diag(λ^(i+1)) scales the fp32 product, not the operand b (no round trip of b)
        out = tl.dot(b, state.to(b.dtype), input_precision=PRECISION)
        if HAS_DECAY:
            out = out * w_in[:, None]
        scores = tl.dot(b, tl.trans(c), input_precision=PRECISION) * intra
        out = tl.dot(scores.to(v.dtype), v, acc=out, input_precision=PRECISION)
        state = _accumulate(state, c, v, w_out, decay, HAS_DECAY, PRECISION)
        tl.store(O + vo_off, out.to(O.dtype.element_ty), mask=n_ok[:, None] & d_ok[None, :])
    if STORE_SN:
        if last:
            tl.store(SN + state_off, state, mask=state_ok)
