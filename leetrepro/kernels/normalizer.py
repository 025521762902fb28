"""Normalised linear attention's passes around the operator (``leetrepro.methods.normalizer``):
with f(x) = c + x, the numerator ``num = op(Q, K, V)`` (the operator at γ = 1) and the running
sums ``ks_i = Σ_(j≤i) k_j``, ``vs_i = Σ_(j≤i) v_j``,

    den_i = c·(i + 1) + q_i·ks_i + eps,    o_i = (num_i + c·vs_i) / den_i

and the backward, with ``dnum = dO / den`` (the operator's dO) and ``dden_i = −dnum_i·o_i``:

    dq_i += dden_i·ks_i,    dk_j += Σ_(i≥j) dden_i q_i,    dv_j += c·Σ_(i≥j) dnum_i

Every pass is one launch over chunks of ``BLOCK_N`` rows, grid (batch·heads, chunks): a chunk's
running sums start from the prefix (or suffix) of the chunks' totals, summed across chunks by
:func:`normalizer_chunk_scan` (a few floats a chunk). The row normalisation of q and k
(``x / max(‖x‖₂, eps)``, :func:`row_normalize_forward` and its backward) is one pass each way
over the same chunks. A tensor argument is ``(pointer, batch stride, head stride, row
stride)``, its last dimension contiguous; sums and products in float32.
"""
import triton
import triton.language as tl

#: the bits of :func:`normalizer_epilogue`'s ``WANT``: which gradients it adds to, and whether
#: q and k are rows the layer normalised (a bit first in ``bit & WANT``: the interpreter passes
#: WANT as a plain int, which takes no constexpr on its right)
WANT_DQ, WANT_DK, WANT_DV, ROWS_NORMALIZED = (tl.constexpr(1 << i) for i in range(4))


