"""Mamba-2's per-row passes around the operator, one pass each (``leetrepro.methods.ssd_rows``).

Rows are the (batch, seqlen, heads) rows of ``headdim`` values of mamba_ssm's layout; every
tensor comes as ``(pointer, batch stride, seqlen stride, head stride)`` (elements, the last
dimension contiguous), so the slices of a fused projection are read in place. One program takes
``BLOCK_T`` rows:

    OUT = A + Y·w + Y2·w2  (Y = X without ``HAS_Y``; A = 0 without ``HAS_A``; the last term
                            only with ``HAS_Y2``)
    DW  = Σ_d X·Y          (with ``HAS_DW``, float32)
    DW2 = Σ_d X·Y2         (with ``HAS_Y2`` and ``HAS_DW2``, float32)

with w, w2 float32 per row (dt; or D, a head's, its row strides 0), products and sums in
float32, OUT rounded once to its dtype (a factor rounded to 16 bits first would scale each
row's every entry by the same error, which the gradients of dt, A and dt_bias then sum). OUT is
contiguous ``(batch, seqlen, heads, headdim)``. Forward ``V' = dt·x`` and ``y = o + D·x``;
backward ``dx = dt·dV' + D·dy`` with ``ddt = Σ x·dV'`` and ``dD``'s rows Σ x·dy, one pass.

Before them, the step sizes and the gates (:func:`dt_gates`, :func:`dt_gates_backward`): dt =
clamp(softplus(dt_raw + dt_bias)) and g = dt·A in one pass over the ``(batch, seqlen, heads)``
rows, and back, with A's and dt_bias's sums per program.

And the gradients of B and C read by groups of heads (Mamba-2's ``ngroups``): each head's summed
over its group's heads (:func:`group_sums`), written once in the inputs' layout.
"""
import collections

import triton
import triton.language as tl


