"""The gates' gradient from the pairs of rows that straddle each row.

With per-token gates (M[i, j] = exp(G_i − G_j), G the gates' running sum), a pair of a row i and
a column j ≤ i adds A_ij = M_ij (b_i·c_j)(dO_i·v_j) to the loss, and g_t sits inside G_i − G_j
exactly when j < t ≤ i: so dg_t is the sum of A_ij over the pairs that straddle t, the initial
state counting as a column before row 0 and the final state's gradient as a row after the last
(``leetrepro.ops``' docstring has the row-dot form it equals). Every term enters with its own
sign and no large sum is subtracted from another, so each dg_t is as accurate as its own terms,
in fp16/bf16 too, where the row-dot form's long running difference is not.

A segment of rows P..E (``SEG`` = NB blocks of ``BLOCK_N``) takes its straddling pairs in four
kinds, with F_P the forward state entering it (Σ_(j<P) e^(G_(P−1) − G_j) c_jᵀ v_j, plus the
initial state decayed) and R_(E+1) the backward state leaving it (Σ_(i>E) e^(G_i − G_E) b_iᵀ dO_i,
plus dS_N):

    j < P,     i > E        e^(G_E − G_(P−1)) ⟨F_P, R_(E+1)⟩, one number for the whole segment
    j < P,     t ≤ i ≤ E    running sums from the segment's end of e^(G_i − G_(P−1)) dO_i·(b_i F_P)
    P ≤ j < t, i > E        running sums from its start of e^(G_E − G_j) (c_j R_(E+1))·v_j
    P ≤ j < t ≤ i ≤ E       the segment's own pairs, a (BLOCK_N × BLOCK_N) tile per pair of
                            blocks: the diagonal tiles straddle inside, the others add their
                            row sums, column sums or total to the blocks they span

Three launches. :func:`segment_states` walks each lane (batch or sequence, head, value-column
block) once forward, writing F_P at each segment's start, and once in reverse time, writing
R_(E+1) at each segment's end (workspaces ``(lanes, slots, BLOCK_R, BLOCK_D)`` fp32, one state
per segment each: together twice the size of dO in bf16 at r = d); then :func:`straddle_gradient`
takes every (lane, segment) on its own, nothing carried from one segment to the next, and writes
each row's dg. The terms are linear in V's columns, so a lane holds a block of them and the
launcher sums the blocks' partial dg. Dot operands in the input dtype (F and R rounded to it,
fp16 scaled into range), accumulation in fp32: O(N·(r·d + SEG·(r+d))) per lane, a little more
than one operator sweep.
"""
import triton
import triton.language as tl

from ._tiles import columns, lane_rows, load_gates, load_rows, row_positions, state_operand


@triton.jit
def _lane(CU, SIZE, K: tl.constexpr):
    """(sequence or batch, head, first value column, first row, rows, workspace row, first slot)
    of this program's lane; a packed sequence's slots start at seq + bos // SEG, which no two
    sequences share."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_N: tl.constexpr = K.BLOCK_N
    VARLEN: tl.constexpr = K.VARLEN
    NB: tl.constexpr = K.SEG_BLOCKS
    N, R, D, H, SLOTS = SIZE
    lane = tl.program_id(0)
    n_db = tl.cdiv(D, BLOCK_D)
    bh = lane // n_db
    d0 = (lane % n_db) * BLOCK_D
    seq = bh // H
    head = (bh % H).to(tl.int64)
    if VARLEN:
        bos = tl.load(CU + seq).to(tl.int64)
        n = tl.load(CU + seq + 1).to(tl.int64) - bos
        row = head * n_db + lane % n_db
        slot0 = seq + bos // (NB * BLOCK_N)
    else:
        bos = 0
        n = N
        row = lane
        slot0 = 0
    return seq, head, d0, bos, n, row.to(tl.int64), slot0


@triton.jit
def _segment_block(g_rows, P, q, base, n, BLOCK_N: tl.constexpr):
    """Block q of the segment at row P: (in range, physical rows, G − G_(P−1) per row) where
    ``base`` is the sum of the segment's gates before the block."""
    ok, phys = row_positions(P + q * BLOCK_N, n, BLOCK_N, False)
    return ok, phys, base + tl.cumsum(load_gates(g_rows, phys, ok), axis=0)


