"""Mamba-3's rows around the operator, one pass each way (``leetrepro.methods.mamba3_rows``).

The turned rows. Each program of the forward takes ``BLOCK_T`` rows of one (sequence, head): q
and k read from their q/k head (``head // REP``, in place), the biases added, the first ``2·A``
dims turned by pairs through the running angles θ (pair i by θ_i), the rest as they are:

    Q̃ = round(R(θ)(Q + Q_bias)),   K̃ = round(R(θ)(K + K_bias)),   KEY = round(w · R(θ)(K + K_bias)),
    OWN = Σ_d Q̃·K̃   (a row's pair with itself, float32)

``round``: to ``ROUND`` (the inputs' 16-bit dtype) and back to float32; Q̃ and KEY are stored in
their outputs' dtype (float32 for the operator's gradients to come unrounded, or the inputs' own
where no gradient is wanted). K̃ itself is not stored: OWN is all the rest of the layer reads of
it. Backward, with the Jacobian taken at the rounded values (``leetrepro.methods.mamba3_rows``'
docstring says why), a program per (row block, sequence, q/k head) walking that head's REP heads:

    dXq = Σ_heads Rᵀ (dQ̃ + dOWN·K̃),   dXk = Σ_heads Rᵀ (dOWN·Q̃ + w·dKEY),
    dw = Σ_d R(θ)(K + K_bias)·dKEY,   dθ_i = dQ̃_(2i+1) Q̃_2i − dQ̃_2i Q̃_(2i+1) + (the same for KEY),

K̃ recomputed, OWN's parts of dθ left out (they cancel exactly: Q̃ and K̃ turn together), each
head's sums of Rᵀ(·) over the program's rows stored for the biases' gradients.

The running angles (:func:`angle_sums`): θ_t = θ0 + Σ_(s ≤ t) tanh(Angles_s)·π·dt_s in
float64, a program a (batch row, head), packed sequences each started again (a segmented scan);
back, the suffix sums of dθ in float64.

The gated output. ``y = (O + w·V)·silu(Z)`` over the rows (w per row: D − the own pair's
weight), and back ``dO = dy·silu(Z)``, ``dV = w·dO``, ``dw = Σ_d V·dO``, ``dZ = dy·(O +
w·V)·silu'(Z)``; products in float32.

Tensors come as ``(pointer, batch stride, seqlen stride, head stride)`` (elements, the last
dimension contiguous): rows ``(batch, seqlen, heads, ·)``; θ ``(batch, seqlen, heads, A)`` read
through its own strides (a view of the angles summed along seqlen); w ``(batch, seqlen, heads)``
likewise. The outputs are contiguous ``(batch, seqlen, heads, ·)``.
"""
import collections

import triton
import triton.language as tl


@triton.jit
def _at(T, b, t, h):
    """The offsets of rows t (a block) of batch b and head h in ``T = (pointer, strides…)``."""
    ptr, s_b, s_t, s_h = T
    return ptr + b.to(tl.int64) * s_b + t.to(tl.int64)[:, None] * s_t + h * s_h


@triton.jit
def _load_pairs(rows, ok, A: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr):
    """``(even, odd)`` [BLOCK_T, BLOCK_A] float32 of the first 2·A dims of rows at pointers
    ``rows`` ([BLOCK_T, 1]), 0 past them: one contiguous load, split in registers."""
    d = tl.arange(0, 2 * BLOCK_A)
    x = tl.load(rows + d[None, :], mask=ok[:, None] & (d < 2 * A)[None, :], other=0.0)
    return tl.split(tl.reshape(x.to(tl.float32), [BLOCK_T, BLOCK_A, 2]))


@triton.jit
def _store_pairs(rows, ok, even, odd, A: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_A: tl.constexpr):
    """even and odd [BLOCK_T, BLOCK_A] interleaved into the first 2·A dims at ``rows``: one
    contiguous store."""
    d = tl.arange(0, 2 * BLOCK_A)
    tl.store(rows + d[None, :], tl.reshape(tl.join(even, odd), [BLOCK_T, 2 * BLOCK_A]),
             mask=ok[:, None] & (d < 2 * A)[None, :])