@triton.jit
def _where(T, bh, H, n0, N, WIDTH, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    """The pointers of T's chunk rows [BLOCK_N, BLOCK_W] and their mask (rows < N, columns <
    WIDTH)."""
    ptr, sb, sh, sn = T
    rows = n0 + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_W)
    ok = (rows < N)[:, None] & (cols < WIDTH)[None, :]
    at = ptr + (bh // H).to(tl.int64) * sb + (bh % H).to(tl.int64) * sh + \
        rows.to(tl.int64)[:, None] * sn + cols[None, :]
    return at, ok


@triton.jit
def _rows(T, bh, H, n0, N, WIDTH, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    """T's chunk rows as float32 [BLOCK_N, BLOCK_W], 0 past N or WIDTH."""
    at, ok = _where(T, bh, H, n0, N, WIDTH, BLOCK_N, BLOCK_W)
    return tl.load(at, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _store_rows(T, x, bh, H, n0, N, WIDTH, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    """x (float32 [BLOCK_N, BLOCK_W]) into T's chunk rows, in T's dtype."""
    at, ok = _where(T, bh, H, n0, N, WIDTH, BLOCK_N, BLOCK_W)
    tl.store(at, x.to(T[0].dtype.element_ty), mask=ok)


@triton.jit
def _chunk(SUMS, part, bh, chunk, WIDTH, BLOCK_W: tl.constexpr, STRIDE: tl.constexpr):
    """Chunk ``chunk``'s sums of one part of a float32 ``(batch·heads, chunks, STRIDE)`` tensor:
    WIDTH columns from column ``part`` (the parts side by side, each padded to its block), their
    pointers and mask. A pass stores the whole block, its padding 0 (the rows are read as 0
    past WIDTH), so that every column of the tensor is defined."""
    cols = tl.arange(0, BLOCK_W)
    at = SUMS + (bh.to(tl.int64) * tl.num_programs(1) + chunk) * STRIDE + part + cols
    return at, cols < WIDTH


@triton.jit
def _scan_columns(SUMS, OUT, base, cols, CHUNKS, WIDTH, REVERSE: tl.constexpr,
                  BLOCK_C: tl.constexpr):
    """:func:`normalizer_chunk_scan` over one block of columns, one direction."""
    carry = tl.zeros(cols.shape, dtype=tl.float32)
    for i in range(0, tl.cdiv(CHUNKS, BLOCK_C)):
        if REVERSE:
            at = CHUNKS - (i + 1) * BLOCK_C + tl.arange(0, BLOCK_C)
            src = at + 1
        else:
            at = i * BLOCK_C + tl.arange(0, BLOCK_C)
            src = at - 1
        ok = (cols < WIDTH)[None, :]
        x = tl.load(SUMS + base + src[:, None] * WIDTH + cols[None, :],
                    mask=((src >= 0) & (src < CHUNKS) & (at >= 0))[:, None] & ok, other=0.0)
        run = tl.cumsum(x, axis=0, reverse=REVERSE) + carry[None, :]
        tl.store(OUT + base + at[:, None] * WIDTH + cols[None, :], run,
                 mask=((at >= 0) & (at < CHUNKS))[:, None] & ok)
        carry = tl.sum(x, axis=0) + carry


@triton.jit
def normalizer_chunk_scan(SUMS, OUT, CHUNKS, WIDTH, REVERSE_FROM, BLOCK_C: tl.constexpr,
                          BLOCK_W: tl.constexpr):
    """OUT[bh, c] = the sum of SUMS[bh, c′] over the chunks before c, or after it for the
    columns from REVERSE_FROM on (a multiple of BLOCK_W: the parts of a pass's sums are padded
    to their blocks): float32 ``(batch·heads, CHUNKS, WIDTH)``, grid (batch·heads, column
    blocks). Each block of chunks is read one chunk shifted (the exclusive sum is the running
    sum of the shifted rows: no difference of large terms) and its running sum carried to the
    next."""
    bh, first = tl.program_id(0), tl.program_id(1) * BLOCK_W
    cols = first + tl.arange(0, BLOCK_W)
    base = bh.to(tl.int64) * CHUNKS * WIDTH
    if first >= REVERSE_FROM:
        _scan_columns(SUMS, OUT, base, cols, CHUNKS, WIDTH, True, BLOCK_C)
    else:
        _scan_columns(SUMS, OUT, base, cols, CHUNKS, WIDTH, False, BLOCK_C)


@triton.jit
def _triangular(x, REVERSE: tl.constexpr, TY: tl.constexpr):
    """The running sums of x's rows (float32 [BLOCK_N, W]) on the tensor cores: a triangular
    matrix of ones times x split in two TY parts (x's high bits, then the rest: each term within
    2⁻¹⁷ of itself), summed in float32. A non-finite entry is left out of the products, whose
    zeros would carry it to the rows on the other side of it, where the answer is finite; the
    sums on its side are NaN (``tl.cumsum`` would give an infinity or NaN there)."""
    i = tl.arange(0, x.shape[0])
    if REVERSE:
        tri = (i[None, :] >= i[:, None]).to(TY)
    else:
        tri = (i[None, :] <= i[:, None]).to(TY)
    bad = ~(tl.abs(x) < float("inf"))
    x = tl.where(bad, 0.0, x)
    high = x.to(TY)
    run = tl.dot(tri, high) + tl.dot(tri, (x - high.to(tl.float32)).to(TY))
    seen = tl.dot(tri, bad.to(TY))  # (how many non-finite entries each row's sum takes)
    return tl.where(seen > 0, float("nan"), run)


@triton.jit
def _running(x, carry, REVERSE: tl.constexpr, RUN: tl.constexpr):
    """The running sums of a chunk's rows (float32 [BLOCK_N, W]) plus ``carry`` (the sum of the
    rows before the chunk, or after it with REVERSE). RUN 0: ``tl.cumsum``; else on the tensor
    cores (:func:`_triangular`), RUN 1 in bf16, RUN 2 in fp16 (under Triton's interpreter, whose
    bf16 dot products are wrong)."""
    if RUN == 0:
        run = tl.cumsum(x, axis=0, reverse=REVERSE)
    else:
        run = _triangular(x, REVERSE, tl.bfloat16 if RUN == 1 else tl.float16)
    return run + carry[None, :]


@triton.jit
def normalizer_totals(K, V, SUMS, SIZE, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_D: tl.constexpr):
    """Each chunk's sums of k and of v into SUMS, float32 ``(batch·heads, chunks, BLOCK_R +
    BLOCK_D)``: k's from column 0, v's from BLOCK_R; ``SIZE = (N, R, D, H)``."""
    N, R, D, H = SIZE
    bh, chunk = tl.program_id(0), tl.program_id(1)
    n0 = chunk * BLOCK_N
    k = _rows(K, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    at, ok = _chunk(SUMS, 0, bh, chunk, R, BLOCK_R, BLOCK_R + BLOCK_D)
    tl.store(at, tl.sum(k, axis=0))
    v = _rows(V, bh, H, n0, N, D, BLOCK_N, BLOCK_D)
    at, ok = _chunk(SUMS, BLOCK_R, bh, chunk, D, BLOCK_D, BLOCK_R + BLOCK_D)
    tl.store(at, tl.sum(v, axis=0))


@triton.jit
def normalizer_forward(NUM, Q, K, V, O, DEN, SUMS, SIZE, c, eps, BLOCK_N: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, HAS_C: tl.constexpr,
                       RUN: tl.constexpr):
    """O (its dtype) and DEN (float32 ``(batch·heads, N)``) from NUM (the operator's output) and
    q, k, v; SUMS: the sums of k and v over the chunks before each (float32, as
    :func:`normalizer_totals` lays them out); ``SIZE = (N, R, D, H)``."""
    N, R, D, H = SIZE
    bh, chunk = tl.program_id(0), tl.program_id(1)
    n0 = chunk * BLOCK_N
    rows = n0 + tl.arange(0, BLOCK_N)
    k = _rows(K, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    at, ok = _chunk(SUMS, 0, bh, chunk, R, BLOCK_R, BLOCK_R + BLOCK_D)
    ks = _running(k, tl.load(at, mask=ok, other=0.0), False, RUN)
    den = tl.sum(_rows(Q, bh, H, n0, N, R, BLOCK_N, BLOCK_R) * ks, axis=1) + eps
    if HAS_C:  # (v's running sum first: num is read last, into the sum)
        den += c * (rows + 1).to(tl.float32)
        v = _rows(V, bh, H, n0, N, D, BLOCK_N, BLOCK_D)
        at, ok = _chunk(SUMS, BLOCK_R, bh, chunk, D, BLOCK_D, BLOCK_R + BLOCK_D)
        num = c * _running(v, tl.load(at, mask=ok, other=0.0), False, RUN) + \
            _rows(NUM, bh, H, n0, N, D, BLOCK_N, BLOCK_D)
    else:
        num = _rows(NUM, bh, H, n0, N, D, BLOCK_N, BLOCK_D)
    _store_rows(O, num / den[:, None], bh, H, n0, N, D, BLOCK_N, BLOCK_D)
    tl.store(DEN + bh.to(tl.int64) * N + rows, den, mask=rows < N)


@triton.jit
def normalizer_prologue(DO, O, DEN, Q, K, DNUM, DDEN, SUMS, SIZE, BLOCK_N: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, WITH_SUMS: tl.constexpr):
    """The backward's first pass: DNUM = dO / den (DNUM's dtype: the operator's dO), DDEN =
    −(dO·o) / den (float32 ``(batch·heads, N)``), and with ``WITH_SUMS`` each chunk's sums into
    SUMS, float32 ``(batch·heads, chunks, 2·BLOCK_R + BLOCK_D)``: k's from column 0, dden·q's
    from BLOCK_R, (dO / den)'s from 2·BLOCK_R (without: Q, K and SUMS not read); ``SIZE = (N,
    R, D, H)``."""
    N, R, D, H = SIZE
    bh, chunk = tl.program_id(0), tl.program_id(1)
    n0 = chunk * BLOCK_N
    rows = n0 + tl.arange(0, BLOCK_N)
    inv = 1.0 / _row_values(DEN, bh, N, rows)
    do = _rows(DO, bh, H, n0, N, D, BLOCK_N, BLOCK_D)
    o = _rows(O, bh, H, n0, N, D, BLOCK_N, BLOCK_D)
    dnum = do * inv[:, None]
    dden = -tl.sum(dnum * o, axis=1)
    tl.store(DDEN + bh.to(tl.int64) * N + rows, dden, mask=rows < N)
    _store_rows(DNUM, dnum, bh, H, n0, N, D, BLOCK_N, BLOCK_D)
    if not WITH_SUMS:
        return
    STRIDE: tl.constexpr = 2 * BLOCK_R + BLOCK_D
    at, ok = _chunk(SUMS, 2 * BLOCK_R, bh, chunk, D, BLOCK_D, STRIDE)
    tl.store(at, tl.sum(dnum, axis=0))
    k = _rows(K, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    at, ok = _chunk(SUMS, 0, bh, chunk, R, BLOCK_R, STRIDE)
    tl.store(at, tl.sum(k, axis=0))
    q = _rows(Q, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    at, ok = _chunk(SUMS, BLOCK_R, bh, chunk, R, BLOCK_R, STRIDE)
    tl.store(at, tl.sum(q * dden[:, None], axis=0))


@triton.jit
def _unnormalized(g, y, s, eps):
    """The gradient of x from that of ``y = x / s`` (s = max(‖x‖₂, eps) per row, float32 [rows]):
    ``(g − y·(y·g)) / s``, or ``g / s`` where the norm was clamped to eps (a constant then)."""
    along = tl.where(s > eps, tl.sum(y * g, axis=1), 0.0)
    return (g - y * along[:, None]) / s[:, None]


@triton.jit
def _row_values(S, bh, N, rows):
    """The chunk rows' entries of a float32 ``(batch·heads, N)`` tensor (denominators, norms),
    1 past N (a safe divisor)."""
    return tl.load(S + bh.to(tl.int64) * N + rows, mask=rows < N, other=1.0)


@triton.jit
def normalizer_epilogue(GRADS, Q, K, DO, DEN, DDEN, SUMS, NORMS, SIZE, c, BLOCK_N: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, WANT: tl.constexpr,
                        RUN: tl.constexpr):
    """The backward's last pass: the denominator's terms added in place to the operator's
    ``GRADS = (dq, dk, dv)`` (each program reads its own rows, then writes them), those that
    ``WANT`` names (bits: :data:`WANT_DQ`, :data:`WANT_DK`, :data:`WANT_DV`); SUMS: the sums of
    k over the chunks before each, of dden·q and of dO / den over the chunks after each (as
    :func:`normalizer_prologue` lays them out). With the bit :data:`ROWS_NORMALIZED`, q and k
    are rows normalised by the layer (``NORMS = (SQ, SK, row_eps)``: their norms, float32
    ``(batch·heads, N)``, clamped at row_eps) and dq, dk are carried back through that
    normalisation. ``SIZE = (N, R, D, H)``."""
    N, R, D, H = SIZE
    DQ, DK, DV = GRADS
    STRIDE: tl.constexpr = 2 * BLOCK_R + BLOCK_D
    SQ, SK, row_eps = NORMS
    bh, chunk = tl.program_id(0), tl.program_id(1)
    n0 = chunk * BLOCK_N
    rows = n0 + tl.arange(0, BLOCK_N)
    # (each gradient's part reads its own tiles, q and k again from the cache: with q and k
    # held across the parts the pass took 170 registers a thread, two programs an SM)
    if WANT_DQ & WANT:
        at, ok = _chunk(SUMS, 0, bh, chunk, R, BLOCK_R, STRIDE)
        ks = _running(_rows(K, bh, H, n0, N, R, BLOCK_N, BLOCK_R),
                      tl.load(at, mask=ok, other=0.0), False, RUN)
        dq = _rows(DQ, bh, H, n0, N, R, BLOCK_N, BLOCK_R) + \
            _row_values(DDEN, bh, N, rows)[:, None] * ks
        if ROWS_NORMALIZED & WANT:
            dq = _unnormalized(dq, _rows(Q, bh, H, n0, N, R, BLOCK_N, BLOCK_R),
                               _row_values(SQ, bh, N, rows), row_eps)
        _store_rows(DQ, dq, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    if WANT_DK & WANT:
        at, ok = _chunk(SUMS, BLOCK_R, bh, chunk, R, BLOCK_R, STRIDE)
        qs = _running(_rows(Q, bh, H, n0, N, R, BLOCK_N, BLOCK_R) *
                      _row_values(DDEN, bh, N, rows)[:, None],
                      tl.load(at, mask=ok, other=0.0), True, RUN)
        dk = _rows(DK, bh, H, n0, N, R, BLOCK_N, BLOCK_R) + qs
        if ROWS_NORMALIZED & WANT:
            dk = _unnormalized(dk, _rows(K, bh, H, n0, N, R, BLOCK_N, BLOCK_R),
                               _row_values(SK, bh, N, rows), row_eps)
        _store_rows(DK, dk, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    if WANT_DV & WANT:
        inv = 1.0 / _row_values(DEN, bh, N, rows)
        do = _rows(DO, bh, H, n0, N, D, BLOCK_N, BLOCK_D)
        at, ok = _chunk(SUMS, 2 * BLOCK_R, bh, chunk, D, BLOCK_D, STRIDE)
        ds = _running(do * inv[:, None], tl.load(at, mask=ok, other=0.0), True, RUN)
        dv = _rows(DV, bh, H, n0, N, D, BLOCK_N, BLOCK_D) + c * ds
        _store_rows(DV, dv, bh, H, n0, N, D, BLOCK_N, BLOCK_D)


@triton.jit
def row_normalize_forward(X, Y, S, SIZE, eps, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    """Each row of X divided by its clamped norm ``s = max(‖x‖₂, eps)``: Y (its dtype) and S
    (float32 ``(batch·heads, N)``); ``SIZE = (N, R, H)``."""
    N, R, H = SIZE
    bh, chunk = tl.program_id(0), tl.program_id(1)
    n0 = chunk * BLOCK_N
    rows = n0 + tl.arange(0, BLOCK_N)
    x = _rows(X, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    s = tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), eps)
    _store_rows(Y, x / s[:, None], bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    tl.store(S + bh.to(tl.int64) * N + rows, s, mask=rows < N)


@triton.jit
def row_normalize_backward(DY, Y, S, DX, SIZE, eps, BLOCK_N: tl.constexpr,
                           BLOCK_R: tl.constexpr):
    """DX = (DY − Y·(Y·DY)) / s for a row whose norm passed eps, DY / s for one clamped to it
    (its norm then a constant), from :func:`row_normalize_forward`'s Y and S."""
    N, R, H = SIZE
    bh, chunk = tl.program_id(0), tl.program_id(1)
    n0 = chunk * BLOCK_N
    rows = n0 + tl.arange(0, BLOCK_N)
    dy = _rows(DY, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    y = _rows(Y, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
    dx = _unnormalized(dy, y, _row_values(S, bh, N, rows), eps)
    _store_rows(DX, dx, bh, H, n0, N, R, BLOCK_N, BLOCK_R)
