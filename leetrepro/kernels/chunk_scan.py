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

``GATE_GRAD`` (gated backward sweeps): E, shaped like O, is the row vectors w whose dot with
each row's part from the state, and in forward time the chunk's own pairs, make the gates'
gradient's pieces (``_tiles.gate_pieces``): a float32 row per lane and one number per chunk, no
state kept. In reverse time a lane's rows are padded at their logical start to whole chunks
(``PAD``), so that its chunks are the forward sweep's; the launcher adds the pieces up
(``leetrepro.methods.chunk.gate_gradient_from_pieces``).

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

from ._tiles import (accumulate_state, add_norm_sums, and_flag, chunk_gates, chunk_inter,
                     chunk_intra, chunk_output, chunk_weights, columns, gate_pieces,
                     half_operand, has_nonfinite, intra_mask, lane_rows, load_chunk, load_gates,
                     load_rows, no_norm_sums, row_positions, segment_state, state_operand,
                     state_remainder, store_rows)


@triton.jit
def chunk_scan_kernel(B, C, V, O, E, O2, STATES, RING, DECAY, CU, SIZE, SCALE, K: tl.constexpr,
                      REPAIR: tl.constexpr, DG=None):
    """Tensors ``B, C, V, O`` (and with ``K.DUAL`` ``E, O2``, else None) each as
    ``(pointer, batch stride, head stride, row stride)`` (elements; the last dimension
    contiguous): any such layout is read and written in place (time-major views, slices of one
    fused projection). ``STATES = (S0, SN)``: float32 (lanes, R, D) initial and final states or
    None. ``RING = (WS, SYNC, FLAGS)``: the ring of published states (float32, lanes × 2 slots ×
    BLOCK_R × BLOCK_D), its int32 flags and ticket (LANES + 1), the lanes' repair flags; each None
    where unused. ``DECAY = (GAMMA, G)``: float64 λ per head with ``K.HAS_DECAY``; with ``K.HAS_GATE`` the
    per-token gates (float32 (batch, heads, N) as ``(pointer, strides)``); 0 for each the call
    has not.
    ``CU``: the packed sequences' offsets or None. ``SIZE = (N, R, D, H, LANES, SEG)``.
    ``SCALE``: O's factor; with ``K.ROWS`` ``(factor, W, batch stride, head stride, row stride,
    D)``: V's row weights W (float32 (batch, heads, N)) and the skip D (float32 (H,)), O =
    factor·op(B, C, W·V) + D·V; with ``K.ROWS == 2`` (a reverse sweep with the dual output: the
    backward of Mamba-2's O = op(B, C, W·x) + D·x, E = x, V = dO) then also ``(RD, block stride,
    half)``: E's rows weighted by W (the dual output and the gates' pieces take W·x), O = W·(
    factor·op(B, C, V)) + D·V (dx), and float32 row dots x·(factor·op) and x·V into RD's two
    halves ((2, value-column blocks, batch·heads, N), contiguous); with ``K.NORM`` ``(factor,
    c, eps, DEN, SUMS, lane stride)``: normalised linear attention's forward (γ = 1, no states;
    ``_normalised``), its denominators into DEN (float32 (batch·heads, N)), each segment's sums
    of its c and v rows published into SUMS (float32 (lanes, segments, BLOCK_R + BLOCK_D)).
    ``DG`` (``K.GATE_GRAD``): the gates' gradient's pieces, ``(rows, block stride, batch stride,
    head stride, row stride, totals, chunks)``: float32 rows (value-column blocks, batch, heads,
    N) and totals (value-column blocks, batch·heads, chunks), each lane writing its block's.
    ``K``: :data:`_tiles.Constants` (``K.SPLIT``:
    segments chained through the ring); ``REPAIR``: rows recomputed with non-finite rows handled
    (the repair launch)."""
    WS, SYNC, FLAGS = RING
    SPLIT: tl.constexpr = K.SPLIT
    if SPLIT:
        LANES = SIZE[4]
        t = tl.atomic_add(SYNC + LANES, 1)  # ticket, in the order programs actually start
        if t == tl.num_programs(0) - 1:  # every ticket taken: the counter zero for the next launch
            tl.atomic_xchg(SYNC + LANES, 0)
    else:
        t = tl.program_id(0)
    io = (B, C, V, O, E, O2)
    fix = _scan(t, io, STATES, RING, DECAY, CU, SIZE, SCALE, K, SPLIT, REPAIR, DG)
    if FLAGS is None:  # (no repair launch follows)
        if fix:  # the lane's first non-finite row is in this segment: its rows again
            _repair(t, io, STATES, DECAY, CU, SIZE, SCALE, K)


