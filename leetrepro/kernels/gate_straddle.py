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
def straddle_gradient(Bt, Ct, V, DO, G, WF, WR, DG, CU, SIZE, K: tl.constexpr, DA=None):
    """Each row's dg (partial over this lane's value columns) into ``DG`` (float32
    ``(column blocks, batch, heads, N)``, contiguous), one segment a program (grid: lanes ×
    segments of the longest lane), from F in ``WF`` and R in ``WR`` (:func:`segment_states`).
    With ``K.ANGLES = (BLOCK_A, A, HALF)``, A > 0, also each row's turned pairs' sums into
    ``DA`` (float32 ``(column blocks, batch, heads, N, A)``): :func:`_angle_block`; ``HALF``:
    the pair tiles' products with the rows' halves in bf16, else fp32."""
    NB: tl.constexpr = K.SEG_BLOCKS
    BLOCK_N: tl.constexpr = K.BLOCK_N
    N, R, D, H, SLOTS = SIZE
    seq, head, d0, bos, n, row, slot0 = _lane(CU, SIZE, K)
    k = tl.program_id(1)
    if k * (NB * BLOCK_N) < n:  # (a packed lane shorter than the longest has fewer segments)
        _segment(Bt, Ct, V, DO, G, WF, WR, (DG, DA), SIZE, K, (seq, head, d0, bos, n),
                 row * SLOTS + slot0 + k, k * (NB * BLOCK_N))