@triton.jit
def _block_totals(g_rows, P, n, NB: tl.constexpr, BLOCK_N: tl.constexpr):
    """The segment's gate sum per block, [NB] fp32."""
    blk = tl.arange(0, NB)
    tot = tl.zeros((NB,), dtype=tl.float32)
    for q in range(0, NB):
        ok, phys = row_positions(P + q * BLOCK_N, n, BLOCK_N, False)
        tot += tl.where(blk == q, tl.sum(load_gates(g_rows, phys, ok), axis=0), 0.0)
    return tot


@triton.jit
def _slot(WS, index, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """The pointers of workspace state ``index`` (a [BLOCK_R, BLOCK_D] tile), built where it is
    read or written: held through a segment's tiles, the 64-bit pointers of a 128 × 64 state
    take 64 registers a thread and spill."""
    return WS + index * BLOCK_R * BLOCK_D + tl.arange(0, BLOCK_R)[:, None] * BLOCK_D + \
        tl.arange(0, BLOCK_D)[None, :]


@triton.jit
def _before(tot, q, NB: tl.constexpr):
    """Σ of ``tot`` over the blocks before q."""
    return tl.sum(tl.where(tl.arange(0, NB) < q, tot, 0.0), axis=0)


@triton.jit
def segment_states(Xt, Y, G, WS, S, CU, INV_SCALE, SIZE, K: tl.constexpr):
    """One state per segment of a lane into ``WS`` (module docstring): forward, F_P entering each
    segment from ``(Xt, Y) = (C, V)`` and S0; with ``K.REVERSE``, R_(E+1) leaving it from
    ``(Xt, Y) = (B, dO)`` and dS_N, walked from the last segment. Xt, Y, G: ``(pointer, batch
    stride, head stride, row stride)`` (G the gates, γ folded in, float32); S: the given state
    ``(batch or sequences, heads, r, d)`` contiguous where ``K.HAS_S0``, times ``INV_SCALE``
    (dS_N divided by the operator's scale: the other terms leave it out, the launcher multiplies
    dg by it); ``CU``: the packed sequences' offsets (``K.VARLEN``); ``SIZE = (N, R, D, H,
    SLOTS)``, SLOTS the workspace's slots per row; ``K``: :data:`_tiles.Constants`."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_N: tl.constexpr = K.BLOCK_N
    BLOCK_R: tl.constexpr = K.BLOCK_R
    NB: tl.constexpr = K.SEG_BLOCKS
    PRECISION: tl.constexpr = K.PRECISION
    REVERSE: tl.constexpr = K.REVERSE
    GX: tl.constexpr = K.GROUPS[0]
    N, R, D, H, SLOTS = SIZE
    seq, head, d0, bos, n, row, slot0 = _lane(CU, SIZE, K)
    x_rows = lane_rows(Xt, seq, head // GX, bos, K.VARLEN)
    y_rows = lane_rows(Y, seq, head, bos, K.VARLEN)
    g_rows = lane_rows(G, seq, head, bos, K.VARLEN)
    cols_r = columns(0, R, BLOCK_R)
    cols_d = columns(d0, D, BLOCK_D)
    state = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    if K.HAS_S0:
        s = S + (seq.to(tl.int64) * H + head) * R * D
        state = tl.load(s + cols_r[0][:, None] * D + cols_d[0][None, :],
                        mask=cols_r[1][:, None] & cols_d[1][None, :], other=0.0).to(tl.float32)
        state = state * INV_SCALE
    SEG: tl.constexpr = NB * BLOCK_N
    n_seg = tl.cdiv(n, SEG)
    for kk in range(0, n_seg):
        if REVERSE:
            k = n_seg - 1 - kk
        else:
            k = kk
        P = k * SEG
        tl.store(_slot(WS, row * SLOTS + slot0 + k, BLOCK_R, BLOCK_D), state)
        local = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
        tot = _block_totals(g_rows, P, n, NB, BLOCK_N)
        seg_total = tl.sum(tot, axis=0)
        for q in range(0, NB):
            ok, phys, Gq = _segment_block(g_rows, P, q, _before(tot, q, NB), n, BLOCK_N)
            x = load_rows(x_rows, phys, ok, cols_r)
            y = load_rows(y_rows, phys, ok, cols_d)
            if REVERSE:
                w = tl.where(ok, tl.exp(Gq), 0.0)  # e^(G_i − G_(P−1)) ≤ 1
            else:
                w = tl.where(ok, tl.exp(seg_total - Gq), 0.0)  # e^(G_E − G_j) ≤ 1
            local = tl.dot(tl.trans((x.to(tl.float32) * w[:, None]).to(x.dtype)), y, acc=local,
                           input_precision=PRECISION)
        state = state * tl.exp(seg_total) + local


@triton.jit
def straddle_gradient(Bt, Ct, V, DO, G, WF, WR, DG, CU, SIZE, K: tl.constexpr):
    """Each row's dg (partial over this lane's value columns) into ``DG`` (float32
    ``(column blocks, batch, heads, N)``, contiguous), one segment a program (grid: lanes ×
    segments of the longest lane), from F in ``WF`` and R in ``WR`` (:func:`segment_states`)."""
    NB: tl.constexpr = K.SEG_BLOCKS
    BLOCK_N: tl.constexpr = K.BLOCK_N
    N, R, D, H, SLOTS = SIZE
    seq, head, d0, bos, n, row, slot0 = _lane(CU, SIZE, K)
    k = tl.program_id(1)
    if k * (NB * BLOCK_N) < n:  # (a packed lane shorter than the longest has fewer segments)
        _segment(Bt, Ct, V, DO, G, WF, WR, DG, SIZE, K, seq, head, d0, bos, n,
                 row * SLOTS + slot0 + k, k * (NB * BLOCK_N))


@triton.jit
def _segment(Bt, Ct, V, DO, G, WF, WR, DG, SIZE, K: tl.constexpr, seq, head, d0, bos, n, slot,
             P):
    """:func:`straddle_gradient`'s segment from row P, its states at workspace ``slot``."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_N: tl.constexpr = K.BLOCK_N
    BLOCK_R: tl.constexpr = K.BLOCK_R
    NB: tl.constexpr = K.SEG_BLOCKS
    PRECISION: tl.constexpr = K.PRECISION
    HALF_RANGE: tl.constexpr = K.HALF_RANGE
    GB: tl.constexpr = K.GROUPS[0]
    GC: tl.constexpr = K.GROUPS[1]
    N, R, D, H, SLOTS = SIZE
    b_rows = lane_rows(Bt, seq, head // GB, bos, K.VARLEN)
    c_rows = lane_rows(Ct, seq, head // GC, bos, K.VARLEN)
    v_rows = lane_rows(V, seq, head, bos, K.VARLEN)
    o_rows = lane_rows(DO, seq, head, bos, K.VARLEN)
    g_rows = lane_rows(G, seq, head, bos, K.VARLEN)
    cols_r = columns(0, R, BLOCK_R)
    cols_d = columns(d0, D, BLOCK_D)
    n_db = tl.cdiv(D, BLOCK_D)
    if K.VARLEN:
        out = DG + ((d0 // BLOCK_D) * H + head) * N + bos
    else:
        out = DG + (((d0 // BLOCK_D) * (tl.num_programs(0) // (n_db * H)) + seq) * H + head) * N
    blk = tl.arange(0, NB)[:, None]
    within = tl.arange(0, BLOCK_N)
    lower = within[:, None] >= within[None, :]
    tot = _block_totals(g_rows, P, n, NB, BLOCK_N)
    seg_total = tl.sum(tot, axis=0)
    f = tl.load(_slot(WF, slot, BLOCK_R, BLOCK_D))
    acc = tl.zeros((NB, BLOCK_N), dtype=tl.float32) + tl.exp(seg_total) * tl.sum(
        tl.sum(f * tl.load(_slot(WR, slot, BLOCK_R, BLOCK_D)), axis=1), axis=0)
    f_op, f_scale = state_operand(f, DO[0].dtype.element_ty, HALF_RANGE)
    for q in range(0, NB):  # rows i in block q
        ok_q, phys_q, Gq = _segment_block(g_rows, P, q, _before(tot, q, NB), n, BLOCK_N)
        b = load_rows(b_rows, phys_q, ok_q, cols_r)
        do = load_rows(o_rows, phys_q, ok_q, cols_d)
        rho = tl.sum(tl.dot(b, f_op, input_precision=PRECISION) * f_scale
                     * do.to(tl.float32), axis=1) * tl.where(ok_q, tl.exp(Gq), 0.0)
        acc += tl.where(blk == q, (tl.sum(rho, axis=0) - tl.cumsum(rho, axis=0) + rho)[None, :],
                        0.0)
        acc += tl.where(blk < q, tl.sum(rho, axis=0), 0.0)
        for p in range(0, q + 1):  # columns j in block p ≤ q
            ok_p, phys_p, Gp = _segment_block(g_rows, P, p, _before(tot, p, NB), n, BLOCK_N)
            c = load_rows(c_rows, phys_p, ok_p, cols_r)
            v = load_rows(v_rows, phys_p, ok_p, cols_d)
            # (i ≥ j by their rows in the segment: all of an earlier block's, the diagonal's
            # lower triangle)
            keep = ok_q[:, None] & ok_p[None, :] & \
                (within[:, None] + (q - p) * BLOCK_N >= within[None, :])
            a = tl.dot(b, tl.trans(c), input_precision=PRECISION) * \
                tl.dot(do, tl.trans(v), input_precision=PRECISION)
            a = tl.where(keep, a * tl.exp(tl.where(keep, Gq[:, None] - Gp[None, :], 0.0)), 0.0)
            if p == q:  # Σ_(i ≥ t) Σ_(j < t) a_ij
                before = tl.cumsum(a, axis=1) - a
                acc += tl.where(blk == q,
                                tl.sum(tl.where(lower, before, 0.0), axis=0)[None, :], 0.0)
            else:  # its row sums to block q, column sums to block p, total in between
                rows_sum = tl.sum(a, axis=1)
                cols_sum = tl.sum(a, axis=0)
                total = tl.sum(rows_sum, axis=0)
                acc += tl.where(blk == q, (total - tl.cumsum(rows_sum, axis=0)
                                           + rows_sum)[None, :], 0.0)
                acc += tl.where(blk == p, (tl.cumsum(cols_sum, axis=0)
                                           - cols_sum)[None, :], 0.0)
                acc += tl.where((blk > p) & (blk < q), total, 0.0)
    r_op, r_scale = state_operand(tl.load(_slot(WR, slot, BLOCK_R, BLOCK_D)),
                                 DO[0].dtype.element_ty, HALF_RANGE)
    for p in range(0, NB):  # columns j, paired with the rows after the segment
        ok_p, phys_p, Gp = _segment_block(g_rows, P, p, _before(tot, p, NB), n, BLOCK_N)
        c = load_rows(c_rows, phys_p, ok_p, cols_r)
        v = load_rows(v_rows, phys_p, ok_p, cols_d)
        w = tl.where(ok_p, tl.exp(seg_total - Gp), 0.0)  # e^(G_E − G_j) ≤ 1
        kappa = tl.sum(tl.dot(c, r_op, input_precision=PRECISION) * r_scale
                       * v.to(tl.float32), axis=1) * w
        acc += tl.where(blk == p, (tl.cumsum(kappa, axis=0) - kappa)[None, :], 0.0)
        acc += tl.where(blk > p, tl.sum(kappa, axis=0), 0.0)
    rows = P + blk * BLOCK_N + within[None, :]
    tl.store(out + rows, acc, mask=rows < n)