@triton.jit
def _turned(X, XB, b, t, hq, h, ok, cos, sin, A: tl.constexpr, P: tl.constexpr,
            BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr):
    """``(even, odd)`` of R(θ)(X + XB) over the pairs ([BLOCK_T, BLOCK_A], float32; 0 past A)."""
    even, odd = _load_pairs(_at(X, b, t, hq), ok, A, BLOCK_T, BLOCK_A)
    d = tl.arange(0, 2 * BLOCK_A)
    be, bo = tl.split(tl.reshape(tl.load(XB + h * P + d, mask=d < 2 * A, other=0.0),
                                 [BLOCK_A, 2]))
    even += be[None, :]
    odd += bo[None, :]
    return even * cos - odd * sin, even * sin + odd * cos


@triton.jit
def _tail(X, XB, b, t, hq, h, e, ok, A: tl.constexpr, P: tl.constexpr):
    """X + XB at the dims 2A + e past the turned pairs ([BLOCK_T, BLOCK_E], float32)."""
    mask = ok[:, None] & (e < P - 2 * A)[None, :]
    return tl.load(_at(X, b, t, hq) + 2 * A + e[None, :], mask=mask, other=0.0).to(tl.float32) + \
        tl.load(XB + h * P + 2 * A + e, mask=e < P - 2 * A, other=0.0)[None, :]


@triton.jit
def _rounded(x, ROUND: tl.constexpr):
    """x rounded to ``ROUND`` ("bf16", "fp16"; "fp32": as it is), held in float32."""
    if ROUND == "bf16":
        y = x.to(tl.bfloat16).to(tl.float32)
    elif ROUND == "fp16":
        y = x.to(tl.float16).to(tl.float32)
    else:
        y = x
    return y


@triton.jit
def _dense(b, t, h, SIZE):
    """The rows' index in a contiguous ``(batch, seqlen, heads, ·)`` tensor (int64)."""
    N, H = SIZE
    return (b.to(tl.int64) * N + t.to(tl.int64)) * H + h


@triton.jit
def _store_row(OUT, b, t, h, e, ok, even, odd, tail, SIZE, A: tl.constexpr, P: tl.constexpr,
               BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr):
    """Pairs and tail into OUT, contiguous ``(batch, seqlen, heads, P)`` (stored in its dtype)."""
    rows = OUT + _dense(b, t, h, SIZE)[:, None] * P
    _store_pairs(rows, ok, even, odd, A, BLOCK_T, BLOCK_A)
    tl.store(rows + 2 * A + e[None, :], tail, mask=ok[:, None] & (e < P - 2 * A)[None, :])


