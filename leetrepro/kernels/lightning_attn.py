"""lightningAttention-2 forward in Triton: intra-block quadratic part plus an inter-block state kept
on chip, one sequential sweep per (batch·head, value-column block, segment of N).

For rows i of block [s, s+L) and the state H = Σ_{j<s} λ^(s-1-j) c_jᵀ v_j (r × BLOCK_D, fp32):
    O_i = Σ_{s≤j≤i} λ^(i-j) (b_i·c_j) v_j + λ^(i-s+1) b_i H
    H  ← λ^L H + Σ_j λ^(s+L-1-j) c_jᵀ v_j
Only non-negative powers of λ appear.

When batch·heads is too small to fill the GPU, N is cut into segments of SEG rows (a multiple of
BLOCK_N): ``la_state_kernel`` computes every segment's own end state from C and V, and
``la_fwd_kernel`` starts segment k from Σ_{j<k} λ^(SEG·(k-1-j)) S_j. One segment = no split.
Non-finite rows: flagged lanes recomputed by a second launch (``REPAIR``), as in chunk_scan.py.
Shared tile code (loads, decay factors, chunk output, state update, precision policy):
``_tiles.py``. Launcher: ``leetrepro.methods.lightning``.
"""
import triton
import triton.language as tl

from ._tiles import (accumulate_state, chunk_output, chunk_weights, columns, has_nonfinite,
                     intra_mask, load_chunk, row_positions, segment_state, state_operand, store_rows)


@triton.jit
def la_state_kernel(C, V, S, GAMMA, SIZE, K: tl.constexpr):
    """S[bh, k] = Σ_{j in segment k} λ^(end_k - 1 - j) c_jᵀ v_j (fp32, r × d per segment).
    Contiguous (b·h, N, ·) C, V; ``SIZE = (N, R, D, H, SEG)``; ``K``: :data:`_tiles.Constants`."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_R: tl.constexpr = K.BLOCK_R
    HAS_DECAY: tl.constexpr = K.HAS_DECAY
    N, R, D, H, SEG = SIZE
    bh = tl.program_id(0)
    d0 = tl.program_id(1) * BLOCK_D
    seg = tl.program_id(2)
    cols_r = columns(0, R, BLOCK_R)
    cols_d = columns(d0, D, BLOCK_D)
    lg = tl.log(tl.load(GAMMA + bh % H)).to(tl.float32) if HAS_DECAY else 0.0  # float64 λ in
    start = seg * SEG
    state, _ = segment_state((C, bh.to(tl.int64) * N * R, R), (V, bh.to(tl.int64) * N * D, D), 0,
                             start, tl.minimum(start + SEG, N), N, lg, cols_r, cols_d, K)
    n_seg = tl.num_programs(2)
    s_off = ((bh.to(tl.int64) * n_seg + seg) * BLOCK_R + cols_r[0][:, None]) * D + \
        cols_d[0][None, :]
    tl.store(S + s_off, state, mask=cols_d[1][None, :])


@triton.jit
def la_fwd_kernel(B, C, V, O, S, FLAGS, GAMMA, SIZE, K: tl.constexpr, SPLIT: tl.constexpr,
                  REPAIR: tl.constexpr):
    """Contiguous (b·h, N, ·) B, C, V, O; S: the segments' own states (``la_state_kernel``) or
    None; FLAGS: int32 per lane; ``SIZE = (N, R, D, H, SEG)``; ``K``: :data:`_tiles.Constants`."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_N: tl.constexpr = K.BLOCK_N
    BLOCK_R: tl.constexpr = K.BLOCK_R
    HALF_RANGE: tl.constexpr = K.HALF_RANGE
    HAS_DECAY: tl.constexpr = K.HAS_DECAY
    PRECISION: tl.constexpr = K.PRECISION
    N, R, D, H, SEG = SIZE
    bh = tl.program_id(0)
    d0 = tl.program_id(1) * BLOCK_D
    seg = tl.program_id(2)
    # a lane's rows (pointer, offset, row stride); int64 offsets: batch 16 × 32 heads × N 100000
    # × 128 overflows int32
    b_rows = (B, bh.to(tl.int64) * N * R, R)
    c_rows = (C, bh.to(tl.int64) * N * R, R)
    v_rows = (V, bh.to(tl.int64) * N * D, D)
    o_rows = (O, bh.to(tl.int64) * N * D, D)
    cols_r = columns(0, R, BLOCK_R)
    cols_d = columns(d0, D, BLOCK_D)
    lg = tl.log(tl.load(GAMMA + bh % H)).to(tl.float32) if HAS_DECAY else 0.0  # float64 λ in
    intra = intra_mask(lg, BLOCK_N, HAS_DECAY)  # [BLOCK_N, BLOCK_N]
    # the state entering this segment: the earlier segments' own states, decayed to its start
    state = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    if SPLIT:  # (S is None with one segment)
        n_seg = tl.num_programs(2)
        seg_decay = tl.exp(SEG.to(tl.float32) * lg) if HAS_DECAY else 1.0
        for k in range(0, seg):
            s_off = ((bh.to(tl.int64) * n_seg + k) * BLOCK_R + cols_r[0][:, None]) * D + \
                cols_d[0][None, :]
            state = state * seg_decay + tl.load(S + s_off, mask=cols_d[1][None, :], other=0.0)
    lane = bh * tl.num_programs(1) + tl.program_id(1)
    start = seg * SEG
    end = tl.minimum(start + SEG, N)
    if REPAIR:  # only the lanes whose outputs came out non-finite are recomputed (chunk_scan.py)
        end = tl.where(tl.load(FLAGS + lane) != 0, end, start)
    for s in range(start, end, BLOCK_N):
        ok, phys = row_positions(s, N, BLOCK_N, False)
        # b, c: [BLOCK_N, BLOCK_R]; v: [BLOCK_N, BLOCK_D]
        b, c, v, bad = load_chunk(b_rows, c_rows, v_rows, phys, ok, cols_r, cols_d, REPAIR)
        w_in, w_out, decay = chunk_weights(lg, s, N, BLOCK_N, HAS_DECAY)
        h, h_scale = state_operand(state, b.dtype, HALF_RANGE)
        out = chunk_output(b, c, v, h, h_scale, w_in, intra, HAS_DECAY, HALF_RANGE,
                           PRECISION)  # [BLOCK_N, BLOCK_D]
        state = accumulate_state(state, c, v, w_out, decay, HAS_DECAY, PRECISION)
        if REPAIR:
            out += tl.cumsum(bad, axis=0)[:, None]
            state += tl.sum(bad, axis=0)
        store_rows(o_rows, phys, ok, cols_d, out)
    if not REPAIR:  # a non-finite c or v leaves the state non-finite for good: one check
        if has_nonfinite(state):
            tl.store(FLAGS + lane, 1)