@triton.jit
def _offsets(T, rows, SIZE):
    """Each row's offset in a tensor ``T = (pointer, batch, seqlen, head strides)``."""
    ROWS, N, H, D = SIZE
    ptr, s_b, s_t, s_h = T
    return ptr + (rows // (N * H)) * s_b + ((rows // H) % N) * s_t + (rows % H) * s_h


@triton.jit
def axpy_rows(X, Y, A, W, OUT, DW, SECOND, SIZE, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
              HAS_Y: tl.constexpr, HAS_A: tl.constexpr, HAS_DW: tl.constexpr,
              HAS_Y2: tl.constexpr, HAS_DW2: tl.constexpr):
    """The module docstring's pass over rows ``BLOCK_T·pid …``; ``SIZE = (rows, seqlen, heads,
    headdim)``; ``SECOND = (Y2, W2, DW2)``, read with ``HAS_Y2``."""
    ROWS, N, H, D = SIZE
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = rows < ROWS
    cols = tl.arange(0, BLOCK_D)
    mask = ok[:, None] & (cols < D)[None, :]
    x = tl.load(_offsets(X, rows, SIZE)[:, None] + cols[None, :], mask=mask, other=0.0)
    w = tl.load(_offsets(W, rows, SIZE), mask=ok, other=0.0).to(tl.float32)
    if HAS_Y:
        y = tl.load(_offsets(Y, rows, SIZE)[:, None] + cols[None, :], mask=mask,
                    other=0.0).to(tl.float32)
    else:
        y = x.to(tl.float32)
    out = y * w[:, None]
    if HAS_A:
        out += tl.load(_offsets(A, rows, SIZE)[:, None] + cols[None, :], mask=mask,
                       other=0.0).to(tl.float32)
    if HAS_Y2:
        Y2, W2, DW2 = SECOND
        y2 = tl.load(_offsets(Y2, rows, SIZE)[:, None] + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        w2 = tl.load(_offsets(W2, rows, SIZE), mask=ok, other=0.0)
        out += y2 * w2.to(tl.float32)[:, None]
        if HAS_DW2:
            tl.store(DW2 + rows, tl.sum(x.to(tl.float32) * y2, axis=1), mask=ok)
    tl.store(OUT + rows[:, None] * D + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)
    if HAS_DW:
        tl.store(DW + rows, tl.sum(x.to(tl.float32) * y, axis=1), mask=ok)


@triton.jit
def group_sums(X, OUT, XS, OS, SIZE, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
               UNROLL: tl.constexpr):
    """OUT[b, g] = Σ_(j < PER) X[b, g·PER + j], summed in float32 in head order, stored in OUT's
    dtype. X: ``(batch, heads, N, R)`` at strides ``XS`` (its batch, head and row strides; the
    last dimension contiguous); OUT: ``(batch, groups, N, R)`` at strides ``OS`` likewise (a
    time-major layout written in place); ``SIZE = (N, R, groups, PER)``. A program takes
    ``BLOCK_T`` rows of one (batch, group); axis 1 of the grid walks the rows. ``UNROLL`` > 1 (a
    divisor of PER): that many heads' loads issued before they are summed (in head order still),
    for groups of many heads, whose loads one after another leave a program waiting on each."""
    N, R, GROUPS, PER = SIZE
    lane = tl.program_id(0).to(tl.int64)
    b, grp = lane // GROUPS, lane % GROUPS
    rows = tl.program_id(1).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_R)
    mask = (rows < N)[:, None] & (cols < R)[None, :]
    sxb, sxh, sxn = XS
    at = X + b * sxb + rows[:, None] * sxn + cols[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_R], tl.float32)
    if UNROLL == 1:
        for j in range(PER):
            acc += tl.load(at + (grp * PER + j) * sxh, mask=mask, other=0.0).to(tl.float32)
    else:
        for j0 in range(0, PER, UNROLL):  # (PER a multiple of UNROLL)
            for u in tl.static_range(UNROLL):
                acc += tl.load(at + (grp * PER + j0 + u) * sxh, mask=mask,
                               other=0.0).to(tl.float32)
    sob, sog, son = OS
    tl.store(OUT + b * sob + grp * sog + rows[:, None] * son + cols[None, :],
             acc.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _softplus(x, SOFTPLUS: tl.constexpr):
    """PyTorch's softplus (threshold 20: x itself above it) and its derivative, float32; log1p
    as ``log(u)·y/(u − 1)`` with u = 1 + y (exact where u rounds to 1: y itself)."""
    if SOFTPLUS:
        y = tl.exp(-tl.abs(x))
        u = 1.0 + y
        log1p = tl.where(u == 1.0, y, tl.log(u) * y / (u - 1.0))
        sp = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)
        grad = tl.where(x > 20.0, 1.0, 1.0 / (1.0 + tl.exp(-x)))
        return sp, grad
    else:
        return x, x * 0.0 + 1.0


#: :func:`dt_gates`' and :func:`dt_gates_backward`'s constexprs: a program's rows (of
#: batch·seqlen) and heads, and what the call has (dt_bias, the softplus, a clamp; the backward's
#: dt gradient and g gradient)
DtConstants = collections.namedtuple(
    "DtConstants", "BLOCK_T BLOCK_H HAS_BIAS SOFTPLUS HAS_LIMIT HAS_DDT HAS_DG",
    defaults=(False, False))