@triton.jit(noinline=True)
def _repair(t, io, STATES, DECAY, CU, SIZE, SCALE, K: tl.constexpr):
    """The rows of segment t // LANES of lane t % LANES again, non-finite rows handled (``_scan``'s
    ``REPAIR``). A function of its own, not inlined: the rare path keeps its registers apart from
    the sweep's (inlined, it doubled the kernel's spills)."""
    _scan(t, io, STATES, (None, None, None), DECAY, CU, SIZE, SCALE, K, False, True)


@triton.jit
def _scan(t, io, STATES, RING, DECAY, CU, SIZE, SCALE, K: tl.constexpr, SPLIT: tl.constexpr,
          REPAIR: tl.constexpr, DG=None):
    """Segment t // LANES of lane t % LANES: steps 1-4 of the module docstring. Returns, outside
    ``REPAIR``, whether the lane's first non-finite row is in this segment (its entering state
    finite, its leaving state not): then its rows must be computed again. ``REPAIR``: its rows
    with non-finite rows handled, from its entering state recomputed from the lane's start (C, V
    read again); with ``FLAGS`` (its own launch, a program a lane, SEG ≥ N), the lanes flagged."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_R: tl.constexpr = K.BLOCK_R
    HAS_S0: tl.constexpr = K.HAS_S0
    STORE_SN: tl.constexpr = K.STORE_SN
    N, R, D, H, LANES, SEG = SIZE
    S0, SN = STATES
    FLAGS = RING[2]
    lane = t % LANES
    seg = t // LANES
    n_db = tl.cdiv(D, BLOCK_D)
    bh = lane // n_db
    # the lane's rows of each tensor, through that tensor's own strides
    rows, n, lg = _lane_io(io, DECAY, SCALE, bh, H, N, CU, K)
    w_rows, SCALE = _value_rows(rows, SCALE, bh, H, lane % n_db, N, K)  # (K.ROWS: weights, skip)
    n, pad, pieces = _lane_pieces(DG, lane, bh, n, n_db, SIZE, CU, K)
    cols = (columns(0, R, BLOCK_R), columns((lane % n_db) * BLOCK_D, D, BLOCK_D))
    start = seg * SEG
    end = tl.minimum(start + SEG, n)
    last = end >= n
    # packed sequences share one grid sized for the longest: segments past a sequence's end
    # neither wait, publish nor store
    go = (start < n) | (seg == 0)
    if REPAIR:
        if FLAGS is not None:  # only the lanes whose outputs came out non-finite
            # read and zeroed (for the next launch) in one atomic, whose one value every thread
            # gets: a load followed by a store raced between warps, and a warp that read after
            # another's store skipped the sweep its program's other warps ran (their barriers
            # and tensor-core products apart: an illegal instruction on Hopper)
            go = go & (tl.atomic_xchg(FLAGS + lane, 0) != 0)
            end = tl.where(go, end, start)
    state_off, state_ok = _state_tile(bh, cols, R, D)

    # 1.-3. the state entering the segment, and this one's published
    state, sums = _entering(rows, S0, RING, (lane, seg, last, go), (start, end, n, pad), lg, cols,
                            (state_off, state_ok), w_rows, SCALE, K, SPLIT, REPAIR)

    entering_ok = True
    if not REPAIR:
        if FLAGS is None:
            if HAS_S0 or SPLIT:
                entering_ok = has_nonfinite(state) == 0

    # 4. the outputs, chunk by chunk, carrying the state on chip
    state = _sweep(state, sums, rows, (start, end, n, pad), lg, cols, SCALE, K, REPAIR, pieces)
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


@triton.jit
def _entering(rows, S0, RING, where, span, lg, cols, tile, w_rows, SCALE, K: tl.constexpr,
              SPLIT: tl.constexpr, REPAIR: tl.constexpr):
    """Steps 1-3 for segment ``where = (lane, seg, last, go)`` of logical rows ``span = (start,
    end, n, pad)``: ``(state, sums)``, the state entering it (the initial state ``S0``'s
    ``tile``, else zero; with ``REPAIR`` and no repair flags, the rows before it added; with
    ``SPLIT``, the previous segment's, once this one's is published) and, with ``K.NORM``, the
    sums of the lane's c and v rows before it (:func:`_sums_before`; else zeros)."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_R: tl.constexpr = K.BLOCK_R
    lane, seg, last, go = where
    start, end, n, pad = span
    # 1. this segment's own state (a first read of its C and V rows)
    local = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    seg_log = tl.full([], 0.0, tl.float32)  # log of the segment's own decay
    own = no_norm_sums(K)
    if SPLIT:
        if not last:
            res = segment_state(rows[1], rows[2], rows[6], start, end, n, lg, cols[0], cols[1],
                                K, pad, w_rows)
            local, seg_log = res[0], res[1]
            if K.NORM:
                own = res[2]
    # 2. the state entering the segment
    if K.HAS_S0:
        state = tl.load(S0 + tile[0], mask=tile[1], other=0.0).to(tl.float32)
    else:
        state = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    sums = no_norm_sums(K)
    if REPAIR:
        if RING[2] is None:  # the state entering the segment, from the rows before it
            if start > 0:
                res = segment_state(rows[1], rows[2], rows[6], 0, start, n, lg, cols[0],
                                    cols[1], K, pad, w_rows)
                state = state * tl.exp(res[1]) + res[0]
                if K.NORM:
                    sums = res[2]
    if SPLIT:  # ... from the previous segment, then 3. this one's published
        state = _chain(state, local, RING, lane, seg, last, go, seg_log, K, (own, SCALE))
        if K.NORM:
            sums = _sums_before(SCALE, lane, seg, K)
    return state, sums