@triton.jit
def _out_rows(OUT, SIZE, lane, width, BLOCK_D: tl.constexpr, VARLEN: tl.constexpr):
    """Where this lane's row 0 starts in an output ``(column blocks, batch, heads, N, width)``
    (a batch of one when packed)."""
    N, R, D, H, SLOTS = SIZE
    seq, head, d0, bos, n = lane
    if VARLEN:
        return OUT + (((d0 // BLOCK_D) * H + head) * N + bos) * width
    else:
        seqs = tl.num_programs(0) // (tl.cdiv(D, BLOCK_D) * H)
        return OUT + ((((d0 // BLOCK_D) * seqs + seq) * H + head) * N) * width


@triton.jit
def _pair_halves(rows, phys, ok, BLOCK_A: tl.constexpr, A):
    """The even and odd columns of the first 2·A of a lane's rows (the turned pairs' two
    halves), [BLOCK_N, BLOCK_A] each."""
    k = tl.arange(0, BLOCK_A)
    return load_rows(rows, phys, ok, (2 * k, k < A)), load_rows(rows, phys, ok, (2 * k + 1, k < A))


@triton.jit
def _state_halves(WS, index, A, BLOCK_A: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """Rows 2a and 2a + 1 (a < A) of workspace state ``index``: [BLOCK_A, BLOCK_D] fp32 each."""
    k = tl.arange(0, BLOCK_A)[:, None]
    base = WS + index * BLOCK_R * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
    ok = (k < A) & (tl.arange(0, BLOCK_D)[None, :] < BLOCK_D)
    return tl.load(base + (2 * k) * BLOCK_D, mask=ok, other=0.0), \
        tl.load(base + (2 * k + 1) * BLOCK_D, mask=ok, other=0.0)


@triton.jit
def _cross(xe, xo, ye, yo):
    """x ×_a y = x_2a y_(2a+1) − x_(2a+1) y_2a for each pair a, from the halves of x and y."""
    return xe * yo - xo * ye


@triton.jit
def _half_products(x, se, so, dtype: tl.constexpr, HALF_RANGE: tl.constexpr,
                   PRECISION: tl.constexpr):
    """(x seᵀ, x soᵀ) for a tile of rows x [BLOCK_N, BLOCK_D] and a state's halves (fp32
    [BLOCK_A, BLOCK_D], rounded to x's dtype as :func:`state_operand` does)."""
    e_op, e_scale = state_operand(se, dtype, HALF_RANGE)
    o_op, o_scale = state_operand(so, dtype, HALF_RANGE)
    return tl.dot(x, tl.trans(e_op), input_precision=PRECISION) * e_scale, \
        tl.dot(x, tl.trans(o_op), input_precision=PRECISION) * o_scale


@triton.jit
def _tile_products(w, xe, xo, PRECISION: tl.constexpr, HALF: tl.constexpr):
    """(w xe, w xo): an fp32 pair tile w times a tile's halves: with ``HALF`` the tile rounded
    to the halves' 16-bit dtype (bf16's range), else in fp32 at ``PRECISION``."""
    if HALF:
        return tl.dot(w.to(xe.dtype), xe), tl.dot(w.to(xo.dtype), xo)
    else:
        return tl.dot(w, xe.to(tl.float32), input_precision=PRECISION), \
            tl.dot(w, xo.to(tl.float32), input_precision=PRECISION)


@triton.jit
def _segment(Bt, Ct, V, DO, G, WF, WR, OUT, SIZE, K: tl.constexpr, lane, slot, P):
    """:func:`straddle_gradient`'s segment from row P of ``lane`` (sequence or batch, head, first
    value column, first row, rows), its states at workspace ``slot``; ``OUT = (DG, DA)``. Each
    row t's sum over the pairs j < t ≤ i that straddle it: the state's pairs (before × after the
    segment), then the segment's own rows i with the columns before them (:func:`_pairs_within`)
    and its columns j with the rows after it (:func:`_pairs_after`)."""
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_N: tl.constexpr = K.BLOCK_N
    BLOCK_R: tl.constexpr = K.BLOCK_R
    NB: tl.constexpr = K.SEG_BLOCKS
    seq, head, d0, bos, n = lane
    rows = (lane_rows(Bt, seq, head // K.GROUPS[0], bos, K.VARLEN),
            lane_rows(Ct, seq, head // K.GROUPS[1], bos, K.VARLEN),
            lane_rows(V, seq, head, bos, K.VARLEN), lane_rows(DO, seq, head, bos, K.VARLEN),
            lane_rows(G, seq, head, bos, K.VARLEN))
    cols = (columns(0, SIZE[1], BLOCK_R), columns(d0, SIZE[2], BLOCK_D))
    out = _out_rows(OUT[0], SIZE, lane, 1, BLOCK_D, K.VARLEN)
    blk = tl.arange(0, NB)[:, None]
    within = tl.arange(0, BLOCK_N)
    tot = _block_totals(rows[4], P, n, NB, BLOCK_N)
    seg_total = tl.sum(tot, axis=0)
    f = tl.load(_slot(WF, slot, BLOCK_R, BLOCK_D))
    acc = tl.zeros((NB, BLOCK_N), dtype=tl.float32) + tl.exp(seg_total) * tl.sum(
        tl.sum(f * tl.load(_slot(WR, slot, BLOCK_R, BLOCK_D)), axis=1), axis=0)
    acc = _pairs_within(rows, cols, (Ct, V, G, WF, WR, OUT[1]), SIZE, K, lane, slot, P, tot,
                        state_operand(f, DO[0].dtype.element_ty, K.HALF_RANGE), acc)
    acc = _pairs_after(rows, cols, WR, K, slot, P, n, tot, seg_total, acc)
    at = P + blk * BLOCK_N + within[None, :]
    tl.store(out + at, acc, mask=at < n)


@triton.jit
def _pairs_within(rows, cols, PTRS, SIZE, K: tl.constexpr, lane, slot, P, tot, f_state, acc):
    """``acc`` (a segment's rows by block) plus, for each row t, the pairs j < t ≤ i of the
    segment's rows i: with a column before the segment (ρ, through the forward state ``f_state``
    = ``(operand, scale)``) and with a column in it (the blocks' pair tiles); with the angles
    (``K.ANGLES``) the turned pairs' sums written too. ``PTRS = (Ct, V, G, WF, WR, DA)``."""
    BLOCK_N: tl.constexpr = K.BLOCK_N
    NB: tl.constexpr = K.SEG_BLOCKS
    PRECISION: tl.constexpr = K.PRECISION
    ANGLES: tl.constexpr = K.ANGLES[1] > 0
    n = lane[4]
    b_rows, c_rows, v_rows, o_rows, g_rows = rows
    cols_r, cols_d = cols
    f_op, f_scale = f_state
    blk = tl.arange(0, NB)[:, None]
    within = tl.arange(0, BLOCK_N)
    lower = within[:, None] >= within[None, :]
    if ANGLES:
        c0, x_after, ytot = _angle_start(PTRS[0], PTRS[1], PTRS[2], PTRS[3], PTRS[4], SIZE, K,
                                         lane, slot, P, tot)
    for qq in range(0, NB):  # rows i in block q (from the last block with the angles)
        if ANGLES:
            q = NB - 1 - qq
        else:
            q = qq
        ok_q, phys_q, Gq = _segment_block(g_rows, P, q, _before(tot, q, NB), n, BLOCK_N)
        b = load_rows(b_rows, phys_q, ok_q, cols_r)
        do = load_rows(o_rows, phys_q, ok_q, cols_d)
        rho = tl.sum(tl.dot(b, f_op, input_precision=PRECISION) * f_scale
                     * do.to(tl.float32), axis=1) * tl.where(ok_q, tl.exp(Gq), 0.0)
        acc += tl.where(blk == q, (tl.sum(rho, axis=0) - tl.cumsum(rho, axis=0) + rho)[None, :],
                        0.0)
        acc += tl.where(blk < q, tl.sum(rho, axis=0), 0.0)
        if ANGLES:
            be, bo = _pair_halves(b_rows, phys_q, ok_q, K.ANGLES[0], K.ANGLES[1])
            x = _angle_rows(be, bo, ok_q, Gq, do, PTRS[3], slot, K)
        for p in range(0, q + 1):  # columns j in block p ≤ q
            ok_p, phys_p, Gp = _segment_block(g_rows, P, p, _before(tot, p, NB), n, BLOCK_N)
            c = load_rows(c_rows, phys_p, ok_p, cols_r)
            v = load_rows(v_rows, phys_p, ok_p, cols_d)
            # (i ≥ j by their rows in the segment: all of an earlier block's, the diagonal's
            # lower triangle)
            keep = ok_q[:, None] & ok_p[None, :] & \
                (within[:, None] + (q - p) * BLOCK_N >= within[None, :])
            w = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            w = tl.where(keep, w * tl.exp(tl.where(keep, Gq[:, None] - Gp[None, :], 0.0)), 0.0)
            a = tl.dot(b, tl.trans(c), input_precision=PRECISION) * w
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
            if ANGLES:  # (the diagonal's own pairs j = i turn together: left out)
                ce, co = _pair_halves(c_rows, phys_p, ok_p, K.ANGLES[0], K.ANGLES[1])
                we, wo = _tile_products(tl.where(within[:, None] + (q - p) * BLOCK_N
                                                 > within[None, :], w, 0.0), ce, co, PRECISION,
                                        K.ANGLES[2])
                x += _cross(be, bo, we, wo)
        if ANGLES:
            x_after = _angle_block(rows, PTRS[4], PTRS[5], SIZE, K, lane, slot, P, tot, q, x, c0,
                                   x_after, ytot)
    return acc


@triton.jit
def _pairs_after(rows, cols, WR, K: tl.constexpr, slot, P, n, tot, seg_total, acc):
    """``acc`` plus, for each row t, the pairs of the segment's columns j < t with the rows after
    the segment (κ, through the reverse state at workspace ``slot``)."""
    BLOCK_N: tl.constexpr = K.BLOCK_N
    NB: tl.constexpr = K.SEG_BLOCKS
    blk = tl.arange(0, NB)[:, None]
    r_op, r_scale = state_operand(tl.load(_slot(WR, slot, K.BLOCK_R, K.BLOCK_D)),
                                 rows[3][0].dtype.element_ty, K.HALF_RANGE)
    for p in range(0, NB):  # columns j, paired with the rows after the segment
        ok_p, phys_p, Gp = _segment_block(rows[4], P, p, _before(tot, p, NB), n, BLOCK_N)
        c = load_rows(rows[1], phys_p, ok_p, cols[0])
        v = load_rows(rows[2], phys_p, ok_p, cols[1])
        w = tl.where(ok_p, tl.exp(seg_total - Gp), 0.0)  # e^(G_E − G_j) ≤ 1
        kappa = tl.sum(tl.dot(c, r_op, input_precision=K.PRECISION) * r_scale
                       * v.to(tl.float32), axis=1) * w
        acc += tl.where(blk == p, (tl.cumsum(kappa, axis=0) - kappa)[None, :], 0.0)
        acc += tl.where(blk > p, tl.sum(kappa, axis=0), 0.0)
    return acc


# The turned pairs' sums (Mamba-3's angles, ``K.ANGLES``). A pair of rows j < i enters the loss
# through b_i·c_j, where b and c are turned by their rows' angles: a turn of pair a by φ at row i
# adds ∂/∂φ = w_ij (b_i ×_a c_j) (w_ij = M_ij dO_i·v_j) and the same turn at row j its negative.
# So the sum over t ≥ s of the angles' gradient keeps the pairs with j < s ≤ i: the pairs that
# straddle s, as dg does with b_i·c_j. Per segment, with x_u = ρ_u + Σ_(j<u) X_uj − Σ_(i>u) X_iu
# over its own pairs (ρ: the pairs with a column before it) and y_u = κ_u (a row after it):
#     S_s = C0 + Σ_(u ≥ s) x_u + Σ_(u < s) y_u,    C0 the pairs before × after,
# walked block by block from the last, each x_u and y_u in fp32 from products of the inputs
# (no long sum of rounded gradients: the suffix sums stay within a segment).


@triton.jit
def _angle_start(Ct, V, G, WF, WR, SIZE, K: tl.constexpr, lane, slot, P, tot):
    """``(C0, Σ x of the blocks after, y's total per block)`` at a segment's start: C0 =
    e^(G_E − G_(P−1)) Σ_d R ×_a F [BLOCK_A]; the y totals [NB, BLOCK_A]."""
    BLOCK_A: tl.constexpr = K.ANGLES[0]
    BLOCK_D: tl.constexpr = K.BLOCK_D
    BLOCK_N: tl.constexpr = K.BLOCK_N
    BLOCK_R: tl.constexpr = K.BLOCK_R
    NB: tl.constexpr = K.SEG_BLOCKS
    A: tl.constexpr = K.ANGLES[1]
    GC: tl.constexpr = K.GROUPS[1]
    N, R, D, H, SLOTS = SIZE
    seq, head, d0, bos, n = lane
    fe, fo = _state_halves(WF, slot, A, BLOCK_A, BLOCK_R, BLOCK_D)
    re, ro = _state_halves(WR, slot, A, BLOCK_A, BLOCK_R, BLOCK_D)
    seg_total = tl.sum(tot, axis=0)
    c0 = tl.exp(seg_total) * tl.sum(_cross(re, ro, fe, fo), axis=1)
    c_rows = lane_rows(Ct, seq, head // GC, bos, K.VARLEN)
    v_rows = lane_rows(V, seq, head, bos, K.VARLEN)
    g_rows = lane_rows(G, seq, head, bos, K.VARLEN)
    blk = tl.arange(0, NB)[:, None]
    ytot = tl.zeros((NB, BLOCK_A), dtype=tl.float32)
    for p in range(0, NB):
        ok_p, phys_p, Gp = _segment_block(g_rows, P, p, _before(tot, p, NB), n, BLOCK_N)
        ytot += tl.where(blk == p, tl.sum(_angle_after(c_rows, v_rows, phys_p, ok_p, Gp,
                                                       seg_total, re, ro, K, d0, D),
                                          axis=0)[None, :], 0.0)
    return c0, tl.zeros((BLOCK_A,), dtype=tl.float32), ytot


@triton.jit
def _angle_after(c_rows, v_rows, phys, ok, Gp, seg_total, re, ro, K: tl.constexpr, d0, D):
    """y_j = κ_j: column j's pairs with the rows after the segment, e^(G_E − G_j) (v_j Rᵀ) ×_a c_j,
    [BLOCK_N, BLOCK_A]."""
    BLOCK_A: tl.constexpr = K.ANGLES[0]
    A: tl.constexpr = K.ANGLES[1]
    BLOCK_D: tl.constexpr = K.BLOCK_D
    HALF_RANGE: tl.constexpr = K.HALF_RANGE
    PRECISION: tl.constexpr = K.PRECISION
    v = load_rows(v_rows, phys, ok, columns(d0, D, BLOCK_D))
    ce, co = _pair_halves(c_rows, phys, ok, BLOCK_A, A)
    we, wo = _half_products(v, re, ro, v.dtype, HALF_RANGE, PRECISION)
    return _cross(we, wo, ce, co) * tl.where(ok, tl.exp(seg_total - Gp), 0.0)[:, None]


@triton.jit
def _angle_rows(be, bo, ok, Gq, do, WF, slot, K: tl.constexpr):
    """x_i's first part ρ_i: row i's pairs with the columns before the segment,
    e^(G_i − G_(P−1)) b_i ×_a (dO_i Fᵀ), [BLOCK_N, BLOCK_A]."""
    BLOCK_A: tl.constexpr = K.ANGLES[0]
    A: tl.constexpr = K.ANGLES[1]
    BLOCK_R: tl.constexpr = K.BLOCK_R
    BLOCK_D: tl.constexpr = K.BLOCK_D
    HALF_RANGE: tl.constexpr = K.HALF_RANGE
    PRECISION: tl.constexpr = K.PRECISION
    fe, fo = _state_halves(WF, slot, A, BLOCK_A, BLOCK_R, BLOCK_D)
    ue, uo = _half_products(do, fe, fo, do.dtype, HALF_RANGE, PRECISION)
    return _cross(be, bo, ue, uo) * tl.where(ok, tl.exp(Gq), 0.0)[:, None]


@triton.jit
def _angle_block(rows, WR, DA, SIZE, K: tl.constexpr, lane, slot, P, tot, q, x, c0, x_after,
                 ytot):
    """Block q's turned pairs' sums into ``DA``, from x (its rows' ρ and the pairs whose row is
    in it: the pairs whose column is in it are taken here), C0, the x of the blocks after it and
    the blocks' y totals (:func:`_angle_start`); returns the x of the blocks from q on."""
    BLOCK_A: tl.constexpr = K.ANGLES[0]
    BLOCK_N: tl.constexpr = K.BLOCK_N
    NB: tl.constexpr = K.SEG_BLOCKS
    PRECISION: tl.constexpr = K.PRECISION
    A: tl.constexpr = K.ANGLES[1]
    HALF: tl.constexpr = K.ANGLES[2]
    BLOCK_R: tl.constexpr = K.BLOCK_R
    BLOCK_D: tl.constexpr = K.BLOCK_D
    VARLEN: tl.constexpr = K.VARLEN
    N, R, D, H, SLOTS = SIZE
    seq, head, d0, bos, n = lane
    b_rows, c_rows, v_rows, o_rows, g_rows = rows
    within = tl.arange(0, BLOCK_N)
    ok_q, phys_q, Gq = _segment_block(g_rows, P, q, _before(tot, q, NB), n, BLOCK_N)
    ce, co = _pair_halves(c_rows, phys_q, ok_q, BLOCK_A, A)
    v = load_rows(v_rows, phys_q, ok_q, columns(d0, D, BLOCK_D))
    for i in range(q, NB):  # the pairs whose column is in block q (rows in block i ≥ q)
        ok_i, phys_i, Gi = _segment_block(g_rows, P, i, _before(tot, i, NB), n, BLOCK_N)
        do = load_rows(o_rows, phys_i, ok_i, columns(d0, D, BLOCK_D))
        be, bo = _pair_halves(b_rows, phys_i, ok_i, BLOCK_A, A)
        keep = ok_i[:, None] & ok_q[None, :] & \
            (within[:, None] + (i - q) * BLOCK_N > within[None, :])
        w = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        w = tl.where(keep, w * tl.exp(tl.where(keep, Gi[:, None] - Gq[None, :], 0.0)), 0.0)
        he, ho = _tile_products(tl.trans(w), be, bo, PRECISION, HALF)
        x -= _cross(he, ho, ce, co)
    re, ro = _state_halves(WR, slot, A, BLOCK_A, BLOCK_R, BLOCK_D)
    y = _angle_after(c_rows, v_rows, phys_q, ok_q, Gq, tl.sum(tot, axis=0), re, ro, K, d0, D)
    blk = tl.arange(0, NB)[:, None]
    s = c0[None, :] + x_after[None, :] + tl.cumsum(x, axis=0, reverse=True) + \
        tl.cumsum(y, axis=0) - y + tl.sum(tl.where(blk < q, ytot, 0.0), axis=0)[None, :]
    out = _out_rows(DA, SIZE, lane, A, BLOCK_D, VARLEN)
    rows = P + q * BLOCK_N + within
    k = tl.arange(0, BLOCK_A)
    tl.store(out + rows[:, None] * A + k[None, :], s, mask=(rows < n)[:, None] & (k < A)[None, :])
    return x_after + tl.sum(x, axis=0)