@triton.jit
def _dt_rows(RAW, BIAS, STRIDES, SIZE, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
             HAS_BIAS: tl.constexpr):
    """This program's rows (of batch·seqlen) × heads of dt_raw (+ dt_bias), float32: ``(x, ok,
    rows, heads)``; RAW at strides ``STRIDES = (batch, seqlen, head)``, ``SIZE = (rows,
    seqlen, heads)``."""
    ROWS, NT, H = SIZE
    SB, ST, SH = STRIDES
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    heads = tl.arange(0, BLOCK_H)
    ok = (rows < ROWS)[:, None] & (heads < H)[None, :]
    at = RAW + ((rows // NT) * SB + (rows % NT) * ST)[:, None] + heads[None, :] * SH
    x = tl.load(at, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(BIAS + heads, mask=heads < H, other=0.0).to(tl.float32)[None, :]
    return x, ok, rows, heads


@triton.jit
def _clamped(dt, LIMIT, HAS_LIMIT: tl.constexpr):
    """dt clamped to ``LIMIT = (low, high)`` and where the clamp lets the gradient through
    (low ≤ dt ≤ high, as PyTorch's clamp)."""
    if HAS_LIMIT:
        low, high = LIMIT
        through = (dt >= low) & (dt <= high)
        return tl.minimum(tl.maximum(dt, low), high), through
    else:
        return dt, dt == dt


@triton.jit
def dt_gates(RAW, BIAS, A, DT, G, STRIDES, SIZE, LIMIT, K: tl.constexpr):
    """dt = clamp(softplus(dt_raw + dt_bias)) and g = dt·A, float32 ``(batch, seqlen, heads)``
    contiguous, each program ``K.BLOCK_T`` rows of batch·seqlen (:func:`_dt_rows`;
    :data:`DtConstants`)."""
    x, ok, rows, heads = _dt_rows(RAW, BIAS, STRIDES, SIZE, K.BLOCK_T, K.BLOCK_H, K.HAS_BIAS)
    ROWS, NT, H = SIZE
    dt, _ = _softplus(x, K.SOFTPLUS)
    dt, _ = _clamped(dt, LIMIT, K.HAS_LIMIT)
    a = tl.load(A + heads, mask=heads < H, other=0.0).to(tl.float32)
    at = rows[:, None] * H + heads[None, :]
    tl.store(DT + at, dt, mask=ok)
    tl.store(G + at, dt * a[None, :], mask=ok)


@triton.jit
def dt_gates_backward(RAW, BIAS, A, DDT, DG, DRAW, PARTS, STRIDES, GRAD_STRIDES, SIZE, LIMIT,
                      K: tl.constexpr):
    """:func:`dt_gates` back: with dt's gradient DDT (``K.HAS_DDT``) and g's DG (``K.HAS_DG``;
    float32, strides ``GRAD_STRIDES``: DDT's then DG's (batch, seqlen, head)), dt_raw's gradient
    (clamp(·)'·softplus'·(DDT + DG·A)) into DRAW (contiguous, its dtype), and this program's
    sums over its rows for dt_bias (that gradient) and A (Σ DG·dt) into PARTS, float32
    ``(2, programs, heads)``."""
    BLOCK_T: tl.constexpr = K.BLOCK_T
    BLOCK_H: tl.constexpr = K.BLOCK_H
    x, ok, rows, heads = _dt_rows(RAW, BIAS, STRIDES, SIZE, BLOCK_T, BLOCK_H, K.HAS_BIAS)
    sp, dsp = _softplus(x, K.SOFTPLUS)
    dt, through = _clamped(sp, LIMIT, K.HAS_LIMIT)
    ROWS, NT, H = SIZE
    b, t = rows // NT, rows % NT
    grad = tl.zeros([BLOCK_T, BLOCK_H], tl.float32)
    da = tl.zeros([BLOCK_T, BLOCK_H], tl.float32)
    DB, DT_, DH, GB, GT, GH = GRAD_STRIDES
    if K.HAS_DDT:
        grad += tl.load(DDT + (b * DB + t * DT_)[:, None] + heads[None, :] * DH, mask=ok,
                        other=0.0)
    if K.HAS_DG:
        dg = tl.load(DG + (b * GB + t * GT)[:, None] + heads[None, :] * GH, mask=ok, other=0.0)
        a = tl.load(A + heads, mask=heads < H, other=0.0).to(tl.float32)
        grad += dg * a[None, :]
        da = dg * dt
    draw = tl.where(through, grad * dsp, 0.0)
    tl.store(DRAW + rows[:, None] * H + heads[None, :], draw.to(DRAW.dtype.element_ty), mask=ok)
    part = tl.program_id(0) * H + heads
    programs = tl.num_programs(0)
    tl.store(PARTS + part, tl.sum(draw, axis=0), mask=heads < H)
    tl.store(PARTS + programs * H + part, tl.sum(da, axis=0), mask=heads < H)
