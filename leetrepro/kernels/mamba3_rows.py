"""Mamba-3's rotated rows around the operator, one pass each way (``leetrepro.methods.mamba3_rows``).

Each program takes ``BLOCK_T`` rows of one (sequence, head): q and k read from their q/k head
(``head // REP``, in place), the biases added, the first ``2·A`` dims turned by pairs through the
running angles θ (pair i by θ_i), the rest as they are:

    Q̃ = round(R(θ)(Q + Q_bias)),   K̃ = round(R(θ)(K + K_bias)),   KEY = round(w · R(θ)(K + K_bias))

``round``: to ``ROUND`` (the inputs' 16-bit dtype) and back to float32, the operator's operands
held in float32 (so that the gradients it returns for them are not rounded). Backward, with the
Jacobian taken at the rounded values (``leetrepro.methods.mamba3_rows``' docstring says why):

    dXq = Rᵀ dQ̃,   dXk = Rᵀ (dK̃ + w·dKEY),   dw = Σ_d R(θ)(K + K_bias)·dKEY,
    dθ_i = dQ̃_(2i+1) Q̃_2i − dQ̃_2i Q̃_(2i+1) + (the same for K̃ and KEY).

Tensors come as ``(pointer, batch stride, seqlen stride, head stride)`` (elements, the last
dimension contiguous): rows ``(batch, seqlen, heads, ·)``; θ ``(batch, seqlen, heads, A)`` read
through its own strides (a view of the angles summed along seqlen); w ``(batch, seqlen, heads)``
likewise. The outputs are contiguous ``(batch, seqlen, heads, ·)`` float32.
"""
import triton
import triton.language as tl


@triton.jit
def _at(T, b, t, h):
    """The offsets of rows t (a block) of batch b and head h in ``T = (pointer, strides…)``."""
    ptr, s_b, s_t, s_h = T
    return ptr + b.to(tl.int64) * s_b + t.to(tl.int64)[:, None] * s_t + h * s_h


@triton.jit
def _turned(X, XB, b, t, hq, h, a, ok, cos, sin, A: tl.constexpr, P: tl.constexpr):
    """``(even, odd)`` of R(θ)(X + XB) over the pairs ``a`` ([BLOCK_T, BLOCK_A], float32; 0 past
    A)."""
    rows = _at(X, b, t, hq)
    mask = ok[:, None] & (a < A)[None, :]
    even = tl.load(rows + 2 * a[None, :], mask=mask, other=0.0).to(tl.float32) + \
        tl.load(XB + h * P + 2 * a, mask=a < A, other=0.0)[None, :]
    odd = tl.load(rows + 2 * a[None, :] + 1, mask=mask, other=0.0).to(tl.float32) + \
        tl.load(XB + h * P + 2 * a + 1, mask=a < A, other=0.0)[None, :]
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
def _store_row(OUT, b, t, h, a, e, ok, even, odd, tail, SIZE, A: tl.constexpr, P: tl.constexpr):
    """Pairs and tail into OUT, contiguous ``(batch, seqlen, heads, P)`` float32."""
    rows = OUT + _dense(b, t, h, SIZE)[:, None] * P
    pm = ok[:, None] & (a < A)[None, :]
    tl.store(rows + 2 * a[None, :], even, mask=pm)
    tl.store(rows + 2 * a[None, :] + 1, odd, mask=pm)
    tl.store(rows + 2 * A + e[None, :], tail, mask=ok[:, None] & (e < P - 2 * A)[None, :])


@triton.jit
def _load_row(X, b, t, h, a, e, ok, SIZE, A: tl.constexpr, P: tl.constexpr):
    """(even, odd, tail) of contiguous ``(batch, seqlen, heads, P)`` float32 rows."""
    rows = X + _dense(b, t, h, SIZE)[:, None] * P
    pm = ok[:, None] & (a < A)[None, :]
    return (tl.load(rows + 2 * a[None, :], mask=pm, other=0.0),
            tl.load(rows + 2 * a[None, :] + 1, mask=pm, other=0.0),
            tl.load(rows + 2 * A + e[None, :], mask=ok[:, None] & (e < P - 2 * A)[None, :],
                    other=0.0))


@triton.jit
def _load_grad(D, b, t, h, a, e, ok, A: tl.constexpr, P: tl.constexpr):
    """(even, odd, tail) of a gradient given as ``(pointer, strides…)``, float32."""
    rows = _at(D, b, t, h)
    pm = ok[:, None] & (a < A)[None, :]
    return (tl.load(rows + 2 * a[None, :], mask=pm, other=0.0).to(tl.float32),
            tl.load(rows + 2 * a[None, :] + 1, mask=pm, other=0.0).to(tl.float32),
            tl.load(rows + 2 * A + e[None, :], mask=ok[:, None] & (e < P - 2 * A)[None, :],
                    other=0.0).to(tl.float32))


@triton.jit
def _program(TH, W, SIZE, A: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr,
             BLOCK_E: tl.constexpr):
    """This program's rows of one (sequence, head) (grid: row blocks, batch·heads): ``(b, h,
    rows t, t in range, pairs a, tail dims e, cos θ, sin θ, w)``, cos θ and sin θ [BLOCK_T,
    BLOCK_A] (1 and 0 past A), the rows' weights w [BLOCK_T]."""
    N, H = SIZE
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = t < N
    a = tl.arange(0, BLOCK_A)
    e = tl.arange(0, BLOCK_E)
    th_ptr, th_b, th_t, th_h, th_a = TH
    theta = tl.load(th_ptr + b.to(tl.int64) * th_b + t.to(tl.int64)[:, None] * th_t + h * th_h +
                    a[None, :] * th_a, mask=ok[:, None] & (a < A)[None, :], other=0.0)
    w_ptr, w_b, w_t, w_h = W
    w = tl.load(w_ptr + b.to(tl.int64) * w_b + t.to(tl.int64) * w_t + h * w_h, mask=ok,
                other=0.0)
    return b, h, t, ok, a, e, tl.cos(theta), tl.sin(theta), w