@triton.jit
def _load_row(X, b, t, h, e, ok, SIZE, A: tl.constexpr, P: tl.constexpr, BLOCK_T: tl.constexpr,
              BLOCK_A: tl.constexpr):
    """(even, odd, tail) of contiguous ``(batch, seqlen, heads, P)`` rows, float32."""
    rows = X + _dense(b, t, h, SIZE)[:, None] * P
    even, odd = _load_pairs(rows, ok, A, BLOCK_T, BLOCK_A)
    return even, odd, tl.load(rows + 2 * A + e[None, :],
                              mask=ok[:, None] & (e < P - 2 * A)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _load_grad(D, b, t, h, e, ok, A: tl.constexpr, P: tl.constexpr, BLOCK_T: tl.constexpr,
               BLOCK_A: tl.constexpr):
    """(even, odd, tail) of a gradient given as ``(pointer, strides…)``, float32."""
    rows = _at(D, b, t, h)
    even, odd = _load_pairs(rows, ok, A, BLOCK_T, BLOCK_A)
    return even, odd, tl.load(rows + 2 * A + e[None, :],
                              mask=ok[:, None] & (e < P - 2 * A)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _angles(TH, W, b, h, t, ok, a, A: tl.constexpr, TH_T: tl.constexpr):
    """``(cos θ, sin θ, w)`` of rows t of (sequence b, head h): [BLOCK_T, BLOCK_A] (1 and 0 past
    A) and the rows' weights [BLOCK_T]. ``TH_T``: θ's rows are its contiguous dimension (as
    ``running_angles`` returns it), so it is loaded along them and turned in registers."""
    th_ptr, th_b, th_t, th_h, th_a = TH
    at = th_ptr + b.to(tl.int64) * th_b + h * th_h
    if TH_T:
        theta = tl.trans(tl.load(at + t.to(tl.int64)[None, :] * th_t + a[:, None] * th_a,
                                 mask=ok[None, :] & (a < A)[:, None], other=0.0))
    else:
        theta = tl.load(at + t.to(tl.int64)[:, None] * th_t + a[None, :] * th_a,
                        mask=ok[:, None] & (a < A)[None, :], other=0.0)
    return tl.cos(theta), tl.sin(theta), _row_weights(W, b, t, h, ok)


@triton.jit
def _row_weights(W, b, t, h, ok):
    """The weights [BLOCK_T] of rows t of (sequence b, head h), W ``(pointer, batch, seqlen,
    head strides)`` float32, 0 past the rows."""
    w_ptr, w_b, w_t, w_h = W
    return tl.load(w_ptr + b.to(tl.int64) * w_b + t.to(tl.int64) * w_t + h * w_h, mask=ok,
                   other=0.0)


@triton.jit
def _program(N, BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_E: tl.constexpr):
    """This program's ``(rows t, t in range, pairs a, tail dims e)``: row block ``program_id(0)``."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    return t, t < N, tl.arange(0, BLOCK_A), tl.arange(0, BLOCK_E)


#: :func:`rotate_rows`' and :func:`rotate_rows_backward`'s constexprs: the heads a q/k head
#: serves (``REP``), the angles and the head dim (``A``, ``P``), a program's rows and its tiles
#: of the pairs' and the tail's columns, the dtype the turned rows are rounded to (``ROUND``),
#: whether θ's angles are its last, contiguous dim (``TH_T``), and the backward's dθ
#: (``DTHETA``)
RowConstants = collections.namedtuple(
    "RowConstants", "REP A P BLOCK_T BLOCK_A BLOCK_E ROUND TH_T DTHETA", defaults=(True,))


@triton.jit
def rotate_rows(Q, K, QB, KB, TH, W, OUT_Q, OUT_KEY, OWN, SIZE, CONST: tl.constexpr):
    """Q̃, KEY and OWN of ``BLOCK_T`` rows of one (sequence, head): grid (row blocks,
    batch·heads). ``SIZE = (N, H)``; θ as ``(pointer, batch, seqlen, head, angle strides)``;
    ``CONST``: :data:`RowConstants`."""
    REP: tl.constexpr = CONST.REP
    A: tl.constexpr = CONST.A
    P: tl.constexpr = CONST.P
    BLOCK_T: tl.constexpr = CONST.BLOCK_T
    BLOCK_A: tl.constexpr = CONST.BLOCK_A
    BLOCK_E: tl.constexpr = CONST.BLOCK_E
    ROUND: tl.constexpr = CONST.ROUND
    TH_T: tl.constexpr = CONST.TH_T
    N, H = SIZE
    b, h = tl.program_id(1) // H, tl.program_id(1) % H
    t, ok, a, e = _program(N, BLOCK_T, BLOCK_A, BLOCK_E)
    cos, sin, w = _angles(TH, W, b, h, t, ok, a, A, TH_T)
    qe, qo = _turned(Q, QB, b, t, h // REP, h, ok, cos, sin, A, P, BLOCK_T, BLOCK_A)
    qe, qo = _rounded(qe, ROUND), _rounded(qo, ROUND)
    qt = _rounded(_tail(Q, QB, b, t, h // REP, h, e, ok, A, P), ROUND)
    _store_row(OUT_Q, b, t, h, e, ok, qe, qo, qt, SIZE, A, P, BLOCK_T, BLOCK_A)
    ke, ko = _turned(K, KB, b, t, h // REP, h, ok, cos, sin, A, P, BLOCK_T, BLOCK_A)
    kt = _tail(K, KB, b, t, h // REP, h, e, ok, A, P)
    own = tl.sum(qe * _rounded(ke, ROUND) + qo * _rounded(ko, ROUND), axis=1) + \
        tl.sum(qt * _rounded(kt, ROUND), axis=1)
    tl.store(OWN + _dense(b, t, h, SIZE), own, mask=ok)
    _store_row(OUT_KEY, b, t, h, e, ok, _rounded(ke * w[:, None], ROUND),
               _rounded(ko * w[:, None], ROUND), _rounded(kt * w[:, None], ROUND), SIZE, A, P,
               BLOCK_T, BLOCK_A)


@triton.jit
def _turn_back(ge, go, cos, sin):
    """Rᵀ of the pairs (ge, go): the gradient of the unturned rows."""
    return ge * cos + go * sin, go * cos - ge * sin


@triton.jit
def _quarter(dy_even, dy_odd, y_even, y_odd):
    """Σ over this row's pairs' parts of dθ: dy_odd·y_even − dy_even·y_odd, per pair."""
    return dy_odd * y_even - dy_even * y_odd


@triton.jit
def _store_sums(OUT, at, e, xe, xo, xt, A: tl.constexpr, P: tl.constexpr,
                BLOCK_A: tl.constexpr):
    """The sums over the rows of (xe, xo, xt) (pairs and tail) as row ``at`` of OUT, float32
    ``(·, P)``."""
    row = OUT + at.to(tl.int64) * P
    d = tl.arange(0, 2 * BLOCK_A)
    tl.store(row + d, tl.reshape(tl.join(tl.sum(xe, axis=0), tl.sum(xo, axis=0)), [2 * BLOCK_A]),
             mask=d < 2 * A)
    tl.store(row + 2 * A + e, tl.sum(xt, axis=0), mask=e < P - 2 * A)


@triton.jit
def rotate_rows_backward(DQ, DKEY, DOWN, RQ, RKEY, K, KB, TH, W, OUT, SIZE, CONST: tl.constexpr):
    """The gradients of :func:`rotate_rows`' inputs: grid (row blocks, batch·q/k heads), each
    program walking its q/k head's REP heads. ``OUT = (dXq, dXk, DQB, DKB, dθ, dw)``: dXq, dXk
    contiguous ``(batch, seqlen, q/k heads, P)`` in their own dtype (summed over the heads in
    float32); DQB, DKB float32 ``(batch, row blocks, heads, P)``, each head's sums over the
    block's rows (the caller sums them); dθ contiguous ``(batch, seqlen, heads, A)`` and dw
    ``(batch, seqlen, heads)`` float32. RQ, RKEY the forward's outputs, DOWN the own pairs'
    gradient ``(batch, seqlen, heads)``; ``CONST``: :data:`RowConstants`, without its
    ``DTHETA`` no dθ (RKEY unread)."""
    REP: tl.constexpr = CONST.REP
    A: tl.constexpr = CONST.A
    P: tl.constexpr = CONST.P
    BLOCK_T: tl.constexpr = CONST.BLOCK_T
    BLOCK_A: tl.constexpr = CONST.BLOCK_A
    BLOCK_E: tl.constexpr = CONST.BLOCK_E
    ROUND: tl.constexpr = CONST.ROUND
    TH_T: tl.constexpr = CONST.TH_T
    DTHETA: tl.constexpr = CONST.DTHETA
    DXQ, DXK, DQB, DKB, DTH, DW = OUT
    N, H = SIZE
    HQ = H // REP
    b, hq = tl.program_id(1) // HQ, tl.program_id(1) % HQ
    t, ok, a, e = _program(N, BLOCK_T, BLOCK_A, BLOCK_E)
    sums = (b * tl.num_programs(0) + tl.program_id(0)) * H
    q_e = tl.zeros([BLOCK_T, BLOCK_A], tl.float32)
    q_o = tl.zeros([BLOCK_T, BLOCK_A], tl.float32)
    q_t = tl.zeros([BLOCK_T, BLOCK_E], tl.float32)
    k_e = tl.zeros([BLOCK_T, BLOCK_A], tl.float32)
    k_o = tl.zeros([BLOCK_T, BLOCK_A], tl.float32)
    k_t = tl.zeros([BLOCK_T, BLOCK_E], tl.float32)
    for j in range(REP):
        h = hq * REP + j
        cos, sin, w = _angles(TH, W, b, h, t, ok, a, A, TH_T)
        down = tl.load(DOWN + _dense(b, t, h, SIZE), mask=ok, other=0.0)[:, None]
        # dθ at the rounded Q̃ and KEY
        de, do, dt_ = _load_grad(DQ, b, t, h, e, ok, A, P, BLOCK_T, BLOCK_A)
        ye, yo, yt = _load_row(RQ, b, t, h, e, ok, SIZE, A, P, BLOCK_T, BLOCK_A)
        ge, go, gt = _load_grad(DKEY, b, t, h, e, ok, A, P, BLOCK_T, BLOCK_A)
        if DTHETA:
            ze, zo, _ = _load_row(RKEY, b, t, h, e, ok, SIZE, A, P, BLOCK_T, BLOCK_A)
            dtheta = _quarter(de, do, ye, yo) + _quarter(ge, go, ze, zo)
        # K̃ again (unrounded: dw; rounded: the own pair's part of dQ̃)
        re, ro = _turned(K, KB, b, t, hq, h, ok, cos, sin, A, P, BLOCK_T, BLOCK_A)
        rt = _tail(K, KB, b, t, hq, h, e, ok, A, P)
        dw = tl.sum(re * ge + ro * go, axis=1) + tl.sum(rt * gt, axis=1)
        xe, xo = _turn_back(de + down * _rounded(re, ROUND), do + down * _rounded(ro, ROUND),
                            cos, sin)
        xt = dt_ + down * _rounded(rt, ROUND)
        _store_sums(DQB, sums + h, e, xe, xo, xt, A, P, BLOCK_A)
        q_e += xe
        q_o += xo
        q_t += xt
        xe, xo = _turn_back(down * ye + w[:, None] * ge, down * yo + w[:, None] * go, cos, sin)
        xt = down * yt + w[:, None] * gt
        _store_sums(DKB, sums + h, e, xe, xo, xt, A, P, BLOCK_A)
        k_e += xe
        k_o += xo
        k_t += xt
        rows = _dense(b, t, h, SIZE)
        if DTHETA:
            tl.store(DTH + rows[:, None] * A + a[None, :], dtheta,
                     mask=ok[:, None] & (a < A)[None, :])
        tl.store(DW + rows, dw, mask=ok)
    _store_row(DXQ, b, t, hq, e, ok, q_e, q_o, q_t, (N, HQ), A, P, BLOCK_T, BLOCK_A)
    _store_row(DXK, b, t, hq, e, ok, k_e, k_o, k_t, (N, HQ), A, P, BLOCK_T, BLOCK_A)


@triton.jit
def _silu(z):
    """(silu(z), its derivative), float32."""
    s = 1.0 / (1.0 + tl.exp(-z))
    return z * s, s * (1.0 + z * (1.0 - s))


@triton.jit
def _row_tile(T, b, t, h, c, mask):
    """A [BLOCK_T, BLOCK_D] tile of rows t (sequence b, head h) of ``T``, float32."""
    return tl.load(_at(T, b, t, h) + c[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _output_program(W, SIZE, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """The gated output's program (grid: row blocks, batch·heads): ``(b, h, rows t, columns c,
    t in range, the tile's mask, the rows' weights w, the rows' dense index, the tile's offsets
    in a contiguous (batch, seqlen, heads, D) output)``."""
    N, H, D = SIZE
    b, h = tl.program_id(1) // H, tl.program_id(1) % H
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, BLOCK_D)
    ok = t < N
    rows = _dense(b, t, h, (N, H))
    return (b, h, t, c, ok, ok[:, None] & (c < D)[None, :], _row_weights(W, b, t, h, ok), rows,
            rows[:, None] * D + c[None, :])


@triton.jit
def gated_output(O, V, Z, W, Y, SIZE, HAS_Z: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """y = (O + w·V)·silu(Z) (without ``HAS_Z``: O + w·V) for ``BLOCK_T`` rows of one (sequence,
    head), Y contiguous ``(batch, seqlen, heads, D)``; ``SIZE = (N, H, D)``; grid (row blocks,
    batch·heads)."""
    b, h, t, c, ok, mask, w, _, out = _output_program(W, SIZE, BLOCK_T, BLOCK_D)
    y = _row_tile(O, b, t, h, c, mask) + w[:, None] * _row_tile(V, b, t, h, c, mask)
    if HAS_Z:
        y = y * _silu(_row_tile(Z, b, t, h, c, mask))[0]
    tl.store(Y + out, y, mask=mask)


@triton.jit
def gated_output_backward(DY, O, V, Z, W, DO, DV, DZ, DW, SIZE, HAS_Z: tl.constexpr,
                          BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """The gradients of :func:`gated_output`: dO, dV (and with ``HAS_Z`` dZ) contiguous
    ``(batch, seqlen, heads, D)`` in their own dtypes, dw float32 ``(batch, seqlen, heads)``."""
    b, h, t, c, ok, mask, w, rows, out = _output_program(W, SIZE, BLOCK_T, BLOCK_D)
    dy = _row_tile(DY, b, t, h, c, mask)
    v = _row_tile(V, b, t, h, c, mask)
    if HAS_Z:
        silu, slope = _silu(_row_tile(Z, b, t, h, c, mask))
        pre = _row_tile(O, b, t, h, c, mask) + w[:, None] * v
        tl.store(DZ + out, dy * pre * slope, mask=mask)
        dy = dy * silu
    tl.store(DO + out, dy, mask=mask)
    tl.store(DV + out, w[:, None] * dy, mask=mask)
    tl.store(DW + rows, tl.sum(v * dy, axis=1), mask=ok)


@triton.jit
def _tanh64(x):
    """tanh of float64 x, from exp(−2|x|) (no cancellation near 0 beyond float64's)."""
    u = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - u) / (1.0 + u)
    return tl.where(x < 0, -y, y)


@triton.jit
def _angle_tile(ANG, DT, b, h, t, a, ok, A: tl.constexpr):
    """``(tanh(Angles), dt)`` of rows t of (sequence b, head h), float64 ([BLOCK_T, BLOCK_A],
    [BLOCK_T]; 0 past the rows or A). ANG ``(pointer, batch, seqlen, head, angle strides)``; DT
    ``(pointer, batch, head, seqlen strides)``."""
    g_ptr, g_b, g_t, g_h, g_a = ANG
    x = tl.load(g_ptr + b.to(tl.int64) * g_b + t.to(tl.int64)[:, None] * g_t + h * g_h +
                a[None, :] * g_a, mask=ok[:, None] & (a < A)[None, :], other=0.0)
    d_ptr, d_b, d_h, d_t = DT
    dt = tl.load(d_ptr + b.to(tl.int64) * d_b + h * d_h + t.to(tl.int64) * d_t, mask=ok,
                 other=0.0)
    return _tanh64(x.to(tl.float64)), dt.to(tl.float64)


@triton.jit
def _restart(v1, f1, v2, f2):
    """A running sum that starts again where a flag is set: the combine of a segmented scan."""
    return tl.where(f2 != 0, v2, v1 + v2), f1 | f2


@triton.jit
def _running(x, flags, carry, VARLEN: tl.constexpr, BLOCK_T: tl.constexpr,
             BLOCK_A: tl.constexpr):
    """The running sums down a tile's rows of x [BLOCK_T, BLOCK_A] after ``carry`` [BLOCK_A];
    ``VARLEN``: started again at each row whose flag is set (a segmented scan; unpacked the
    sums run on from the carry, which starts at 0)."""
    if VARLEN:
        total, seen = tl.associative_scan(
            (x, tl.broadcast_to(flags[:, None], [BLOCK_T, BLOCK_A])), 0, _restart)
        total = tl.where(seen != 0, total, total + carry[None, :])
    else:
        total = tl.cumsum(x, axis=0) + carry[None, :]
    return total


@triton.jit
def _starts(SEQ, b, t, ok, N, VARLEN: tl.constexpr, REVERSE: tl.constexpr):
    """``(flags, sequence)`` of rows t: flags 1 where a sequence starts (``REVERSE``: ends), the
    rows' sequence (``b`` unpacked); packed, from ``SEQ`` (each row's sequence, int64)."""
    if VARLEN:
        seq = tl.load(SEQ + t, mask=ok, other=0)
        if REVERSE:
            nxt = tl.load(SEQ + t + 1, mask=t + 1 < N, other=-1)
            flags = (nxt != seq) | (t + 1 >= N)
        else:
            prev = tl.load(SEQ + t - 1, mask=ok & (t > 0), other=-1)
            flags = prev != seq
    else:
        seq = tl.zeros_like(t) + b
        if REVERSE:
            flags = t == N - 1
        else:
            flags = t == 0
    return flags.to(tl.int32), seq


@triton.jit
def angle_sums(ANG, DT, TH0, TH, SEQ, SIZE, HAS_TH0: tl.constexpr, VARLEN: tl.constexpr,
               BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr):
    """θ_t = θ0 + Σ_(s ≤ t) tanh(Angles_s)·π·dt_s down each sequence's rows, summed in float64
    and reduced mod 2π, stored in TH's dtype, contiguous ``(batch, heads, A, seqlen)``: one
    program a (batch row, head) and ``BLOCK_A`` angles walking its rows, grid (batch·heads,
    angle blocks); ``VARLEN``: sequences packed in a batch of one, ``SEQ`` each row's (int64),
    the sums started again at each; TH0 contiguous ``(sequences, heads, A)``; ``SIZE = (N, H,
    A)``."""
    N, H, A = SIZE
    b, h = tl.program_id(0) // H, tl.program_id(0) % H
    a = tl.program_id(1) * BLOCK_A + tl.arange(0, BLOCK_A)
    lane = tl.program_id(0).to(tl.int64) * A
    carry = tl.zeros([BLOCK_A], tl.float64)
    two_pi = 6.283185307179586
    for t0 in range(0, N, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        ok = t < N
        th, dt = _angle_tile(ANG, DT, b, h, t, a, ok, A)
        inc = th * (3.141592653589793 * dt)[:, None]
        flags, seq = _starts(SEQ, b, t, ok, N, VARLEN, False)
        if HAS_TH0:  # (each sequence's starting angle enters with its first row)
            inc += tl.where(flags[:, None] != 0,
                            tl.load(TH0 + (seq.to(tl.int64) * H + h)[:, None] * A + a[None, :],
                                    mask=ok[:, None] & (a < A)[None, :], other=0.0), 0.0)
        total = _running(inc, flags, carry, VARLEN, BLOCK_T, BLOCK_A)
        carry = tl.sum(tl.where(t[:, None] == tl.minimum(t0 + BLOCK_T, N) - 1, total, 0.0), 0)
        total -= tl.floor(total / two_pi) * two_pi
        tl.store(TH + (lane + a[None, :]) * N + t[:, None], total,
                 mask=ok[:, None] & (a < A)[None, :])


@triton.jit
def angle_sums_backward(DTH, ANG, DT, DANG, DDT, DTH0, SEQ, SIZE, VARLEN: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr):
    """The gradients of :func:`angle_sums`: each row's suffix sum within its sequence S_t =
    Σ_(s ≥ t) dθ_s in float64 (its terms cancel: the sums are small differences of large ones),
    dAngles = S·π·dt·(1 − tanh²) and ddt = Σ_A S·π·tanh, and each sequence's dθ0 = S at its
    first row. The rows walked from the last, each block in descending order; grid as
    :func:`angle_sums`'. DTH ``(pointer, batch, seqlen, head, angle strides)``; DANG contiguous
    ``(batch, seqlen, heads, A)``, DDT ``(angle blocks, batch, heads, seqlen)`` (each block's
    part of ddt), DTH0 ``(sequences, heads, A)`` (zeros where a sequence has no rows), each in
    its own dtype."""
    N, H, A = SIZE
    b, h = tl.program_id(0) // H, tl.program_id(0) % H
    a = tl.program_id(1) * BLOCK_A + tl.arange(0, BLOCK_A)
    carry = tl.zeros([BLOCK_A], tl.float64)
    d_ptr, d_b, d_t, d_h, d_a = DTH
    for i in range(0, N, BLOCK_T):
        t = (N - 1 - i) - tl.arange(0, BLOCK_T)
        ok = t >= 0
        mask = ok[:, None] & (a < A)[None, :]
        g = tl.load(d_ptr + b.to(tl.int64) * d_b + t.to(tl.int64)[:, None] * d_t + h * d_h +
                    a[None, :] * d_a, mask=mask, other=0.0).to(tl.float64)
        flags, seq = _starts(SEQ, b, t, ok, N, VARLEN, True)
        suffix = _running(g, flags, carry, VARLEN, BLOCK_T, BLOCK_A)
        carry = tl.sum(tl.where(t[:, None] == tl.maximum(N - 1 - i - (BLOCK_T - 1), 0), suffix,
                                0.0), 0)
        th, dt = _angle_tile(ANG, DT, b, h, t, a, ok, A)
        s = suffix * 3.141592653589793
        tl.store(DANG + ((b.to(tl.int64) * N + t.to(tl.int64)[:, None]) * H + h) * A +
                 a[None, :], s * dt[:, None] * (1.0 - th * th), mask=mask)
        tl.store(DDT + ((tl.program_id(1) * tl.num_programs(0) + b * H + h).to(tl.int64) * N
                        + t), tl.sum(s * th, axis=1), mask=ok)
        first, _ = _starts(SEQ, b, t, ok, N, VARLEN, False)
        tl.store(DTH0 + (seq.to(tl.int64) * H + h)[:, None] * A + a[None, :], suffix,
                 mask=mask & (first[:, None] != 0))
