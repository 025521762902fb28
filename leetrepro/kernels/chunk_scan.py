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
The counters (SYNC: ring flags and ticket; FLAGS) are left zero by every launch that uses them
(the last ticket resets the ticket, a lane's last segment its flag as its wait reads it, the
repair launch the flags it reads), so the launcher keeps them from call to call without zeroing them.
Only non-negative powers of λ appear. ``DUAL`` also writes O2 = op(E, V, C) for a fourth input E
shaped like V: its state Σ v_jᵀ c_j is the transpose of this one, so one sweep gives both (the
backward's dV and dC). ``REVERSE`` runs the same recurrence over the rows read
backwards (logical row t = physical row N-1-t): the backward pass's dV and dC.

``SCALE`` multiplies the outputs as they are stored (flash-linear-attention's query scale, free).
Packed sequences (``VARLEN``): lane (sequence, head) reads rows CU[seq]..CU[seq+1]-1 of a batch of
one. Every tensor is addressed through its own strides, so time-major views and the slices of a
fused projection are read and written in place.

Non-finite rows of C or V: a chunk multiplies whole tiles, so a NaN/Inf in row j meets the zero
weights of earlier rows of its chunk (0 × NaN) and would spoil them. Detecting that per chunk
costs several times the sweep (a reduction and a branch per chunk break the load-to-MMA pipeline;
NOTES.md). But such a row also makes the carried state non-finite, and nothing makes it finite
again, so each program checks its state once, at its end. With ``FLAGS`` (long calls, and the Hopper kernel's) it
flags its lane, and a second launch (``REPAIR``, one program per lane, a few microseconds when
nothing is flagged) recomputes only the flagged lanes from their start, the non-finite entries of
C and V zeroed, every row from the first non-finite one on set to NaN. Without (short calls, where
a launch's host time weighs), the segment whose entering state was finite and leaving state is not
holds the lane's first non-finite row: it computes its own rows again the same way
(``_repair``), its entering state from the rows before it; later segments' rows are non-finite
already, earlier ones' exact. Shared tile code: ``_tiles.py``. Launcher:
``leetrepro.methods.chunk``.
"""
import triton
import triton.language as tl

from ._tiles import (accumulate_state, and_flag, chunk_output, chunk_weights,
                                      has_nonfinite, intra_mask, load_chunk, load_rows,
                                      row_positions, segment_state, state_operand, store_rows)


@triton.jit
def chunk_scan_kernel(B, C, V, O, E, O2, S0, SN, WS, SYNC, FLAGS, GAMMA, CU, N, R, D, H, LANES, SEG,
                      SCALE, SB_B, SB_H, SB_T, SC_B, SC_H, SC_T, SV_B, SV_H, SV_T,
                      SO_B, SO_H, SO_T, SE_B, SE_H, SE_T, SP_B, SP_H, SP_T,
                      HAS_DECAY: tl.constexpr, VARLEN: tl.constexpr, HAS_S0: tl.constexpr,
                      STORE_SN: tl.constexpr, SPLIT: tl.constexpr, REVERSE: tl.constexpr,
                      DUAL: tl.constexpr, HALF_RANGE: tl.constexpr, REPAIR: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                      PRECISION: tl.constexpr):
    """Strides: ``S<X>_B, S<X>_H, S<X>_T`` (batch, head, row; elements) of each tensor X of B, C,
    V, O, E and O2 (``SP_*``), each its own: any layout whose last dimension is contiguous is read
    and written in place (time-major views, slices of one fused projection)."""
    if SPLIT:
        t = tl.atomic_add(SYNC + LANES, 1)  # ticket, in the order programs actually start
        if t == tl.num_programs(0) - 1:  # every ticket taken: the counter zero for the next launch
            tl.atomic_xchg(SYNC + LANES, 0)
    else:
        t = tl.program_id(0)
    fix = _scan(t, B, C, V, O, E, O2, S0, SN, WS, SYNC, FLAGS, GAMMA, CU, N, R, D, H, LANES, SEG,
                SCALE, SB_B, SB_H, SB_T, SC_B, SC_H, SC_T, SV_B, SV_H, SV_T, SO_B, SO_H, SO_T,
                SE_B, SE_H, SE_T, SP_B, SP_H, SP_T, HAS_DECAY, VARLEN, HAS_S0, STORE_SN,
                SPLIT, REVERSE, DUAL, HALF_RANGE, REPAIR, BLOCK_N, BLOCK_R, BLOCK_D, PRECISION)
    if FLAGS is None:  # (no repair launch follows)
        if fix:  # the lane's first non-finite row is in this segment: its rows again
            _repair(t, B, C, V, O, E, O2, S0, SN, GAMMA, CU, N, R, D, H, LANES, SEG, SCALE,
                    SB_B, SB_H, SB_T, SC_B, SC_H, SC_T, SV_B, SV_H, SV_T, SO_B, SO_H, SO_T,
                    SE_B, SE_H, SE_T, SP_B, SP_H, SP_T, HAS_DECAY, VARLEN, HAS_S0, STORE_SN,
                    REVERSE, DUAL, HALF_RANGE, BLOCK_N, BLOCK_R, BLOCK_D, PRECISION)


@triton.jit(noinline=True)
def _repair(t, B, C, V, O, E, O2, S0, SN, GAMMA, CU, N, R, D, H, LANES, SEG, SCALE,
            SB_B, SB_H, SB_T, SC_B, SC_H, SC_T, SV_B, SV_H, SV_T, SO_B, SO_H, SO_T,
            SE_B, SE_H, SE_T, SP_B, SP_H, SP_T, HAS_DECAY: tl.constexpr, VARLEN: tl.constexpr,
            HAS_S0: tl.constexpr, STORE_SN: tl.constexpr, REVERSE: tl.constexpr,
            DUAL: tl.constexpr, HALF_RANGE: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """The rows of segment t // LANES of lane t % LANES again, non-finite rows handled (``_scan``'s
    ``REPAIR``). A function of its own, not inlined: the rare path keeps its registers apart from
    the sweep's (inlined, it doubled the kernel's spills)."""
    _scan(t, B, C, V, O, E, O2, S0, SN, None, None, None, GAMMA, CU, N, R, D, H, LANES, SEG, SCALE,
          SB_B, SB_H, SB_T, SC_B, SC_H, SC_T, SV_B, SV_H, SV_T, SO_B, SO_H, SO_T,
          SE_B, SE_H, SE_T, SP_B, SP_H, SP_T, HAS_DECAY, VARLEN, HAS_S0, STORE_SN, False, REVERSE,
          DUAL, HALF_RANGE, True, BLOCK_N, BLOCK_R, BLOCK_D, PRECISION)


@triton.jit
def _lane_base(seq, head, bos, S_B, S_H, S_T, VARLEN: tl.constexpr):
    """Element offset of a lane's row 0 in a tensor of strides (S_B, S_H, S_T): batch ``seq``, or
    with ``VARLEN`` the packed batch of one from row ``bos``. int64: batch 16 × 32 heads × N
    100000 × 128 overflows int32."""
    if VARLEN:
        return head * S_H + bos * S_T
    else:
        return seq.to(tl.int64) * S_B + head * S_H


@triton.jit
def _scan(t, B, C, V, O, E, O2, S0, SN, WS, SYNC, FLAGS, GAMMA, CU, N, R, D, H, LANES, SEG, SCALE,
          SB_B, SB_H, SB_T, SC_B, SC_H, SC_T, SV_B, SV_H, SV_T, SO_B, SO_H, SO_T,
          SE_B, SE_H, SE_T, SP_B, SP_H, SP_T, HAS_DECAY: tl.constexpr, VARLEN: tl.constexpr,
          HAS_S0: tl.constexpr, STORE_SN: tl.constexpr, SPLIT: tl.constexpr,
          REVERSE: tl.constexpr, DUAL: tl.constexpr, HALF_RANGE: tl.constexpr,
          REPAIR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
          BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """Segment t // LANES of lane t % LANES: steps 1-4 of the module docstring. Returns, outside
    ``REPAIR``, whether the lane's first non-finite row is in this segment (its entering state
    finite, its leaving state not): then its rows must be computed again. ``REPAIR``: the
    segment's rows with non-finite rows handled, from its entering state recomputed from the
    lane's start (C and V read again up to the segment); with ``FLAGS`` (a launch of its own, one
    program per lane, SEG ≥ N), only the lanes flagged."""
    lane = t % LANES
    seg = t // LANES
    n_db = tl.cdiv(D, BLOCK_D)
    bh = lane // n_db
    d0 = (lane % n_db) * BLOCK_D
    # rows addressed through each tensor's own strides (head-major, time-major, slices of a
    # fused projection: no copies)
    seq = bh // H
    head = (bh % H).to(tl.int64)
    if VARLEN:  # sequence `seq` is rows cu[seq]..cu[seq+1]-1 of the packed batch of one
        bos = tl.load(CU + seq).to(tl.int64)
        n = (tl.load(CU + seq + 1) - bos).to(tl.int32)
    else:
        bos = 0
        n = N
    b_base = _lane_base(seq, head, bos, SB_B, SB_H, SB_T, VARLEN)
    c_base = _lane_base(seq, head, bos, SC_B, SC_H, SC_T, VARLEN)
    v_base = _lane_base(seq, head, bos, SV_B, SV_H, SV_T, VARLEN)
    o_base = _lane_base(seq, head, bos, SO_B, SO_H, SO_T, VARLEN)
    cols_r = tl.arange(0, BLOCK_R)
    cols_d = d0 + tl.arange(0, BLOCK_D)
    r_ok = cols_r < R
    d_ok = cols_d < D
    if HAS_DECAY:
        lg = tl.log(tl.load(GAMMA + bh % H)).to(tl.float32)  # float64 λ in, log taken in float64
    else:
        lg = 0.0
    intra = intra_mask(lg, BLOCK_N, HAS_DECAY)
    start = seg * SEG
    end = tl.minimum(start + SEG, n)
    last = end >= n
    # packed sequences share one grid sized for the longest: segments past a sequence's end
    # neither wait, publish nor store
    go = (start < n) | (seg == 0)
    if REPAIR:
        if FLAGS is not None:  # only the lanes whose outputs came out non-finite
            go = go & (tl.load(FLAGS + lane) != 0)
            end = tl.where(go, end, start)
            tl.store(FLAGS + lane, 0)  # (zero again for the next launch)
    state_off = (bh.to(tl.int64) * R + cols_r[:, None]) * D + cols_d[None, :]
    state_ok = r_ok[:, None] & d_ok[None, :]
    ws_tile = cols_r[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]

    # 1. this segment's own state (a first read of its C and V rows)
    local = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    if SPLIT:
        if not last:
            local = segment_state(C, V, c_base, v_base, start, end, n, lg, cols_r, r_ok, cols_d,
                                  d_ok, SC_T, SV_T, BLOCK_R, BLOCK_D, BLOCK_N, HAS_DECAY, REVERSE,
                                  PRECISION)

    # 2. the state entering the segment
    if HAS_S0:
        state = tl.load(S0 + state_off, mask=state_ok, other=0.0).to(tl.float32)
    else:
        state = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    if REPAIR:
        if FLAGS is None:  # the state entering the segment, from the rows before it
            if start > 0:
                if HAS_DECAY:
                    state = state * tl.exp(start.to(tl.float32) * lg)
                state += segment_state(C, V, c_base, v_base, 0, start, n, lg, cols_r, r_ok,
                                       cols_d, d_ok, SC_T, SV_T, BLOCK_R, BLOCK_D, BLOCK_N,
                                       HAS_DECAY, REVERSE, PRECISION)
    if SPLIT:
        if (seg > 0) & go:
            # the flag reads seg once the previous segment has published; the lane's last
            # segment swaps it back to zero as it reads it (every earlier segment is past its own
            # wait then), so the launch leaves its flags zero
            after = seg - seg * last.to(tl.int32)
            flag = tl.atomic_cas(SYNC + lane, seg, after, sem="acquire")
            while flag != seg:
                flag = tl.atomic_cas(SYNC + lane, seg, after, sem="acquire")
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

    entering_ok = True
    if not REPAIR:
        if FLAGS is None:
            if HAS_S0 or SPLIT:
                entering_ok = has_nonfinite(state) == 0

    # 4. the outputs, chunk by chunk, carrying the state on chip
    for s in range(start, end, BLOCK_N):
        ok, phys = row_positions(s, n, BLOCK_N, REVERSE)
        b, c, v, bad = load_chunk(B, C, V, b_base, c_base, v_base, phys, ok, cols_r, r_ok,
                                  cols_d, d_ok, SB_T, SC_T, SV_T, REPAIR)
        w_in, w_out, decay = chunk_weights(lg, s, n, BLOCK_N, HAS_DECAY)
        h, h_scale = state_operand(state, b.dtype, HALF_RANGE)
        out = chunk_output(b, c, v, h, h_scale, w_in, intra, HAS_DECAY, HALF_RANGE, PRECISION)
        if REPAIR:  # NaN from the first non-finite row on, none before
            poison = tl.cumsum(bad, axis=0)[:, None]
            out += poison
        store_rows(O, o_base, phys, ok, cols_d, d_ok, SO_T, out * SCALE)
        if DUAL:  # op(E, V, C) from the transposed state: the backward's dC beside dV
            e = load_rows(E, _lane_base(seq, head, bos, SE_B, SE_H, SE_T, VARLEN), phys, ok,
                          cols_d, d_ok, SE_T)
            out2 = chunk_output(e, v, c, tl.trans(h), h_scale, w_in, intra, HAS_DECAY,
                                HALF_RANGE, PRECISION)
            if REPAIR:
                out2 += poison
            store_rows(O2, _lane_base(seq, head, bos, SP_B, SP_H, SP_T, VARLEN), phys, ok,
                       cols_r, r_ok, SP_T, out2 * SCALE)
        state = accumulate_state(state, c, v, w_out, decay, HAS_DECAY, PRECISION)
        if REPAIR:
            state += tl.sum(bad, axis=0)
    fix = False
    if not REPAIR:  # a non-finite c or v leaves the state non-finite for good, and every later
        # segment's with it: one check
        if FLAGS is None:  # the segment whose entering state was finite repairs its rows
            fix = go & entering_ok & has_nonfinite(state)
        elif has_nonfinite(state):  # the repair launch recomputes the lane
            tl.store(FLAGS + lane, 1)
    if STORE_SN:
        if last:
            tl.store(SN + state_off, state, mask=and_flag(state_ok, go))
    return fix