@triton.jit
def _sums_before(SCALE, lane, seg, K: tl.constexpr):
    """``K.NORM``'s sums of the c and v rows of a lane's segments before ``seg``, from what each
    published (:func:`_chain`; read once this segment's flag has risen, past L1): in a fixed
    order, as :func:`_tiles.no_norm_sums` holds them."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_R: tl.constexpr = K.BLOCK_R
    at = SCALE[4] + lane.to(tl.int64) * SCALE[5]
    z = tl.zeros([BLOCK_R], dtype=tl.float32)
    sv = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in range(0, seg):
        z += tl.load(at + j * (BLOCK_R + BLOCK_D) + tl.arange(0, BLOCK_R), cache_modifier=".cg")
        sv += tl.load(at + j * (BLOCK_R + BLOCK_D) + BLOCK_R + tl.arange(0, BLOCK_D),
                      cache_modifier=".cg")
    return (z[:, None] + tl.zeros([BLOCK_R, 16], dtype=tl.float32),
            sv[None, :] + tl.zeros([16, BLOCK_D], dtype=tl.float32))


@triton.jit
def _lane_io(io, DECAY, SCALE, bh, H, N, CU, K: tl.constexpr):
    """``(rows, n, lg)``: the lane's rows (:func:`_tiles.lane_rows`) of B, C, V, O, E, O2, the
    gates, in that order (0 for each the call has not: E, O2 without ``K.DUAL``, the gates
    without ``K.HAS_GATE``), then with ``K.ROWS`` V's row weights (``SCALE[1:5]``); its
    length (N, or with ``K.VARLEN`` its sequence's, rows CU[seq]..CU[seq+1]-1
    of the packed batch of one) and its head's log λ in fp32 (``K.HAS_DECAY``; else 0)."""
    DUAL: tl.constexpr = K.DUAL
    HAS_DECAY: tl.constexpr = K.HAS_DECAY
    HAS_GATE: tl.constexpr = K.HAS_GATE
    VARLEN: tl.constexpr = K.VARLEN
    B, C, V, O, E, O2 = io
    GAMMA, G = DECAY
    if HAS_DECAY:
        lg = tl.log(tl.load(GAMMA + bh % H)).to(tl.float32)  # float64 λ in, log taken in float64
    else:
        lg = 0.0
    seq = bh // H
    head = (bh % H).to(tl.int64)
    bos = _bos(CU, seq, VARLEN)
    if VARLEN:
        n = (tl.load(CU + seq + 1) - bos).to(tl.int32)
    else:
        n = N
    # (a grouped tensor's head: the group the lane's head reads, in place)
    GB: tl.constexpr = K.GROUPS[0]
    GC: tl.constexpr = K.GROUPS[1]
    GV: tl.constexpr = K.GROUPS[2]
    GE: tl.constexpr = K.GROUPS[3]
    rows = (lane_rows(B, seq, head // GB, bos, VARLEN), lane_rows(C, seq, head // GC, bos, VARLEN),
            lane_rows(V, seq, head // GV, bos, VARLEN), lane_rows(O, seq, head, bos, VARLEN))
    # (a tuple holds no bare None when compiled: 0 stands for a tensor the call has not)
    if DUAL:
        rows = rows + (lane_rows(E, seq, head // GE, bos, VARLEN),
                       lane_rows(O2, seq, head, bos, VARLEN))
    elif K.GATE_GRAD:  # (E: the gates' gradient's row vectors)
        rows = rows + (lane_rows(E, seq, head // GE, bos, VARLEN), 0)
    else:
        rows = rows + (0, 0)
    if HAS_GATE:
        rows = rows + (lane_rows(G, seq, head, bos, VARLEN),)
    else:
        rows = rows + (0,)
    if K.ROWS:
        rows = rows + (lane_rows((SCALE[1], SCALE[2], SCALE[3], SCALE[4]), seq, head, bos,
                                 VARLEN),)
    return rows, n, lg


@triton.jit
def _value_rows(rows, SCALE, bh, H, blk, N, K: tl.constexpr):
    """``(V's row weights' lane rows, SCALE)`` with ``K.ROWS == 1`` (SCALE then the output's
    factor and the head's skip D); with ``K.ROWS == 2`` (the weights on E's and O's rows, which
    a segment's state does not take: 0) SCALE also holds the lane's row of the row dots' first
    half in value-column block ``blk`` and the halves' distance; with ``K.NORM`` (0, (c, eps,
    the lane's row of the denominators, whether block ``blk`` stores them)); else ``(0,
    SCALE)``."""
    if K.ROWS == 2:
        skip = tl.load(SCALE[5] + bh % H).to(tl.float32)
        rd = SCALE[6] + blk.to(tl.int64) * SCALE[7] + bh.to(tl.int64) * N
        return 0, (SCALE[0], skip, rd, SCALE[8])
    elif K.ROWS:
        return rows[7], (SCALE[0], tl.load(SCALE[5] + bh % H).to(tl.float32))
    elif K.NORM == 1:  # (c, eps, the lane's row of the denominators, whether this block stores
        # them)
        return 0, (SCALE[1], SCALE[2], SCALE[3] + bh.to(tl.int64) * N, blk == 0, SCALE[4],
                   SCALE[5])
    elif K.NORM == 4:  # (the constant offset c)
        return 0, (SCALE[1], 0)
    elif K.NORM:  # (the offsets: c, the lane's row of them)
        return 0, (SCALE[1], SCALE[3] + bh.to(tl.int64) * N)
    else:
        return 0, SCALE


@triton.jit
def _weighted(x, w, K: tl.constexpr):
    """E's tile x with ``K.ROWS == 2``: w·x by rows in float32, the product rounded to x's
    dtype: the tensor V' = w·x the dB sweep reads, bit for bit (the gates' pieces of both sweeps
    then telescope); else x."""
    if K.ROWS == 2:
        return (x.to(tl.float32) * w.to(tl.float32)[:, None]).to(x.dtype)
    else:
        return x


@triton.jit
def _normalised(b, c, v, h, h_scale, mask, sums, s, phys, ok, SCALE, K: tl.constexpr):
    """``K.NORM``'s chunk (γ = 1): normalised linear attention with f(x) = c + x,
    ``o_i = Σ_{j≤i} (b_i·c_j + c) v_j / (Σ_{j≤i} (b_i·c_j + c) + eps)``, the operator's
    (b, c, v) = (q, k, v). The masked scores take + c on and below the diagonal; beside the
    state the sweep carries ``sums``, Σ c_j and Σ v_j over the rows before the chunk (float32,
    [BLOCK_R, 16] and [16, BLOCK_D], every column or row the same sum: products with a tile of
    ones, which hold no fp32 copy of a row tile in registers), so that a row's part from them is
    ``q_i·H + c·Σv`` over ``q_i·Σk + c·s`` (q_i·Σk from Σk's 16-bit operand and its remainder's,
    as exact as fp32's). Returns the chunk's rows divided by their denominators (float32) and
    the sums carried past it; the block that ``SCALE[3]`` names stores the denominators
    (float32, row by row)."""
    HALF_RANGE: tl.constexpr = K.HALF_RANGE
    PRECISION: tl.constexpr = K.PRECISION
    cst = SCALE[0]
    z, sv = sums
    out = chunk_inter(b, h, h_scale, 1.0, False, HALF_RANGE, PRECISION)
    # (chunk_intra's product with c added: through it, with the 0-1 mask multiplied in, the fp32
    # sweep spilled 1028-1032 bytes a thread where this spills 808, sm_90, r = d = 128)
    scores = tl.where(mask != 0.0, tl.dot(b, tl.trans(c), input_precision=PRECISION) + cst, 0.0)
    if HALF_RANGE:
        p, p_scale = half_operand(scores, v.dtype)
        out += tl.dot(p, v, input_precision=PRECISION) * p_scale
    else:
        out += tl.dot(scores.to(v.dtype), v, input_precision=PRECISION)
    # q·Σk as the state's part is taken: Σk as an operand, and in 16 bits its remainder's too
    zh, z_scale = state_operand(z, b.dtype, HALF_RANGE)
    qz = chunk_inter(b, zh, z_scale, 1.0, False, HALF_RANGE, PRECISION)
    if HALF_RANGE:
        qz += chunk_inter(b, state_remainder(z, zh, z_scale), z_scale, 1.0, False, HALF_RANGE,
                          PRECISION)
    # (qz's 16 columns are the same: any one of them)
    den = tl.sum(scores, axis=1) + tl.max(qz, axis=1) + (cst * s + SCALE[1])
    if SCALE[3]:
        tl.store(SCALE[2] + phys, den, mask=ok)
    out = (out + cst * tl.max(sv, axis=0)[None, :]) / den[:, None]
    return out, add_norm_sums(sums, c, v, PRECISION)


@triton.jit
def _norm_chunk(b, c, v, h, h_scale, mask, sums, s, phys, ok, SCALE, K: tl.constexpr):
    """``K.NORM``'s chunk: the normaliser's (1, :func:`_normalised`) or the scores' offsets'
    (:func:`_offset_chunk`)."""
    if K.NORM == 1:
        return _normalised(b, c, v, h, h_scale, mask, sums, s, phys, ok, SCALE, K)
    else:
        return _offset_chunk(b, c, v, h, h_scale, mask, sums, phys, ok, SCALE, K)


@triton.jit
def _offset_chunk(b, c, v, h, h_scale, mask, sums, phys, ok, SCALE, K: tl.constexpr):
    """``K.NORM`` 2, 3 or 4's chunk (γ = 1): the operator with a rank-one term on its scores,
    op(B', C', V) for B' = [B, α], C' = [C, β] (:func:`leetrepro.methods.chunk.chunk_scan`'s
    ``offsets``): the masked scores take α_i·β_j, and each row's part from the rows before the
    chunk α_i·Σ β_j v_j beside b_i·H; 2: β = 1, α the rows' (``SCALE[1]``), 4: β = 1, α the
    constant ``SCALE[0]``, 3: α = 1, β the columns' (``SCALE[1]``). Σ β_j v_j rides
    in ``sums[1]`` ([16, BLOCK_D]: with ones every row the sum; with β its 16-bit part in rows
    0-7 and its remainder in rows 8-15). Returns the chunk's rows (float32) and the sums past
    it."""
    BLOCK_N: tl.constexpr = K.BLOCK_N
    HALF_RANGE: tl.constexpr = K.HALF_RANGE
    PRECISION: tl.constexpr = K.PRECISION
    z, sv = sums
    out = chunk_inter(b, h, h_scale, 1.0, False, HALF_RANGE, PRECISION)
    dots = tl.dot(b, tl.trans(c), input_precision=PRECISION)
    half = (tl.arange(0, 16) < 8)[:, None]
    if K.NORM == 3:
        beta = tl.load(SCALE[1] + phys, mask=ok, other=0.0)
        scores = tl.where(mask != 0.0, dots + beta[None, :], 0.0)
        out += (tl.sum(sv, axis=0) * 0.125)[None, :]
        hi = beta.to(v.dtype).to(tl.float32)
        w = tl.where(half, hi[None, :], (beta - hi)[None, :])  # [16, BLOCK_N]
    else:
        if K.NORM == 4:
            alpha = SCALE[0]
            scores = tl.where(mask != 0.0, dots + alpha, 0.0)
            out += alpha * tl.max(sv, axis=0)[None, :]
        else:
            alpha = tl.load(SCALE[1] + phys, mask=ok, other=0.0)
            scores = tl.where(mask != 0.0, dots + alpha[:, None], 0.0)
            out += alpha[:, None] * tl.max(sv, axis=0)[None, :]
        w = tl.full([16, BLOCK_N], 1.0, tl.float32)
    if HALF_RANGE:
        p, p_scale = half_operand(scores, v.dtype)
        out += tl.dot(p, v, input_precision=PRECISION) * p_scale
    else:
        out += tl.dot(scores.to(v.dtype), v, input_precision=PRECISION)
    return out, (z, tl.dot(w.to(v.dtype), v, acc=sv, input_precision=PRECISION))


@triton.jit
def _store_output(o_rows, phys, ok, cols_d, out, v, x_e, w_e, SCALE, K: tl.constexpr):
    """O's chunk stored once: out·factor; with ``K.ROWS == 1`` plus the skip D·v; with ``K.ROWS
    == 2`` (out = dV' for V' = w·x, x E's rows ``x_e``, v = dO: Mamba-2's backward) dx = w·dV' +
    D·v, and the rows' dots x·dV' and x·v (float32, over this block's columns) into the two
    halves of the row dots (:func:`_value_rows`)."""
    if K.ROWS == 2:
        dv = out * SCALE[0]
        xf = x_e.to(tl.float32)
        vf = v.to(tl.float32)
        tl.store(SCALE[2] + phys, tl.sum(xf * dv, axis=1), mask=ok)
        tl.store(SCALE[2] + SCALE[3] + phys, tl.sum(xf * vf, axis=1), mask=ok)
        store_rows(o_rows, phys, ok, cols_d, dv * w_e[:, None] + SCALE[1] * vf)
    elif K.ROWS:  # (the skip D·V from the chunk's own v)
        store_rows(o_rows, phys, ok, cols_d, out * SCALE[0] + SCALE[1] * v.to(tl.float32))
    elif K.NORM:  # (divided by its denominators already)
        store_rows(o_rows, phys, ok, cols_d, out)
    else:
        store_rows(o_rows, phys, ok, cols_d, out * SCALE)


@triton.jit
def _lane_pieces(DG, lane, bh, n, n_db, SIZE, CU, K: tl.constexpr):
    """``(n, pad, pieces)`` of a lane of n rows: with ``K.GATE_GRAD``, in reverse time its rows
    padded at their logical start to whole chunks (ending where the forward sweep's do), and its
    rows of the gates' gradient's pieces and its block's totals (``_sweep``'s ``pieces``); else
    n, 0 and 0."""
    GATE_GRAD: tl.constexpr = K.GATE_GRAD
    BLOCK_N: tl.constexpr = K.BLOCK_N
    N, R, D, H, LANES, SEG = SIZE
    pad = 0
    pieces = 0
    if GATE_GRAD:
        if K.REVERSE:
            pad = (BLOCK_N - n % BLOCK_N) % BLOCK_N
        blk = lane % n_db
        pieces = (lane_rows((DG[0] + blk * DG[1], DG[2], DG[3], DG[4]), bh // H,
                            (bh % H).to(tl.int64), _bos(CU, bh // H, K.VARLEN), K.VARLEN),
                  DG[5] + (blk * (LANES // n_db) + bh).to(tl.int64) * DG[6])
    return n + pad, pad, pieces


@triton.jit
def _bos(CU, seq, VARLEN: tl.constexpr):
    """The first row of packed sequence ``seq`` (``VARLEN``), else 0."""
    if VARLEN:
        return tl.load(CU + seq).to(tl.int64)
    else:
        return 0


@triton.jit
def _state_tile(bh, cols, R, D):
    """Offsets and mask of the lane's [BLOCK_R, BLOCK_D] tile of a float32 (b·h, R, D) state."""
    cols_r, r_ok = cols[0]
    cols_d, d_ok = cols[1]
    return (bh.to(tl.int64) * R + cols_r[:, None]) * D + cols_d[None, :], \
        r_ok[:, None] & d_ok[None, :]


@triton.jit
def _chain(state, local, RING, lane, seg, last, go, seg_log, K: tl.constexpr, norm=0):
    """Steps 2-3 with segments: the state entering segment ``seg`` (``state``: the lane's initial
    one) from the previous segment's ring slot once its flag rises, and, unless ``last``, this
    segment's P_k = e^seg_log P_(k-1) + ``local`` published to the other slot, its flag raised
    (``seg_log``: the log of the segment's decay, λ^length or its gates' total). ``norm``
    (``K.NORM``): ``(the segment's own sums, SCALE)``, its sums published beside it
    (:func:`_sums_before`)."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_R: tl.constexpr = K.BLOCK_R
    WS, SYNC, FLAGS = RING
    ws_tile = tl.arange(0, BLOCK_R)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
    if (seg > 0) & go:
        # the flag reads seg once the previous segment has published; the lane's last
        # segment swaps it back to zero as it reads it (every earlier segment is past its own
        # wait then), so the launch leaves its flags zero
        after = seg - seg * last.to(tl.int32)
        flag = tl.atomic_cas(SYNC + lane, seg, after, sem="acquire")
        while flag != seg:
            flag = tl.atomic_cas(SYNC + lane, seg, after, sem="acquire")
        # .cg: read L2, never a stale L1 line of an earlier use of this ring slot
        state = tl.load(WS + (lane * 2 + (seg - 1) % 2).to(tl.int64) * BLOCK_R * BLOCK_D +
                        ws_tile, cache_modifier=".cg")
    if not last:
        tl.store(WS + (lane * 2 + seg % 2).to(tl.int64) * BLOCK_R * BLOCK_D + ws_tile,
                 state * tl.exp(seg_log) + local)
        if K.NORM:  # (columns and rows the same: one of each)
            at = norm[1][4] + lane.to(tl.int64) * norm[1][5] + seg * (BLOCK_R + BLOCK_D)
            tl.store(at + tl.arange(0, BLOCK_R), tl.max(norm[0][0], axis=1))
            tl.store(at + BLOCK_R + tl.arange(0, BLOCK_D), tl.max(norm[0][1], axis=0))
        tl.debug_barrier()  # every thread's part of P_k is written before the flag rises
        tl.atomic_xchg(SYNC + lane, seg + 1, sem="release")
    return state


@triton.jit
def _sweep(state, sums, rows, span, lg, cols, SCALE, K: tl.constexpr, REPAIR: tl.constexpr,
           pieces):
    """Step 4: the outputs of logical rows ``span = (start, end, n, pad)`` chunk by chunk from the
    entering ``state`` (and ``K.NORM``'s ``sums``), which it returns carried to ``end``. ``REPAIR``: c and v with their
    non-finite entries zeroed, every row from the first non-finite one on NaN. ``SCALE``:
    :func:`_value_rows`'. ``pieces`` (``K.GATE_GRAD``): the lane's rows of the gates'
    gradient's pieces and its totals' pointer (``_scan``), where each chunk writes its own."""
    BLOCK_N: tl.constexpr = K.BLOCK_N
    DUAL: tl.constexpr = K.DUAL
    HALF_RANGE: tl.constexpr = K.HALF_RANGE
    HAS_DECAY: tl.constexpr = K.HAS_DECAY
    HAS_GATE: tl.constexpr = K.HAS_GATE
    GATE_GRAD: tl.constexpr = K.GATE_GRAD
    PRECISION: tl.constexpr = K.PRECISION
    REVERSE: tl.constexpr = K.REVERSE
    WEIGHTED: tl.constexpr = HAS_DECAY or HAS_GATE
    b_rows, c_rows, v_rows, o_rows = rows[0], rows[1], rows[2], rows[3]
    start, end, n, pad = span
    cols_r, cols_d = cols
    intra = intra_mask(lg, BLOCK_N, HAS_DECAY)  # [BLOCK_N, BLOCK_N] (γ: one for every chunk)
    for s in range(start, end, BLOCK_N):
        ok, phys = row_positions(s, n, BLOCK_N, REVERSE, pad)
        b, c, v, bad = load_chunk(b_rows, c_rows, v_rows, phys, ok, cols_r, cols_d, REPAIR)  # (N,R|D)
        if HAS_GATE:  # (the chunk's own mask and weights, from its gates)
            w_in, w_out, decay, mask = chunk_gates(rows[6], phys, ok, BLOCK_N)
            if K.ROWS == 1:  # (V' = w·V: row j of V reaches the mask's column j and the update)
                w_v = load_gates(rows[7], phys, ok)
                w_out = w_out * w_v
                mask = mask * w_v[None, :]
        else:
            w_in, w_out, decay = chunk_weights(lg, s, n, BLOCK_N, HAS_DECAY)
            mask = intra
        w_e = 0.0
        x_e = 0.0
        if K.ROWS == 2:  # (E = x, whose rows' weights w make E' = w·x: Mamba-2's V')
            w_e = load_gates(rows[7], phys, ok)
        h, h_scale = state_operand(state, b.dtype, HALF_RANGE)  # [BLOCK_R, BLOCK_D]
        if GATE_GRAD:  # (the rows' dots with the state's part as it is made: fewer spills)
            x_e = load_rows(rows[4], phys, ok, cols_d)  # [BLOCK_N, BLOCK_D]
            e = _weighted(x_e, w_e, K)
            out = chunk_inter(b, h, h_scale, w_in, WEIGHTED, HALF_RANGE, PRECISION)
            if b.dtype != tl.float32:  # (the state's 16-bit rounding would add up across the
                # chunks the pieces telescope over: its remainder's product too, NOTES.md)
                out += chunk_inter(b, state_remainder(state, h, h_scale), h_scale, w_in,
                                   WEIGHTED, HALF_RANGE, PRECISION)
            e_rows = tl.sum(out * e.to(tl.float32), axis=1)
            scores, own = chunk_intra(b, c, v, mask, HALF_RANGE, PRECISION)
            out += own  # [BLOCK_N, BLOCK_D]
        elif K.NORM:
            out, sums = _norm_chunk(b, c, v, h, h_scale, mask, sums, s, phys, ok, SCALE, K)
        else:
            out = chunk_output(b, c, v, h, h_scale, w_in, mask, WEIGHTED, HALF_RANGE, PRECISION)
        if REPAIR:  # NaN from the first non-finite row on, none before
            poison = tl.cumsum(bad, axis=0)[:, None]
            out += poison
        if K.ROWS == 2 and not GATE_GRAD:  # (E's rows for O's row dots)
            x_e = load_rows(rows[4], phys, ok, cols_d)  # [BLOCK_N, BLOCK_D]
            e = _weighted(x_e, w_e, K)
        _store_output(o_rows, phys, ok, cols_d, out, v, x_e, w_e, SCALE, K)
        if DUAL and not GATE_GRAD and K.ROWS != 2:  # (E loaded late: the plain dual sweep
            e = load_rows(rows[4], phys, ok, cols_d)  # spills less so)  [BLOCK_N, BLOCK_D]
        if GATE_GRAD:
            part, total = gate_pieces(e_rows, scores, e, v, REVERSE, PRECISION)
            dg_ptr, dg_base, dg_stride = pieces[0]
            tl.store(dg_ptr + dg_base + phys * dg_stride, part, mask=ok)
            if REVERSE:  # (the chunk's place in physical order)
                chunk = (n - s) // BLOCK_N - 1
            else:
                chunk = s // BLOCK_N
            tl.store(pieces[1] + chunk, total)
        if DUAL:  # op(E, V, C) from the transposed state: the backward's dC beside dV
            out2 = chunk_output(e, v, c, tl.trans(h), h_scale, w_in, mask, WEIGHTED,
                                HALF_RANGE, PRECISION)  # [BLOCK_N, BLOCK_R]
            if REPAIR:
                out2 += poison
            store_rows(rows[5], phys, ok, cols_r, out2 * (SCALE[0] if K.ROWS else SCALE))
        state = accumulate_state(state, c, v, w_out, decay, WEIGHTED, PRECISION, GATE_GRAD)
        if REPAIR:
            state += tl.sum(bad, axis=0)
    return state