@triton.jit
def rotate_rows(Q, K, QB, KB, TH, W, OUT_Q, OUT_K, OUT_KEY, SIZE, REP: tl.constexpr,
                A: tl.constexpr, P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr,
                BLOCK_E: tl.constexpr, ROUND: tl.constexpr):
    """Q̃, K̃ and KEY of ``BLOCK_T`` rows of one (sequence, head): grid (row blocks, batch·heads).
    ``SIZE = (N, H)``; θ as ``(pointer, batch, seqlen, head, angle strides)``."""
    b, h, t, ok, a, e, cos, sin, w = _program(TH, W, SIZE, A, BLOCK_T, BLOCK_A, BLOCK_E)
    even, odd = _turned(Q, QB, b, t, h // REP, h, a, ok, cos, sin, A, P)
    tail = _tail(Q, QB, b, t, h // REP, h, e, ok, A, P)
    _store_row(OUT_Q, b, t, h, a, e, ok, _rounded(even, ROUND), _rounded(odd, ROUND),
               _rounded(tail, ROUND), SIZE, A, P)
    even, odd = _turned(K, KB, b, t, h // REP, h, a, ok, cos, sin, A, P)
    tail = _tail(K, KB, b, t, h // REP, h, e, ok, A, P)
    _store_row(OUT_K, b, t, h, a, e, ok, _rounded(even, ROUND), _rounded(odd, ROUND),
               _rounded(tail, ROUND), SIZE, A, P)
    _store_row(OUT_KEY, b, t, h, a, e, ok, _rounded(even * w[:, None], ROUND),
               _rounded(odd * w[:, None], ROUND), _rounded(tail * w[:, None], ROUND), SIZE, A, P)


@triton.jit
def _turn_back(ge, go, cos, sin):
    """Rᵀ of the pairs (ge, go): the gradient of the unturned rows."""
    return ge * cos + go * sin, go * cos - ge * sin


@triton.jit
def _quarter(dy_even, dy_odd, y_even, y_odd):
    """Σ over this row's pairs' parts of dθ: dy_odd·y_even − dy_even·y_odd, per pair."""
    return dy_odd * y_even - dy_even * y_odd


@triton.jit
def rotate_rows_backward(DQ, DK, DKEY, RQ, RK, RKEY, K, KB, TH, W, DXQ, DXK, DTH, DW, SIZE,
                         REP: tl.constexpr, A: tl.constexpr, P: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_E: tl.constexpr):
    """The gradients of :func:`rotate_rows`' inputs a head each: dXq, dXk (contiguous ``(batch,
    seqlen, heads, P)`` float32, summed over each q/k head's heads and the rows by the caller),
    dθ (contiguous ``(batch, seqlen, heads, A)``) and dw (contiguous ``(batch, seqlen, heads)``);
    RQ, RK, RKEY the forward's rounded outputs."""
    b, h, t, ok, a, e, cos, sin, w = _program(TH, W, SIZE, A, BLOCK_T, BLOCK_A, BLOCK_E)
    # q: Rᵀ dQ̃, and its part of dθ at the rounded Q̃
    de, do, dt_ = _load_grad(DQ, b, t, h, a, e, ok, A, P)
    ye, yo, _ = _load_row(RQ, b, t, h, a, e, ok, SIZE, A, P)
    dtheta = _quarter(de, do, ye, yo)
    xe, xo = _turn_back(de, do, cos, sin)
    _store_row(DXQ, b, t, h, a, e, ok, xe, xo, dt_, SIZE, A, P)
    # k: the rows feed K̃ and KEY (= w·K̃ before rounding)
    ke, ko, kt = _load_grad(DK, b, t, h, a, e, ok, A, P)
    ye, yo, _ = _load_row(RK, b, t, h, a, e, ok, SIZE, A, P)
    dtheta += _quarter(ke, ko, ye, yo)
    ye_, yo_, _ = _load_row(RKEY, b, t, h, a, e, ok, SIZE, A, P)
    de, do, dt_ = _load_grad(DKEY, b, t, h, a, e, ok, A, P)
    dtheta += _quarter(de, do, ye_, yo_)
    re, ro = _turned(K, KB, b, t, h // REP, h, a, ok, cos, sin, A, P)
    rt = _tail(K, KB, b, t, h // REP, h, e, ok, A, P)
    dw = tl.sum(re * de + ro * do, axis=1) + tl.sum(rt * dt_, axis=1)
    xe, xo = _turn_back(ke + w[:, None] * de, ko + w[:, None] * do, cos, sin)
    _store_row(DXK, b, t, h, a, e, ok, xe, xo, kt + w[:, None] * dt_, SIZE, A, P)
    rows = _dense(b, t, h, SIZE)
    tl.store(DTH + rows[:, None] * A + a[None, :], dtheta, mask=ok[:, None] & (a < A)[None, :])
    tl.store(DW + rows, dw, mask=ok)
